"""Identities through etcd (kvstore mode): the same allocator as CRD mode
(`tables.cluster_identities.ClusterIdentityAllocator`), fed from Cilium's identity keys
instead of CiliumIdentity objects, so the endpoint and identity code cannot tell the
backends apart.

* **watch**: `sources.kvstore.watcher.PrefixWatcher` over ``identities/v1/id/``; each key
  becomes the object the allocator reads (name = the id, ``security-labels`` from the
  labels key, ``creationTimestamp`` = the key's creation revision, zero-padded, so "the
  oldest object wins" means "the first key etcd created wins", the same on every agent).
  Deliveries are applied in a worker thread through ``apply_changes`` (the endpoint
  manager's `renumber_identities`).
* **create**: once the first list is in, an identity local endpoints use without a key is
  created by compare-and-swap on the key's creation (``create_revision == 0``). When
  another agent took the number first, the watch brings its key and the allocator moves
  the label set; the creation is tried again under the new number. Two agents creating
  keys for one label set under different numbers both succeed; every agent then uses the
  older key, and the other is left unreferenced for the operator's GC. Each creation is
  decided under the lock deliveries are applied under (as in CRD mode,
  sources/k8s_identities.py): decided while a delivery is half-applied, it created the
  key of a number the endpoints were just moving off.
* **references**: for each identity local endpoints use, this node owns
  ``identities/v1/value/<labels>/<node>`` -> id under its lease (sources/kvstore/
  session.py); it is deleted when the last local endpoint lets go, and expires with the
  lease when the agent dies. The operator deletes ids no reference names
  (`collect_identities`).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping
from typing import Any

import anyio
import anyio.abc

from sources.k8s_identities import ApplyChanges
from sources.kvstore.etcd_client import Compare, EtcdClient, KeyValue, KVStoreError, delete_op
from sources.kvstore.layout import KeyLayout, labels_key, labels_of_key
from sources.kvstore.session import KVStoreSession
from sources.kvstore.watcher import PrefixWatcher
from statedb import ReadTxn
from tables.cluster_identities import (
    SECURITY_LABELS,
    ClusterIdentityAllocator,
    labels_to_security_labels,
)
from tables.identities import MIN_ALLOCATED_IDENTITY, Identity, identity_id_index

log = logging.getLogger(__name__)


def identity_object_of(layout: KeyLayout, kv: KeyValue) -> dict[str, Any]:
    """The CiliumIdentity-shaped object of an ``identities/v1/id/<id>`` key."""
    name = kv.key[len(layout.identity_ids):]
    labels = tuple(labels_of_key(kv.value.decode(errors="replace")))
    return {
        "metadata": {"name": name, "creationTimestamp": f"{kv.create_revision:020d}"},
        SECURITY_LABELS: labels_to_security_labels(labels),
    }


def local_identities(allocator: ClusterIdentityAllocator, txn: ReadTxn) -> list[Identity]:
    """The allocated (not reserved) identities local endpoints use."""
    table = allocator.table
    return [r for r in table.lower_bound(txn, identity_id_index.query(MIN_ALLOCATED_IDENTITY))
            if r.refcount > 0]


class KVStoreIdentities:
    """See the module doc. ``run`` needs the session running."""

    #: The health line under the endpoints component (sources/cluster_state.py).
    health_name = "identities"

    def __init__(
        self,
        allocator: ClusterIdentityAllocator,
        session: KVStoreSession,
        apply_changes: ApplyChanges,
        node_name: str,
        layout: KeyLayout | None = None,
        *,
        grace: float = 0.0,
        retry_interval: float = 1.0,
    ) -> None:
        self.allocator = allocator
        self.session = session
        self.client: EtcdClient = session.client
        self.apply_changes = apply_changes
        self.node_name = node_name
        self.layout = layout or KeyLayout()
        self.retry_interval = retry_interval
        self.watcher = PrefixWatcher(self.client, self.layout.identity_ids, self._deliver,
                                     grace=grace)
        self.created = 0
        self.conflicts = 0
        self.moved = 0
        self.last_error = ""
        self._attempted: dict[int, float] = {}
        #: Held while a delivery is applied (module doc: creations are decided under it).
        self._applying = anyio.Lock()

    @property
    def synced(self) -> bool:
        return self.watcher.synced

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Watch, create and reference until cancelled."""
        async with anyio.create_task_group() as tg:
            await tg.start(self.watcher.run)
            tg.start_soon(self._publish_loop)
            task_status.started()

    # ----- the watch ------------------------------------------------------------------------
    async def _deliver(self, ups: Mapping[str, KeyValue], dels: list[str], synced: bool) -> None:
        upserts = [identity_object_of(self.layout, kv) for kv in ups.values()]
        names = [k[len(self.layout.identity_ids):] for k in dels]
        async with self._applying:
            await anyio.to_thread.run_sync(self.apply, upserts, names)

    def apply(self, upserts: list[dict[str, Any]], deletes: list[str]) -> list[int]:
        """Apply one delivery; returns the endpoints moved to other numbers."""
        moved = self.apply_changes(lambda txn: self.allocator.observe(txn, upserts, deletes))
        if moved:
            self.moved += len(moved)
            log.info("identities: endpoints %s follow the cluster's numbering", moved)
        return moved

    # ----- keys and references --------------------------------------------------------------
    async def _publish_loop(self) -> None:
        table, db = self.allocator.table, self.allocator.db
        while True:
            txn = db.read_txn()
            _, watch = table.all_watch(txn)
            if self.synced:
                try:
                    await self.publish(txn)
                except KVStoreError as e:
                    self._failed(e)
            del txn  # a held ReadTxn keeps old row versions (docs/statedb.md)
            with anyio.move_on_after(self.retry_interval):
                await watch.wait_async()

    async def publish(self, txn: ReadTxn) -> None:
        """Create the keys of unpublished identities; make this node's references equal
        the identities its endpoints use."""
        now = time.monotonic()
        unpublished = {r.id for r in self.allocator.unpublished(txn)}
        for num in [n for n in self._attempted if n not in unpublished]:
            del self._attempted[num]
        wanted: dict[str, str] = {}
        for row in local_identities(self.allocator, txn):
            if row.id in unpublished:
                if now - self._attempted.get(row.id, -math.inf) >= self.retry_interval:
                    async with self._applying:
                        due = self.allocator.still_unpublished(self.allocator.db.read_txn(), row)
                    if due:
                        self._attempted[row.id] = now
                        await self._create(row)
                continue
            obj = self.allocator.object_of(row.id)
            if obj is not None and obj.labels == row.labels:
                wanted[self.layout.identity_ref(row.labels, self.node_name)] = str(row.id)
        for key, value in wanted.items():
            await self.session.put(key, value)
        mine = f"/{self.node_name}"
        for key in self.session.owned():
            if key.startswith(self.layout.identity_values) and key.endswith(mine) \
                    and key not in wanted:
                await self.session.delete(key)
        self.last_error = ""

    async def _create(self, row: Identity) -> None:
        taken = await self.client.create(self.layout.identity_id(row.id), labels_key(row.labels))
        if taken is None:
            self.created += 1
            await self.session.put(self.layout.identity_ref(row.labels, self.node_name),
                                   str(row.id))
        elif taken.value.decode(errors="replace") != labels_key(row.labels):
            self.conflicts += 1  # the watch brings the other key; the label set moves

    def _failed(self, e: BaseException) -> None:
        msg = f"identities: {e}"
        if msg != self.last_error:
            log.warning("kvstore: %s (tried again)", msg)
        self.last_error = msg

    # ----- reporting ----------------------------------------------------------------------------
    def health(self) -> tuple[bool, str]:
        """(ok, message) for the ``endpoints/identities`` health line."""
        h = self.watcher.health()
        pending = len(self.allocator.unpublished(self.allocator.db.read_txn()))
        parts = [
            f"kvstore {h.message()}",
            f"{self.allocator.object_count()} in the cluster",
            f"{pending} to create",
            f"{self.created} created, {self.conflicts} taken meanwhile",
        ]
        ok = h.synced and h.connected and not self.last_error
        if self.last_error:
            parts.append(self.last_error)
        errors = self.allocator.errors
        if errors:
            ok = False
            first = sorted(errors)[0]
            parts.append(f"{len(errors)} refused, e.g. {errors[first]}")
        return ok, "; ".join(parts)


