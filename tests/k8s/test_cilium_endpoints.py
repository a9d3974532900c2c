"""CiliumEndpoints: remote pods into the ipcache (rules without I/O), then an agent's
endpoints published through the fake API server and other nodes' read back."""

from __future__ import annotations

import ipaddress
import json
import random
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from sources.k8s_client import ClientSettings, K8sClient
from sources.k8s_endpoints import CiliumEndpoints
from sources.k8s_identities import ClusterIdentities
from sources.k8s_reflector import Delta
from statedb import DB
from tables.cluster_identities import ClusterIdentityAllocator
from tables.endpoint_entries import EntryTables, IPCacheEntry, endpoint_owner
from tables.endpoint_manager import EndpointManager
from tables.endpoints import EndpointChange, new_endpoints_table
from tables.identities import new_identities_table
from tables.ipam import IPAM, IPAMConfig
from tables.remote_endpoints import RemoteEndpointEntries

from .fake_apiserver import FakeAPIServer
from .helpers import FAST, wait_for
from .objects import pod
from .test_fake_apiserver import _env, _kubectl, needs_kubectl

NODE_IP = ipaddress.ip_address("192.0.2.1")


def cep(name: str, ips: list[str], identity: int = 1000, node: str = "192.0.2.2",
        ns: str = "shop", created: str = "2026-11-27T00:00:00Z") -> dict[str, Any]:
    pair = {f"ipv{ipaddress.ip_address(ip).version}": ip for ip in ips}
    return {
        "apiVersion": "cilium.io/v2",
        "kind": "CiliumEndpoint",
        "metadata": {"name": name, "namespace": ns, "creationTimestamp": created},
        "status": {
            "id": 7,
            "identity": {"id": identity, "labels": ["k8s:app=web"]},
            "networking": {"addressing": [pair], "node": node},
            "state": "ready",
        },
    }


def ipcache(db: DB, entries: EntryTables) -> dict[str, IPCacheEntry]:
    return {str(e.prefix): e for e in entries.ipcache.all(db.read_txn())}


def apply(db: DB, rem: RemoteEndpointEntries, ups: list[Any] = (), dels: list[str] = ()) -> int:  # type: ignore[assignment]
    with db.write_txn(rem.ipcache) as txn:
        return rem.apply(
            txn, [(f"{o['metadata']['namespace']}/{o['metadata']['name']}", o) for o in ups], dels
        )


def test_remote_endpoints_become_ipcache_entries_with_their_node() -> None:
    db, entries = DB(), EntryTables()
    db.register(entries.ipcache)
    rem = RemoteEndpointEntries(entries.ipcache)
    apply(db, rem, [cep("web", ["10.1.0.5", "fd00::5"])])
    got = ipcache(db, entries)
    assert got["10.1.0.5/32"].identity == 1000
    assert got["10.1.0.5/32"].tunnel_endpoint == ipaddress.ip_address("192.0.2.2")
    assert got["fd00::5/128"].owner == "cep:shop/web"
    # A change of identity rewrites the entries; an unchanged object writes nothing.
    assert apply(db, rem, [cep("web", ["10.1.0.5", "fd00::5"], identity=1001)]) == 2
    assert apply(db, rem, [cep("web", ["10.1.0.5", "fd00::5"], identity=1001)]) == 0
    apply(db, rem, dels=["shop/web"])
    assert ipcache(db, entries) == {}


def test_two_claims_on_one_address_have_one_winner_in_any_order() -> None:
    older = cep("a", ["10.1.0.9"], identity=1000, created="2026-11-27T00:00:00Z")
    newer = cep("b", ["10.1.0.9"], identity=2000, created="2026-11-27T00:00:05Z")
    for order in ([older, newer], [newer, older]):
        db, entries = DB(), EntryTables()
        db.register(entries.ipcache)
        rem = RemoteEndpointEntries(entries.ipcache)
        for o in order:
            apply(db, rem, [o])
        assert ipcache(db, entries)["10.1.0.9/32"].identity == 1000
        assert rem.conflicts == {ipaddress.ip_address("10.1.0.9"): ["shop/a", "shop/b"]}
        apply(db, rem, dels=["shop/a"])
        assert ipcache(db, entries)["10.1.0.9/32"].identity == 2000
        assert rem.conflicts == {}


def test_a_malformed_object_gets_its_own_error_and_changes_nothing() -> None:
    db, entries = DB(), EntryTables()
    db.register(entries.ipcache)
    rem = RemoteEndpointEntries(entries.ipcache)
    apply(db, rem, [cep("web", ["10.1.0.5"])])
    bad = cep("web", ["10.1.0.6"])
    bad["status"]["networking"]["node"] = "nowhere"
    worse = cep("db", ["10.1.0.7"])
    worse["status"]["identity"] = {"id": "x"}
    apply(db, rem, [bad, worse, cep("ok", ["10.1.0.8"])])
    assert sorted(rem.errors) == ["shop/db", "shop/web"]
    assert "status.networking.node" in rem.errors["shop/web"]
    assert sorted(ipcache(db, entries)) == ["10.1.0.5/32", "10.1.0.8/32"]


