"""Kubernetes' NetworkPolicy truth tables, evaluated in the control plane (issue #26):
the cases of tests/policy/netpol_model.py through the policy writer over statedb, as the
agent runs it, with the nine pods as endpoints (their namespaces' labels known, their
named container ports), then every probe decided from the computed ``policy-entries`` and
``policy-endpoints`` rows: egress at the source, ingress at the destination, each by the
datapath's lookup rules (both the plain and the longest-prefix-match one), and checked
against the rules evaluated directly (``policy trace``'s answer)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from policy.parse import parse_policy
from policy.source import PolicyObjects, new_policies_table
from policy.verdict import evaluate_entries, evaluate_entries_lpm, evaluate_rules
from policy.writer import PolicyWriter
from statedb import DB
from tables.endpoints import Endpoint, new_endpoints_table, parse_named_ports
from tables.identities import IdentityAllocator
from tables.policy_entries import (
    PolicyKey,
    new_policy_endpoints_table,
    new_policy_entries_table,
    policy_endpoint_id_index,
    policy_endpoint_index,
)

from .netpol_model import (
    ALL_PODS,
    CASES,
    NAMESPACE_LABELS,
    Case,
    Cell,
    cells,
    compare,
    named_ports,
    pod_labels,
)

PROTO = {"TCP": 6, "UDP": 17}


class ControlPlane:
    """The nine pods as endpoints in statedb and the policy writer following them."""

    def __init__(self) -> None:
        self.db = DB()
        self.alloc = IdentityAllocator(self.db)
        self.endpoints = new_endpoints_table()
        self.policies = new_policies_table()
        self.entries = new_policy_entries_table()
        self.modes = new_policy_endpoints_table()
        self.db.register(self.endpoints, self.policies, self.entries, self.modes)
        self.writer = PolicyWriter(self.db, identities=self.alloc.table,
                                   endpoints=self.endpoints, policies=self.policies,
                                   entries=self.entries, policy_endpoints=self.modes)
        self.ids: dict[str, int] = {}
        self.eps: dict[str, Endpoint] = {}
        ports = parse_named_ports(named_ports(), "ports")
        with self.db.write_txn(self.alloc.table, self.endpoints) as txn:
            for n, pod in enumerate(ALL_PODS, start=1):
                ns, name = pod.split("/")
                ep = Endpoint(
                    n, pod_name=name, pod_namespace=ns,
                    labels=tuple(f"k8s:{k}={v}" for k, v in pod_labels(pod).items()),
                    namespace_labels=tuple(sorted(NAMESPACE_LABELS[ns].items())),
                    named_ports=ports,
                )
                ident = self.alloc.acquire(txn, ep.identity_labels())
                ep = replace(ep, identity=ident.id)
                self.endpoints.insert(txn, ep)
                self.ids[pod], self.eps[pod] = n, ep

    def apply(self, objs: list[dict[str, Any]]) -> None:
        with self.db.write_txn(self.policies) as txn:
            for o in objs:
                PolicyObjects(self.policies).upsert(txn, o)
        self.writer.step()

    def verdicts(self, ingress: bool = True) -> dict[Cell, bool]:
        """Every probe from the computed rows, both lookups agreeing (``ingress`` False:
        the source's egress only, for a datapath that does not enforce ingress)."""
        txn = self.db.read_txn()
        rows: dict[int, Any] = {}
        for ep_id in self.ids.values():
            found = self.entries.list(txn, policy_endpoint_index.query(ep_id))
            entries = {e.key: e for e in found}
            mode = self.modes.get(txn, policy_endpoint_id_index.query(ep_id))
            rows[ep_id] = (entries, mode)
        out: dict[Cell, bool] = {}
        for src, dst, port, proto in cells():
            verdict = True
            sides = [(src, dst, True), (dst, src, False)] if ingress else [(src, dst, True)]
            for ep_pod, peer_pod, egress in sides:
                entries, mode = rows[self.ids[ep_pod]]
                kw: dict[str, Any] = dict(endpoint_id=self.ids[ep_pod],
                                          identity=self.eps[peer_pod].identity, egress=egress,
                                          protocol=PROTO[proto], port=port)
                one = evaluate_entries(entries, mode, **kw)
                assert evaluate_entries_lpm(entries, mode, **kw) == one, (src, dst, kw)
                verdict = verdict and one
            out[(src, dst, port, proto)] = verdict
        return out

    def rule_verdicts(self) -> dict[Cell, bool]:
        """Every probe from the rules evaluated directly (what ``policy trace`` answers)."""
        rules = [r for p in self.policies.all(self.db.read_txn()) for r in p.rules]
        out: dict[Cell, bool] = {}
        for src, dst, port, proto in cells():
            s, d = self.eps[src], self.eps[dst]
            kw: dict[str, Any] = dict(protocol=PROTO[proto], port=port)
            eg = evaluate_rules(rules, s.identity_labels(), d.identity_labels(), egress=True,
                                peer_ports=d.port_names(), **kw)
            ing = evaluate_rules(rules, d.identity_labels(), s.identity_labels(), egress=False,
                                 subject_ports=d.port_names(), **kw)
            out[(src, dst, port, proto)] = eg.allowed and ing.allowed
        return out


def test_no_policy_allows_everything() -> None:
    cp = ControlPlane()
    cp.writer.step()
    assert all(cp.verdicts().values())
    assert not list(cp.entries.all(cp.db.read_txn()))


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_matrix(case: Case) -> None:
    for obj in case.policies:
        parse_policy(obj)  # every case is a valid policy
    cp = ControlPlane()
    cp.apply(case.policies)
    want = case.expect()
    compare(f"{case.name} (entries)", cp.verdicts(), want)
    compare(f"{case.name} (rules)", cp.rule_verdicts(), want)


def test_cases_cover_every_operator_and_feature() -> None:
    text = repr([c.policies for c in CASES])
    for needle in ("'In'", "'NotIn'", "'Exists'", "'DoesNotExist'", "matchLabels",
                   "namespaceSelector", "podSelector", "serve-80-tcp", "'Egress'",
                   "'Ingress'"):
        assert needle in text, needle
    assert any(len(c.policies) > 1 for c in CASES)  # stacked policies
    assert PolicyKey  # the rows are Cilium's keys (tables/policy_entries.py)
