"""The stored state of one table, and the per-table part of a write transaction.

A `TableState` is a table's contents at one revision: a snapshot. Its data
lives in structures shared by every snapshot of the table, read at the
snapshot's revision:

- ``store``: a multi-version map (`statedb.versions.VersionStore`) from the
  encoded primary key to the row's records (`Entry`): a plain tuple
  ``(obj, revision, key)`` for an upsert, a `Deletion` for a deletion;
  ``rows`` is its dict of newest records, the fast path of a lookup;
- ``secondary[i]``: for a unique index, a multi-version map from index key to
  the row's record (None for non-unique indexes, which exist only as ordered
  views);
- ``log``: the change log, a list of the same records in revision
  order, appended by writers and read by a snapshot only up to its own
  ``log_len``. Change iterators read it (handing out each upsert as a
  `Change`), and iteration over a snapshot goes through the log (never
  through the mutable dicts).

A committed `TableState` object is registered with its table's snapshot
tracker (`SnapshotTracker`): while it is referenced, the records it can see
are kept, and only those: each write transaction starts by dropping the
records of the keys written since the last one that no live snapshot sees,
and once a snapshot dies a sweep checks every key with older records again, a
slice per transaction (`TableTxn._trim`, `VersionStore.retain`).

Ordered views (sorted maps used by prefix, lower_bound and all) are not
kept up to date by writers; `statedb.ordered` builds them on demand from
the nearest earlier view plus the log.

A `TableTxn` is the writable version of a `TableState` inside one write
transaction: it writes records above the committed revision into the shared
stores (invisible to every snapshot until the commit publishes the new
revision) and appends to the shared log; an abort takes them out again.
"""

from __future__ import annotations

import weakref
from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Sequence
from operator import itemgetter
from typing import TYPE_CHECKING, Any, ClassVar, Generic, NamedTuple, TypeVar

from statedb.errors import ObjectReusedError, UniqueIndexConflictError
from statedb.sortedmap import SortedMap
from statedb.versions import WRITING, VersionStore

if TYPE_CHECKING:
    from statedb.ordered import TxnOverlay, TxnView
    from statedb.table import Table

O = TypeVar("O")


class _ChangeFields(NamedTuple, Generic[O]):
    """The tuple fields of a `Change` (a NamedTuple body cannot hold class attributes)."""

    obj: O
    revision: int
    key: bytes


# The generated __new__ lives in a namespace of its own, where this module's string
# annotations cannot be resolved (documentation tools and get_type_hints try): give it
# the objects themselves.
_ChangeFields.__new__.__annotations__ = {"obj": O, "revision": int, "key": bytes}


class Change(_ChangeFields[O]):
    """One upsert or deletion of a row, at the revision that made it: statedb's change record.

    Change iterators (`statedb.ChangeIterator`) yield these. ``obj`` is the row (for a
    deletion, the deleted row),
    ``revision`` the revision of the write, ``key`` the row's encoded primary key (what
    `Table.primary_key_of` returns), ready for `Table.compare_and_swap_many` and for
    primary-key queries (``table.primary.query_bytes(key)``), and ``deleted`` is True
    for a deletion.

    A named tuple of ``(obj, revision, key)``; ``deleted`` is a class attribute, True on
    deletion records (instances of the `Deletion` subclass), so a record costs three
    slots and reading ``deleted`` is one attribute lookup. Build an upsert record with
    ``Change(obj, revision, key)``, a deletion with `Change.deletion`.

    The table stores deletions as these very records, and upserts as plain tuples of the
    same three fields (8 bytes a row less: CPython allocates a tuple subclass with one
    spare item); a change iterator hands an upsert out as a `Change` of its fields.
    """

    __slots__ = ()
    deleted: ClassVar[bool] = False

    @staticmethod
    def deletion(obj: Any, revision: int, key: bytes) -> Change[Any]:
        """The record of the deletion of ``obj`` (key ``key``) at ``revision``."""
        return _tuple_new(Deletion, (obj, revision, key))


