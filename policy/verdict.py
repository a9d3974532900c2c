"""Verdicts: is this traffic allowed? Evaluated two ways that must agree.

`evaluate_rules` answers directly from the rules and the labels of the two sides: the
reference the computation is checked against (tests/policy) and what ``statewright policy
trace`` reports, with the rules that decided. `evaluate_entries` answers from an
endpoint's computed entries, as a datapath lookup does:

* a direction not enforced for the endpoint allows everything;
* otherwise the entries matching the traffic are those whose identity is the remote
  identity or 0, whose protocol is the traffic's or 0, and whose port prefix covers the
  port; a matching deny entry denies, else a matching allow entry allows, else the
  traffic is denied (default deny).

`evaluate_entries_lpm` answers as a longest-prefix-match datapath does (Cilium's policy
map): one lookup with the remote identity and one with identity 0, each returning only
its most specific match (protocol before wildcard protocol, then the longest port
prefix); a deny from either denies, else an allow from either allows. The computation
makes explicit in its rows the deny precedence this needs (policy/compute.py), so both
ways agree.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from policy.model import NO_PORT_NAMES, PortNames, Rule
from policy.ports import port_key_matches
from policy.selector import LabelView
from tables.policy_entries import PolicyEndpoint, PolicyEntry, PolicyKey


@dataclass(frozen=True, slots=True)
class Verdict:
    """The outcome in one direction, and the policies that decided it."""

    enforced: bool
    allowed: bool
    allowed_by: tuple[str, ...] = ()
    denied_by: tuple[str, ...] = ()
    selected_by: tuple[str, ...] = field(default=())

    def to_json(self) -> dict[str, Any]:
        """JSON form (``policy trace``)."""
        return {
            "enforced": self.enforced,
            "verdict": "allowed" if self.allowed else "denied",
            "allowed-by": list(self.allowed_by),
            "denied-by": list(self.denied_by),
            "selected-by": list(self.selected_by),
        }


def evaluate_rules(
    rules: Iterable[Rule],
    subject: Iterable[str] | LabelView,
    peer: Iterable[str] | LabelView,
    *,
    egress: bool,
    protocol: int,
    port: int,
    subject_ports: PortNames = NO_PORT_NAMES,
    peer_ports: PortNames = NO_PORT_NAMES,
) -> Verdict:
    """The verdict of the rules for traffic of an endpoint labelled ``subject`` with a peer
    labelled ``peer`` (egress: subject -> peer; ingress: peer -> subject). Named ports
    resolve as policy/model.py says: egress through the peer's ports (``peer_ports``),
    ingress through the subject's (``subject_ports``)."""
    sv = subject if isinstance(subject, LabelView) else LabelView(subject)
    pv = peer if isinstance(peer, LabelView) else LabelView(peer)
    selected: set[str] = set()
    allow: set[str] = set()
    deny: set[str] = set()
    for r in rules:
        if r.egress != egress or not r.subject.matches(sv):
            continue
        selected.add(r.policy)
        if r.peers is not None and not any(p.matches(pv) for p in r.peers):
            continue
        names = peer_ports if egress else subject_ports
        if not r.port_matches(protocol, port, names):
            continue
        (deny if r.deny else allow).add(r.policy)
    enforced = bool(selected)
    allowed = not enforced or (bool(allow) and not deny)
    return Verdict(
        enforced, allowed, tuple(sorted(allow)), tuple(sorted(deny)), tuple(sorted(selected))
    )


def _enforced(enforcement: PolicyEndpoint | None, egress: bool) -> bool:
    """Whether the endpoint's policy is enforced in the direction (else all is allowed)."""
    return enforcement is not None and (
        enforcement.egress_enforced if egress else enforcement.ingress_enforced
    )


def evaluate_entries(
    entries: Mapping[PolicyKey, PolicyEntry],
    enforcement: PolicyEndpoint | None,
    *,
    endpoint_id: int,
    identity: int,
    egress: bool,
    protocol: int,
    port: int,
) -> bool:
    """Whether an endpoint's entries allow the traffic (see the module doc)."""
    if not _enforced(enforcement, egress):
        return True
    allowed = False
    for e in entries.values():
        k = e.key
        if k.endpoint_id != endpoint_id or k.egress != egress:
            continue
        if k.identity not in (0, identity):
            continue
        if not port_key_matches((k.protocol, k.dport, k.port_prefix_len), protocol, port):
            continue
        if e.deny:
            return False
        allowed = True
    return allowed


def evaluate_entries_lpm(
    entries: Mapping[PolicyKey, PolicyEntry],
    enforcement: PolicyEndpoint | None,
    *,
    endpoint_id: int,
    identity: int,
    egress: bool,
    protocol: int,
    port: int,
) -> bool:
    """Whether a longest-prefix-match datapath allows the traffic (see the module doc)."""
    if not _enforced(enforcement, egress):
        return True
    found: list[PolicyEntry] = []
    for ident in {identity, 0}:
        best: PolicyEntry | None = None
        best_rank = (-1, -1)
        for e in entries.values():
            k = e.key
            if k.endpoint_id != endpoint_id or k.egress != egress or k.identity != ident:
                continue
            if not port_key_matches((k.protocol, k.dport, k.port_prefix_len), protocol, port):
                continue
            rank = (1 if k.protocol else 0, k.port_prefix_len)
            if rank > best_rank:
                best, best_rank = e, rank
        if best is not None:
            found.append(best)
    if any(e.deny for e in found):
        return False
    return bool(found)
