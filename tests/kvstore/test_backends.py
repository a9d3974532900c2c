"""The same cluster tests on both backends: CRD mode (the fake API server) and kvstore
mode (a real 3-member etcd cluster, and the fake API server for each agent's own Node):
identities (racing agents agree; a deleted identity in use comes back under its number;
a restarted agent keeps its numbers; malformed ones are refused alone), remote endpoints
in the ipcache (following, refusing a malformed one) and the node registry (every node,
changes, deletions, a malformed node refused alone)."""

from __future__ import annotations

import ipaddress
import random
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest

from tables.cluster_identities import ClusterIdentityAllocator
from tests.k8s.fake_apiserver import FakeAPIServer
from tests.k8s.helpers import wait_for
from tests.kvstore.backends import (
    BAD_IP,
    Agent,
    Backend,
    CRDBackend,
    KVStoreBackend,
    manager,
    pod,
)
from tests.kvstore.etcd_cluster import EtcdCluster

pytestmark = pytest.mark.anyio


@pytest.fixture(params=["crd", "kvstore"])
async def backend(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Backend]:
    if request.param == "crd":
        srv = FakeAPIServer().start()
        try:
            yield CRDBackend(srv, tmp_path)
        finally:
            srv.stop()
    else:
        etcd: EtcdCluster = request.getfixturevalue("etcd")
        srv = FakeAPIServer().start()
        kv = KVStoreBackend(etcd.endpoints, apiserver=srv, tmp=tmp_path)
        try:
            yield kv
        finally:
            await kv.close()
            srv.stop()


def agent(tmp: Path, name: str, n: int) -> Agent:
    return Agent(name, manager(tmp / name, f"10.{40 + n}.0.0/24", seed=n),
                 ipaddress.IPv4Address(f"192.0.2.{n + 1}"))


async def test_two_agents_agree_on_identities_under_races(
    backend: Backend, tmp_path: Path
) -> None:
    """Random label sets, both agents allocating at once: every label set ends on one
    number on both agents, the store's identity of those labels."""
    rng = random.Random(32)
    pool = [f"k8s:k{i}=v{i % 3}" for i in range(9)]  # distinct keys: no set collapses
    sets = [sorted(rng.sample(pool, rng.randint(1, 3))) for _ in range(12)]
    a, b = agent(tmp_path, "node-a", 0), agent(tmp_path, "node-b", 1)
    async with anyio.create_task_group() as tg:
        await backend.start_agent(tg, a)
        await backend.start_agent(tg, b)

        async def make(ag: Agent, order: list[int]) -> None:
            for i in order:
                await anyio.to_thread.run_sync(ag.mgr.create, "0", pod(f"{ag.name}-{i}", sets[i]))
                await anyio.sleep(0)

        order = list(range(len(sets)))
        rng.shuffle(order)
        async with anyio.create_task_group() as racing:
            racing.start_soon(make, a, order)
            racing.start_soon(make, b, list(reversed(order)))

        def numbers(ag: Agent) -> dict[int, int]:
            """Label set index -> the number the agent's endpoint uses."""
            return {int(e.pod_name.rsplit("-", 1)[1]): e.identity
                    for e in ag.mgr.endpoints.all(ag.mgr.db.read_txn())}

        def labels_of(ag: Agent, num: int) -> tuple[str, ...] | None:
            row = ag.mgr.identities.lookup(ag.mgr.db.read_txn(), num)
            return None if row is None else row.labels

        store: dict[int, tuple[str, ...]] = {}

        async def agreed() -> bool:
            store.clear()
            store.update(await backend.identities())
            na, nb = numbers(a), numbers(b)
            if na != nb or len(na) != len(sets):
                return False
            return all(store.get(num) == labels_of(a, num) == labels_of(b, num) is not None
                       for num in na.values())

        with anyio.fail_after(30):
            while not await agreed():
                await anyio.sleep(0.05)
        await anyio.sleep(0.5)
        assert await agreed()
        distinct = {tuple(s) for s in sets}
        assert len(set(numbers(a).values())) == len(distinct)
        assert all(numbers(a)[i] == numbers(a)[j] for i in range(len(sets))
                   for j in range(len(sets)) if sets[i] == sets[j])
        for ag in (a, b):
            for ok, msg in ag.health():
                assert ok, msg
        tg.cancel_scope.cancel()
    for ag in (a, b):
        await backend.stop_agent(ag)