def test_a_local_entry_wins_over_a_remote_claim() -> None:
    db, entries = DB(), EntryTables()
    db.register(entries.ipcache)
    with db.write_txn(entries.ipcache) as txn:
        net = ipaddress.ip_network("10.1.0.5/32")
        entries.ipcache.insert(txn, IPCacheEntry(net, 300, endpoint_owner(4)))
    rem = RemoteEndpointEntries(entries.ipcache)
    apply(db, rem, [cep("stale", ["10.1.0.5"])])
    assert ipcache(db, entries)["10.1.0.5/32"].owner == "endpoint:4"
    assert rem.conflicts[ipaddress.ip_address("10.1.0.5")] == ["endpoint:4", "shop/stale"]


def test_an_object_created_and_deleted_in_one_delivery_leaves_no_entry(kubeconfig: str) -> None:
    """A watch resuming after a stall hands over a CiliumEndpoint's creation and deletion
    in one delivery: no ipcache entry may stay for it (applied as two sets, deletions
    first, it stayed), and one deleted and created again in one delivery stays."""
    db, entries = DB(), EntryTables()
    db.register(entries.ipcache)
    rem = RemoteEndpointEntries(entries.ipcache)
    client = K8sClient(ClientSettings(kubeconfig=kubeconfig))
    try:
        ceps = CiliumEndpoints(
            db, client, endpoints=new_endpoints_table(), identities=new_identities_table(),
            entries=rem, pod_uid_of=lambda ns, n: None, node_ip=lambda: NODE_IP,
        )
        gone, back = cep("gone", ["10.1.0.5"]), cep("back", ["10.1.0.6"])
        ceps.apply([Delta("upsert", "shop/back", back)], True)
        ceps.apply([Delta("upsert", "shop/gone", gone), Delta("delete", "shop/gone", gone),
                    Delta("delete", "shop/back", back), Delta("upsert", "shop/back", back)],
                   False)
        assert sorted(ipcache(db, entries)) == ["10.1.0.6/32"]
        assert sorted(ceps.served) == ["shop/back"]
    finally:
        client.close()


# ----- through the API server ---------------------------------------------------------------
@pytest.fixture
def state_dir() -> Iterator[str]:
    d = tempfile.mkdtemp(prefix="statewright-ceps-")
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.mark.anyio
async def test_an_agent_publishes_its_endpoints_and_reads_the_others(
    apiserver: FakeAPIServer, kubeconfig: str, state_dir: str
) -> None:
    db = DB()
    ipam = IPAM(db, IPAMConfig.parse(("10.40.0.0/28",), state_dir))
    ipam.restore(reserve_router=False)
    ipam.reserve_routers()
    alloc = ClusterIdentityAllocator(db, rng=random.Random(3))
    mgr = EndpointManager(db, ipam, alloc, state_dir, entries=EntryTables())
    uids = {("shop", "web"): apiserver.upsert(pod("web", "node-a", "10.40.0.2", 0, ns="shop"))[
        "metadata"]["uid"]}
    client = K8sClient(ClientSettings(kubeconfig=kubeconfig))
    rem = RemoteEndpointEntries(
        mgr.entries.ipcache, lambda k: mgr.resolve(f"pod-name:{k}") is not None
    )
    ceps = CiliumEndpoints(
        db, client, endpoints=mgr.endpoints, identities=alloc.table, entries=rem,
        pod_uid_of=lambda ns, n: uids.get((ns, n)), node_ip=lambda: NODE_IP, config=FAST,
        resync_interval=0.2,
    )
    try:
        async with anyio.create_task_group() as tg:
            await tg.start(ceps.run)
            ep = mgr.create("0", EndpointChange.parse(
                {"k8s-pod-name": "web", "k8s-namespace": "shop", "labels": ["k8s:app=web"]}))

            def published() -> dict[str, Any] | None:
                got = [o for o in apiserver.objects("CiliumEndpoint")
                       if o["metadata"]["name"] == "web"]
                return got[0] if got else None

            await wait_for(lambda: published() is not None, "the CiliumEndpoint created")
            obj = published()
            assert obj is not None
            st = obj["status"]
            assert st["id"] == ep.id and st["identity"]["id"] == ep.identity
            assert st["identity"]["labels"] == [  # no Namespace object: its labels unknown
                "k8s:app=web",
                "k8s:io.cilium.k8s.namespace.labels.kubernetes.io/metadata.name=shop",
                "k8s:io.kubernetes.pod.namespace=shop", "statewright:namespace-labels=unknown"]
            assert st["networking"] == {"addressing": [{"ipv4": str(ep.ipv4)}],
                                        "node": str(NODE_IP)}
            assert obj["metadata"]["ownerReferences"][0]["uid"] == uids[("shop", "web")]
            # Its own object makes no remote entry.
            assert ipcache(db, mgr.entries)[f"{ep.ipv4}/32"].owner == endpoint_owner(ep.id)
            # The endpoint's state changes: the object is updated (with its version).
            before = len([r for r in apiserver.requests if r.verb == "update"])
            mgr.renumber_identities(lambda txn: {})  # no-op
            with db.write_txn(mgr.endpoints) as txn:
                from dataclasses import replace

                from tables.endpoints import EndpointState
                mgr.endpoints.insert(txn, replace(mgr.get(str(ep.id)),
                                                  state=EndpointState.READY))
            await wait_for(lambda: (published() or {}).get("status", {}).get("state") == "ready",
                           "the CiliumEndpoint updated")
            assert len([r for r in apiserver.requests if r.verb == "update"]) > before
            # Another node's pod appears, changes identity, and goes.
            apiserver.upsert(cep("db", ["10.41.0.3"], identity=4321, node="192.0.2.9"))
            await wait_for(lambda: "10.41.0.3/32" in ipcache(db, mgr.entries), "remote entry")
            row = ipcache(db, mgr.entries)["10.41.0.3/32"]
            assert (row.identity, str(row.tunnel_endpoint)) == (4321, "192.0.2.9")
            apiserver.upsert(cep("db", ["10.41.0.3"], identity=4322, node="192.0.2.9"))
            await wait_for(lambda: ipcache(db, mgr.entries)["10.41.0.3/32"].identity == 4322,
                           "remote entry updated")
            apiserver.delete("CiliumEndpoint", "shop", "db")
            await wait_for(lambda: "10.41.0.3/32" not in ipcache(db, mgr.entries),
                           "remote entry removed")
            # The local endpoint deleted: its object goes.
            mgr.delete(str(ep.id))
            await wait_for(lambda: published() is None, "the CiliumEndpoint deleted")
            ok, message = ceps.health()
            assert ok, message
            tg.cancel_scope.cancel()
    finally:
        client.close()
    writes = {r.verb for r in apiserver.requests if r.resource == "ciliumendpoints"}
    assert writes >= {"create", "update", "delete", "list", "watch"}


