"""kvstore mode under failures, against a real 3-member etcd cluster: the leader killed
mid-churn, an agent partitioned from etcd, and the operator's identity GC."""

from __future__ import annotations

import ipaddress
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from sources.kvstore.config import EtcdConfig
from sources.kvstore.etcd_client import EtcdClient
from sources.kvstore.gc import KVStoreIdentityGC
from sources.kvstore.identities import collect_identities
from tests.k8s.fake_apiserver import FakeAPIServer
from tests.k8s.helpers import wait_for
from tests.kvstore.backends import Agent, KVStoreBackend, manager, pod
from tests.kvstore.etcd_cluster import EtcdCluster, TCPProxy

pytestmark = pytest.mark.anyio


@pytest.fixture
async def kv(etcd: EtcdCluster) -> AsyncIterator[KVStoreBackend]:
    backend = KVStoreBackend(etcd.endpoints)
    try:
        yield backend
    finally:
        etcd.wait_leader()
        await backend.close()


def agent(tmp: Path, name: str, n: int) -> Agent:
    return Agent(name, manager(tmp / name, f"10.{50 + n}.0.0/24", seed=n),
                 ipaddress.IPv4Address(f"192.0.2.{n + 1}"))


def node_object(name: str, ip: str, labels: dict[str, str]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels},
            "status": {"addresses": [{"type": "InternalIP", "address": ip}]}}


def published(a: Agent) -> dict[str, tuple[int, str]]:
    """What ``a``'s endpoints should look like in another agent's ipcache."""
    return {f"{ip}/{ip.max_prefixlen}": (ep.identity, str(a.node_ip))
            for ep in a.mgr.endpoints.all(a.mgr.db.read_txn()) for ip in ep.addresses()}


async def etcd_ips(kv: KVStoreBackend) -> dict[str, tuple[int, str]]:
    import json
    kvs, _ = await kv.admin.list_prefix(kv.layout.ips)
    out = {}
    for item in kvs:
        pair = json.loads(item.value)
        out[f"{pair['IP']}/32"] = (pair["ID"], pair["HostIP"])
    return out


async def test_killing_the_leader_mid_churn_loses_nothing(
    etcd: EtcdCluster, kv: KVStoreBackend, tmp_path: Path
) -> None:
    a, b = agent(tmp_path, "node-a", 0), agent(tmp_path, "node-b", 1)
    async with anyio.create_task_group() as tg:
        await kv.start_agent(tg, a)
        await kv.start_agent(tg, b)
        killed = []

        async def churn() -> None:
            live: list[int] = []
            for i in range(40):
                ep = await anyio.to_thread.run_sync(
                    a.mgr.create, "0", pod(f"c{i}", [f"k8s:churn=c{i % 7}"]))
                live.append(ep.id)
                if i % 3 == 2:
                    await anyio.to_thread.run_sync(a.mgr.delete, str(live.pop(0)))
                if i == 15:
                    leader = etcd.wait_leader()
                    etcd.stop_member(leader)
                    killed.append(leader)
                await anyio.sleep(0.03)

        await churn()
        assert killed
        etcd.wait_leader()
        etcd.start_member(killed[0])

        async def converged() -> bool:
            want = published(a)
            return b.remote() == want == await etcd_ips(kv) and len(want) > 0

        with anyio.fail_after(30):
            while not await converged():
                await anyio.sleep(0.1)
        # Identities: every number a's endpoints use is in etcd with its labels, and b
        # knows it (a refcount-0 row: the selector cache learns remote identities).
        store = await kv.identities()
        for ep in a.mgr.endpoints.all(a.mgr.db.read_txn()):
            row = b.mgr.identities.lookup(b.mgr.db.read_txn(), ep.identity)
            assert row is not None and store[ep.identity] == row.labels
        etcd.wait_leader()
        with anyio.fail_after(10):
            while not all(ok for ag in (a, b) for ok, _ in ag.health()):
                await anyio.sleep(0.1)
        tg.cancel_scope.cancel()
    for ag in (a, b):
        await kv.stop_agent(ag)


