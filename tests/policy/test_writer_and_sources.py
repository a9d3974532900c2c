"""The policy writer over statedb, the manifest source's policy kinds, parse errors."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from policy.errors import PolicyError
from policy.parse import parse_policy
from policy.source import PolicyObjects, new_policies_table
from policy.writer import PolicyWriter
from sources.manifests import ManifestSource
from statedb import DB
from tables.endpoints import Endpoint, new_endpoints_table
from tables.identities import IdentityAllocator, pod_identity_labels
from tables.lb_writer import LBWriter
from tables.policy_entries import (
    PolicyKey,
    new_policy_endpoints_table,
    new_policy_entries_table,
    policy_endpoint_index,
)

WEB = pod_identity_labels({"app": "web"}, "default")
DB_LABELS = pod_identity_labels({"app": "db"}, "default")


def cnp(name: str, egress: list[dict[str, Any]], selector: str = "web") -> dict[str, Any]:
    return {
        "apiVersion": "cilium.io/v2",
        "kind": "CiliumNetworkPolicy",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"endpointSelector": {"matchLabels": {"app": selector}}, "egress": egress},
    }


TO_DB_5432 = [
    {
        "toEndpoints": [{"matchLabels": {"app": "db"}}],
        "toPorts": [{"ports": [{"port": "5432", "protocol": "TCP"}]}],
    }
]


class Harness:
    def __init__(self) -> None:
        self.db = DB()
        self.alloc = IdentityAllocator(self.db)
        self.endpoints = new_endpoints_table()
        self.policies = new_policies_table()
        self.entries = new_policy_entries_table()
        self.pe = new_policy_endpoints_table()
        self.db.register(self.endpoints, self.policies, self.entries, self.pe)
        self.writer = PolicyWriter(
            self.db,
            identities=self.alloc.table,
            endpoints=self.endpoints,
            policies=self.policies,
            entries=self.entries,
            policy_endpoints=self.pe,
        )
        self.objects = PolicyObjects(self.policies)

    def add_endpoint(self, ep_id: int, labels: tuple[str, ...]) -> int:
        with self.db.write_txn(self.alloc.table, self.endpoints) as txn:
            ident = self.alloc.acquire(txn, labels)
            self.endpoints.insert(txn, Endpoint(ep_id, labels=labels, identity=ident.id))
        return ident.id

    def remove_endpoint(self, ep_id: int) -> None:
        with self.db.write_txn(self.alloc.table, self.endpoints) as txn:
            ep = next(e for e in self.endpoints.all(txn) if e.id == ep_id)
            self.alloc.release(txn, ep.identity)
            self.endpoints.delete(txn, ep)

    def apply(self, obj: dict[str, Any]) -> None:
        with self.db.write_txn(self.policies) as txn:
            self.objects.upsert(txn, obj)

    def keys(self, ep: int) -> set[tuple[int, bool, int, int, int]]:
        txn = self.db.read_txn()
        return {
            (e.key.identity, e.key.egress, e.key.protocol, e.key.dport, e.key.port_prefix_len)
            for e in self.entries.list(txn, policy_endpoint_index.query(ep))
        }


def test_writer_follows_identities_endpoints_and_policies() -> None:
    h = Harness()
    web = h.add_endpoint(1, WEB)
    h.apply(cnp("web", TO_DB_5432))
    h.writer.step()
    assert h.keys(1) == set()
    enf = list(h.pe.all(h.db.read_txn()))
    assert [(e.endpoint_id, e.egress_enforced, e.ingress_enforced) for e in enf] == [
        (1, True, False)
    ]
    # A db pod appears: only endpoint 1 gets an entry, for the new identity.
    dbid = h.add_endpoint(2, DB_LABELS)
    res, _ = h.writer.step()
    assert h.keys(1) == {(dbid, True, 6, 5432, 16)}
    assert h.keys(2) == set()
    assert res.written == 2  # the entry and endpoint 2's enforcement row
    # Nothing changed: nothing written.
    res, _ = h.writer.step()
    assert res.written == 0
    # The db pod goes: its entry goes.
    h.remove_endpoint(2)
    h.writer.step()
    assert h.keys(1) == set()
    # The policy goes: endpoint 1 is no longer enforced.
    with h.db.write_txn(h.policies) as txn:
        h.objects.delete(txn, cnp("web", []))
    h.writer.step()
    (row,) = h.pe.all(h.db.read_txn())
    assert (row.endpoint_id, row.egress_enforced) == (1, False)
    assert web >= 256


def test_entry_rows_name_their_rules() -> None:
    h = Harness()
    h.add_endpoint(1, WEB)
    dbid = h.add_endpoint(2, DB_LABELS)
    h.apply(cnp("a", TO_DB_5432))
    h.apply(cnp("b", TO_DB_5432))
    h.writer.step()
    (entry,) = h.entries.all(h.db.read_txn())
    assert entry.key == PolicyKey(1, dbid, True, 6, 5432, 16)
    assert entry.rules == ("default/a", "default/b")
    assert not entry.deny


def _write(path: Path, *objs: object) -> None:
    path.write_text(yaml.safe_dump_all(objs))
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))


def test_manifest_source_applies_policies_and_reports_bad_ones_alone(tmp_path: Path) -> None:
    db = DB()
    lbw = LBWriter.create(db)
    policies = new_policies_table()
    db.register(policies)
    src = ManifestSource(lbw, [tmp_path], interval=0.01)
    f = tmp_path / "p.yaml"
    bad = cnp("bad", [{"toPorts": [{"ports": [{"port": "Not_A-Name"}]}]}])
    _write(f, cnp("good", TO_DB_5432), bad)
    # Before the handler is added, the policy kinds are ignored, not errors.
    res = src.sync()
    assert res.ignored == 2 and not src.errors
    src.add_kind_handler(PolicyObjects(policies))
    src.sync()
    names = [p.name for p in policies.all(db.read_txn())]
    assert names == ["default/good"]
    (err,) = src.errors.values()
    assert "CiliumNetworkPolicy default/bad" in err
    assert "spec.egress[0].toPorts[0].ports[0].port" in err
    assert "not a port number or name" in err
    # Fixing the bad one applies it; removing the file removes both.
    fixed = cnp("bad", [{"toPorts": [{"ports": [{"port": "80"}]}]}])
    _write(f, cnp("good", TO_DB_5432), fixed)
    src.sync()
    assert [p.name for p in policies.all(db.read_txn())] == ["default/bad", "default/good"]
    assert not src.errors
    f.unlink()
    src.sync()
    assert list(policies.all(db.read_txn())) == []


@pytest.mark.parametrize(
    ("obj", "field", "message"),
    [
        (cnp("x", [{"toEntities": ["moon"]}]), "spec.egress[0].toEntities[0]", "not an entity"),
        (cnp("x", [{"toCIDR": ["10.0.0.300/8"]}]), "spec.egress[0].toCIDR[0]", "not a CIDR"),
        (cnp("x", [{"toFQDNs": [{"matchName": "a"}]}]), "spec.egress[0].toFQDNs", "supported"),
        (
            cnp("x", [{"toPorts": [{"ports": [{"port": "90", "endPort": 80}]}]}]),
            "spec.egress[0].toPorts[0].ports[0].endPort",
            "below",
        ),
        (
            cnp("x", [{"toPorts": [{"ports": [{"port": "80"}], "rules": {"http": [{}]}}]}]),
            "spec.egress[0].toPorts[0].rules",
            "L7",
        ),
        (
            {
                "kind": "NetworkPolicy",
                "metadata": {"name": "n"},
                "spec": {"podSelector": {"matchExpressions": [{"key": "a", "operator": "Is"}]}},
            },
            "spec.podSelector.matchExpressions[0].operator",
            "not one of",
        ),
        (
            {"kind": "NetworkPolicy", "metadata": {"name": "n"}, "spec": {}},
            "spec.podSelector",
            "required",
        ),
    ],
)
def test_parse_errors_name_object_and_field(obj: dict[str, Any], field: str, message: str) -> None:
    with pytest.raises(PolicyError) as info:
        parse_policy(obj)
    assert info.value.field == field
    assert message in str(info.value)
    assert info.value.obj.endswith("/x") or info.value.obj.endswith("/n")