async def test_the_ipcache_follows_remote_endpoints(backend: Backend, tmp_path: Path) -> None:
    a, b = agent(tmp_path, "node-a", 0), agent(tmp_path, "node-b", 1)
    async with anyio.create_task_group() as tg:
        await backend.start_agent(tg, a)
        await backend.start_agent(tg, b)
        ep = await anyio.to_thread.run_sync(a.mgr.create, "0", pod("web", ["k8s:app=web"]))
        key = f"{ep.ipv4}/32"
        await wait_for(lambda: key in b.remote(), "b sees a's endpoint")

        def settled() -> bool:
            now = a.mgr.get(str(ep.id)).identity
            return b.remote().get(key) == (now, "192.0.2.1")

        await wait_for(settled, "b has a's endpoint with its identity and node")
        assert key not in a.remote()  # its own endpoint is no remote entry on a
        ep2 = await anyio.to_thread.run_sync(a.mgr.create, "0", pod("db", ["k8s:app=db"]))
        key2 = f"{ep2.ipv4}/32"
        await wait_for(lambda: key2 in b.remote(), "b sees the second endpoint")
        await anyio.to_thread.run_sync(a.mgr.delete, str(ep.id))
        await wait_for(lambda: key not in b.remote(), "b drops the deleted endpoint")
        assert key2 in b.remote()
        for ag in (a, b):
            for ok, msg in ag.health():
                assert ok, msg
        tg.cancel_scope.cancel()
    for ag in (a, b):
        await backend.stop_agent(ag)


def _apiserver(backend: Backend) -> FakeAPIServer:
    srv = getattr(backend, "apiserver", None)
    assert isinstance(srv, FakeAPIServer)
    return srv


def _unhealthy(ag: Agent) -> str:
    return "; ".join(msg for ok, msg in ag.health() if not ok)


async def test_a_deleted_identity_in_use_comes_back_and_bad_ones_are_refused(
    backend: Backend, tmp_path: Path
) -> None:
    a, b = agent(tmp_path, "node-a", 0), agent(tmp_path, "node-b", 1)
    async with anyio.create_task_group() as tg:
        await backend.start_agent(tg, a)
        await backend.start_agent(tg, b)
        ep = await anyio.to_thread.run_sync(a.mgr.create, "0", pod("web", ["k8s:app=web"]))
        num = ep.identity

        async def stored() -> bool:
            return num in await backend.identities()

        with anyio.fail_after(20):
            while not await stored():
                await anyio.sleep(0.05)
        await wait_for(lambda: b.mgr.identities.lookup(b.mgr.db.read_txn(), num) is not None,
                       "b knows a's identity")
        # Deleted by mistake while a's endpoint uses it: created again under its number.
        await backend.delete_identity(num)
        with anyio.fail_after(20):
            while not await stored():
                await anyio.sleep(0.05)
        assert a.mgr.get(str(ep.id)).identity == num
        # A malformed identity is refused on its own; everything else stays.
        await backend.put_bad_identity("bad")
        alloc = a.mgr.identities
        assert isinstance(alloc, ClusterIdentityAllocator)
        await wait_for(lambda: "bad" in alloc.errors, "a refuses the bad identity")
        assert "bad" in _unhealthy(a)
        assert a.mgr.get(str(ep.id)).identity == num
        assert b.mgr.identities.lookup(b.mgr.db.read_txn(), num) is not None
        ep2 = await anyio.to_thread.run_sync(b.mgr.create, "0", pod("web2", ["k8s:app=web"]))
        assert ep2.identity == num  # the cluster's number, at once
        await backend.delete_bad()
        await wait_for(lambda: not _unhealthy(a), "a healthy once the bad identity is gone")
        tg.cancel_scope.cancel()
    for ag in (a, b):
        await backend.stop_agent(ag)


async def test_a_restarted_agent_keeps_its_numbers_and_the_others_see_no_flap(
    backend: Backend, tmp_path: Path
) -> None:
    a, b = agent(tmp_path, "node-a", 0), agent(tmp_path, "node-b", 1)
    async with anyio.create_task_group() as tg:
        await backend.start_agent(tg, a)
        await backend.start_agent(tg, b)
        ep = await anyio.to_thread.run_sync(a.mgr.create, "0", pod("web", ["k8s:app=web"]))
        key = f"{ep.ipv4}/32"
        await wait_for(lambda: b.remote().get(key) == (a.mgr.get(str(ep.id)).identity,
                                                       "192.0.2.1"), "b has a's endpoint")
        num = a.mgr.get(str(ep.id)).identity
        seen: list[bool] = []

        async def watch_b() -> None:
            while True:
                present = key in b.remote()
                if not seen or seen[-1] != present:
                    seen.append(present)
                await anyio.sleep(0.01)

        tg.start_soon(watch_b)
        await backend.stop_agent(a)
        again = Agent("node-a", manager(tmp_path / "node-a", "10.40.0.0/24", seed=0),
                      a.node_ip)
        again.mgr.ipam.restore(reserve_router=False)
        assert again.mgr.restore(lambda _ep: True).restored == [ep.id]
        await backend.start_agent(tg, again)
        await wait_for(lambda: not _unhealthy(again), "the restarted agent synced")
        assert again.mgr.get(str(ep.id)).identity == num
        await anyio.sleep(1.0)
        assert seen == [True] and b.remote()[key] == (num, "192.0.2.1")
        assert await backend.identities() == {num: b.mgr.identities.lookup(
            b.mgr.db.read_txn(), num).labels}  # type: ignore[union-attr]
        tg.cancel_scope.cancel()
    for ag in (again, b):
        await backend.stop_agent(ag)


