"""The stored state of one table, and the per-table part of a write transaction.

A `TableState` is the committed, immutable contents of a table at one
revision: the primary index (ordered map and hash map, both keyed by the
encoded primary key), one ordered map per secondary index, the revision
index (revision -> row, for change iteration) and the graveyard (deletions
kept for change iterators). Rows are stored as ``(obj, revision)`` entries
shared by every index.

A `TableTxn` is a `TableState` whose maps are transients owned by one write
transaction; it applies inserts and deletes and records which keys changed
so that commit can close exactly the affected watches.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import immutables

from statedb.errors import ObjectReusedError, UniqueIndexConflictError
from statedb.sortedmap import EMPTY, SortedMap

if TYPE_CHECKING:
    from statedb.table import Table

Entry = tuple[Any, int]


def nonunique_key(key: bytes, primary: bytes) -> bytes:
    """Key of a non-unique index entry: secondary key, primary key, secondary length."""
    return key + primary + len(key).to_bytes(2, "big")


class TableState:
    """One table's contents at one revision (immutable once committed)."""

    __slots__ = (
        "graveyard",
        "hash",
        "pending_init",
        "primary",
        "revision",
        "revisions",
        "secondary",
    )

    def __init__(self, n_secondary: int) -> None:
        self.revision = 0
        self.primary: SortedMap = EMPTY
        self.hash: Any = immutables.Map()
        self.secondary: list[SortedMap] = [EMPTY] * n_secondary
        self.revisions: SortedMap = EMPTY
        self.graveyard: SortedMap = EMPTY
        self.pending_init: frozenset[str] = frozenset()

    def __len__(self) -> int:
        return len(self.primary)


class TableTxn(TableState):
    """The writable state of one table inside a write transaction."""

    __slots__ = ("base", "changed", "modified", "table")

    def __init__(self, table: Table[Any], base: TableState) -> None:
        self.table = table
        self.base = base
        self.revision = base.revision
        self.primary = base.primary.transient()
        self.hash = base.hash.mutate()
        self.secondary = [m.transient() for m in base.secondary]
        self.revisions = base.revisions.transient()
        self.graveyard = base.graveyard.transient()
        self.pending_init = base.pending_init
        # changed[0]: primary keys; changed[i + 1]: keys of secondary index i.
        self.changed: list[set[bytes]] = [set() for _ in range(len(base.secondary) + 1)]
        self.modified = False

    # ----- writes --------------------------------------------------
    def insert(self, obj: Any) -> Any:
        """Insert or replace the row with obj's primary key; return the replaced row or None."""
        table = self.table
        pk = table.primary_key_of(obj)
        old = self.hash.get(pk)
        if old is not None and old[0] is obj:
            raise ObjectReusedError(table.name, pk)
        indexes = table.secondary
        if indexes:
            new_keys = [idx.keys_of(obj) for idx in indexes]
            self._check_unique(pk, new_keys)
        rev = self.revision + 1
        self.revision = rev
        entry = (obj, rev)
        self.hash[pk] = entry
        self.primary.set(pk, entry)
        if old is not None:
            self.revisions.pop(old[1])
        self.revisions.set(rev, entry)
        self.changed[0].add(pk)
        self.modified = True
        if indexes:
            old_obj = old[0] if old is not None else None
            for i, idx in enumerate(indexes):
                self._update_secondary(i, idx.unique, pk, entry, old_obj, new_keys[i])
        return old[0] if old is not None else None

    def _check_unique(self, pk: bytes, new_keys: list[list[bytes]]) -> None:
        table = self.table
        for i, idx in enumerate(table.secondary):
            if not idx.unique:
                continue
            smap = self.secondary[i]
            for k in new_keys[i]:
                existing = smap.get(k)
                if existing is not None and table.primary_key_of(existing[0]) != pk:
                    raise UniqueIndexConflictError(table.name, idx.name, k)

    def _update_secondary(
        self, i: int, unique: bool, pk: bytes, entry: Entry, old_obj: Any, new_keys: list[bytes]
    ) -> None:
        smap = self.secondary[i]
        changed = self.changed[i + 1]
        if old_obj is not None:
            for k in self.table.secondary[i].keys_of(old_obj):
                if k not in new_keys:
                    smap.pop(k if unique else nonunique_key(k, pk))
                    changed.add(k)
        for k in new_keys:
            smap.set(k if unique else nonunique_key(k, pk), entry)
            changed.add(k)

    def delete(self, obj: Any) -> Any:
        """Delete the row with obj's primary key; return the deleted row or None."""
        table = self.table
        pk = table.primary_key_of(obj)
        old = self.hash.get(pk)
        if old is None:
            return None
        self._delete_entry(pk, old)
        return old[0]

    def _delete_entry(self, pk: bytes, old: Entry) -> None:
        table = self.table
        rev = self.revision + 1
        self.revision = rev
        del self.hash[pk]
        self.primary.pop(pk)
        self.revisions.pop(old[1])
        self.changed[0].add(pk)
        self.modified = True
        old_obj = old[0]
        for i, idx in enumerate(table.secondary):
            smap = self.secondary[i]
            changed = self.changed[i + 1]
            for k in idx.keys_of(old_obj):
                smap.pop(k if idx.unique else nonunique_key(k, pk))
                changed.add(k)
        if table.delete_trackers:
            self.graveyard.set(rev, (old_obj, rev))

    def delete_all(self) -> int:
        """Delete every row; return how many were deleted."""
        items = list(self.primary.freeze().items_from())
        for pk, entry in items:
            self._delete_entry(pk, entry)
        return len(items)

    # ----- commit ---------------------------------------------------
    def collect_garbage(self) -> None:
        """Drop graveyard entries every change iterator has already seen."""
        if not len(self.graveyard):
            return
        trackers = list(self.table.delete_trackers.values())
        if not trackers:
            self.graveyard.clear()
            self.modified = True
            return
        low = min(t[0] for t in trackers)
        if self.graveyard.pop_through(low):
            self.modified = True

    def seal(self) -> TableState:
        """Turn this transaction's maps into an immutable TableState (the txn gives them up)."""
        st = TableState.__new__(TableState)
        st.revision = self.revision
        st.primary = self.primary.seal()
        st.hash = self.hash.finish()
        st.secondary = [m.seal() for m in self.secondary]
        st.revisions = self.revisions.seal()
        st.graveyard = self.graveyard.seal()
        st.pending_init = self.pending_init
        return st
