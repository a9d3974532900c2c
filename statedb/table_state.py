"""The stored state of one table, and the per-table part of a write transaction.

A `TableState` is a table's committed, immutable contents at one revision.
Point data lives in persistent hash maps (immutables' HAMT, written in C):

- ``hash``: encoded primary key -> entry, a `Change` record
  ``(obj, revision, key, False)`` (the row's latest upsert);
- ``secondary[i]``: for a unique index, key -> entry (None for non-unique
  indexes, which exist only as ordered views);
- ``log``: the change log, a list of `Change` records in revision order:
  the entries themselves and tombstones ``(obj, revision, key, True)``,
  appended by writers and read by snapshots only up to their own ``log_len``.
  Change iterators hand these very records out, so reporting a change
  allocates nothing.

Ordered views (sorted maps used by prefix, lower_bound and all) are not
kept up to date by writers; `statedb.ordered` builds them on demand from
the nearest earlier view plus the log, so a write costs only a few HAMT
updates and one list append.

A `TableTxn` is the writable version of a `TableState` inside one write
transaction: its maps are HAMT mutations and it appends to the shared log
(an abort truncates what it appended).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Generic, NamedTuple, TypeVar

import immutables

from statedb.errors import ObjectReusedError, UniqueIndexConflictError
from statedb.sortedmap import SortedMap

if TYPE_CHECKING:
    from statedb.ordered import TxnView
    from statedb.table import Table

O = TypeVar("O")


class Change(NamedTuple, Generic[O]):
    """One upsert or deletion of a row, at the revision that made it: statedb's change record.

    Change iterators (`statedb.ChangeIterator`) yield these, and they are what the table
    stores: the change log and the hash maps hold the same records, so handing one out
    costs no allocation. ``key`` is the row's encoded primary key (what
    `Table.primary_key_of` returns), ready for `Table.compare_and_swap_many` and for
    primary-key queries (``table.primary.query_bytes(key)``). ``obj`` of a deletion is the
    deleted row. A tuple underneath: build one with ``Change(obj, revision, key, deleted)``.
    """

    obj: O
    revision: int
    key: bytes
    deleted: bool


# The stored form of a row or deletion; same thing as Change, named for the storage code.
Entry = Change[Any]
EMPTY_MAP: Any = immutables.Map()
# tuple.__new__ bound once: builds a Change from a prepared tuple without running the
# NamedTuple's Python-level __new__ (the write path creates one record per write).
_tuple_new = tuple.__new__


def new_entry(obj: Any, revision: int, pk: bytes) -> Entry:
    """The record of an upsert of ``obj`` at ``revision`` under primary key ``pk``."""
    return _tuple_new(Change, (obj, revision, pk, False))


def new_tombstone(obj: Any, revision: int, pk: bytes) -> Entry:
    """The record of a deletion (``obj``: the deleted row, or None once no one needs it)."""
    return _tuple_new(Change, (obj, revision, pk, True))


def is_tombstone(e: Entry) -> bool:
    """True for a deletion record in the log."""
    return e[3]


class TableState:
    """One table's contents at one revision (immutable once committed)."""

    __slots__ = (
        "hash",
        "log",
        "log_len",
        "ordered",
        "pending_init",
        "revision",
        "secondary",
        "tombstones",
    )

    def __init__(self, n_secondary: int) -> None:
        self.revision = 0
        self.hash: Any = EMPTY_MAP
        self.secondary: list[Any] = [EMPTY_MAP] * n_secondary  # None: non-unique
        self.log: list[Entry] = []
        self.log_len = 0
        self.tombstones = 0  # deletions held for change iterators (the graveyard)
        self.pending_init: frozenset[str] = frozenset()
        # Ordered views built on demand, per index position (0 = primary).
        self.ordered: list[SortedMap | None] = [None] * (n_secondary + 1)

    def __len__(self) -> int:
        return len(self.hash)