async def test_a_partitioned_agent_keeps_its_state_and_resyncs(
    etcd: EtcdCluster, kv: KVStoreBackend, tmp_path: Path
) -> None:
    a, b = agent(tmp_path, "node-a", 0), agent(tmp_path, "node-b", 1)
    proxies = [TCPProxy(m.client_port) for m in etcd.members]
    cut_off = EtcdConfig(tuple(p.url for p in proxies), request_timeout=2.0)
    try:
        async with anyio.create_task_group() as tg:
            await kv.start_agent(tg, a)
            await kv.start_agent(tg, b, config=cut_off)
            eps = [await anyio.to_thread.run_sync(a.mgr.create, "0", pod(f"p{i}", ["k8s:x=1"]))
                   for i in range(3)]
            await wait_for(lambda: b.remote() == published(a) != {}, "b has a's endpoints")
            before = b.remote()
            mine = await anyio.to_thread.run_sync(b.mgr.create, "0", pod("mine", ["k8s:y=1"]))
            await wait_for(lambda: f"{mine.ipv4}/32" in a.remote(), "a has b's endpoint")
            for p in proxies:
                p.cut()
            await wait_for(lambda: not b.endpoints.watcher.health().connected, "b cut off")
            # Meanwhile: a deletes one endpoint and adds another. b keeps what it had.
            await anyio.to_thread.run_sync(a.mgr.delete, str(eps[0].id))
            await anyio.to_thread.run_sync(a.mgr.create, "0", pod("late", ["k8s:x=2"]))
            await anyio.sleep(1.0)
            assert b.remote() == before
            ok, message = b.endpoints.health()
            assert not ok and "disconnected" in message
            # a still has b's endpoint (b's lease outlives a short cut).
            assert f"{mine.ipv4}/32" in a.remote()
            for p in proxies:
                p.heal()
            await wait_for(lambda: b.remote() == published(a), "b re-synced")
            await wait_for(lambda: b.endpoints.health()[0], "b healthy again")
            tg.cancel_scope.cancel()
    finally:
        for p in proxies:
            p.close()
    for ag in (a, b):
        await kv.stop_agent(ag)


async def test_operator_gc_deletes_unreferenced_identities(
    etcd: EtcdCluster, kv: KVStoreBackend
) -> None:
    c = EtcdClient(kv.config)
    lay = kv.layout
    try:
        await c.put(lay.identity_id(1000), "k8s:app=used;")
        await c.put(lay.identity_id(1001), "k8s:app=orphan;")
        await c.put(lay.identity_id(1002), "k8s:app=moved;")
        await c.put(lay.identity_ref(("k8s:app=used",), "node-a"), "1000")
        await c.put(lay.identity_ref(("k8s:app=moved",), "node-a"), "1003")  # another id
        since: dict[int, float] = {}
        assert await collect_identities(c, lay, since, grace=10.0, now=100.0) == []
        assert sorted(since) == [1001, 1002]
        # Within the grace period a reference comes back for 1002.
        await c.put(lay.identity_ref(("k8s:app=moved",), "node-b"), "1002")
        assert await collect_identities(c, lay, since, grace=10.0, now=111.0) == [1001]
        assert since == {}
        assert sorted(await kv.identities()) == [1000, 1002]
        # The operator's loop (grace 0 here): the next orphan goes at the first pass.
        await c.put(lay.identity_id(1004), "k8s:app=orphan2;")
        gc = KVStoreIdentityGC(c, lay, grace=0.0)
        assert await gc.collect() == [1004] and gc.last_error == ""
        assert sorted(await kv.identities()) == [1000, 1002]
    finally:
        await c.aclose()


