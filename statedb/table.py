"""Tables: a named set of immutable rows with a primary index, secondary indexes and queries.

Every query takes a transaction (a `ReadTxn` snapshot or a `WriteTxn`, which
sees its own writes) and returns results in key order. A query's key is a
`Query` built from an index (``index.query(value)``) or, for the primary
index, the plain key value. The ``*_watch`` variants also return a `Watch`
that closes once the query's result may have changed after that snapshot.
`Table.revisions` yields any query's rows with the revision that last wrote
each, and `Table.get_revision` is `get` with it.
"""

from __future__ import annotations

import builtins
import collections
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from operator import itemgetter
from struct import Struct
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar, get_args

from statedb import keys as keycodec
from statedb.errors import (
    ObjectNotFoundError,
    RevisionMismatchError,
    UnknownIndexError,
)
from statedb.index import Index, Query
from statedb.ordered import escape_key, nonunique_entries, ordered_view
from statedb.retired_logs import RetiredLogs
from statedb.sortedmap import SortedMap
from statedb.table_state import SnapshotTracker, TableState, TableTxn
from statedb.watch import Watch, closed_watch

if TYPE_CHECKING:
    from statedb.changes import ChangeIterator
    from statedb.db import DB
    from statedb.txn import ReadTxn, WriteTxn

O = TypeVar("O")
if TYPE_CHECKING:
    from typing_extensions import TypeVar as TypeVarWithDefault

    #: The key type of a table's primary index: ``Table[Row]`` means ``Table[Row, Any]``.
    PK = TypeVarWithDefault("PK", default=Any)
else:
    # At run time a plain TypeVar (the default needs typing_extensions below Python 3.13,
    # which the core does not depend on); Table.__class_getitem__ supplies it instead.
    PK = TypeVar("PK")

#: How `Table.revisions` matches its query key: as `list`, `prefix` or `lower_bound` do.
Match = Literal["exact", "prefix", "lower_bound"]
MATCHES = get_args(Match)

_obj = itemgetter(0)
_obj_rev = itemgetter(0, 1)


class _NoKeyType:
    """A type no key has: the encoder of a table without a C-level equivalent."""


# Key encoders with a C-level equivalent for keys of one exact type, used by `Table.get`
# (a Python-level encoder call is a third of a primary-key lookup): for a key of that
# type the equivalent returns the same bytes; for a key it cannot encode it raises, and
# the lookup calls the encoder itself, which raises its own error.
_C_ENCODERS: dict[Any, tuple[type, Callable[[Any], bytes]]] = {
    keycodec.string: (str, str.encode),
    keycodec.uint64: (int, Struct(">Q").pack),
    keycodec.uint32: (int, Struct(">I").pack),
    keycodec.uint16: (int, Struct(">H").pack),
    keycodec.uint8: (int, Struct(">B").pack),
}
_NO_C_ENCODER: tuple[type, Callable[[Any], bytes]] = (_NoKeyType, keycodec.raw)