class TableTxn(TableState):
    """The writable state of one table inside a write transaction."""

    __slots__ = ("base", "modified", "table", "view_cache")

    def __init__(self, table: Table[Any], base: TableState) -> None:
        self.table = table
        self.base = base
        self.revision = base.revision
        self.hash = base.hash.mutate()
        self.secondary = [m.mutate() if m is not None else None for m in base.secondary]
        self.log = base.log
        self.log_len = base.log_len
        if len(self.log) != base.log_len:
            # A previous transaction died without abort(); drop its leftovers.
            del self.log[base.log_len :]
        self.tombstones = base.tombstones
        self.pending_init = base.pending_init
        self.ordered = [None] * len(base.ordered)
        # Ordered views of this transaction's contents, per index position.
        self.view_cache: dict[int, TxnView] = {}
        self.modified = False

    # ----- writes --------------------------------------------------
    def insert(self, obj: Any, pk: bytes | None = None) -> Any:
        """Insert or replace the row with obj's primary key; return the replaced row or None.

        ``pk`` is obj's encoded primary key when the caller already has it.
        """
        table = self.table
        if pk is None:
            pk = table.pk_encode(table.pk_key(obj))
        h = self.hash
        old = h.get(pk)
        if old is not None and old[0] is obj:
            raise ObjectReusedError(table.name, pk)
        rev = self.revision + 1
        entry = _tuple_new(Change, (obj, rev, pk, False))
        if table.unique_specs:
            self._index(pk, entry, old)
        self.revision = rev
        h[pk] = entry
        self.log.append(entry)
        self.modified = True
        return old[0] if old is not None else None

    def insert_many(self, objs: Iterable[Any]) -> int:
        """Insert or replace every object in turn (see `Table.insert_many`); return how many."""
        table = self.table
        if table.unique_specs:
            n = 0
            for obj in objs:
                self.insert(obj)
                n += 1
            return n
        key_of = table.pk_key
        encode = table.pk_encode
        h = self.hash
        get = h.get
        append = self.log.append
        new = _tuple_new
        change = Change
        rev = start = self.revision
        try:
            for obj in objs:
                pk = encode(key_of(obj))
                old = get(pk)
                if old is not None and old[0] is obj:
                    raise ObjectReusedError(table.name, pk)
                rev += 1
                entry = new(change, (obj, rev, pk, False))
                h[pk] = entry
                append(entry)
        finally:
            # Also after an error: the rows written so far stay, as with one insert() each.
            self._advance(start, rev)
        return rev - start

    def swap_many(self, items: Iterable[tuple[bytes, int, Any]]) -> list[tuple[int, Any]]:
        """Replace each row stored under key if still at revision (see
        `Table.compare_and_swap_many`); return the positions not written, with the error or
        None."""
        table = self.table
        key_of = table.pk_key
        indexed = bool(table.unique_specs)
        h = self.hash
        get = h.get
        append = self.log.append
        skipped: list[tuple[int, Any]] = []
        new = _tuple_new
        change = Change
        rev = start = self.revision
        try:
            for i, (pk, expected, obj) in enumerate(items):
                old = get(pk)
                if old is None or old[1] != expected:
                    skipped.append((i, None))
                    continue
                old_obj = old[0]
                entry = new(change, (obj, rev + 1, pk, False))
                try:
                    # The stored row has key ``pk``: comparing key values avoids encoding.
                    if key_of(obj) != key_of(old_obj):
                        raise ValueError(
                            f"table {table.name!r}: object's primary key is not {pk!r}"
                        )
                    if old_obj is obj:
                        raise ObjectReusedError(table.name, pk)
                    if indexed:
                        self._index(pk, entry, old)
                except Exception as exc:
                    skipped.append((i, exc))
                    continue
                rev += 1
                h[pk] = entry
                append(entry)
        finally:
            self._advance(start, rev)
        return skipped

    def _advance(self, start: int, rev: int) -> None:
        """Record the revision a bulk write reached (``start``: where it began)."""
        self.revision = rev
        if rev != start:
            self.modified = True

    def _index(self, pk: bytes, entry: Entry, old: Entry | None) -> None:
        """Update the unique secondary indexes for ``entry`` replacing ``old`` (checks first)."""
        table = self.table
        obj = entry[0]
        old_obj = old[0] if old is not None else None
        specs = table.unique_specs
        new_keys = [
            [enc(one(obj))] if one is not None else [enc(k) for k in many(obj)]
            for _, one, many, enc in specs
        ]
        self._check_unique(pk, new_keys)
        for (i, one, many, enc), nks in zip(specs, new_keys):
            smap = self.secondary[i]
            if old_obj is not None:
                oks = [enc(one(old_obj))] if one is not None else [enc(k) for k in many(old_obj)]
                for k in oks:
                    if k not in nks:
                        del smap[k]
            for k in nks:
                smap[k] = entry

    def _check_unique(self, pk: bytes, new_keys: list[list[bytes]]) -> None:
        table = self.table
        for (i, _, _, _), keys in zip(table.unique_specs, new_keys):
            smap = self.secondary[i]
            for k in keys:
                existing = smap.get(k)
                if existing is not None and existing[2] != pk:
                    raise UniqueIndexConflictError(table.name, table.secondary[i].name, k)

    def delete(self, obj: Any) -> Any:
        """Delete the row with obj's primary key; return the deleted row or None."""
        table = self.table
        pk = table.pk_encode(table.pk_key(obj))
        old = self.hash.get(pk)
        if old is None:
            return None
        self._delete_entry(pk, old)
        return old[0]

    def _delete_entry(self, pk: bytes, old: Entry) -> None:
        rev = self.revision + 1
        self.revision = rev
        del self.hash[pk]
        old_obj = old[0]
        table = self.table
        if table.delete_trackers:
            # Held for change iterators: the graveyard, released by release_tombstones.
            table.held_tombstones.append((rev, len(self.log)))
            self.log.append(new_tombstone(old_obj, rev, pk))
        else:
            self.log.append(new_tombstone(None, rev, pk))
        self.modified = True
        for i, idx in enumerate(table.secondary):
            if idx.unique:
                smap = self.secondary[i]
                for k in idx.keys_of(old_obj):
                    del smap[k]

    def delete_all(self) -> int:
        """Delete every row; return how many were deleted."""
        # A HAMT mutation cannot be iterated: finish it, read it, and mutate anew.
        current = self.hash.finish()
        self.hash = current.mutate()
        items = list(current.items())
        for pk, entry in items:
            self._delete_entry(pk, entry)
        return len(items)

    # ----- commit and abort -----------------------------------------
    def seal(self) -> TableState:
        """Return this transaction's contents as an immutable TableState."""
        st = TableState.__new__(TableState)
        st.revision = self.revision
        st.hash = self.hash.finish()
        st.secondary = [m.finish() if m is not None else None for m in self.secondary]
        st.log = self.log
        st.log_len = len(self.log)
        st.tombstones = self.tombstones
        st.pending_init = self.pending_init
        st.ordered = [None] * len(self.ordered)
        return st

    def discard(self) -> None:
        """Undo this transaction's log appends (abort)."""
        end = self.base.log_len
        held = self.table.held_tombstones
        while held and held[-1][1] >= end:
            held.pop()
        del self.log[end:]

    def release_tombstones(self) -> None:
        """Drop the objects of deletions every change iterator has seen (graveyard GC).

        The log keeps an object-less record (the key is still needed to derive ordered
        views); iterators copy their records when next() is called, so rewriting a slot
        in place cannot disturb one.
        """
        held = self.table.held_tombstones
        if held:
            trackers = list(self.table.delete_trackers.values())
            low = min(t[0] for t in trackers) if trackers else self.revision
            log = self.log
            while held and held[0][0] <= low:
                _, pos = held.popleft()
                e = log[pos]
                log[pos] = new_tombstone(None, e[1], e[2])
        self.tombstones = len(held)
