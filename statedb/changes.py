"""Change iterators: every upsert and deletion of a table, each exactly once, in revision order.

The first `ChangeIterator.next` returns every current row as an upsert; each
later call returns what was committed since, read from the table's change
log: every deletion, and each row's latest upsert (an upsert superseded by a
later write is skipped, the later one is reported). While an iterator is
open, log compaction keeps the deletions it has not seen; `close` releases
that hold.

Changes come out as `Change` records (obj, revision, key; deleted), read
from the records the table's log stores: deletions as they are, upserts (a
plain tuple of the same fields in the table) as a `Change` built when the
caller takes it; `ChangeIterator.next_records` hands out the stored records
themselves, for consumers of every write of a busy table.
"""

from __future__ import annotations

import itertools
import weakref
from collections import deque
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from statedb.table_state import (
    Change,
    Deletion,
    Entry,
    TableState,
    TableTxn,
    as_change,
    live_entries,
    log_position,
)
from statedb.watch import Watch

if TYPE_CHECKING:
    from statedb.table import Table
    from statedb.txn import ReadTxn

O = TypeVar("O")

_ids = itertools.count(1)
# Builds a Change from a stored upsert's tuple, in C.
_tuple_new = tuple.__new__

# Ends a draining iterator's queue (see `_draining`).
_END = object()

#: A batch of up to this many log records is decided in `ChangeIterator.next` itself; a
#: larger one while it is consumed (`_deciding`), so that no single call stalls its caller.
EAGER_RECORDS = 4096
#: Records a large batch decides per record it hands out: the snapshot is let go of once
#: an eighth of the batch is consumed.
DECIDE_AHEAD = 8

# Whether a log record of snapshot ``st`` is a change to report (decided inline per record
# in `_deciding` and `ChangeIterator._since`): a deletion always; an upsert while it is
# still its key's row in ``st``. The version store's head is that row when it is the
# record. A head at or below ``st``'s revision is the row ``st`` sees (heads only get
# newer, and a writer's uncommitted head is above every committed revision), so any other
# record is superseded without asking the version store; only a head newer than ``st``
# needs ``st.entry``.


def _draining(records: list[Entry]) -> Iterator[Entry]:
    """An iterator over ``records`` that lets go of each record as it hands it out.

    The iterator of a large batch of changes is consumed over many rounds (the reconciler
    takes a bounded number per round); a list iterator would keep every record, and through
    it every row version already handled, alive until the last one. A queue popped from
    the front in C (``iter(popleft, end)``) frees them as it goes, at no cost per record.
    """
    queue: deque[Any] = deque(records)
    queue.append(_END)
    return iter(queue.popleft, _END)


def _deciding(records: list[Entry], st: TableState, raw: bool) -> Iterator[Any]:
    """The changes among ``records`` (a slice of ``st``'s log), decided ahead of the consumer:
    `Change` records, or the stored records themselves when ``raw`` (see
    `ChangeIterator.next_records`).

    Deciding whether an upsert is still its key's row in ``st`` costs a dict lookup or two
    per record, a cache miss each in a large table: for a million records, a third of a
    second in one call. This generator decides `DECIDE_AHEAD` records per record it hands
    out, so the work is spread over the consumer's rounds, and lets go of ``st`` (and of
    every record it has passed) once all are decided.
    """
    queue = records  # the caller's own copy: reversed in place, taken from the end
    queue.reverse()
    del records
    out: deque[Entry] = deque()
    take, put, give = queue.pop, out.append, out.popleft
    rows_get = st.rows.get
    entry = st.entry  # holds st: deleted below once every record is decided
    revision = st.revision
    del st
    deletion = Deletion
    while queue:
        for _ in range(min(DECIDE_AHEAD, len(queue))):
            e = take()
            if (
                type(e) is deletion
                or (h := rows_get(e[2])) is e
                or (h is not None and h[1] > revision and entry(e[2]) is e)
            ):
                put(e)
        if not queue:
            break  # every record decided: let go of st before handing out another
        if out:
            yield give() if raw else as_change(give())
    del entry
    while out:
        yield give() if raw else as_change(give())


