"""CiliumIdentities through the API server: the watch that feeds the cluster identity
allocator (tables/cluster_identities.py) and the creation of the objects for the
identities local endpoints use.

* **watch**: a `sources.k8s_reflector.Reflector` over every CiliumIdentity; each delivery
  is applied in a worker thread through ``apply_changes`` (the endpoint manager's
  `renumber_identities`): the allocator's `observe` and the endpoints it renumbers commit
  in one write transaction. `observe` takes a delivery as two sets, deletions then
  upserts, so each object's last change only is passed (`net_changes`): a watch that
  resumes after a stall hands over an object's creation and deletion in one delivery.
* **create**: once the initial list is in (before it an agent cannot know which numbers
  are taken), every identity a local endpoint uses without an object is created
  (`ClusterIdentityAllocator.unpublished`), in a worker thread, one request each; the
  loop wakes whenever the ``identities`` table changes and at least every
  ``retry_interval`` seconds. A creation answered 409 AlreadyExists (the number was taken
  meanwhile) or that failed (API server unreachable) is tried again after
  ``retry_interval`` if the identity still has no object; the watch delivering the object
  that took its number makes the allocator move the label set to another number first.
  Each creation is decided under the lock deliveries are applied under: `observe` drops
  an object from the allocator's cache before the endpoints it moves off that number are
  committed, and a decision taken in between would create the object no endpoint uses
  any more (in CRD mode it could even win the agreement and move every agent back).
  Nothing here runs in the CNI call: an endpoint has its number at once, its object
  follows.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterable, Mapping

import anyio
import anyio.abc
import urllib3

from sources.k8s_client import K8sClient, resource_path
from sources.k8s_http import K8sApiError, describe_error
from sources.k8s_reflector import Delta, Reflector, ReflectorConfig, ResourceSpec
from statedb import WriteTxn
from tables.cluster_identities import ClusterIdentityAllocator, identity_object
from tables.identities import Identity

log = logging.getLogger(__name__)

GROUP = "cilium.io"
VERSION = "v2"
PLURAL = "ciliumidentities"

#: The endpoint manager's `renumber_identities`: runs the allocator's change in one write
#: transaction with the endpoints it moves; returns the endpoints moved.
ApplyChanges = Callable[[Callable[[WriteTxn], Mapping[int, int]]], list[int]]


def net_changes(deltas: Iterable[Delta]) -> tuple[list[Delta], list[str]]:
    """One delivery as (upserts, keys deleted) holding each object's last change only:
    what consumers need that apply the two as sets, deletions first (the identity
    allocator, the remote endpoints). Passed every change, they would keep an object
    created and deleted in one delivery, as if its deletion had come first."""
    last: dict[str, Delta] = {}
    for d in deltas:
        last[d.key] = d
    upserts = [d for d in last.values() if d.op == "upsert"]
    return upserts, [d.key for d in last.values() if d.op == "delete"]


def identity_resource_spec() -> ResourceSpec:
    """Every CiliumIdentity of the cluster."""
    return ResourceSpec(PLURAL, "CiliumIdentity", f"{GROUP}/{VERSION}", PLURAL)


class ClusterIdentities:
    """See the module doc."""

    #: The health line under the endpoints component (sources/cluster_state.py).
    health_name = "identities"

    def __init__(
        self,
        allocator: ClusterIdentityAllocator,
        client: K8sClient,
        apply_changes: ApplyChanges,
        config: ReflectorConfig | None = None,
        *,
        retry_interval: float = 1.0,
        request_timeout: float = 10.0,
    ) -> None:
        self.allocator = allocator
        self.client = client
        self.apply_changes = apply_changes
        self.retry_interval = retry_interval
        self.request_timeout = request_timeout
        self.reflector = Reflector(client, identity_resource_spec(), self._deliver, config)
        #: True once the initial list has been applied.
        self.synced = False
        self.created = 0
        self.conflicts = 0
        self.last_error = ""
        self.moved = 0
        self._attempted: dict[int, float] = {}
        #: Held while a delivery is applied (module doc: creations are decided under it).
        self._applying = anyio.Lock()

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Watch and create until cancelled."""
        async with anyio.create_task_group() as tg:
            tg.start_soon(self.reflector.run, name="k8s reflector ciliumidentities")
            tg.start_soon(self._create_loop, name="ciliumidentity creation")
            task_status.started()

    # ----- the watch ------------------------------------------------------------------------
    async def _deliver(self, _r: Reflector, deltas: list[Delta], synced: bool) -> None:
        async with self._applying:
            await anyio.to_thread.run_sync(self.apply, deltas, synced)

    def apply(self, deltas: list[Delta], synced: bool) -> list[int]:
        """Apply one delivery; returns the endpoints it moved to other numbers."""
        ups, deletes = net_changes(deltas)
        upserts = [d.obj for d in ups]
        moved = self.apply_changes(lambda txn: self.allocator.observe(txn, upserts, deletes))
        if moved:
            self.moved += len(moved)
            log.info("identities: endpoints %s follow the cluster's numbering", moved)
        if synced:
            self.synced = True
        return moved

    # ----- creating objects -----------------------------------------------------------------
    async def _create_loop(self) -> None:
        table, db = self.allocator.table, self.allocator.db
        while True:
            txn = db.read_txn()
            _, watch = table.all_watch(txn)
            rows = self.allocator.unpublished(txn) if self.synced else None
            del txn  # a held ReadTxn keeps old row versions (docs/statedb.md)
            if rows is not None:
                await self._create_due(rows)
            with anyio.move_on_after(self.retry_interval):
                await watch.wait_async()

    async def _create_due(self, rows: list[Identity]) -> None:
        now = time.monotonic()
        wanted = {r.id for r in rows}
        for num in [n for n in self._attempted if n not in wanted]:
            del self._attempted[num]
        for row in rows:
            if now - self._attempted.get(row.id, -math.inf) < self.retry_interval:
                continue
            async with self._applying:
                # No delivery half-applied now; one applied since `rows` may have moved it.
                if not self.allocator.still_unpublished(self.allocator.db.read_txn(), row):
                    continue
            self._attempted[row.id] = now
            await anyio.to_thread.run_sync(self.create, row)

    def create(self, row: Identity) -> bool:
        """Create the object of ``row`` (blocking: a worker thread); True when created."""
        try:
            self.client.create(
                resource_path(f"{GROUP}/{VERSION}", PLURAL),
                identity_object(row.id, row.labels),
                timeout=self.request_timeout,
            )
        except K8sApiError as e:
            if e.status == 409:
                self.conflicts += 1
                return False
            self._failed(row, e)
            return False
        except (urllib3.exceptions.HTTPError, OSError) as e:
            self._failed(row, e)
            return False
        self.created += 1
        self.last_error = ""
        return True

    def _failed(self, row: Identity, e: BaseException) -> None:
        msg = f"creating CiliumIdentity {row.id}: {describe_error(e)}"
        if msg != self.last_error:
            log.warning("identities: %s (tried again)", msg)
        self.last_error = msg

    # ----- reporting ----------------------------------------------------------------------------
    def health(self) -> tuple[bool, str]:
        """(ok, message) for the ``endpoints/identities`` health line."""
        h = self.reflector.health
        pending = len(self.allocator.unpublished(self.allocator.db.read_txn()))
        parts = [
            f"{h.state} ({'synced' if h.synced else 'not synced'})",
            f"{self.allocator.object_count()} in the cluster",
            f"{pending} to create",
            f"{self.created} created, {self.conflicts} taken meanwhile",
        ]
        ok = not (h.last_error and not h.synced) and not self.last_error
        if h.last_error and not h.synced:
            parts.append(h.last_error)
        if self.last_error:
            parts.append(self.last_error)
        errors = self.allocator.errors
        if errors:
            ok = False
            first = sorted(errors)[0]
            parts.append(f"{len(errors)} refused, e.g. {errors[first]}")
        return ok, "; ".join(parts)
