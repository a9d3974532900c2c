"""Selectors on namespace labels fail closed when a namespace's labels are unknown.

A pod's identity carries its namespace's labels (``k8s:io.cilium.k8s.namespace.labels.
<key>=<value>``, tables/identities.py) only when the agent has read its Namespace object;
until then it carries ``kubernetes.io/metadata.name`` (known from the name alone) and the
marker ``statewright:namespace-labels=unknown``. A requirement on any other namespace
label cannot be evaluated for such an identity: its answer is unknown, and evaluating it
against the labels that are missing would be wrong (``NotIn`` and ``DoesNotExist`` would
select every such pod, ``In`` and ``Exists`` none).

So a selector is evaluated only against labels the agent knows, and where it cannot be,
the rule is applied in the way that allows less (`fail_closed`):

* **allow rules** select a peer, or a subject for their allows, only when the answer is
  known: the selector gets ``!statewright:namespace-labels`` (`known_only`);
* a subject whose answer is unknown is still **enforced** in the rule's direction (it
  may be selected, and then it is default-deny there) but gets none of the rule's allows:
  a rule with the relaxed subject and no peer (`relaxed`);
* **deny rules** apply where the answer is known to be yes *or* is unknown: their
  subject and peer selectors are the known one and the relaxed one (the selector without
  the requirements it cannot evaluate, for identities with the marker).

Rules that do not depend on namespace labels are unchanged. The transformation is done
when a policy is parsed, so the computation, the datapath's entries and ``policy trace``
all see the same rules, and ``policy get`` shows the extra requirements.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from policy.model import Policy, Rule
from policy.selector import ANY_SOURCE, Requirement, Selector
from tables.identities import (
    NAMESPACE_LABELS_PREFIX,
    NAMESPACE_LABELS_UNKNOWN,
    NAMESPACE_NAME_LABEL,
    POD_NAMESPACE_LABEL,
    Identity,
)

_UNKNOWN_SOURCE, _, _rest = NAMESPACE_LABELS_UNKNOWN.partition(":")
_UNKNOWN_KEY, _, _UNKNOWN_VALUE = _rest.partition("=")

#: Identities whose namespace labels are known (no marker).
LABELS_KNOWN = Requirement(_UNKNOWN_SOURCE, _UNKNOWN_KEY, "DoesNotExist")
#: Identities whose namespace labels are unknown (the marker).
LABELS_UNKNOWN = Requirement(_UNKNOWN_SOURCE, _UNKNOWN_KEY, "In", (_UNKNOWN_VALUE,))
#: The selector of every identity whose namespace labels are unknown.
UNKNOWN_SELECTOR = Selector((LABELS_UNKNOWN,))


def needs_namespace_labels(req: Requirement) -> bool:
    """Whether ``req`` reads a namespace label other than ``kubernetes.io/metadata.name``
    (which every pod identity carries)."""
    return (
        req.source in ("k8s", ANY_SOURCE)
        and req.key.startswith(NAMESPACE_LABELS_PREFIX)
        and req.key != NAMESPACE_LABELS_PREFIX + NAMESPACE_NAME_LABEL
    )


def depends(sel: Selector) -> bool:
    """Whether ``sel`` has a requirement on namespace labels that may be unknown."""
    return any(needs_namespace_labels(r) for r in sel.requirements)


def known_only(sel: Selector) -> Selector:
    """``sel`` restricted to identities whose namespace labels are known."""
    return sel.with_requirements(LABELS_KNOWN) if depends(sel) else sel


def relaxed(sel: Selector) -> Selector:
    """The identities with unknown namespace labels that ``sel`` may select: ``sel``
    without its namespace-label requirements, for identities carrying the marker."""
    kept = tuple(r for r in sel.requirements if not needs_namespace_labels(r))
    return Selector(kept).with_requirements(LABELS_UNKNOWN)


def fail_closed(rule: Rule) -> list[Rule]:
    """``rule`` as rules that never allow on an unknown answer (see the module doc)."""
    peers = rule.peers or ()
    if not depends(rule.subject) and not any(depends(p) for p in peers):
        return [rule]
    if rule.deny:
        subjects = [rule.subject]
        if depends(rule.subject):
            subjects = [known_only(rule.subject), relaxed(rule.subject)]
        new_peers: tuple[Selector, ...] | None = None
        if rule.peers is not None:
            out: set[Selector] = set()
            for p in rule.peers:
                out.update((known_only(p), relaxed(p)) if depends(p) else (p,))
            new_peers = tuple(sorted(out))
        return [replace(rule, subject=s, peers=new_peers) for s in subjects]
    allow_peers = None if rule.peers is None else tuple(sorted({known_only(p) for p in peers}))
    rules = [replace(rule, subject=known_only(rule.subject), peers=allow_peers)]
    if depends(rule.subject):
        rules.append(replace(rule, subject=relaxed(rule.subject), peers=(), ports=()))
    return rules


def fail_closed_rules(rules: list[Rule]) -> tuple[Rule, ...]:
    """Every rule through `fail_closed`, without duplicates, in order."""
    out: dict[Rule, None] = {}
    for r in rules:
        for f in fail_closed(r):
            out.setdefault(f, None)
    return tuple(out)


def uses_namespace_labels(policy: Policy) -> bool:
    """Whether a rule of ``policy`` fails closed for pods of unknown namespace labels."""
    return any(
        LABELS_KNOWN in sel.requirements or LABELS_UNKNOWN in sel.requirements
        for sel in policy.selectors()
    )


def unknown_namespaces(identities: Iterable[Identity]) -> set[str]:
    """The namespaces of the identities that carry the unknown-labels marker."""
    prefix = f"k8s:{POD_NAMESPACE_LABEL}="
    out: set[str] = set()
    for ident in identities:
        if NAMESPACE_LABELS_UNKNOWN in ident.labels:
            out.update(lab[len(prefix):] for lab in ident.labels if lab.startswith(prefix))
    return out
