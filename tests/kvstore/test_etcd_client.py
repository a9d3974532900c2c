"""The etcd client, session and watcher against a real 3-member etcd cluster."""

from __future__ import annotations

import time
from collections.abc import Mapping

import anyio
import pytest

from sources.kvstore.config import EtcdConfig
from sources.kvstore.etcd_client import (
    CompactedError,
    EtcdClient,
    KeyValue,
    KVStoreClosed,
    KVStoreUnavailable,
)
from sources.kvstore.session import KVStoreSession
from sources.kvstore.watcher import PrefixWatcher
from tests.kvstore.etcd_cluster import EtcdCluster, TCPProxy, free_port

pytestmark = pytest.mark.anyio


def client_of(etcd: EtcdCluster, *endpoints: str) -> EtcdClient:
    return EtcdClient(EtcdConfig(tuple(endpoints or etcd.endpoints), request_timeout=3.0))


class Recorder:
    """A watcher's consumer that keeps the state and every delivery."""

    def __init__(self) -> None:
        self.state: dict[str, bytes] = {}
        self.log: list[tuple[str, str]] = []

    async def __call__(self, ups: Mapping[str, KeyValue], dels: list[str], synced: bool) -> None:
        for k, kv in ups.items():
            self.state[k] = kv.value
            self.log.append(("put", k))
        for k in dels:
            self.state.pop(k, None)
            self.log.append(("delete", k))


async def wait_for(cond: object, timeout: float = 10.0) -> None:
    with anyio.fail_after(timeout):
        while not cond():  # type: ignore[operator]
            await anyio.sleep(0.02)


async def test_a_closed_client_fails_with_a_kvstore_error(
    etcd: EtcdCluster, prefix: str
) -> None:
    """Every request on a closed client, a watch included, is a `KVStoreClosed` naming
    the endpoint: the watcher's retry loop handles it like any other etcd error."""
    c = client_of(etcd)
    await c.aclose()
    with pytest.raises(KVStoreClosed, match="client is closed"):
        await c.put(prefix + "a", "1")
    with pytest.raises(KVStoreClosed, match=etcd.endpoints[0]):
        await c.probe(etcd.endpoints[0])
    with pytest.raises(KVStoreClosed):
        async for _ in c.watch(prefix, 1):
            pass


async def test_kv_txn_and_create(etcd: EtcdCluster, prefix: str) -> None:
    c = client_of(etcd)
    try:
        await c.put(prefix + "a", "1")
        assert (await c.get(prefix + "a")).value == b"1"  # type: ignore[union-attr]
        assert await c.create(prefix + "b", "x") is None
        taken = await c.create(prefix + "b", "y")
        assert taken is not None and taken.value == b"x"
        kvs, rev = await c.list_prefix(prefix)
        assert [kv.key for kv in kvs] == [prefix + "a", prefix + "b"] and rev >= 3
        assert await c.delete(prefix, prefix=True) == 2
        assert await c.get(prefix + "a") is None
    finally:
        await c.aclose()


async def test_dead_endpoint_costs_one_retry(etcd: EtcdCluster, prefix: str) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    c = client_of(etcd, dead, etcd.endpoints[0])
    try:
        await c.put(prefix + "k", "v")
        assert c.endpoint == etcd.endpoints[0]
    finally:
        await c.aclose()
    c = client_of(etcd, dead)
    try:
        with pytest.raises(KVStoreUnavailable, match="no endpoint answered"):
            await c.get(prefix + "k")
    finally:
        await c.aclose()


async def test_lease_keys_expire(etcd: EtcdCluster, prefix: str) -> None:
    c = client_of(etcd)
    try:
        lease = await c.lease_grant(2)
        await c.put(prefix + "owned", "v", lease)
        assert await c.lease_keepalive(lease) == 2
        await anyio.sleep(3.2)
        assert await c.get(prefix + "owned") is None
        assert await c.lease_keepalive(lease) == 0
    finally:
        await c.aclose()


async def test_watch_compacted_raises(etcd: EtcdCluster, prefix: str) -> None:
    c = client_of(etcd)
    try:
        rev = await c.put(prefix + "a", "1")
        rev = await c.put(prefix + "a", "2")
        await c.compact(rev)
        with pytest.raises(CompactedError) as info:
            async for _ in c.watch(prefix, rev - 1):
                pass
        assert info.value.compact_revision == rev
    finally:
        await c.aclose()


