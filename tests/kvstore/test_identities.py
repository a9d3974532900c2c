"""Identities in kvstore mode: what the backend-independent tests (test_backends.py) cannot
arrange, against the module's real etcd cluster."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from pathlib import Path

import anyio
import pytest

from sources.kvstore.config import EtcdConfig
from sources.kvstore.etcd_client import EtcdClient
from sources.kvstore.identities import KVStoreIdentities
from sources.kvstore.layout import KeyLayout, labels_key
from sources.kvstore.session import KVStoreSession
from statedb import WriteTxn
from tests.k8s.helpers import wait_for
from tests.k8s.test_cluster_identities import WEB, alloc_of, manager, pod
from tests.kvstore.etcd_cluster import EtcdCluster


@pytest.mark.anyio
async def test_no_key_is_created_while_a_delivery_is_half_applied(
    etcd: EtcdCluster, prefix: str, tmp_path: Path
) -> None:
    """`observe` drops a deleted key's identity from the allocator's cache before the
    endpoints it moves off that number are committed: a creation decided in between
    created the key again though no endpoint would use it any more. Here the commit of
    that delivery is held for a second, twenty retry intervals: no key may come back."""
    layout = KeyLayout(base=f"{prefix}cilium/state/")
    config = EtcdConfig(tuple(etcd.endpoints), request_timeout=3.0)
    admin = EtcdClient(config)
    await admin.create(layout.identity_id(900), labels_key(WEB))  # the older: it wins
    await admin.create(layout.identity_id(950), labels_key(WEB))
    mgr = manager(str(tmp_path))
    hold, reached, release = threading.Event(), threading.Event(), threading.Event()

    def apply_changes(change: Callable[[WriteTxn], Mapping[int, int]]) -> list[int]:
        def held(txn: WriteTxn) -> Mapping[int, int]:
            moves = change(txn)
            if hold.is_set():
                reached.set()
                release.wait(10)
            return moves

        return mgr.renumber_identities(held)

    session = KVStoreSession(EtcdClient(config), retry_interval=0.1)
    ids = KVStoreIdentities(alloc_of(mgr), session, apply_changes, "node-a", layout,
                            retry_interval=0.05)
    try:
        async with anyio.create_task_group() as tg:
            await tg.start(session.run)
            await tg.start(ids.run)
            await wait_for(lambda: ids.synced and alloc_of(mgr).object_count() == 2, "sync")
            ep = mgr.create("0", pod("a", ["k8s:app=web"]))
            assert ep.identity == 900
            hold.set()
            await admin.delete(layout.identity_id(900))
            await wait_for(reached.is_set, "the deletion half-applied")
            await anyio.sleep(1.0)
            release.set()
            await wait_for(lambda: mgr.get(str(ep.id)).identity == 950, "the endpoint moving")
            await anyio.sleep(0.3)  # twice the retry interval or more
            tg.cancel_scope.cancel()
        kvs, _ = await admin.list_prefix(layout.identity_ids)
        assert [kv.key for kv in kvs] == [layout.identity_id(950)]
    finally:
        release.set()
        await session.close()
        await session.client.aclose()
        await admin.delete(layout.base, prefix=True)
        await admin.aclose()
