"""Change iterators: every upsert and deletion of a table, each exactly once, in revision order.

The first `ChangeIterator.next` returns every current row as an upsert; each
later call returns what was committed since, merging the revision index
(upserts) with the graveyard (deletions). While an iterator is open the
table keeps deleted rows in its graveyard; commits drop graveyard entries
every open iterator has seen, and `close` releases the iterator's hold.
"""

from __future__ import annotations

import heapq
import itertools
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Generic, TypeVar

from statedb.watch import Watch

if TYPE_CHECKING:
    from statedb.table import Table
    from statedb.txn import ReadTxn

O = TypeVar("O")

_ids = itertools.count(1)


@dataclass(frozen=True, slots=True)
class Change(Generic[O]):
    """One upsert or deletion of a row, at the revision that made it."""

    obj: O
    revision: int
    deleted: bool


class ChangeIterator(Generic[O]):
    """Iterates over a table's changes; create with ``table.changes(wtxn)``."""

    def __init__(self, table: Table[O], start_revision: int) -> None:
        self.table = table
        self._id = next(_ids)
        self._start = start_revision
        self._seen = -1  # -1: the first next() returns every row
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
        watch that closes when more changes arrive."""
        if self.closed:
            raise RuntimeError(f"change iterator of table {self.table.name!r} is closed")
        st = self.table._state(txn)
        if st.revision < self._start:
            raise ValueError(
                f"table {self.table.name!r}: snapshot at revision {st.revision} is older than "
                f"the change iterator (created at {self._start}); take a new read_txn()"
            )
        seen, upto = self._seen, st.revision
        if seen < 0:
            changes = self._all(st.revisions.values_from())
        elif upto <= seen:
            changes = iter(())
        else:
            ups = st.revisions.items_from(seen + 1)
            dels = st.graveyard.items_from(seen + 1)
            changes = self._merge(ups, dels, upto)
        self._seen = upto
        self._tracker[0] = upto
        return changes, self.table._table_watch(txn)

    @staticmethod
    def _all(entries: Iterator[tuple[O, int]]) -> Iterator[Change[O]]:
        for obj, rev in entries:
            yield Change(obj, rev, False)

    @staticmethod
    def _merge(
        ups: Iterator[tuple[int, tuple[O, int]]],
        dels: Iterator[tuple[int, tuple[O, int]]],
        upto: int,
    ) -> Iterator[Change[O]]:
        tagged_ups = ((rev, e[0], False) for rev, e in ups)
        tagged_dels = ((rev, e[0], True) for rev, e in dels)
        for rev, obj, deleted in heapq.merge(tagged_ups, tagged_dels, key=lambda c: c[0]):
            if rev > upto:
                return
            yield Change(obj, rev, deleted)