async def test_session_rewrites_keys_under_a_new_lease(etcd: EtcdCluster, prefix: str) -> None:
    """An expired lease (cut off longer than the TTL): the keys come back under a new one."""
    c = client_of(etcd)
    s = KVStoreSession(c, ttl=2, retry_interval=0.1)
    try:
        async with anyio.create_task_group() as tg:
            await tg.start(s.run)
            await s.wait_ready()
            await s.put(prefix + "mine", "v")
            first = s.lease
            await c.lease_revoke(first)  # as if it had expired
            assert await c.get(prefix + "mine") is None
            s._wake.set()
            await wait_for(lambda: s.lease != first)
            async def back() -> bool:
                return (await c.get(prefix + "mine")) is not None
            with anyio.fail_after(5):
                while not await back():
                    await anyio.sleep(0.05)
            h = s.health()
            assert h.ok and h.leases_granted == 2 and h.owned_keys == 1, h
            await s.delete(prefix + "mine")
            assert await c.get(prefix + "mine") is None
            tg.cancel_scope.cancel()
    finally:
        await s.close()
        await c.aclose()


async def test_watcher_resumes_after_a_cut_and_relists_after_compaction(
    etcd: EtcdCluster, prefix: str
) -> None:
    admin = client_of(etcd)
    proxy = TCPProxy(etcd.members[0].client_port)
    c = client_of(etcd, proxy.url)
    rec = Recorder()
    w = PrefixWatcher(c, prefix, rec, retry_interval=0.1)
    try:
        await admin.put(prefix + "a", "1")
        async with anyio.create_task_group() as tg:
            await tg.start(w.run)
            await wait_for(lambda: rec.state == {prefix + "a": b"1"})
            await admin.put(prefix + "b", "1")
            await wait_for(lambda: prefix + "b" in rec.state)
            # A cut: the consumer keeps its state; changes made meanwhile arrive once.
            proxy.cut()
            await wait_for(lambda: not w.health().connected)
            await admin.put(prefix + "c", "1")
            await admin.delete(prefix + "a")
            assert rec.state.keys() == {prefix + "a", prefix + "b"}
            proxy.heal()
            await wait_for(lambda: rec.state.keys() == {prefix + "b", prefix + "c"})
            assert w.health().relists == 0 and w.health().resumes >= 1
            # Compaction during a cut: the watcher lists again, applies only the difference.
            proxy.cut()
            await wait_for(lambda: not w.health().connected)
            n = len(rec.log)
            await admin.put(prefix + "d", "1")
            await admin.put(prefix + "b", "2")
            await admin.delete(prefix + "c")
            rev = await admin.put(prefix + "e", "1")
            await admin.delete(prefix + "e")
            await admin.compact(rev + 1)
            proxy.heal()
            await wait_for(lambda: rec.state == {prefix + "b": b"2", prefix + "d": b"1"})
            assert w.health().relists == 1
            assert sorted(rec.log[n:]) == sorted(
                [("put", prefix + "b"), ("put", prefix + "d"), ("delete", prefix + "c")])
            tg.cancel_scope.cancel()
    finally:
        proxy.close()
        await c.aclose()
        await admin.aclose()


async def test_watcher_grace_period_hides_a_delete_then_add(etcd: EtcdCluster, prefix: str) -> None:
    admin = client_of(etcd)
    rec = Recorder()
    w = PrefixWatcher(admin, prefix, rec, grace=1.0)
    try:
        async with anyio.create_task_group() as tg:
            await tg.start(w.run)
            await admin.put(prefix + "a", "1")
            await wait_for(lambda: prefix + "a" in rec.state)
            await admin.delete(prefix + "a")
            await anyio.sleep(0.3)
            await admin.put(prefix + "a", "1")
            await anyio.sleep(1.2)
            assert rec.log == [("put", prefix + "a")]
            t0 = time.monotonic()
            await admin.delete(prefix + "a")
            await wait_for(lambda: prefix + "a" not in rec.state)
            assert time.monotonic() - t0 >= 0.9
            assert rec.log == [("put", prefix + "a"), ("delete", prefix + "a")]
            tg.cancel_scope.cancel()
    finally:
        await admin.aclose()


async def test_watcher_leaves_a_member_gone_silent(etcd: EtcdCluster, prefix: str) -> None:
    """A partition that drops packets (no reset): the probe finds the stream's member
    silent and the watch resumes on another one, missing nothing."""
    admin = client_of(etcd)
    proxies = [TCPProxy(m.client_port) for m in etcd.members]
    c = EtcdClient(EtcdConfig(tuple(p.url for p in proxies), request_timeout=1.0))
    rec = Recorder()
    w = PrefixWatcher(c, prefix, rec, retry_interval=0.1, probe_interval=0.3)
    try:
        async with anyio.create_task_group() as tg:
            await tg.start(w.run)
            await admin.put(prefix + "a", "1")
            await wait_for(lambda: prefix + "a" in rec.state)
            first = c.endpoint
            next(p for p in proxies if p.url == first).freeze()
            await admin.put(prefix + "b", "1")
            await wait_for(lambda: prefix + "b" in rec.state, 15)
            assert c.endpoint != first and w.health().resumes >= 1
            tg.cancel_scope.cancel()
    finally:
        for p in proxies:
            p.close()
        await c.aclose()
        await admin.aclose()