class Table(Generic[O, PK]):
    """A table of rows of type O, registered with one `DB`.

    For type checkers a table is ``Table[O, PK]``: O is the row type and PK the key type
    of the primary index, both taken from the indexes given, so ``get(txn, 12345)`` on a
    table with ``str`` primary keys or a query built by another table's index (of other
    rows) is rejected. ``Table[Row]`` in an annotation means ``Table[Row, Any]``.
    """

    def __init__(
        self,
        name: str,
        primary: Index[O, PK],
        *secondary: Index[O, Any],
        row_type: type[O] | None = None,
    ) -> None:
        if not primary.unique or primary.key is None:
            raise ValueError(f"table {name!r}: the primary index must be unique and single-key")
        names = [primary.name] + [i.name for i in secondary]
        if len(set(names)) != len(names):
            raise ValueError(f"table {name!r}: index names must be distinct: {names}")
        self.name = name
        #: The class of the rows, when given: it names the columns of an empty table's
        #: listing (statedb.show). ``Table[Row](...)`` also says it, through its type argument.
        self.row_type: type[O] | None = row_type
        self.primary: Index[O, PK] = primary
        self.secondary: tuple[Index[O, Any], ...] = secondary
        self._index_pos = {idx.name: i for i, idx in enumerate(secondary)}
        self.pk_key: Callable[[O], PK] = primary.key
        self.pk_encode: Callable[[PK], bytes] = primary.encode
        # The key type and C-level encoder `get` uses (a type no key has when there is none).
        self.pk_c_type, self.pk_c_encode = _C_ENCODERS.get(primary.encode, _NO_C_ENCODER)
        #: The key type the encoder returns as it is (`keys.self_encoding`): lookups and
        #: writes use such a key without the call (a type no key has when there is none).
        self.pk_self_type: Any = keycodec.self_encoded_type(primary.encode) or _NoKeyType
        # (key, keys, encode, unique) per secondary index, for the write path.
        # (position, key, keys, encode) per unique secondary index, for the write path.
        self.unique_specs: builtins.list[tuple[int, Any, Any, Any]] = [
            (pos, i.key, i.keys, i.encode) for pos, i in enumerate(secondary) if i.unique
        ]
        # Newest ordered view built per index position: (state, view).
        self.ordered_cache: builtins.list[tuple[TableState, SortedMap] | None] = [None] * (
            len(secondary) + 1
        )
        # Set when registered with a DB.
        self.db: DB | None = None
        self.lock_order = -1
        self.lock = threading.Lock()
        # Watch registries, shared by all snapshots: index position (0 = primary,
        # i + 1 = secondary i) -> key -> watch. Weak values: a watch nobody holds
        # is forgotten instead of piling up.
        self.key_watches: builtins.list[weakref.WeakValueDictionary[bytes, Watch]] = [
            weakref.WeakValueDictionary() for _ in range(len(secondary) + 1)
        ]
        self.prefix_watches: builtins.list[weakref.WeakValueDictionary[bytes, Watch]] = [
            weakref.WeakValueDictionary() for _ in range(len(secondary) + 1)
        ]
        self.table_watch = Watch()
        # Set when table_watch was handed out; commits replace and close it only then.
        self.table_watch_taken = False
        self.init_watch = Watch()
        # Change iterators that still need deletions: id -> [last seen revision].
        self.delete_trackers: dict[int, builtins.list[int]] = {}
        # (revision, log position) of deletions kept for change iterators; writer-owned.
        self.held_tombstones: collections.deque[tuple[int, int]] = collections.deque()
        # Live snapshots of this table, and how far versions were trimmed below them.
        self.snapshots = SnapshotTracker()
        self.trimmed_revision = 0
        # (log list, position) where the last trim stopped: saves two binary searches.
        self.trim_mark: tuple[builtins.list[Any] | None, int] = (None, 0)
        # Log length kept by the last compaction (see statedb.ordered.compact_log), and
        # the compaction in progress (statedb.ordered.Compaction); writer-owned.
        self.log_floor = 0
        self.compaction: Any = None
        # Logs compaction replaced, freed a slice per commit once unreferenced.
        self.retired_logs = RetiredLogs()
        # Per unique secondary index position: (revision, key) of each record written
        # under a key since the last trim, in revision order; writer-owned.
        self.index_logs: dict[int, builtins.list[tuple[int, bytes]]] = {
            pos: [] for pos, i in enumerate(secondary) if i.unique
        }

    def __repr__(self) -> str:
        return f"<Table {self.name}>"

    if not TYPE_CHECKING:

        def __class_getitem__(cls, params):
            # ``Table[Row]`` is ``Table[Row, Any]`` at run time too (e.g. ``Table[Row](...)``,
            # whose ``__orig_class__`` statedb.show reads), as PK's default says to type
            # checkers.
            if not isinstance(params, tuple):
                params = (params, Any)
            return super().__class_getitem__(params)

    @property
    def indexes(self) -> builtins.list[Index[O, Any]]:
        """The primary index followed by the secondary indexes."""
        return [self.primary, *self.secondary]

    def index(self, name: str) -> Index[O, Any]:
        """Return the index called ``name``."""
        if name == self.primary.name:
            return self.primary
        pos = self._index_pos.get(name)
        if pos is None:
            raise UnknownIndexError(self.name, name, [i.name for i in self.indexes])
        return self.secondary[pos]

    def primary_key_of(self, obj: O) -> bytes:
        """Return the encoded primary key of ``obj``."""
        return self.pk_encode(self.pk_key(obj))

    # ----- plumbing ----------------------------------------------------
    def state(self, txn: ReadTxn) -> TableState:
        """This table's state in ``txn``: the snapshot (or the write transaction's own
        `TableTxn`) the queries read. For statedb's own modules (change iterators)."""
        try:
            return txn.states[self.name]
        except KeyError:
            from statedb.errors import TableNotRegisteredError

            raise TableNotRegisteredError(self.name) from None

    def _resolve(self, q: Query[O] | PK) -> tuple[int, bool, bytes]:
        """Return (index position, unique, encoded key); position 0 is the primary index."""
        if type(q) is Query:
            if q.index == self.primary.name:
                return 0, True, q.key
            pos = self._index_pos.get(q.index)
            if pos is None:
                raise UnknownIndexError(self.name, q.index, [i.name for i in self.indexes])
            return pos + 1, self.secondary[pos].unique, q.key
        # Not a Query, so a primary key (a type check cannot narrow ``type(q) is Query``).
        return 0, True, self.pk_encode(q)  # type: ignore[arg-type]

    def _multi_key(self, pos: int) -> bool:
        return pos > 0 and self.secondary[pos - 1].keys is not None

    def _view(self, txn: ReadTxn, pos: int) -> SortedMap:
        return ordered_view(self, self.state(txn), pos)

    # ----- queries ---------------------------------------------------------
    def get(self, txn: ReadTxn, q: Query[O] | PK) -> O | None:
        """Return the first row matching the key exactly, or None."""
        kind = type(q)
        if kind is Query:
            found = self._get_entry(txn, q)
            return found[0] if found is not None else None
        # A primary key value: the lookup inlined (the most frequent query of all).
        pk: bytes
        if kind is self.pk_self_type:
            pk = q  # type: ignore[assignment]  # its own encoding
        elif kind is self.pk_c_type:
            # Read into a local first: calling an instance attribute as ``self.x(q)`` goes
            # through the generic method lookup, a load then a call does not.
            c_encode = self.pk_c_encode
            try:
                pk = c_encode(q)
            except Exception:
                pk = self.pk_encode(q)  # type: ignore[arg-type]  # raises the encoder's error
        else:
            pk = self.pk_encode(q)  # type: ignore[arg-type]  # not a Query: a primary key
        st = txn.states[self.name]
        e = st.rows.get(pk)
        if e is None:
            return None
        # Only when a head may be newer than this snapshot, read the head's revision.
        if st.revision < st.store.newest and e[1] > st.revision:
            e = st.store.older_at(pk, st.revision, e)
            return e[0] if e is not None else None
        # Upserts are stored as plain tuples, deletions as Deletion records.
        return e[0] if type(e) is tuple else None

    def get_many(self, txn: ReadTxn, pks: Iterable[PK]) -> builtins.list[O | None]:
        """``[get(txn, pk) for pk in pks]`` for primary key values (not queries), in one
        call: a reader of several rows it knows the keys of (the LB writer reading a
        service's backends)."""
        st = txn.states[self.name]
        if type(pks) is not builtins.list and type(pks) is not tuple:
            pks = builtins.list(pks)  # read twice when a head is newer than the snapshot
        rows_get = st.rows.get
        self_type = self.pk_self_type
        encode = self.pk_encode
        out: builtins.list[O | None] = []
        append = out.append
        for q in pks:
            # A key of the self-encoded type is its own encoding.
            e = rows_get(q if type(q) is self_type else encode(q))  # type: ignore[arg-type]
            # A deletion record (or None) is no row.
            append(e[0] if type(e) is tuple else None)
        # Each head read is the snapshot's row when no head is newer than the snapshot:
        # always in a write transaction's own state (the writer holds the table), else
        # when ``newest``, read after the heads (as in `get`), says so.
        if type(st) is TableTxn or st.revision >= st.store.newest:
            return out
        return self._get_many_older(st, pks)

    def _get_many_older(self, st: TableState, pks: Iterable[PK]) -> builtins.list[O | None]:
        """`get_many` in a snapshot that a head may be newer than (a writer is under way):
        such a head's key is read from the older versions."""
        rows_get = st.rows.get
        rev = st.revision
        store = st.store
        self_type = self.pk_self_type
        out: builtins.list[O | None] = []
        append = out.append
        for q in pks:
            if type(q) is self_type:
                pk: bytes = q  # type: ignore[assignment]  # its own encoding
            else:
                pk = self.pk_encode(q)
            e = rows_get(pk)
            if e is None:
                append(None)
            elif e[1] > rev and rev < store.newest:
                e = store.older_at(pk, rev, e)
                append(e[0] if e is not None else None)
            else:
                append(e[0] if type(e) is tuple else None)
        return out

    def get_revision(self, txn: ReadTxn, q: Query[O] | PK) -> tuple[O, int] | None:
        """Return (row, revision) of the first row matching the key exactly, or None."""
        e = self._get_entry(txn, q)
        return (e[0], e[1]) if e is not None else None

    def _get_entry(self, txn: ReadTxn, q: Query[O] | PK) -> Any:
        st = self.state(txn)
        pos, unique, key = self._resolve(q)
        if pos == 0:
            return st.entry(key)
        if unique:
            return st.index_entry(pos - 1, key)
        for e in nonunique_entries(self, st, pos, key):
            return e
        return None

    def get_watch(self, txn: ReadTxn, q: Query[O] | PK) -> tuple[O | None, Watch]:
        """Like `get`, plus a watch that closes when the row under this key changes."""
        pos, _, key = self._resolve(q)
        watch = self._key_watch(pos, key)
        e = self._get_entry(txn, q)
        return (e[0] if e is not None else None), self._validate(txn, watch, pos, key, e)

    def list(self, txn: ReadTxn, q: Query[O] | PK) -> Iterator[O]:
        """Yield every row whose key equals the query key, in primary key order."""
        return map(_obj, self._list_entries(txn, q))

    def _list_entries(self, txn: ReadTxn, q: Query[O] | PK) -> Iterator[Any]:
        st = self.state(txn)
        pos, unique, key = self._resolve(q)
        if unique:
            found = st.entry(key) if pos == 0 else st.index_entry(pos - 1, key)
            return iter((found,) if found is not None else ())
        return nonunique_entries(self, st, pos, key)

    def list_watch(self, txn: ReadTxn, q: Query[O] | PK) -> tuple[Iterator[O], Watch]:
        """Like `list`, plus a watch that closes when a row under this key changes."""
        pos, _, key = self._resolve(q)
        watch = self._key_watch(pos, key)
        return self.list(txn, q), self._validate(txn, watch, pos, key)

    def prefix(self, txn: ReadTxn, q: Query[O] | PK) -> Iterator[O]:
        """Yield every row with a key starting with the query key, in key order."""
        return map(_obj, self._prefix_entries(txn, q))

    def _prefix_entries(self, txn: ReadTxn, q: Query[O] | PK) -> Iterator[Any]:
        pos, unique, key = self._resolve(q)
        view = self._view(txn, pos)
        if not unique:
            key = escape_key(key)
        entries = (e for _, e in view.items_prefix(key))
        # Only a multi-key index can hold one row under several matching keys.
        return _distinct(entries) if self._multi_key(pos) else entries

    def prefix_watch(self, txn: ReadTxn, q: Query[O] | PK) -> tuple[Iterator[O], Watch]:
        """Like `prefix`, plus a watch that closes when any row under the prefix changes."""
        pos, _, key = self._resolve(q)
        watch = _registered(self.prefix_watches[pos], key)
        return self.prefix(txn, q), self._validate(txn, watch, pos, key)

    def lower_bound(self, txn: ReadTxn, q: Query[O] | PK) -> Iterator[O]:
        """Yield every row with a key >= the query key, in key order."""
        return map(_obj, self._lower_bound_entries(txn, q))

    def _lower_bound_entries(self, txn: ReadTxn, q: Query[O] | PK) -> Iterator[Any]:
        pos, unique, key = self._resolve(q)
        view = self._view(txn, pos)
        entries = view.values_from(key if unique else escape_key(key))
        return _distinct(entries) if self._multi_key(pos) else entries

    def lower_bound_watch(self, txn: ReadTxn, q: Query[O] | PK) -> tuple[Iterator[O], Watch]:
        """Like `lower_bound`, plus a watch that closes when the table changes."""
        return self.lower_bound(txn, q), self.changed_watch(txn)

    def all(self, txn: ReadTxn) -> Iterator[O]:
        """Yield every row in primary key order."""
        return self._view(txn, 0).firsts_from()

    def revisions(
        self, txn: ReadTxn, q: Query[O] | PK | None = None, *, match: Match = "exact"
    ) -> Iterator[tuple[O, int]]:
        """Yield (row, revision) pairs: the rows `all` yields when ``q`` is None, else those
        `list` (``match="exact"``), `prefix` or `lower_bound` yields for ``q``, in their order.

        The revision is the one of the transaction that last wrote the row.
        """
        if q is None:
            return map(_obj_rev, self._view(txn, 0).values_from())
        if match == "exact":
            return map(_obj_rev, self._list_entries(txn, q))
        if match == "prefix":
            return map(_obj_rev, self._prefix_entries(txn, q))
        if match == "lower_bound":
            return map(_obj_rev, self._lower_bound_entries(txn, q))
        raise ValueError(f"table {self.name!r}: unknown match {match!r}; use one of {MATCHES}")

    def all_watch(self, txn: ReadTxn) -> tuple[Iterator[O], Watch]:
        """Like `all`, plus a watch that closes when the table changes."""
        return self.all(txn), self.changed_watch(txn)

    def count(self, txn: ReadTxn) -> int:
        """Return the number of rows."""
        return self.state(txn).count

    def revision(self, txn: ReadTxn) -> int:
        """Return the table's revision in this transaction (the revision of its last write)."""
        return self.state(txn).revision

    def graveyard_size(self, txn: ReadTxn) -> int:
        """Return how many deletion records the change log still holds."""
        return self.state(txn).tombstones

    def retention(self, txn: ReadTxn) -> dict[str, int]:
        """What this table keeps beyond its rows, for finding memory that does not go away:
        the change log's length (``log_records``), the keys with older row versions kept
        for snapshots (``older_versions``), how many committed states are still alive
        (``live_snapshots``) and the oldest one's revision, against the table's revision
        and the revision trimming has reached, and the records of logs compaction replaced that
        are not freed yet (``retired_log_records``, see `statedb.retired_logs`).

        ``oldest_snapshot`` leaves out the states the table's own ordered-view cache keeps
        (bounded: a view that falls too far behind is dropped at the next commit, see
        `statedb.ordered.drop_stale_views`); ``oldest_cached_view`` is theirs. An
        ``oldest_snapshot`` that stays behind while ``older_versions`` grows is a
        transaction some code keeps referenced."""
        st = self.state(txn)
        cached = {id(c[0]) for c in self.ordered_cache if c is not None}
        while True:
            try:
                live = [(ref(), rev) for ref, rev in list(self.snapshots.live.items())]
                break
            except RuntimeError:  # a snapshot was freed (its weakref callback) meanwhile
                continue
        held = [rev for s, rev in live if s is not None and id(s) not in cached]
        views = [rev for s, rev in live if s is not None and id(s) in cached]
        return {
            "rows": st.count,
            "revision": st.revision,
            "log_records": st.log_len,
            "older_versions": len(st.store.older),
            "live_snapshots": len(held),
            "oldest_snapshot": min(held, default=st.revision),
            "oldest_cached_view": min(views, default=st.revision),
            "trimmed_revision": self.trimmed_revision,
            "graveyard": st.tombstones,
            "retired_log_records": self.retired_logs.pending(),
        }

    # ----- watches -----------------------------------------------------
    def _key_watch(self, pos: int, key: bytes) -> Watch:
        return _registered(self.key_watches[pos], key)

    def _latest(self) -> TableState:
        assert self.db is not None
        return self.db.root[self.name]

    def _validate(
        self, txn: ReadTxn, watch: Watch, pos: int, key: bytes, entry: Any = ...
    ) -> Watch:
        """Return ``watch`` if it still describes this snapshot, else a closed watch.

        The watch was registered before the latest state is read, so a commit either
        closes it or is visible here. A primary-key get compares the row itself; other
        queries on a snapshot older than the latest commit get a closed watch (the
        result may have changed). A write transaction's watches close at its commit.
        """
        st = self.state(txn)
        if isinstance(st, TableTxn):
            return watch
        latest = self._latest()
        if latest is st or latest.revision == st.revision:
            return watch
        if pos == 0 and entry is not ... and latest.entry(key) is entry:
            return watch
        return closed_watch()

    def changed_watch(self, txn: ReadTxn) -> Watch:
        """A watch that closes when the table changes after ``txn``'s snapshot (at once if it
        already has); a write transaction's closes at its commit."""
        # Order matters: take the watch, then flag it, then compare revisions; a
        # commit in between either closes this watch or is seen by the comparison.
        watch = self.table_watch
        self.table_watch_taken = True
        st = self.state(txn)
        if isinstance(st, TableTxn):
            return watch
        if self._latest().revision == st.revision:
            return watch
        return closed_watch()

    # ----- writes ------------------------------------------------------------
    # TableTxn hands rows back untyped (Any); the no-any-return ignores below are where
    # they become O again, with no conversion at run time.
    def insert(self, txn: WriteTxn, obj: O) -> O | None:
        """Insert ``obj``, replacing the row with the same primary key; return the old row."""
        return txn.table_txn(self).insert(obj)  # type: ignore[no-any-return]

    def insert_many(self, txn: WriteTxn, objs: Iterable[O]) -> int:
        """Insert every object of ``objs`` in order, as `insert` would one by one; return how
        many. The loader's fast path: no per-row method dispatch, nothing returned per row.
        On an error the objects before the failing one stay written (in this transaction)."""
        return txn.table_txn(self).insert_many(objs)

    def insert_new(
        self, txn: WriteTxn, objs: Sequence[O], start: int = 0, pks: Sequence[bytes] = ()
    ) -> int:
        """Insert ``objs[start:]`` in order as long as no row has the object's primary key;
        return the position of the first object not written (a row has its key), or
        ``len(objs)`` when all were. What ``get`` then `insert_many` of the absent ones
        does, in one lookup per object: a loader of rows that are nearly always new
        writes them with it and deals with an existing one (then continues after it).
        ``pks``: the objects' encoded primary keys (``primary_key_of``, in the same
        order), when the caller has them."""
        return txn.table_txn(self).insert_new(objs, start, pks)

    def modify(self, txn: WriteTxn, obj: O, merge: Callable[[O, O], O]) -> O | None:
        """Insert ``merge(old, obj)`` if a row with obj's key exists, else ``obj``; return old."""
        tt = txn.table_txn(self)
        old = tt.entry(self.primary_key_of(obj))
        return tt.insert(merge(old[0], obj) if old is not None else obj)  # type: ignore[no-any-return]

    def compare_and_swap(self, txn: WriteTxn, revision: int, obj: O) -> O:
        """Replace the row with obj's key only if it is still at ``revision``; return the old row.

        Raises ObjectNotFoundError when there is no such row and RevisionMismatchError
        when it changed since.
        """
        tt = txn.table_txn(self)
        pk = self.primary_key_of(obj)
        old = tt.entry(pk)
        if old is None:
            raise ObjectNotFoundError(self.name, pk)
        if old[1] != revision:
            raise RevisionMismatchError(self.name, pk, revision, old[1])
        tt.insert(obj, pk)
        return old[0]  # type: ignore[no-any-return]

    def compare_and_swap_many(
        self, txn: WriteTxn, items: Iterable[tuple[bytes, int, O]]
    ) -> builtins.list[tuple[int, Exception | None]]:
        """Compare-and-swap many rows in one call: for each ``(key, revision, obj)``, replace
        the row stored under the encoded primary ``key`` by ``obj`` if it is still at
        ``revision``.

        Returns the positions of the items not written, in order: with None when that row is
        gone or at another revision, with the exception when writing it failed (obj's key is
        not ``key``, a unique index conflict, a reused object). Every other item is written.
        Meant for bulk write-backs such as the reconciler's statuses, whose keys come from
        `Change.key` of a change iterator's records: no key is encoded and a refused row
        costs no exception.
        Per row it costs about what `compare_and_swap` does (the hash-map write dominates).
        """
        return txn.table_txn(self).swap_many(items)

    def delete(self, txn: WriteTxn, obj: O) -> O | None:
        """Delete the row with obj's primary key; return it, or None when absent."""
        return txn.table_txn(self).delete(obj)  # type: ignore[no-any-return]

    def compare_and_delete(self, txn: WriteTxn, revision: int, obj: O) -> O:
        """Delete the row with obj's key only if it is still at ``revision``; return it."""
        tt = txn.table_txn(self)
        pk = self.primary_key_of(obj)
        old = tt.entry(pk)
        if old is None:
            raise ObjectNotFoundError(self.name, pk)
        if old[1] != revision:
            raise RevisionMismatchError(self.name, pk, revision, old[1])
        return tt.delete(obj)  # type: ignore[no-any-return]

    def delete_all(self, txn: WriteTxn) -> int:
        """Delete every row; return how many."""
        return txn.table_txn(self).delete_all()

    # ----- change tracking and initialization ---------------------------------
    def changes(self, txn: WriteTxn) -> ChangeIterator[O]:
        """Start tracking changes (including deletions) from this write transaction on."""
        from statedb.changes import ChangeIterator

        tt = txn.table_txn(self)
        return ChangeIterator(self, tt.revision)

    def register_initializer(self, txn: WriteTxn, name: str) -> Callable[[WriteTxn], None]:
        """Mark the table uninitialized until the returned function is called in a write txn."""
        tt = txn.table_txn(self)
        tt.pending_init = tt.pending_init | {name}
        tt.modified = True

        def done(wtxn: WriteTxn) -> None:
            t = wtxn.table_txn(self)
            if name in t.pending_init:
                t.pending_init = t.pending_init - {name}
                t.modified = True

        return done

    def initialized(self, txn: ReadTxn) -> tuple[bool, Watch]:
        """Return (whether every registered initializer is done, a watch closing when it is)."""
        st = self.state(txn)
        if not st.pending_init:
            return True, closed_watch()
        watch = self.init_watch
        if not isinstance(st, TableTxn) and not self._latest().pending_init:
            return False, closed_watch()
        return False, watch

    def pending_initializers(self, txn: ReadTxn) -> builtins.list[str]:
        """Return the names of initializers not yet done."""
        return sorted(self.state(txn).pending_init)


def _distinct(entries: Iterator[Any]) -> Iterator[Any]:
    """Yield each row once, even when several of its keys match (multi-key indexes)."""
    seen: set[int] = set()
    for e in entries:
        if id(e) not in seen:
            seen.add(id(e))
            yield e


def _registered(reg: weakref.WeakValueDictionary[bytes, Watch], key: bytes) -> Watch:
    """The watch registered under ``key``, registering a new one when there is none."""
    watch = reg.get(key)
    if watch is None:
        watch = reg.setdefault(key, Watch())
    return watch
