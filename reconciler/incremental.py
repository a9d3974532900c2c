"""Incremental reconciliation: one bounded round of work from the table's change stream and the
retry queue, applied to the target, with the verdicts written back to the rows.

A round collects deletions and Pending/Refreshing rows (skipping unchanged
Done/Error rows) plus due retries, up to the round size; runs deletes before
updates (a snapshot never holds a live row older than a deletion of its key);
then writes Done/Error with compare-and-swap on the row's revision so a newer
write is never overwritten.

The work comes from statedb as the change log's own records
(`ChangeIterator.next_records`: a plain tuple ``(obj, revision, key)`` per
upsert, a `Change` per deletion), used as they are and read by position, with
the encoded primary key (``key``) serving the retry queue and the status
write-back without computing it again.
"""

from __future__ import annotations

import inspect
import itertools
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

import anyio

from reconciler.config import Config
from reconciler.metrics import ReconcilerMetrics
from reconciler.operations import BatchEntry, settle
from reconciler.retries import RetryItem, RetryQueue
from reconciler.status import Status, StatusKind, status_done, status_error
from reconciler.waiting import exhausted_resource
from statedb import DB, Change, ChangeIterator, ReadTxn, Watch, WriteTxn

O = TypeVar("O")

log = logging.getLogger(__name__)

_NEEDS_WORK = (StatusKind.PENDING, StatusKind.REFRESHING)
_ALL_KINDS = tuple(StatusKind)
# Changes examined between two yields to the event loop while skipping Done/Error rows.
_CHECKPOINT_EVERY = 4096



class Updates(Generic[O]):
    """The updates of one round: the rows to hand to the target, and their verdicts' homes.

    ``work[i]`` is an upsert record ``(obj, revision, key)`` (the change stream's plain
    tuple, or a `Change` for a retry or a held row): its ``obj`` goes to the target (unless
    ``targets`` says otherwise) and the verdict is written onto that row at
    ``revision`` under ``key`` if the row's own status is still what it was. The
    change stream's records are used as they are: a round handles thousands.
    ``targets[i]`` is the object to hand to the target instead, for a retry of an
    object that differs from the current row.
    """

    __slots__ = ("changes", "skipped", "targets", "work")

    def __init__(self) -> None:
        self.work: list[tuple[O, int, bytes]] = []
        self.targets: dict[int, O] = {}
        #: How many of ``work`` (the first ones) come from the change stream; the rest
        #: are retries.
        self.changes = 0
        #: Positions in ``work`` left out because a writer replaced the row while the
        #: round ran (see ``Incremental._superseded``): no target call, no verdict.
        self.skipped: set[int] = set()

    def __len__(self) -> int:
        return len(self.work)

    def target(self, i: int) -> O:
        """The object update ``i`` hands to the target."""
        targets = self.targets
        if targets and i in targets:
            return targets[i]
        return self.work[i][0]


def error_text(exc: BaseException) -> str:
    """The message stored in a row's Error status: the exception text, or its type when empty."""
    text = str(exc)
    return text if text else type(exc).__name__