class ChangeIterator(Generic[O]):
    """Iterates over a table's changes; create with ``table.changes(wtxn)``."""

    def __init__(self, table: Table[O], start_revision: int) -> None:
        self.table = table
        self._id = next(_ids)
        self._start = start_revision
        self._seen = -1  # -1: the first next() returns every row
        # Revision ranges (lo, hi] after _seen that the owner wrote itself (mark_seen).
        self._own: list[tuple[int, int]] = []
        # The tracker holds the last revision delivered; deletions after it are kept.
        self._tracker = [start_revision]
        table.delete_trackers[self._id] = self._tracker
        self._finalizer = weakref.finalize(self, table.delete_trackers.pop, self._id, None)

    @property
    def closed(self) -> bool:
        """True after close()."""
        return not self._finalizer.alive

    def close(self) -> None:
        """Stop tracking; the table may now drop deleted rows kept for this iterator."""
        self._finalizer()

    def next(self, txn: ReadTxn) -> tuple[Iterator[Change[O]], Watch]:
        """Return the changes committed up to ``txn``'s snapshot since the last call, and a
        watch that closes when more changes arrive.

        Each change is a `Change` record ``(obj, revision, key)`` with ``deleted``, made of the
        table's own log record when the caller takes it (a deletion is that record), so
        ``key`` (the encoded primary key) need not be computed again by a caller writing
        rows back.
        """
        return self._next(txn, False)

    def next_records(self, txn: ReadTxn) -> tuple[Iterator[tuple[O, int, bytes]], Watch]:
        """`next`, with each change handed out as the table stores it: an upsert as a plain
        tuple ``(obj, revision, key)``, a deletion as its `Deletion` record (a `Change`, also
        a tuple of those fields). Tell them apart by type (``type(rec) is tuple``: an
        upsert), read the fields by position.

        For consumers that read every change of a busy table (the reconciler and its
        refresher read each write of their table): a record costs no new object, where
        `next` builds a `Change` of each upsert (about 600 instructions with its
        deallocation). The same changes as `next`, in the same order; the two may be
        mixed on one iterator.
        """
        return self._next(txn, True)

    def _next(self, txn: ReadTxn, raw: bool) -> tuple[Iterator[Any], Watch]:
        if self.closed:
            raise RuntimeError(f"change iterator of table {self.table.name!r} is closed")
        st = self.table.state(txn)
        if isinstance(st, TableTxn):
            st = st.base  # changes are reported once committed
        if st.revision < self._start:
            raise ValueError(
                f"table {self.table.name!r}: snapshot at revision {st.revision} is older than "
                f"the change iterator (created at {self._start}); take a new read_txn()"
            )
        seen, upto = self._seen, st.revision
        records: Iterator[Any]
        if seen < 0:
            records = self._current(st, raw)
        elif upto <= seen:
            # An older (or the same) snapshot: nothing new, and no rewinding.
            return iter(()), self.table.changed_watch(txn)
        else:
            own = sorted(r for r in self._own if r[0] < upto)
            records = self._since(st, seen, own, raw)
            if self._own:
                self._own = [r for r in self._own if r[1] > upto]
        self._seen = upto
        self._tracker[0] = upto
        return records, self.table.changed_watch(txn)

    def mark_seen(self, from_revision: int, to_revision: int) -> bool:
        """Skip revisions (from_revision, to_revision]: the caller's own write transaction.

        For a writer that iterates its own table: every revision of its own write
        transaction is its own (the table lock excludes other writers), so it need not
        read them back. Commits by others before or after that range are still reported.
        Returns False (and changes nothing) before the first `next` (which lists every
        row, own writes included) or for a range that is not after what was delivered.
        """
        seen = self._seen
        if seen < 0 or to_revision < from_revision or from_revision < seen:
            return False
        if from_revision == seen:
            self._seen = to_revision
            self._tracker[0] = to_revision
        elif to_revision > from_revision:
            self._own.append((from_revision, to_revision))
        return True

    @staticmethod
    def _current(st: TableState, raw: bool) -> Iterator[Any]:
        """Every row of the snapshot, as upsert records in revision order (stored records
        when ``raw``)."""
        if raw:
            return _draining(live_entries(st))
        # Every record is an upsert: built as Change by map in C, one record at a time.
        return map(_tuple_new, itertools.repeat(Change), _draining(live_entries(st)))

    @staticmethod
    def _since(st: TableState, seen: int, own: list[tuple[int, int]], raw: bool) -> Iterator[Any]:
        """Deletions and latest upserts after revision ``seen``, in revision order (stored
        records when ``raw``), leaving out the revision ranges ``own`` ((lo, hi],
        ascending): the log slice is cut around them by binary search, so skipping costs
        nothing per record."""
        rows_get = st.rows.get
        entry = st.entry
        log, n = st.log, st.log_len
        start = log_position(log, n, seen)
        if not own:
            records = log[start:n]  # copied now: see TableTxn.release_tombstones
        else:
            records = []
            for lo, hi in own:
                cut = log_position(log, n, lo)
                records += log[start:cut]
                start = max(start, log_position(log, n, hi))
            records += log[start:n]
        # Every deletion; an upsert only while it is still its key's row in st (mostly one
        # dict lookup: see the note above `_deciding`). A small batch is decided now, while
        # the caller holds st, a large one ahead of its consumer (`_deciding`): either way
        # the iterator does not keep st until its last record, so a stream consumed over
        # many rounds does not keep every older version of what it reports.
        if len(records) > EAGER_RECORDS:
            return _deciding(records, st, raw)
        deletion = Deletion
        revision = st.revision
        kept = [
            e
            for e in records
            if type(e) is deletion
            or (h := rows_get(e[2])) is e
            or (h is not None and h[1] > revision and entry(e[2]) is e)
        ]
        if raw:
            return _draining(kept)
        if deletion in map(type, kept):
            return map(as_change, _draining(kept))
        # Upserts only: each built as a Change by map in C.
        return map(_tuple_new, itertools.repeat(Change), _draining(kept))
