"""Selectors on namespace labels fail closed (issue #26): each selector operator against
a namespace whose labels are known and one whose labels are unknown, through the rules
(``policy trace``) and through the computed entries (what the datapath enforces)."""

from __future__ import annotations

from typing import Any

import pytest

from policy.compute import PolicyComputation
from policy.parse import parse_policy
from policy.verdict import evaluate_entries, evaluate_entries_lpm, evaluate_rules
from tables.identities import pod_identity_labels

CLIENT = 300
#: identity -> labels: pods of namespace y (labels known, ns=y), w (known, no ns label),
#: u (labels unknown: no Namespace object read) and the host.
PEERS: dict[int, tuple[str, ...]] = {
    301: pod_identity_labels({"app": "s"}, "y", {"ns": "y"}),
    302: pod_identity_labels({"app": "s"}, "w", {}),
    303: pod_identity_labels({"app": "s"}, "u", None),
    1: ("reserved:host",),
}
Y, W, U, HOST = 301, 302, 303, 1

#: selector -> the peers it allows; the unknown namespace is never allowed, nor the host
#: (a namespaceSelector selects pods).
CASES: list[tuple[str, dict[str, Any], set[int]]] = [
    ("matchLabels", {"matchLabels": {"ns": "y"}}, {Y}),
    ("In", {"matchExpressions": [{"key": "ns", "operator": "In", "values": ["y"]}]}, {Y}),
    ("NotIn", {"matchExpressions": [{"key": "ns", "operator": "NotIn", "values": ["y"]}]},
     {W}),
    ("Exists", {"matchExpressions": [{"key": "ns", "operator": "Exists"}]}, {Y}),
    ("DoesNotExist", {"matchExpressions": [{"key": "ns", "operator": "DoesNotExist"}]}, {W}),
    # kubernetes.io/metadata.name is known from the name alone: it selects the unknown
    # namespace's pods as any other
    ("metadata.name", {"matchLabels": {"kubernetes.io/metadata.name": "u"}}, {U}),
    ("metadata.name NotIn",
     {"matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "NotIn",
                            "values": ["y"]}]}, {W, U}),
]


def _egress_to(ns_selector: dict[str, Any]) -> dict[str, Any]:
    return {
        "kind": "NetworkPolicy",
        "metadata": {"name": "p", "namespace": "x"},
        "spec": {
            "podSelector": {"matchLabels": {"app": "client"}},
            "policyTypes": ["Egress"],
            "egress": [{"to": [{"namespaceSelector": ns_selector}],
                        "ports": [{"port": 80}]}],
        },
    }


def _computed(policy: dict[str, Any], client_labels: tuple[str, ...]) -> PolicyComputation:
    comp = PolicyComputation()
    comp.upsert_identity(CLIENT, client_labels)
    for ident, labels in PEERS.items():
        comp.upsert_identity(ident, labels)
    comp.upsert_policy(parse_policy(policy))
    comp.set_endpoint(1, CLIENT)
    return comp


def _allowed(comp: PolicyComputation, remote: int, *, egress: bool = True) -> bool:
    """The computed entries' verdict, checked to agree under both lookups."""
    entries, enf = comp.entries(1), comp.enforcement(1)
    kw: dict[str, Any] = dict(endpoint_id=1, identity=remote, egress=egress, protocol=6,
                              port=80)
    got = evaluate_entries(entries, enf, **kw)
    assert evaluate_entries_lpm(entries, enf, **kw) == got
    return got


@pytest.mark.parametrize(("op", "selector", "allowed"), CASES, ids=[c[0] for c in CASES])
def test_each_operator_allows_only_known_namespaces(
    op: str, selector: dict[str, Any], allowed: set[int]
) -> None:
    client = pod_identity_labels({"app": "client"}, "x", {"ns": "x"})
    comp = _computed(_egress_to(selector), client)
    rules = [r for p in comp.repo.policies() for r in p.rules]
    for ident, labels in PEERS.items():
        want = ident in allowed
        trace = evaluate_rules(rules, client, labels, egress=True, protocol=6, port=80)
        assert trace.enforced and trace.allowed == want, (op, ident)
        assert _allowed(comp, ident) == want, (op, ident)


def test_not_in_from_the_issue_denies_the_excluded_namespace_when_labels_are_unknown() -> None:
    # without Namespace objects, every pod's namespace labels are unknown: the egress
    # rule to "ns NotIn (y)" must not let the client reach namespace y
    client = pod_identity_labels({"app": "client"}, "x", None)
    y_unknown = pod_identity_labels({"app": "s"}, "y", None)
    comp = PolicyComputation()
    comp.upsert_identity(CLIENT, client)
    comp.upsert_identity(310, y_unknown)
    comp.upsert_policy(parse_policy(_egress_to(CASES[2][1])))
    comp.set_endpoint(1, CLIENT)
    assert not _allowed(comp, 310)


def _cnp(spec: dict[str, Any]) -> dict[str, Any]:
    return {"kind": "CiliumNetworkPolicy", "metadata": {"name": "c", "namespace": "x"},
            "spec": spec}


NS_Y = {"matchLabels": {"k8s:io.cilium.k8s.namespace.labels.ns": "y",
                        "k8s:io.kubernetes.pod.namespace": "y"}}


def test_a_deny_on_namespace_labels_applies_when_they_are_unknown() -> None:
    # allow everything, deny the pods of namespaces labelled ns=y: a pod whose namespace
    # labels are unknown might be one of them, so the deny applies to it
    policy = _cnp({
        "endpointSelector": {"matchLabels": {"app": "client"}},
        "egress": [{"toEntities": ["all"]}],
        "egressDeny": [{"toEndpoints": [
            {"matchExpressions": [{"key": "k8s:io.cilium.k8s.namespace.labels.ns",
                                   "operator": "In", "values": ["y"]},
                                  {"key": "k8s:io.kubernetes.pod.namespace",
                                   "operator": "Exists"}]}]}],
    })
    client = pod_identity_labels({"app": "client"}, "x", {"ns": "x"})
    comp = _computed(policy, client)
    assert not _allowed(comp, Y)
    assert _allowed(comp, W)
    assert not _allowed(comp, U)
    assert _allowed(comp, HOST)


def test_a_subject_on_namespace_labels_is_enforced_without_allows_when_unknown() -> None:
    # the policy applies to pods of namespaces labelled env=prod and allows them egress to
    # namespace y: a client whose namespace labels are unknown may be such a pod, so its
    # egress is enforced (default deny) but the rule allows it nothing
    policy = _cnp({
        "endpointSelector": {"matchLabels": {"k8s:io.cilium.k8s.namespace.labels.env":
                                             "prod"}},
        "egress": [{"toEndpoints": [NS_Y]}],
    })
    known = _computed(policy, pod_identity_labels({"app": "client"}, "x", {"env": "prod"}))
    assert _allowed(known, Y) and not _allowed(known, W)
    other = _computed(policy, pod_identity_labels({"app": "client"}, "x", {"env": "dev"}))
    assert _allowed(other, Y) and _allowed(other, W)  # not selected: allow-all
    unknown = _computed(policy, pod_identity_labels({"app": "client"}, "x", None))
    enf = unknown.enforcement(1)
    assert enf is not None and enf.egress_enforced
    assert not _allowed(unknown, Y) and not _allowed(unknown, W)
