"""Refreshing: re-apply Done rows older than the refresh interval, to repair targets changed
behind the reconciler's back.

A separate task follows the table's change stream and remembers, per Done row,
when it becomes due. A due row that is still unchanged is marked Refreshing
(compare-and-swap on its revision), which the incremental rounds then update.

The task reads the stream in batches: once a change arrives it lets more gather for
`FOLLOW_DELAY` seconds (at most a tenth of the interval) before reading them. A row
becomes due an interval after its status was written, so reading its change a little
later moves no due time; and under a steady churn the task wakes a few times a second
instead of at every commit (twice per change: the write and the reconciler's status).
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from typing import Generic, TypeVar

import anyio

from reconciler.config import Config
from reconciler.metrics import ReconcilerMetrics
from reconciler.status import StatusKind, status_refreshing
from statedb import DB, ChangeIterator, Watch

#: As a module constant: reading a member off its enum class costs ~10 times a global
#: on Python 3.11 (the metaclass' ``__getattr__`` hook), and `_step` reads it per row.
_DONE = StatusKind.DONE

#: Changes `Refresher._step` takes between two yields to the event loop.
_CHECKPOINT_EVERY = 4096

O = TypeVar("O")

log = logging.getLogger(__name__)

#: Seconds the refresher lets changes gather after the first one before reading them.
FOLLOW_DELAY = 0.1


class Refresher(Generic[O]):
    """Marks stale Done rows Refreshing; run it as a task next to the reconciler loop."""

    def __init__(self, db: DB, config: Config[O], metrics: ReconcilerMetrics) -> None:
        assert config.refresh_interval is not None
        self.db = db
        self.config = config
        self.metrics = metrics
        self.interval = config.refresh_interval
        self.follow_delay = min(FOLLOW_DELAY, self.interval / 10)
        # Primary key -> due wall time, in the order the rows became Done: a row's due
        # time is its status write's time plus the interval, so that is also the order
        # they come due (a wall clock stepped back delays the rows behind it by that step
        # at most). A row written again moves to the end; a row that is no longer Done, or
        # deleted, leaves. O(1) per change, one entry per Done row: the key is the
        # change's (the table's own bytes object, not a copy) and the value a float,
        # about 117 bytes per row (60,000 frontends: 7 MB).
        self._due: OrderedDict[bytes, float] = OrderedDict()

    async def run(self) -> None:
        """Loop until cancelled."""
        cfg = self.config
        table = cfg.table
        with await self.db.write_txn_async(table) as wtxn:
            it = table.changes(wtxn)
        # A finished transaction still holds the snapshot of every table it began with, and
        # a held snapshot keeps every row version since it (no trim, no log compaction):
        # this coroutine lives as long as the agent, so it must not keep it.
        del wtxn
        try:
            while True:
                try:
                    delay, watch = await self._step(it)
                except Exception:  # a broken status callback must not stop the reconciler
                    log.exception("reconciler %s: refresh of %s failed", cfg.name, table.name)
                    await cfg.clock.sleep(cfg.retry_max_backoff)
                    continue
                if delay is None or delay > 0:
                    await cfg.clock.sleep(delay, [watch])
                    if watch.closed:
                        # Real time, not the clock's: a test's fake clock need not move
                        # for changes to be read.
                        await anyio.sleep(self.follow_delay)
                else:
                    await anyio.lowlevel.checkpoint()
        finally:
            it.close()

    async def _step(self, it: ChangeIterator[O]) -> tuple[float | None, Watch]:
        """Track new changes and mark due rows; return (delay until the next due row, watch)."""
        cfg = self.config
        txn = self.db.read_txn()
        changes, watch = it.next_records(txn)
        del txn
        due = self._due
        # Per change: a deleted row or one not Done leaves, a Done one moves to the end
        # with its due time. This loop runs for every write of the table (the writer's and
        # the reconciler's status), so it reads the stored records (an upsert is a plain
        # tuple (obj, revision, key)) and binds what it calls once.
        get_status = cfg.get_object_status
        interval = self.interval
        drop = due.pop
        to_end = due.move_to_end
        left = _CHECKPOINT_EVERY
        for rec in changes:
            key = rec[2]
            if type(rec) is not tuple:  # a deletion
                drop(key, None)
            else:
                status = get_status(rec[0])
                if status.kind is _DONE:
                    due[key] = status.updated_at + interval
                    to_end(key)
                else:
                    drop(key, None)
            left -= 1
            if not left:
                left = _CHECKPOINT_EVERY
                await anyio.lowlevel.checkpoint()
        if await self._mark_due():
            return 0.0, watch
        if not due:
            return None, watch
        first = next(iter(due.values()))
        return max(0.0, first - cfg.clock.wall()), watch

    async def _mark_due(self) -> int:
        """Mark up to refresh_batch_size due rows Refreshing in one write transaction (taken
        off the event loop while another thread holds the table)."""
        cfg = self.config
        table = cfg.table
        now = cfg.clock.wall()
        due: list[bytes] = []
        entries = self._due
        while entries and len(due) < cfg.refresh_batch_size:
            key, when = next(iter(entries.items()))
            if when > now:
                break
            del entries[key]
            due.append(key)
        if not due:
            return 0
        marked = 0
        interval = self.interval
        with await self.db.write_txn_async(table) as wtxn:
            for key in due:
                obj = table.get(wtxn, table.primary.query_bytes(key))
                if obj is None:
                    continue  # deleted since
                status = cfg.get_object_status(obj)
                if status.kind is not _DONE or status.updated_at + interval > now:
                    # Changed since (not Done, or Done again later): a change not read yet,
                    # whose newer due time is tracked when it is.
                    continue
                try:
                    table.insert(wtxn, cfg.set_object_status(obj, status_refreshing(now)))
                except Exception as exc:
                    log.error("refresh of %s key=%r failed: %s", table.name, key, exc)
                    continue
                marked += 1
        self.metrics.refreshes_total += marked
        return len(due)