class Deletion(Change[O]):
    """A `Change` that is a deletion (``deleted`` is True)."""

    __slots__ = ()
    deleted = True


class Gap(Change[Any]):
    """What fills a log slot whose upsert record was dropped: it has no row and no key.

    Trimming drops the upserts superseded below every live snapshot from the version
    stores; their log slots then hold a `Gap` instead, so the record, its revision and its
    row are freed without copying the log (a copy would move every position the log's
    readers and `Table.held_tombstones` refer to). A gap's revision is the one of the slot
    before it, so the log stays in revision order for binary searches, and one gap object
    fills a whole run of slots. No reader reports a gap: it is not a deletion and not the
    record of any key (its key, ``b""``, is never stored with it).
    """

    __slots__ = ()


# A stored record: a plain tuple (obj, revision, key) for an upsert (``type(e) is tuple``
# tells it), a Deletion for a deletion, and in the log also a Gap.
Entry = tuple[Any, int, bytes]
# tuple.__new__ bound once: builds a Change from a prepared tuple without running the
# NamedTuple's Python-level __new__ (the write path creates one record per write).
_tuple_new = tuple.__new__


def new_tombstone(obj: Any, revision: int, pk: bytes) -> Entry:
    """The record of a deletion (``obj``: the deleted row, or None once no one needs it)."""
    return _tuple_new(Deletion, (obj, revision, pk))


def is_tombstone(e: Entry) -> bool:
    """True for a deletion record in the log."""
    return type(e) is Deletion


def as_change(e: Entry) -> Change[Any]:
    """A stored record as a change iterator hands it out: a `Change` (deletions already are)."""
    return _tuple_new(Change, e) if type(e) is tuple else e  # type: ignore[return-value]


_rev = itemgetter(1)
_key = itemgetter(2)


def log_position(log: list[Entry], log_len: int, revision: int) -> int:
    """Return the position of the first log record with a revision above ``revision``."""
    return bisect_right(log, revision, 0, log_len, key=_rev)


#: Keys of ``older`` the sweep checks at least per write transaction while a pass is
#: under way (or `SWEEP_PER_WRITE` per record written since the last one, whichever is
#: more, so that a pass keeps up with the writes). Small, because every write
#: transaction pays for it on the writer's thread (the event loop): checking a key costs
#: ~1.4 us, ~4 us when its records go (their log slots are vacated by binary search in
#: a compacted log), so a pass after a long-held snapshot died cost 512 keys, ~3 ms, per
#: transaction of a 60,000-frontend table (benchmarks/k8s.py --scale, its churn's stall
#: cluster); 128 bound it to ~0.5 ms and a quarter of the sweep's CPU while it is held.
SWEEP_CHUNK = 128
SWEEP_PER_WRITE = 2
_NO_REVISIONS: frozenset[int] = frozenset()

# Fills the first slot of a log (nothing before it to take a revision from).
_FIRST_GAP = _tuple_new(Gap, (None, 0, b""))


def vacate(log: list[Entry], n: int, dropped: list[Entry]) -> int:
    """Replace the upsert records ``dropped`` in ``log[:n]`` by gaps; return how many.

    Deletions stay (change iterators and the graveyard's positions need them), and so do
    records no longer in this log (a compaction since left them out).
    """
    if not n:
        return 0
    vacated = 0
    # Between compactions each revision has one slot, so a record's position is found by
    # counting back from the last one; a compacted stretch needs a binary search (a gap
    # never comes before the record whose revision it copies).
    last = n - 1 - log[n - 1][1]
    for e in dropped:
        if type(e) is not tuple:
            continue
        rev = e[1]
        i = last + rev
        if i < 0 or i >= n or log[i] is not e:
            i = bisect_left(log, rev, 0, n, key=_rev)
            if i >= n or log[i] is not e:
                continue
        prev = log[i - 1] if i else _FIRST_GAP
        log[i] = prev if type(prev) is Gap else _tuple_new(Gap, (None, prev[1], b""))
        vacated += 1
    return vacated