async def test_compaction_during_a_cut_relists_the_agent_and_applies_only_the_difference(
    etcd: EtcdCluster, tmp_path: Path
) -> None:
    """Agent level: b is cut off from etcd while a deletes an endpoint, adds one with new
    labels (a new identity) and its Node changes; etcd is compacted past b's revision.
    Healed, b's three watches (identities, ipcache, nodes) find their revision gone, list
    again and apply only what changed: b's tables then equal etcd's contents."""
    srv = FakeAPIServer().start()
    kv = KVStoreBackend(etcd.endpoints, apiserver=srv, tmp=tmp_path)
    proxies = [TCPProxy(m.client_port) for m in etcd.members]
    cut_off = EtcdConfig(tuple(p.url for p in proxies), request_timeout=2.0)
    a, b = agent(tmp_path, "node-a", 0), agent(tmp_path, "node-b", 1)
    for i, name in enumerate(("node-a", "node-b")):
        srv.upsert(node_object(name, f"192.0.2.{i + 1}", {"zone": "z0"}))
    try:
        async with anyio.create_task_group() as tg:
            await kv.start_agent(tg, a)
            await kv.start_agent(tg, b, config=cut_off)
            eps = [await anyio.to_thread.run_sync(a.mgr.create, "0", pod(f"p{i}", ["k8s:x=1"]))
                   for i in range(3)]
            await wait_for(lambda: b.remote() == published(a) != {}, "b has a's endpoints")
            await wait_for(lambda: "node-a" in b.node_rows(), "b has node-a")
            applied: list[tuple[list[str], list[str]]] = []
            orig = b.endpoints.apply

            def recording(ups: list[tuple[str, Any]], dels: list[str], synced: bool) -> int:
                applied.append(([k for k, _ in ups], list(dels)))
                return int(orig(ups, dels, synced))

            b.endpoints.apply = recording
            watchers = {"identities": b.identities.watcher, "ipcache": b.endpoints.watcher,
                        "nodes": b.registry.nodes.watcher}  # type: ignore[union-attr]
            for p in proxies:
                p.cut()
            await wait_for(lambda: not any(w.health().connected for w in watchers.values()),
                           "b cut off")
            before = b.remote()
            await anyio.to_thread.run_sync(a.mgr.delete, str(eps[0].id))
            new = await anyio.to_thread.run_sync(a.mgr.create, "0", pod("late", ["k8s:x=2"]))
            srv.upsert(node_object("node-a", "192.0.2.1", {"zone": "z1"}))
            await wait_for(lambda: f"{new.ipv4}/32" in published(a), "a's new endpoint")

            async def node_a_changed() -> bool:
                v = (await kv.admin.get(kv.layout.node("node-a")))
                return v is not None and b'"z1"' in v.value

            with anyio.fail_after(10):
                while not await node_a_changed() or await etcd_ips(kv) != published(a) \
                        or new.identity not in await kv.identities():
                    await anyio.sleep(0.05)
            assert b.remote() == before  # cut off: b keeps what it had
            rev = await kv.admin.put(kv.layout.base + "bump", "1")
            await kv.admin.compact(rev)
            for p in proxies:
                p.heal()
            await wait_for(lambda: b.remote() == published(a), "b re-synced its ipcache")
            await wait_for(lambda: dict(b.node_rows()["node-a"].labels).get("zone") == "z1",
                           "b has node-a's new labels")
            await wait_for(lambda: b.mgr.identities.lookup(b.mgr.db.read_txn(), new.identity)
                           is not None, "b knows the new identity")
            for name, w in watchers.items():
                assert w.health().relists >= 1, (name, w.health())
            # Only the difference: the new endpoint's address in, the deleted one's out.
            ups = {k for u, _ in applied for k in u}
            dels = {k for _, d in applied for k in d}
            assert ups == {str(new.ipv4)} and dels == {str(eps[0].ipv4)}, applied
            with anyio.fail_after(10):
                while not all(ok for ok, _ in b.health()):
                    await anyio.sleep(0.1)
            tg.cancel_scope.cancel()
    finally:
        for p in proxies:
            p.close()
        for ag in (a, b):
            await kv.stop_agent(ag)
        await kv.close()
        srv.stop()