class Incremental(Generic[O]):
    """Runs incremental rounds for one reconciler; owns the table's change iterator."""

    def __init__(
        self, db: DB, config: Config[O], retries: RetryQueue, metrics: ReconcilerMetrics
    ) -> None:
        self.db = db
        self.config = config
        self.table = config.table
        self.retries = retries
        self.metrics = metrics
        self._iter: ChangeIterator[O] | None = None
        self._changes: Iterator[tuple[O, int, bytes]] | None = None
        self._changes_revision = 0
        # Revision of the newest snapshot whose changes were all attempted.
        self.attempted_revision = -1
        # Changed rows skipped because they carried Done or Error (see
        # Config.reconcile_every_change); counted once the initial listing is through.
        self.skipped_settled_writes = 0
        self._listed = False
        #: Whether the table is initialized (set by the Reconciler's loop); until then the
        #: rows ``Config.hold_until_initialized`` selects are held.
        self.table_initialized = False
        #: The held rows: primary key -> revision of the version held (see `_hold` and
        #: `_release_held`).
        self.held: dict[bytes, int] = {}

    # ----- change stream -------------------------------------------------
    async def open(self) -> None:
        """Start tracking the table's changes (the first round sees every row); waits for a
        busy table off the event loop."""
        with await self.db.write_txn_async(self.table) as wtxn:
            self._iter = self.table.changes(wtxn)

    def close(self) -> None:
        """Stop tracking changes so the table can drop deleted rows kept for us."""
        if self._iter is not None:
            self._iter.close()
            self._iter = None
        self._changes = None

    async def resync(self) -> None:
        """Start over from a full listing of the table (after a round failed part way, its
        changes may be half processed; Pending rows are found again, held ones too, stale
        target entries are left to the next prune)."""
        self.held.clear()
        self.close()
        await self.open()

    @property
    def backlog(self) -> bool:
        """True when changes of an earlier snapshot are still waiting (the last round was
        full), or held rows are to be handed over (the table is initialized)."""
        return self._changes is not None or (self.table_initialized and bool(self.held))

    @property
    def caught_up(self) -> bool:
        """True when every change of the table up to the last round's snapshot went to the
        target: no change waits for a round and no row is held."""
        return self._changes is None and not self.held

    def key_text(self, obj: Any) -> str:
        """``repr`` of the row's primary key value (as health messages and problems show
        it), or ``<unknown key>`` when the key function fails."""
        try:
            return repr(self.table.primary.key(obj))  # type: ignore[misc]
        except Exception:  # a broken key function must not hide the real error
            return "<unknown key>"

    def _context(self, op: str, obj: Any, exc: BaseException) -> str:
        return f"{op} {self.table.name} key={self.key_text(obj)}: {error_text(exc)}"

    # ----- one round ----------------------------------------------------------
    async def run_round(self, txn: ReadTxn) -> Watch | None:
        """Process one bounded round against snapshot ``txn``.

        Returns the change stream's watch when this round read new changes (or, when its
        own status commit came right after the round's snapshot, the watch of the table as
        that commit left it), else None.
        """
        assert self._iter is not None, "Incremental.open() was not called"
        watch: Watch | None = None
        if self._changes is None:
            changes, watch = self._iter.next_records(txn)
            self._changes = changes
            self._changes_revision = self.table.revision(txn)
        deletes: list[tuple[O, int]] = []
        updates: Updates[O] = Updates()
        budget = self.config.incremental_round_size
        taken = await self._collect_changes(self._changes, deletes, updates.work, budget)
        if taken < budget:
            self._changes = None
            stream_revision = self._changes_revision
            self._listed = True
        else:
            stream_revision = -1
        if self.held and self.table_initialized:
            taken += self._release_held(txn, updates.work, budget - taken)
        updates.changes = len(updates.work)
        self._collect_retries(txn, deletes, updates, budget - taken)
        if deletes:
            await self._run_deletes(txn, deletes)
        if updates:
            errors = await self._run_updates(txn, updates)
            base, own, after = self._commit_statuses(
                updates, errors, await self._status_txn()
            )
            if base == stream_revision:
                # Nobody wrote between the round's snapshot and its status commit: the
                # commit's own revisions need no attempt (the change stream skips them).
                stream_revision = own
                # The commit closed the watch the round got from the change stream; wait
                # on the one that follows it instead, or the loop would wake for the
                # status writes alone and run an empty round. (Taken against the commit's
                # own snapshot: a write since then gives an already closed watch.)
                watch = self.table.changed_watch(after)
        if stream_revision >= 0 and not self.held:
            # A held row's change is not attempted until it is handed over.
            self.attempted_revision = stream_revision
        self.update_error_metrics()
        return watch

    def update_error_metrics(self) -> None:
        """Failures waiting for a retry, and objects parked for an exhausted resource."""
        parked = self.retries.parked
        self.metrics.current_errors = len(self.retries) - parked
        self.metrics.waiting = parked

    async def _collect_changes(
        self,
        changes: Iterator[tuple[O, int, bytes]],
        deletes: list[tuple[O, int]],
        updates: list[tuple[O, int, bytes]],
        budget: int,
    ) -> int:
        get_status = self.config.get_object_status
        retries = self.retries
        # Retries are only added after collection, so "is the queue empty" holds throughout.
        has_retries = bool(retries)
        needs_work = _ALL_KINDS if self.config.reconcile_every_change else _NEEDS_WORK
        listed = self._listed
        add_update = updates.append
        hold = None if self.table_initialized else self.config.hold_until_initialized
        held = self.held
        taken = 0
        examined = 0
        # The change log's records (obj, revision, key): an upsert is a plain tuple, a
        # deletion a `Change`.
        for rec in changes:
            obj = rec[0]
            if held:
                # A newer version or a deletion of a held row: the held one is obsolete.
                held.pop(rec[2], None)
            if type(rec) is not tuple:  # a deletion
                if has_retries:
                    retries.clear(rec[2])
                deletes.append((obj, rec[1]))
            else:
                status = get_status(obj)
                if status.kind not in needs_work or (hold is not None and hold(obj)):
                    if status.kind in needs_work:
                        self._hold(rec)
                    elif listed:
                        self._skipped_settled(rec)
                    examined += 1
                    if examined >= _CHECKPOINT_EVERY:
                        examined = 0
                        await anyio.lowlevel.checkpoint()
                    continue
                if has_retries:
                    retries.clear(rec[2])
                add_update(rec)
            taken += 1
            if taken >= budget:
                break
        return taken

    def _hold(self, rec: tuple[O, int, bytes]) -> None:
        """Hold a changed row until the table is initialized (its retry, if any, is
        obsolete: this newer version is handed over instead)."""
        self.held[rec[2]] = rec[1]
        if self.retries:
            self.retries.clear(rec[2])

    def _release_held(
        self, txn: ReadTxn, updates: list[tuple[O, int, bytes]], budget: int
    ) -> int:
        """Hand over up to ``budget`` held rows (the table is initialized now): each still
        at its held version in ``txn`` joins the round's updates; one replaced or deleted
        since is dropped, since the change stream hands over its newer version or its
        deletion. Returns how many joined."""
        if budget <= 0:
            return 0
        table = self.table
        query = table.primary.query_bytes
        held = self.held
        n = 0
        for key in list(itertools.islice(held, budget)):
            revision = held.pop(key)
            cur = table.get_revision(txn, query(key))
            if cur is None or cur[1] != revision:
                continue
            updates.append(Change(cur[0], revision, key))
            n += 1
        return n

    def _skipped_settled(self, rec: tuple[O, int, bytes]) -> None:
        """A writer changed a row but left it Done (or Error): say so the first time."""
        self.skipped_settled_writes += 1
        if self.skipped_settled_writes == 1:
            log.warning(
                "reconciler %s: a write to table %s kept the row's %s status (key %s), so it "
                "was not reconciled; give changed rows status_pending(), or set "
                "Config(reconcile_every_change=True)",
                self.config.name, self.table.name,
                self.config.get_object_status(rec[0]).kind.name, self.key_text(rec[0]),
            )

    def _collect_retries(
        self,
        txn: ReadTxn,
        deletes: list[tuple[O, int]],
        updates: Updates[O],
        budget: int,
    ) -> None:
        if not self.retries or budget <= 0:
            return
        # Parked objects whose resource has units free again are due now.
        self.retries.wake(self.config.clock.now())
        table = self.table
        get_status = self.config.get_object_status
        for item in list(self.retries.pop_due(self.config.clock.now(), budget)):
            cur = table.get_revision(txn, table.primary.query_bytes(item.key))
            if item.delete:
                if cur is not None:
                    # The key was inserted again after the failed delete: deleting now
                    # would undo that insert. The insert is (or was) reconciled instead.
                    self.retries.clear(item.key)
                    continue
                deletes.append((item.obj, item.revision))
                continue
            if cur is None:
                # Deleted since; its deletion comes through the change stream.
                self.retries.clear(item.key)
                continue
            row, rev = cur
            own = get_status(row)
            if own.kind is not StatusKind.ERROR:
                # Pending/Refreshing: a newer write is queued in the change stream.
                # Done: already reconciled. Either way this retry is obsolete.
                self.retries.clear(item.key)
                continue
            if rev == item.revision and item.obj is not row:
                updates.targets[len(updates.work)] = item.obj
            updates.work.append(Change(row, rev, item.key))

    async def _in_chunks(
        self,
        what: str,
        call: Callable[[ReadTxn, list[BatchEntry[O]]], Any],
        txn: ReadTxn,
        entries: list[BatchEntry[O]],
        updates: Updates[O] | None = None,
    ) -> None:
        """Hand ``entries`` to the batch operation ``call`` ``target_chunk_size`` at a time,
        yielding to the event loop between chunks; a chunk whose call raises gets the error
        on every entry the call left without a result. Given the round's ``updates``
        (``entries[i]`` is ``updates.work[i]``), the rows a writer replaced during a yield
        are left out of the chunks after it (`_superseded`). With ``Config.target_chunk_max``
        the chunks grow while they are cheap (`next_chunk_size`)."""
        cfg = self.config
        size = low = cfg.target_chunk_size
        high = cfg.target_chunk_max or low
        now = cfg.clock.now
        base = self.table.revision(txn)
        lo, count = 0, len(entries)
        while lo < count:
            hi = lo + size
            part = entries[lo:hi]
            if lo:
                await anyio.lowlevel.checkpoint()
                if updates is not None and self._superseded(updates, lo, hi, base):
                    skipped = updates.skipped
                    part = [e for i, e in enumerate(part, lo) if i not in skipped]
            lo = hi
            if not part:
                continue
            start = now() if high > low else 0.0
            try:
                await settle(call(txn, part))
            except Exception as exc:
                log.warning("%s of %s failed: %s", what, self.table.name, exc)
                for e in part:
                    if e.result is None:
                        e.result = exc
            if high > low:
                size = next_chunk_size(size, now() - start, low, high, cfg.target_chunk_budget)

    def _superseded(self, updates: Updates[O], lo: int, hi: int, base: int) -> bool:
        """Add to ``updates.skipped`` the change-stream rows among ``work[lo:hi]`` that a
        writer replaced (or deleted) since the round's snapshot, at revision ``base``, was
        taken; return whether any was. Such a row's version would reach the target only
        to be replaced at once: the change stream hands over the newer version (or the
        deletion) in a later round, so the target gets the latest version straight away
        (a round yields between chunks, and a writer may commit meanwhile, e.g. the
        EndpointSlices of services whose frontends the round holds). A row whose own
        status is unchanged (another reconciler's status written on it) is still applied,
        as `_commit_statuses` writes the verdict onto such a row. Retries are left alone."""
        hi = min(hi, updates.changes)
        if lo >= hi:
            return False
        table = self.table
        latest = self.db.read_txn()
        if table.revision(latest) == base:
            return False
        get_status = self.config.get_object_status
        query = table.primary.query_bytes
        work, skipped = updates.work, updates.skipped
        found = False
        for i in range(lo, hi):
            w = work[i]
            cur = table.get_revision(latest, query(w[2]))
            if cur is None or (cur[1] != w[1] and get_status(cur[0]) != get_status(w[0])):
                skipped.add(i)
                found = True
        return found

    # ----- deletes ----------------------------------------------------------------
    async def _run_deletes(self, txn: ReadTxn, deletes: list[tuple[O, int]]) -> None:
        m = self.metrics
        failed: list[tuple[O, int, BaseException]] = []
        start = time.perf_counter()
        batch_ops = self.config.batch_operations
        chunk = self.config.target_chunk_size
        if batch_ops is not None:
            entries = [BatchEntry(obj, rev) for obj, rev in deletes]
            await self._in_chunks("delete_batch", batch_ops.delete_batch, txn, entries)
            failed = [(e.obj, e.revision, e.result) for e in entries if e.result is not None]
            succeeded = [e.obj for e in entries if e.result is None]
        else:
            delete = self.config.operations.delete
            succeeded = []
            for n, (obj, rev) in enumerate(deletes):
                if n and n % chunk == 0:
                    await anyio.lowlevel.checkpoint()
                try:
                    await settle(delete(txn, rev, obj))
                except Exception as exc:
                    failed.append((obj, rev, exc))
                else:
                    succeeded.append(obj)
        m.deletes.observe(time.perf_counter() - start, len(deletes))
        if self.retries:
            pk = self.table.primary_key_of
            for obj in succeeded:
                self.retries.clear(pk(obj))
        if failed:
            now = self.config.clock.now()
            m.delete_errors_total += len(failed)
            for obj, rev, err in failed:
                msg = self._context("delete", obj, err)
                log.debug("%s", msg)
                self.retries.add(
                    self.table.primary_key_of(obj), obj, rev, True, msg, now,
                    exhausted_resource(err),
                )

    # ----- updates ----------------------------------------------------------------
    async def _run_updates(
        self, txn: ReadTxn, updates: Updates[O]
    ) -> dict[int, BaseException]:
        """Apply the updates to the target, ``target_chunk_size`` at a time with a yield to
        the event loop in between; return the failures by position in ``updates``."""
        start = time.perf_counter()
        errors: dict[int, BaseException] = {}
        batch_ops = self.config.batch_operations
        chunk = self.config.target_chunk_size
        if batch_ops is not None:
            if updates.targets:
                target = updates.target
                entries = [BatchEntry(target(i), w[1]) for i, w in enumerate(updates.work)]
            else:
                entries = [BatchEntry(w[0], w[1]) for w in updates.work]
            await self._in_chunks("update_batch", batch_ops.update_batch, txn, entries, updates)
            for i, e in enumerate(entries):
                if e.result is not None:
                    errors[i] = e.result
        else:
            update = self.config.operations.update
            isawaitable = inspect.isawaitable
            targets = updates.targets
            skipped = updates.skipped
            base = self.table.revision(txn)
            for i, w in enumerate(updates.work):
                if i and i % chunk == 0:
                    await anyio.lowlevel.checkpoint()
                    self._superseded(updates, i, i + chunk, base)
                if skipped and i in skipped:
                    continue
                try:
                    result = update(txn, w[1], targets[i] if targets and i in targets else w[0])
                    # Inline form of settle(): no coroutine per row for synchronous targets.
                    if result is not None and isawaitable(result):
                        await result
                except Exception as exc:
                    errors[i] = exc
        self.metrics.updates.observe(time.perf_counter() - start, len(updates))
        return errors

    async def _status_txn(self) -> WriteTxn:
        """A write transaction on the table, taken without blocking the event loop: while
        another writer (in any thread) holds the table, wait for it in a worker thread."""
        return await self.db.write_txn_async(self.table)

    def _commit_statuses(
        self, updates: Updates[O], errors: dict[int, BaseException], wtxn: WriteTxn
    ) -> tuple[int, int, ReadTxn]:
        """Write Done/Error onto each row unless the row's own status changed meanwhile, in
        ``wtxn`` (committed here); return the table's revision before and after it, and
        the snapshot the commit made."""
        cfg = self.config
        table = self.table
        wall = cfg.clock.wall()
        done = status_done(wall)
        # Position -> (error, status-write succeeded); only rows that did not end Done+written.
        outcome: dict[int, tuple[BaseException | None, bool]] = {}
        work = updates.work
        try:
            items, positions = self._status_items(updates, errors, done, wall, outcome)
        except BaseException:
            wtxn.abort()  # nothing written yet: give the table back
            raise
        with wtxn:
            base_revision = table.revision(wtxn)
            for k, swap_exc in table.compare_and_swap_many(wtxn, items):
                i = positions[k] if positions is not None else k
                exc = errors.get(i) if errors else None
                problem: BaseException | None = swap_exc
                written = False
                if problem is None:
                    # The row changed or went since the round read it.
                    status = done if exc is None else status_error(error_text(exc), wall)
                    try:
                        written = self._write_if_own_status_unchanged(wtxn, work[i], status)
                    except Exception as retry_exc:
                        problem = retry_exc
                if problem is not None:
                    self._log_status_write_error(work[i][0], problem)
                    if exc is None:
                        exc = problem
                outcome[i] = (exc, written)
            failed: list[tuple[int, int, BaseException]] = []
            for i, (exc, written) in outcome.items():
                if exc is not None and written:
                    cur = table.get_revision(wtxn, table.primary.query_bytes(work[i][2]))
                    rev = cur[1] if cur is not None else table.revision(wtxn)
                    failed.append((i, rev, exc))
            own_revision = table.revision(wtxn)
            after = wtxn.commit()
        # The status writes are ours: do not read them back through the change stream.
        if self._iter is not None:
            self._iter.mark_seen(base_revision, own_revision)
        if self.retries:
            clear = self.retries.clear
            for i, w in enumerate(work):
                if i not in outcome or outcome[i][0] is None:
                    clear(w[2])
        if failed:
            now = cfg.clock.now()
            self.metrics.update_errors_total += len(failed)
            for i, rev, exc in failed:
                msg = self._context("update", updates.target(i), exc)
                log.debug("%s", msg)
                self.retries.add(
                    work[i][2], updates.target(i), rev, False, msg, now, exhausted_resource(exc)
                )
        return base_revision, own_revision, after

    def _status_items(
        self,
        updates: Updates[O],
        errors: dict[int, BaseException],
        done: Status,
        wall: float,
        outcome: dict[int, tuple[BaseException | None, bool]],
    ) -> tuple[list[tuple[bytes, int, Any]], list[int] | None]:
        """The status writes of a round's updates, as `Table.compare_and_swap_many` items
        ``(key, revision, row with its verdict)``, and each item's position in
        ``updates.work`` (None: item k is ``work[k]``). Adds to ``outcome`` the updates
        that failed (with whether their status is to be written) and those whose status
        callback raised (logged here; not written)."""
        set_status = self.config.set_object_status
        work = updates.work
        skipped = updates.skipped
        if not errors and not skipped:
            # The usual round: every update succeeded and none was replaced meanwhile, so
            # every row gets Done. ``set_object_status`` is a function of its arguments:
            # when it raises for a row, the loop below starts over and reports that row.
            try:
                return [(w[2], w[1], set_status(w[0], done)) for w in work], None
            except Exception:
                pass
        items: list[tuple[bytes, int, Any]] = []
        positions: list[int] | None = [] if skipped else None
        for i, w in enumerate(work):
            if skipped and i in skipped:
                continue  # replaced meanwhile: its newer version gets the verdict
            row = w[0]  # obj, by position: the cheapest access in this per-row loop
            exc = errors.get(i) if errors else None
            status = done if exc is None else status_error(error_text(exc), wall)
            try:
                new_row = set_status(row, status)
            except Exception as write_exc:
                self._log_status_write_error(row, write_exc)
                outcome[i] = (exc if exc is not None else write_exc, False)
                if positions is None:
                    positions = list(range(len(items)))
                continue
            items.append((w[2], w[1], new_row))
            if positions is not None:
                positions.append(i)
            if exc is not None:
                outcome[i] = (exc, True)
        return items, positions

    def _log_status_write_error(self, row: Any, exc: BaseException) -> None:
        log.error(
            "reconciler %s: cannot write status of %s key=%s: %s",
            self.config.name, self.table.name, self.key_text(row), exc,
        )

    def _write_if_own_status_unchanged(
        self, wtxn: WriteTxn, w: tuple[O, int, bytes], status: Status
    ) -> bool:
        # The row changed. When only other reconcilers' statuses changed (our own status is
        # exactly what we started from) our verdict still holds: write it onto the new row.
        table = self.table
        get_status = self.config.get_object_status
        cur = table.get_revision(wtxn, table.primary.query_bytes(w[2]))
        if cur is None or get_status(cur[0]) != get_status(w[0]):
            return False
        table.insert(wtxn, self.config.set_object_status(cur[0], status))
        return True


def next_chunk_size(size: int, took: float, low: int, high: int, budget: float) -> int:
    """The size of a round's next chunk after one of ``size`` objects took ``took`` seconds
    (see ``Config.target_chunk_max``): doubled while a chunk takes at most half of
    ``budget``, halved once one takes more, within [``low``, ``high``]."""
    if took * 2 <= budget:
        return min(size * 2, high)
    if took > budget:
        return max(size // 2, low)
    return size


__all__ = ["Incremental", "RetryItem", "Updates", "error_text"]
