"""The same cluster tests on both backends: CRD mode (the fake API server) and kvstore
mode (a real 3-member etcd cluster)."""

from __future__ import annotations

import ipaddress
import random
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest

from tests.k8s.fake_apiserver import FakeAPIServer
from tests.k8s.helpers import wait_for
from tests.kvstore.backends import (
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
        kv = KVStoreBackend(etcd.endpoints)
        try:
            yield kv
        finally:
            await kv.close()


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