async def collect_identities(
    client: EtcdClient, layout: KeyLayout, unused_since: dict[int, float], grace: float,
    now: float | None = None,
) -> list[int]:
    """One pass of the operator's identity GC in kvstore mode: ids that no node's
    reference names, unreferenced for ``grace`` seconds (``unused_since`` carries the
    first time each was seen so between passes), are deleted if their key did not change
    meanwhile. Returns the ids deleted."""
    now = time.monotonic() if now is None else now
    ids, _ = await client.list_prefix(layout.identity_ids)
    refs, _ = await client.list_prefix(layout.identity_values)
    referenced: set[tuple[str, str]] = set()
    for kv in refs:
        split = layout.split_identity_ref(kv.key)
        if split is not None:
            referenced.add((split[0], kv.value.decode(errors="replace")))
    deleted: list[int] = []
    seen: set[int] = set()
    for kv in ids:
        name = kv.key[len(layout.identity_ids):]
        if not name.isdigit():
            continue
        num = int(name)
        if (kv.value.decode(errors="replace"), name) in referenced:
            continue
        seen.add(num)
        first = unused_since.setdefault(num, now)
        if now - first < grace:
            continue
        res = await client.txn([Compare(kv.key, "MOD", kv.mod_revision)], [delete_op(kv.key)])
        if res.succeeded:
            deleted.append(num)
        unused_since.pop(num, None)
    for num in [n for n in unused_since if n not in seen]:
        del unused_since[num]
    return deleted