async def test_a_malformed_remote_endpoint_is_refused_alone(
    backend: Backend, tmp_path: Path
) -> None:
    a, b = agent(tmp_path, "node-a", 0), agent(tmp_path, "node-b", 1)
    async with anyio.create_task_group() as tg:
        await backend.start_agent(tg, a)
        await backend.start_agent(tg, b)
        ep = await anyio.to_thread.run_sync(a.mgr.create, "0", pod("web", ["k8s:app=web"]))
        await wait_for(lambda: f"{ep.ipv4}/32" in b.remote(), "b has a's endpoint")
        name = await backend.put_bad_endpoint(BAD_IP)
        await wait_for(lambda: name in _unhealthy(b), "b refuses the malformed endpoint")
        assert f"{BAD_IP}/32" not in b.remote() and f"{ep.ipv4}/32" in b.remote()
        await backend.delete_bad()
        await wait_for(lambda: not _unhealthy(b), "b healthy once it is gone")
        tg.cancel_scope.cancel()
    for ag in (a, b):
        await backend.stop_agent(ag)


def _node(i: int, labels: dict[str, str] | None = None) -> dict[str, object]:
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": f"node-{'ab'[i]}", "labels": labels or {}},
            "spec": {"podCIDRs": [f"10.{40 + i}.0.0/24"]},
            "status": {"addresses": [{"type": "InternalIP", "address": f"192.0.2.{i + 1}"}]}}


async def test_the_node_registry_on_every_agent(backend: Backend, tmp_path: Path) -> None:
    """Each agent's nodes table holds every node; a change and a deletion of one node's
    Node reach the other agent; a malformed node is refused alone. The kubelet writes the
    Nodes to the API server; in kvstore mode each agent reads only its own there and the
    other's from etcd."""
    srv = _apiserver(backend)
    srv.upsert(_node(0))
    srv.upsert(_node(1))
    a, b = agent(tmp_path, "node-a", 0), agent(tmp_path, "node-b", 1)
    source = {"crd": "k8s", "kvstore": "kvstore"}[backend.name]
    async with anyio.create_task_group() as tg:
        await backend.start_agent(tg, a)
        await backend.start_agent(tg, b)

        def view(ag: Agent) -> dict[str, tuple[str, str, str]]:
            return {n: (str(r.internal_ip(4)), r.source, dict(r.labels).get("zone", ""))
                    for n, r in ag.node_rows().items()}

        await wait_for(lambda: view(a) == {"node-a": ("192.0.2.1", "k8s", ""),
                                           "node-b": ("192.0.2.2", source, "")}, "a's nodes")
        await wait_for(lambda: view(b) == {"node-a": ("192.0.2.1", source, ""),
                                           "node-b": ("192.0.2.2", "k8s", "")}, "b's nodes")
        assert a.node_rows()["node-b"].pod_cidrs == b.node_rows()["node-b"].pod_cidrs
        srv.upsert(_node(1, {"zone": "z1"}))
        await wait_for(lambda: view(a)["node-b"][2] == "z1", "a sees node-b's new label")
        await backend.put_bad_node("node-bad")
        await wait_for(lambda: "node-bad" in _unhealthy(a), "a refuses the malformed node")
        assert set(view(a)) == {"node-a", "node-b"}
        await backend.delete_bad()
        await wait_for(lambda: not _unhealthy(a), "a healthy once it is gone")
        srv.delete("Node", "", "node-b")
        await wait_for(lambda: set(view(a)) == {"node-a"}, "a drops node-b")
        await wait_for(lambda: set(view(b)) == {"node-a"}, "b drops its own node")
        tg.cancel_scope.cancel()
    for ag in (a, b):
        await backend.stop_agent(ag)
