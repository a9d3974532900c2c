"""Namespace labels without and with an API server (issue #26): the namespaces table and
its two sources, and the labels every pod endpoint takes from it, whether or not its Pod
object is known."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from typing import Any

import pytest

from sources.k8s_namespaces import NamespaceSource
from sources.k8s_reflector import Delta
from statedb import DB
from tables.endpoint_entries import EntryTables
from tables.endpoint_manager import EndpointManager
from tables.endpoints import Endpoint, EndpointChange
from tables.identities import IdentityAllocator, identity_id_index
from tables.ipam import IPAM, IPAMConfig
from tables.namespaces import (
    NamespaceError,
    NamespaceObjects,
    namespace_labels,
    new_namespaces_table,
)

NS = "k8s:io.kubernetes.pod.namespace"
NSL = "k8s:io.cilium.k8s.namespace.labels."
UNKNOWN = "statewright:namespace-labels=unknown"


def _ns(name: str, labels: Any = None) -> dict[str, Any]:
    return {"kind": "Namespace", "metadata": {"name": name, "labels": labels}}


@pytest.fixture
def state_dir() -> Iterator[str]:
    d = tempfile.mkdtemp(prefix="statewright-nslabels-")
    yield d
    shutil.rmtree(d, ignore_errors=True)


def test_rows_from_both_sources_api_server_first() -> None:
    db = DB()
    table = new_namespaces_table()
    db.register(table)
    manifests = NamespaceObjects(table)
    source = NamespaceSource(None, db, table)  # type: ignore[arg-type]  # not run
    with db.write_txn(table) as txn:
        source.register_initializer(txn)
    assert namespace_labels(db.read_txn(), table, "web") is None
    with db.write_txn(table) as txn:
        manifests.upsert(txn, _ns("web", {"team": "a"}))
    assert namespace_labels(db.read_txn(), table, "web") == {
        "team": "a", "kubernetes.io/metadata.name": "web"}
    assert not table.initialized(db.read_txn())[0]
    source.apply([Delta("upsert", "web", _ns("web", {"team": "b"}))], synced=True)
    assert table.initialized(db.read_txn())[0]
    assert namespace_labels(db.read_txn(), table, "web") == {
        "team": "b", "kubernetes.io/metadata.name": "web"}
    source.apply([Delta("delete", "web", _ns("web"))])
    assert namespace_labels(db.read_txn(), table, "web") == {
        "team": "a", "kubernetes.io/metadata.name": "web"}
    # a malformed Namespace is refused alone and reported
    source.apply([Delta("upsert", "bad", _ns("bad", {"k": 1})),
                  Delta("upsert", "ok", _ns("ok"))])
    assert namespace_labels(db.read_txn(), table, "bad") is None
    assert namespace_labels(db.read_txn(), table, "ok") == {"kubernetes.io/metadata.name": "ok"}
    assert "metadata.labels.k" in source.refused["bad"]
    with pytest.raises(NamespaceError, match=r"metadata\.name"):
        manifests.check({"kind": "Namespace", "metadata": {}})


def test_identity_labels_known_unknown_and_claims() -> None:
    unknown = Endpoint(1, pod_name="a", pod_namespace="web", labels=("k8s:app=x",))
    assert unknown.identity_labels() == (
        "k8s:app=x", f"{NSL}kubernetes.io/metadata.name=web", f"{NS}=web", UNKNOWN)
    known = Endpoint(1, pod_name="a", pod_namespace="web", labels=("k8s:app=x",),
                     namespace_labels=(("team", "a"),))
    assert known.identity_labels() == (
        "k8s:app=x", f"{NSL}kubernetes.io/metadata.name=web", f"{NSL}team=a", f"{NS}=web")
    # neither a request nor a Pod can claim namespace labels, or that they are known
    claims = ("k8s:app=x", f"{NSL}team=z", "statewright:namespace-labels=known",
              f"{NSL}kubernetes.io/metadata.name=other")
    sneaky = Endpoint(1, pod_name="a", pod_namespace="web", labels=claims, pod_labels=claims)
    assert sneaky.identity_labels() == unknown.identity_labels()
    # not a pod: nothing of a namespace
    assert Endpoint(1, labels=("k8s:app=x",)).identity_labels() == ("k8s:app=x",)
    # the namespace's labels survive the state file
    assert Endpoint.from_json(known.to_json()).namespace_labels == (("team", "a"),)
    assert Endpoint.from_json(unknown.to_json()).namespace_labels is None


def test_endpoints_follow_namespace_labels_without_a_pod_object(state_dir: str) -> None:
    db = DB()
    table = new_namespaces_table()
    db.register(table)
    ipam = IPAM(db, IPAMConfig.parse(("10.34.0.0/28",), state_dir))
    ipam.restore(reserve_router=False)
    ipam.reserve_routers()
    mgr = EndpointManager(
        db, ipam, IdentityAllocator(db), state_dir, entries=EntryTables(),
        namespace_labels_of=lambda ns: namespace_labels(db.read_txn(), table, ns),
    )
    change = EndpointChange.parse({"k8s-pod-name": "a", "k8s-namespace": "web",
                                   "labels": ["k8s:app=x"]})
    ep = mgr.create("0", change)
    assert ep.namespace_labels is None and UNKNOWN in ep.identity_labels()

    def labels_of(num: int) -> tuple[str, ...]:
        ident = mgr.identities.table.get(db.read_txn(), identity_id_index.query(num))
        assert ident is not None
        return ident.labels

    with db.write_txn(table) as txn:
        NamespaceObjects(table).upsert(txn, _ns("web", {"team": "a"}))
    assert mgr.sync_namespace_labels() == [ep.id]
    moved = mgr.get(str(ep.id))
    assert moved.identity != ep.identity
    assert f"{NSL}team=a" in labels_of(moved.identity)
    assert UNKNOWN not in labels_of(moved.identity)
    assert mgr.sync_namespace_labels() == []
    # a new pod of the namespace takes the labels at creation
    other = mgr.create("0", EndpointChange.parse({"k8s-pod-name": "b", "k8s-namespace": "web",
                                                   "labels": ["k8s:app=x"]}))
    assert other.identity == moved.identity
    # the Namespace removed: unknown again
    with db.write_txn(table) as txn:
        NamespaceObjects(table).delete(txn, _ns("web"))
    assert sorted(mgr.sync_namespace_labels()) == sorted([ep.id, other.id])
    assert UNKNOWN in labels_of(mgr.get(str(ep.id)).identity)