@needs_kubectl
@pytest.mark.anyio
async def test_kubectl_lists_what_an_agent_wrote(
    apiserver: FakeAPIServer, kubeconfig: str, state_dir: str, tmp_path: Path
) -> None:
    """kubectl, the independent client, sees the CiliumIdentity and the CiliumEndpoint an
    agent's publishers created."""
    db = DB()
    ipam = IPAM(db, IPAMConfig.parse(("10.40.2.0/28",), state_dir))
    ipam.restore(reserve_router=False)
    ipam.reserve_routers()
    alloc = ClusterIdentityAllocator(db, rng=random.Random(4))
    mgr = EndpointManager(db, ipam, alloc, state_dir, entries=EntryTables())
    uid = apiserver.upsert(pod("api", "node-a", "10.40.2.2", 0, ns="shop"))["metadata"]["uid"]
    client = K8sClient(ClientSettings(kubeconfig=kubeconfig))
    ids = ClusterIdentities(alloc, client, mgr.renumber_identities, FAST, retry_interval=0.2)
    ceps = CiliumEndpoints(
        db, client, endpoints=mgr.endpoints, identities=alloc.table,
        entries=RemoteEndpointEntries(mgr.entries.ipcache), pod_uid_of=lambda _n, _p: uid,
        node_ip=lambda: NODE_IP, config=FAST, resync_interval=0.2,
    )
    try:
        async with anyio.create_task_group() as tg:
            await tg.start(ids.run)
            await tg.start(ceps.run)
            ep = mgr.create("0", EndpointChange.parse(
                {"k8s-pod-name": "api", "k8s-namespace": "shop", "labels": ["k8s:app=api"]}))

            def written() -> bool:
                names = {o["metadata"]["name"] for o in apiserver.objects("CiliumIdentity")}
                return str(ep.identity) in names and any(
                    o["metadata"]["name"] == "api" for o in apiserver.objects("CiliumEndpoint"))

            await wait_for(written, "the agent's CiliumIdentity and CiliumEndpoint")
            tg.cancel_scope.cancel()
    finally:
        client.close()

    def kubectl(*args: str) -> Any:
        out = subprocess.run(
            _kubectl(kubeconfig, tmp_path, "get", *args, "-o", "json"),
            capture_output=True, text=True, timeout=60, env=_env(tmp_path),
        )
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)["items"]

    (ident,) = kubectl("ciliumidentities")
    assert ident["metadata"]["name"] == str(ep.identity)
    assert ident["security-labels"] == {  # no Namespace object: its labels unknown
        "k8s:app": "api",
        "k8s:io.cilium.k8s.namespace.labels.kubernetes.io/metadata.name": "shop",
        "k8s:io.kubernetes.pod.namespace": "shop",
        "statewright:namespace-labels": "unknown",
    }
    (cep_obj,) = kubectl("ciliumendpoints", "-A")
    assert (cep_obj["metadata"]["namespace"], cep_obj["metadata"]["name"]) == ("shop", "api")
    assert cep_obj["status"]["identity"]["id"] == ep.identity
    assert cep_obj["status"]["networking"]["addressing"] == [{"ipv4": str(ep.ipv4)}]