class SnapshotTracker:
    """The revisions of a table's live snapshots (committed `TableState` objects).

    Each committed state gets a weak reference whose callback forgets it when the
    state is freed: no reader registers or unregisters anything, so `DB.read_txn`
    stays one reference copy, and a dropped snapshot cannot leak.
    """

    __slots__ = ("live",)

    def __init__(self) -> None:
        # weak reference -> revision; the callback (dict.pop) runs when the state dies.
        self.live: dict[weakref.ref[TableState], int] = {}

    def track(self, st: TableState) -> None:
        """Keep what ``st`` can see until ``st`` is freed."""
        live = self.live
        live[weakref.ref(st, live.pop)] = st.revision

    def revisions(self, current: int) -> list[int]:
        """The distinct revisions of the live snapshots and ``current`` (the committed
        revision), ascending."""
        while True:
            try:
                if min(self.live.values(), default=current) >= current:
                    return [current]  # the common case: only the committed state is live
                revs = set(self.live.values())
            except RuntimeError:
                # A snapshot was freed (its callback ran) during the scan: scan again.
                continue
            revs.add(current)
            return sorted(revs)

    def oldest(self, default: int) -> int:
        """The lowest revision of a live snapshot (``default`` when none is live)."""
        while True:
            try:
                return min(self.live.values(), default=default)
            except RuntimeError:
                # A snapshot was freed (its callback ran) during the scan: scan again.
                continue


class TableState:
    """One table's contents at one revision (immutable once committed)."""

    __slots__ = (
        "__weakref__",
        "count",
        "log",
        "log_len",
        "ordered",
        "pending_init",
        "revision",
        "rows",
        "secondary",
        "store",
        "tombstones",
    )

    def __init__(self, store: VersionStore, secondary: list[VersionStore | None]) -> None:
        self.revision = 0
        self.store = store
        self.rows = store.heads
        self.secondary = secondary  # None: non-unique
        self.count = 0
        self.log: list[Entry] = []
        self.log_len = 0
        self.tombstones = 0  # deletions held for change iterators (the graveyard)
        self.pending_init: frozenset[str] = frozenset()
        # Ordered views built on demand, per index position (0 = primary).
        self.ordered: list[SortedMap | None] = [None] * (len(secondary) + 1)

    def __len__(self) -> int:
        return self.count

    def entry(self, pk: bytes) -> Entry | None:
        """The stored record of the row with primary key ``pk`` in this snapshot, or None."""
        e = self.rows.get(pk)
        if e is None:
            return None
        if self.revision < self.store.newest and e[1] > self.revision:
            return self.store.older_at(pk, self.revision, e)
        return e if type(e) is tuple else None

    def index_entry(self, i: int, key: bytes) -> Entry | None:
        """The record of the row under ``key`` in unique secondary index ``i``, or None."""
        store = self.secondary[i]
        assert store is not None
        return store.get(key, self.revision)

    def copy(self) -> TableState:
        """A new state object with the same contents (the caller registers it)."""
        return _state_of(self, self.log_len)


def live_entries(st: TableState) -> list[Entry]:
    """Every row record of snapshot ``st``, in revision order, read through the log.

    The log slice is copied first (a C-level copy), so writers appending, compacting or
    releasing tombstones meanwhile cannot disturb the scan.
    """
    n = len(st.log) if isinstance(st, TableTxn) else st.log_len
    records = st.log[:n]
    rows_get = st.rows.get
    entry = st.entry
    # A record is a live row when it is the newest record of its key in st: mostly it is
    # still the head (one dict lookup); otherwise ask the version store.
    return [e for e in records if type(e) is tuple and (rows_get(e[2]) is e or entry(e[2]) is e)]


class TableTxn(TableState):
    """The writable state of one table inside a write transaction."""

    __slots__ = ("base", "modified", "overlays", "superseded", "table", "view_cache")

    def __init__(self, table: Table[Any], base: TableState) -> None:
        self.table = table
        self.base = base
        self.revision = base.revision
        self.store = base.store
        self.rows = base.rows
        self.secondary = base.secondary
        self.count = base.count
        self.log = base.log
        self.log_len = base.log_len
        self.tombstones = base.tombstones
        self.pending_init = base.pending_init
        self.ordered = [None] * len(base.ordered)
        # Ordered views of this transaction's contents, per index position.
        self.view_cache: dict[int, TxnView] = {}
        # Its own writes as non-unique indexes see them, per index position.
        self.overlays: dict[int, TxnOverlay] = {}
        self.modified = False
        # Upsert records this transaction wrote and then replaced or deleted itself: no
        # snapshot or change iterator can ever see them, so `seal` frees their log slots.
        self.superseded: list[Entry] = []
        # Before any head is installed (also by the leftover cleanup below): readers
        # compare revisions until the transaction ends (see VersionStore.newest).
        for store in self._stores():
            store.newest = WRITING
        if len(self.log) != base.log_len:
            # A previous transaction died without abort(); take out its leftovers.
            self.discard()
        self._trim()

    def _stores(self) -> list[VersionStore]:
        """The version stores of this table (primary, then unique secondary indexes)."""
        return [self.store, *(s for s in self.secondary if s is not None)]

    def settle(self, revision: int) -> None:
        """Mark the stores as holding no head above ``revision`` (the committed revision),
        once this transaction's records are either published or taken out."""
        for store in self._stores():
            store.newest = revision

    def entry(self, pk: bytes) -> Entry | None:
        """The record of ``pk`` as this transaction sees it (its own writes included)."""
        # The writer holds the table lock: every head is committed or its own, so the
        # head is what it sees.
        e = self.rows.get(pk)
        return e if type(e) is tuple else None

    # ----- writes --------------------------------------------------
    def insert(self, obj: Any, pk: bytes | None = None) -> Any:
        """Insert or replace the row with obj's primary key; return the replaced row or None.

        ``pk`` is obj's encoded primary key when the caller already has it.
        """
        table = self.table
        if pk is None:
            # Loads then calls: ``table.f(x)`` on an instance attribute takes the generic
            # method lookup.
            key_of = table.pk_key
            k: Any = key_of(obj)
            kind = type(k)
            if kind is table.pk_self_type:
                pk = k
            elif kind is table.pk_c_type:
                # The encoder's C-level equivalent (see `Table.get`); the encoder itself
                # raises its own error for a key the equivalent cannot encode.
                c_encode = table.pk_c_encode
                try:
                    pk = c_encode(k)
                except Exception:
                    encode = table.pk_encode
                    pk = encode(k)
            else:
                encode = table.pk_encode
                pk = encode(k)
        heads = self.rows
        head = old = heads.get(pk)
        if old is not None:
            if type(old) is not tuple:
                old = None  # a deletion record
            elif old[0] is obj:
                raise ObjectReusedError(table.name, pk)
        rev = self.revision + 1
        entry = (obj, rev, pk)
        if table.unique_specs:
            self._index(pk, entry, old)
        self.revision = rev
        base_rev = self.base.revision
        # VersionStore.put, inlined (``rows`` is the store's ``heads``): a committed head
        # moves to ``older`` for the snapshots, before the new one is installed.
        if head is not None and head[1] <= base_rev:
            self.store.keep_older(pk, head)
        heads[pk] = entry
        self.log.append(entry)
        if old is None:
            self.count += 1
        elif old[1] > base_rev:
            self.superseded.append(old)
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
        self_type = table.pk_self_type
        store = self.store
        heads = store.heads
        get = heads.get
        keep_older = store.keep_older
        base_rev = self.base.revision
        append = self.log.append
        superseded = self.superseded
        added = 0
        rev = start = self.revision
        try:
            for obj in objs:
                k: Any = key_of(obj)
                pk = k if type(k) is self_type else encode(k)
                old = get(pk)
                if old is None or type(old) is not tuple:
                    added += 1
                elif old[0] is obj:
                    raise ObjectReusedError(table.name, pk)
                rev += 1
                entry = (obj, rev, pk)
                # VersionStore.put, inlined: keep the committed head for snapshots.
                if old is not None:
                    if old[1] <= base_rev:
                        keep_older(pk, old)
                    elif type(old) is tuple:
                        superseded.append(old)
                heads[pk] = entry
                append(entry)
        finally:
            # Also after an error: the rows written so far stay, as with one insert() each.
            self.count += added
            self._advance(start, rev)
        return rev - start

    def insert_new(self, objs: Sequence[Any], start: int = 0, pks: Sequence[bytes] = ()) -> int:
        """Insert ``objs[start:]`` in order while no row has the object's key; return the
        position of the first object not written (its key has a row), or ``len(objs)``
        (see `Table.insert_new`; ``pks``: their encoded keys, when given)."""
        table = self.table
        n = len(objs)
        if table.unique_specs:
            entry_of = self.entry
            for i in range(start, n):
                obj = objs[i]
                pk = pks[i] if pks else table.pk_encode(table.pk_key(obj))
                if entry_of(pk) is not None:
                    return i
                self.insert(obj, pk)
            return n
        key_of = table.pk_key
        encode = table.pk_encode
        self_type = table.pk_self_type
        heads = self.store.heads
        get = heads.get
        append = self.log.append
        rev = begin = self.revision
        i = start
        try:
            while i < n:
                obj = objs[i]
                if pks:
                    pk = pks[i]
                else:
                    k: Any = key_of(obj)
                    pk = k if type(k) is self_type else encode(k)
                old = get(pk)
                if old is not None:
                    if type(old) is tuple:
                        return i  # a row has this key
                    # A deletion record (a committed one is kept for snapshots): written
                    # as `insert` writes it.
                    self.count += rev - begin
                    self._advance(begin, rev)
                    self.insert(obj, pk)
                    rev = begin = self.revision
                    i += 1
                    continue
                rev += 1
                heads[pk] = entry = (obj, rev, pk)
                append(entry)
                i += 1
        finally:
            # Also after an error: the rows written so far stay, as with one insert() each.
            # Each revision since ``begin`` is a new row's.
            self.count += rev - begin
            self._advance(begin, rev)
        return n

    def swap_many(self, items: Iterable[tuple[bytes, int, Any]]) -> list[tuple[int, Any]]:
        """Replace each row stored under key if still at revision (see
        `Table.compare_and_swap_many`); return the positions not written, with the error or
        None."""
        table = self.table
        key_of = table.pk_key
        indexed = bool(table.unique_specs)
        store = self.store
        heads = store.heads
        get = heads.get
        keep_older = store.keep_older
        keep_first = store.older.setdefault
        base_rev = self.base.revision
        append = self.log.append
        skipped: list[tuple[int, Any]] = []
        rev = start = self.revision
        try:
            for i, (pk, expected, obj) in enumerate(items):
                old = get(pk)
                if old is None or old[1] != expected or type(old) is not tuple:
                    skipped.append((i, None))
                    continue
                old_obj = old[0]
                next_rev = rev + 1
                entry = (obj, next_rev, pk)
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
                rev = next_rev  # the record's own int: one object per write, not two
                # VersionStore.put, inlined (``expected`` is the head's revision). The
                # committed head is kept for the snapshots by `VersionStore.keep_older`,
                # whose first case, a key with nothing older kept (every row of a status
                # commit), is one C call here: it then stores the head, else returns
                # what is kept and keep_older adds the head to it.
                if expected <= base_rev:
                    if keep_first(pk, old) is not old:
                        keep_older(pk, old)
                else:
                    self.superseded.append(old)
                heads[pk] = entry
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
        base_rev = self.base.revision
        rev = entry[1]
        for (i, one, many, enc), nks in zip(specs, new_keys):
            store = self.secondary[i]
            assert store is not None
            written = table.index_logs[i]
            if old_obj is not None:
                oks = [enc(one(old_obj))] if one is not None else [enc(k) for k in many(old_obj)]
                for k in oks:
                    if k not in nks:
                        # The key leaves this row: a deletion record under it.
                        store.put(k, _tuple_new(Deletion, (None, rev, pk)), base_rev)
                        written.append((rev, k))
            for k in nks:
                store.put(k, entry, base_rev)
                written.append((rev, k))

    def _check_unique(self, pk: bytes, new_keys: list[list[bytes]]) -> None:
        table = self.table
        for (i, _, _, _), keys in zip(table.unique_specs, new_keys):
            store = self.secondary[i]
            assert store is not None
            heads = store.heads
            for k in keys:
                existing = heads.get(k)
                if existing is not None and type(existing) is tuple and existing[2] != pk:
                    raise UniqueIndexConflictError(table.name, table.secondary[i].name, k)

    def delete(self, obj: Any) -> Any:
        """Delete the row with obj's primary key; return the deleted row or None."""
        table = self.table
        k: Any = table.pk_key(obj)
        pk = k if type(k) is table.pk_self_type else table.pk_encode(k)
        old = self.entry(pk)
        if old is None:
            return None
        self._delete_entry(pk, old)
        return old[0]

    def _delete_entry(self, pk: bytes, old: Entry) -> None:
        rev = self.revision + 1
        self.revision = rev
        old_obj = old[0]
        table = self.table
        base_rev = self.base.revision
        if table.delete_trackers:
            # Held for change iterators: the graveyard, released by release_tombstones.
            table.held_tombstones.append((rev, len(self.log)))
            tomb = new_tombstone(old_obj, rev, pk)
        else:
            tomb = new_tombstone(None, rev, pk)
        self.store.put(pk, tomb, base_rev)
        self.log.append(tomb)
        if old[1] > base_rev:
            self.superseded.append(old)
        self.count -= 1
        self.modified = True
        for i, idx in enumerate(table.secondary):
            if idx.unique:
                store = self.secondary[i]
                assert store is not None
                written = table.index_logs[i]
                for k in idx.keys_of(old_obj):
                    store.put(k, _tuple_new(Deletion, (None, rev, pk)), base_rev)
                    written.append((rev, k))

    def delete_all(self) -> int:
        """Delete every row; return how many were deleted."""
        entries = live_entries(self)
        for e in entries:
            self._delete_entry(e[2], e)
        return len(entries)

    # ----- trimming, commit and abort ----------------------------------
    def _trim(self) -> None:
        """Drop the records no live snapshot sees (runs when the transaction starts).

        Each key written since the last trim (the log and the index logs list them, in
        revision order) keeps only the records a live snapshot sees (`VersionStore.retain`);
        a snapshot that dies later makes the sweep (`VersionStore.sweep`) check every key
        of ``older`` again, a slice per transaction. So a snapshot held for a long time
        keeps at most one version per key it can see, and the upserts dropped leave the
        log at once (as gaps, see `vacate`).
        """
        table = self.table
        base = self.base
        revision = base.revision
        live = table.snapshots.revisions(revision)
        log, n = self.log, base.log_len
        done = table.trimmed_revision
        # Where the last trim stopped, while the log is still the same list (compaction
        # replaces it).
        mark = table.trim_mark
        start = mark[1] if mark[0] is log else log_position(log, n, done)
        primary = self.store
        dropped: list[Entry] = []
        if start < n:
            retain = primary.retain
            trim = primary.trim
            single = len(live) == 1
            heads = primary.heads
            older = primary.older
            records = log[start:n]
            # Nothing to do when no key written has older records kept and no record is a
            # deletion (a load's inserts): checked by C-level loops, a tenth of the
            # per-record loop's cost.
            if (not older or older.keys().isdisjoint(map(_key, records))) and (
                Deletion not in map(type, records)
            ):
                records = []
            older_get = older.get
            for e in records:
                pk = e[2]
                if older_get(pk) is None:
                    # The common case: nothing older kept. Only a deletion can still leave
                    # something behind: a deletion head, which with nothing older means
                    # "absent" to every snapshot, as no record does.
                    if type(e) is Deletion:
                        h = heads.get(pk)
                        if h is not None and type(h) is Deletion:
                            del heads[pk]
                    continue
                if type(e) is Gap:
                    continue  # no key's record (its key b"" may be a real row's key)
                if single:
                    # Only the committed state is live: drop whatever is older than e.
                    trim(pk, e[1], revision, dropped)
                else:
                    retain(pk, live, dropped)
        for i, written in table.index_logs.items():
            if written:
                store = self.secondary[i]
                assert store is not None
                if len(live) == 1:
                    trim = store.trim
                    for rev, key in written:
                        trim(key, rev, revision)
                else:
                    retain = store.retain
                    for _, key in written:
                        retain(key, live)
                written.clear()
        # Snapshots below the committed revision are the ones that may keep older records;
        # when one of those seen at the last trim is gone, the sweep checks every key again.
        below = frozenset(live[:-1]) if len(live) > 1 else _NO_REVISIONS
        if below or primary.kept_for or primary.sweeping:
            self._sweep(live, below, SWEEP_PER_WRITE * (revision - done), dropped)
        if dropped:
            # No live snapshot sees these records, and no change iterator reports an
            # upsert that is not its key's row: free them now rather than at compaction.
            vacate(log, n, dropped)
        table.trimmed_revision = revision
        table.trim_mark = (log, n)

    def _sweep(
        self, live: list[int], below: frozenset[int], budget: int, dropped: list[Entry]
    ) -> None:
        """A slice of the sweep (`VersionStore.sweep`) over the table's version stores, at
        least `SWEEP_CHUNK` keys; a pass starts once a snapshot in a store's ``kept_for``
        (the live revisions below the committed one at the last trim) is gone."""
        budget = max(SWEEP_CHUNK, budget)
        primary = self.store
        pending = False
        for store in self._stores():
            if store.kept_for and not below >= store.kept_for:
                store.stale = True
            store.kept_for = below
            if budget > 0 and (store.cursor or store.stale):
                budget -= store.sweep(live, budget, dropped if store is primary else None)
            pending = pending or bool(store.cursor) or store.stale
        # Whether the next trim must come back here even with no snapshot held.
        primary.sweeping = pending

    def seal(self) -> TableState:
        """Return this transaction's contents as an immutable TableState (not yet tracked).

        The records this transaction superseded itself leave the log first (as gaps, see
        `vacate`): they were never committed, so no reader needs them.
        """
        n = len(self.log)
        if self.superseded:
            vacate(self.log, n, self.superseded)
            self.superseded = []
        return _state_of(self, n)

    def discard(self) -> None:
        """Undo this transaction's writes (abort): restore the heads, truncate the logs."""
        end = self.base.log_len
        base_rev = self.base.revision
        table = self.table
        held = table.held_tombstones
        while held and held[-1][1] >= end:
            held.pop()
        restore = self.store.restore
        for pk in {e[2] for e in self.log[end:]}:
            restore(pk, base_rev)
        for i, written in table.index_logs.items():
            k = bisect_right(written, base_rev, key=itemgetter(0))
            if k < len(written):
                store = self.secondary[i]
                assert store is not None
                for key in {key for _, key in written[k:]}:
                    store.restore(key, base_rev)
                del written[k:]
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


def _state_of(src: TableState | TableTxn, log_len: int) -> TableState:
    """A new TableState with ``src``'s contents up to ``log_len`` log records and no ordered
    view yet (a committed state's copy, or a transaction sealed)."""
    st = TableState.__new__(TableState)
    st.revision = src.revision
    st.store = src.store
    st.rows = src.rows
    st.secondary = src.secondary
    st.count = src.count
    st.log = src.log
    st.log_len = log_len
    st.tombstones = src.tombstones
    st.pending_init = src.pending_init
    st.ordered = [None] * len(src.ordered)
    return st
