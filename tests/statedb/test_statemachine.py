"""A hypothesis state machine that runs random writes, commits and aborts on three tables
and checks the database against a plain dict model after every step.

Tables (each with a different primary key encoding):

- ``ints``: uint64 primary key; ``uniq`` (unique), ``tags`` (non-unique, multi-key),
  ``grp`` (non-unique).
- ``strs``: str primary key; ``tags`` (non-unique, multi-key), ``alias`` (unique,
  multi-key).
- ``nets``: IP network primary key; ``grp`` (non-unique), ``uniq`` (unique).

The model of a table is a dict from encoded primary key to (row, revision) plus the
table revision. Every query kind is computed from it by brute force: a row matches
an index query through any of its keys, and results are ordered by (the row's
smallest matching key, primary key), each row once. Checked:

- every query kind as `Table.revisions` and as the plain query, in the open write transaction (which
  sees its own writes), on the latest snapshot, and on older snapshots (which must
  keep showing the contents they were taken with);
- every error the writes raise (unlocked table, reused object, CAS mismatch/absent,
  unique conflicts), with nothing changed by a failed write;
- change iterators: replaying their changes onto a dict rebuilds the table exactly,
  revisions only grow, and the graveyard never holds deletions every iterator saw;
- watches: after each commit every watch whose query result differs from what it
  was taken with is closed; no watch closes on abort or before the commit.
"""

from __future__ import annotations

import ipaddress
import itertools
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from statedb import (
    DB,
    ChangeIterator,
    Index,
    ObjectNotFoundError,
    ObjectReusedError,
    Query,
    ReadTxn,
    RevisionMismatchError,
    Table,
    TableNotLockedError,
    UniqueIndexConflictError,
    Watch,
    WriteTxn,
    keys,
)


@dataclass(frozen=True, slots=True)
class Row:
    """A row of any of the tables; ``ver`` makes every created row distinct."""

    pk: Any
    uniq: str = ""
    tags: frozenset[str] = frozenset()
    alias: frozenset[str] = frozenset()
    grp: str = ""
    ver: int = 0


UNIQ = ["", "u", "ua", "uab", "ub", "v"]
TAGS = ["", "a", "ab", "abb", "b", "ba", "c"]
ALIAS = ["x", "xy", "y", "yx", "z"]
GRP = ["g", "g1", "g10", "h"]
POOLS: dict[str, list[Any]] = {"uniq": UNIQ, "tags": TAGS, "alias": ALIAS, "grp": GRP}
NETS = [
    ipaddress.ip_network(n)
    for n in [
        "0.0.0.0/0",
        "10.0.0.0/8",
        "10.0.0.0/16",
        "10.1.0.0/16",
        "10.1.2.3/32",
        "192.168.1.0/24",
        "::/0",
        "2001:db8::/32",
        "2001:db8::1/128",
        "fe80::/10",
    ]
]

UNIQ_INDEX: Index[Row, str] = Index("uniq", key=lambda r: r.uniq)
TAGS_INDEX: Index[Row, str] = Index("tags", keys=lambda r: r.tags, unique=False)
ALIAS_INDEX: Index[Row, str] = Index("alias", keys=lambda r: r.alias)
GRP_INDEX: Index[Row, str] = Index("grp", key=lambda r: r.grp, unique=False)


@dataclass(frozen=True)
class Spec:
    """How to build one table of the machine and draw its primary keys."""

    name: str
    pks: list[Any]
    primary: Index[Row, Any]
    secondary: tuple[Index[Row, Any], ...]


SPECS = [
    Spec(
        "ints",
        list(range(10)),
        Index("id", key=lambda r: r.pk, encode=keys.uint64),
        (UNIQ_INDEX, TAGS_INDEX, GRP_INDEX),
    ),
    Spec(
        "strs",
        ["", "a", "ab", "abb", "b", "ba", "z"],
        Index("name", key=lambda r: r.pk),
        (TAGS_INDEX, ALIAS_INDEX),
    ),
    Spec(
        "nets",
        NETS,
        Index("net", key=lambda r: r.pk, encode=keys.ip_network),
        (GRP_INDEX, UNIQ_INDEX),
    ),
]
SPEC = {s.name: s for s in SPECS}
QUERY_KINDS = ["get", "list", "prefix", "lower_bound", "all"]
#: Write operations of the machine's write rule; repeats make an operation more likely.
WRITE_OPS = [
    "insert",
    "insert",
    "insert",
    "insert",
    "modify",
    "modify",
    "delete",
    "compare_and_swap",
    "compare_and_swap",
    "compare_and_delete",
    "reinsert_stored",
    "delete_all",
]


@dataclass
class TableModel:
    """The expected contents of one table: encoded primary key -> (row, revision)."""

    rows: dict[bytes, tuple[Row, int]] = field(default_factory=dict)
    revision: int = 0

    def copy(self) -> TableModel:
        """An independent copy (rows are immutable, so a shallow dict copy is enough)."""
        return TableModel(dict(self.rows), self.revision)


Model = dict[str, TableModel]


def copy_model(model: Model) -> Model:
    """An independent copy of every table's model."""
    return {name: tm.copy() for name, tm in model.items()}


def index_of(spec: Spec, name: str) -> Index[Row, Any]:
    """The index of ``spec`` called ``name``."""
    for idx in (spec.primary, *spec.secondary):
        if idx.name == name:
            return idx
    raise KeyError(name)


def expected_entries(
    spec: Spec, tm: TableModel, index: str, match: Callable[[bytes], bool]
) -> list[tuple[Row, int]]:
    """Rows with a key in ``index`` satisfying ``match``, ordered by (smallest matching
    key, primary key), each row once."""
    idx = index_of(spec, index)
    found = []
    for pk, (row, rev) in tm.rows.items():
        matching = [k for k in idx.keys_of(row) if match(k)]
        if matching:
            found.append((min(matching), pk, row, rev))
    found.sort(key=lambda f: (f[0], f[1]))
    return [(row, rev) for _, _, row, rev in found]


def expected_query(
    spec: Spec, tm: TableModel, kind: str, index: str, key: bytes
) -> list[tuple[Row, int]]:
    """The model's answer to a query; ``get`` answers with at most one entry."""
    if kind == "all":
        return [tm.rows[pk] for pk in sorted(tm.rows)]
    if kind in ("get", "list"):
        found = expected_entries(spec, tm, index, lambda k: k == key)
        return found[:1] if kind == "get" else found
    if kind == "prefix":
        return expected_entries(spec, tm, index, lambda k: k.startswith(key))
    assert kind == "lower_bound"
    return expected_entries(spec, tm, index, lambda k: k >= key)


def actual_query(
    table: Table[Row], txn: ReadTxn, kind: str, index: str, key: bytes, raw: Any
) -> tuple[list[tuple[Row, int]], list[Row]]:
    """Run a query both through `Table.revisions` and as the plain one.

    ``raw``, when not None, is the primary key value to query with instead of a Query.
    """
    q: Any = raw if raw is not None else Query(index, key)
    if kind == "get":
        got = table.get_revision(txn, q)
        plain = table.get(txn, q)
        return ([got] if got is not None else []), ([plain] if plain is not None else [])
    if kind == "list":
        return list(table.revisions(txn, q)), list(table.list(txn, q))
    if kind == "prefix":
        return list(table.revisions(txn, q, match="prefix")), list(table.prefix(txn, q))
    if kind == "lower_bound":
        return list(table.revisions(txn, q, match="lower_bound")), list(table.lower_bound(txn, q))
    assert kind == "all"
    return list(table.revisions(txn)), list(table.all(txn))


def watch_query(
    table: Table[Row], txn: ReadTxn, kind: str, index: str, key: bytes
) -> tuple[list[Row], Watch]:
    """Run the *_watch variant of a query; returns its rows and its watch."""
    q = Query(index, key)
    if kind == "get":
        row, w = table.get_watch(txn, q)
        return ([row] if row is not None else []), w
    if kind == "list":
        rows, w = table.list_watch(txn, q)
    elif kind == "prefix":
        rows, w = table.prefix_watch(txn, q)
    elif kind == "lower_bound":
        rows, w = table.lower_bound_watch(txn, q)
    else:
        rows, w = table.all_watch(txn)
    return list(rows), w


@dataclass
class WatchRecord:
    """A watch taken by the machine, with the query and the result it was taken with."""

    watch: Watch
    in_write_txn: bool
    table: str
    kind: str
    index: str
    key: bytes
    result: list[Row]


@dataclass
class IterRecord:
    """An open change iterator and the table contents rebuilt from its changes."""

    it: ChangeIterator[Row]
    table: str
    start: int
    seen: int
    state: dict[bytes, Row] = field(default_factory=dict)
    started: bool = False


class StateDBMachine(RuleBasedStateMachine):
    """Random transactions on three tables, checked against `TableModel`s."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: dict[str, Table[Row]] = {
            s.name: Table(s.name, s.primary, *s.secondary) for s in SPECS
        }
        self.db = DB(*self.tables.values())
        self.committed: Model = {s.name: TableModel() for s in SPECS}
        self.txn: WriteTxn | None = None
        self.pending: Model = {}
        self.pending_deletes: dict[str, list[int]] = {}
        self.deletes: dict[str, list[int]] = {s.name: [] for s in SPECS}
        self.snapshots: list[tuple[ReadTxn, Model]] = []
        self.watches: list[WatchRecord] = []
        self.iters: list[IterRecord] = []
        self.versions = itertools.count(1)

    # ----- drawing -------------------------------------------------------
    def draw_row(self, data: st.DataObject, spec: Spec, pk: Any = None) -> Row:
        """A new row for ``spec`` (with primary key ``pk`` when given)."""
        if pk is None:
            pk = data.draw(st.sampled_from(spec.pks), label="pk")
        return Row(
            pk=pk,
            uniq=data.draw(st.sampled_from(UNIQ), label="uniq"),
            tags=data.draw(st.frozensets(st.sampled_from(TAGS), max_size=3), label="tags"),
            alias=data.draw(st.frozensets(st.sampled_from(ALIAS), max_size=2), label="alias"),
            grp=data.draw(st.sampled_from(GRP), label="grp"),
            ver=next(self.versions),
        )

    def draw_query(
        self, data: st.DataObject, spec: Spec, kinds: list[str]
    ) -> tuple[str, str, bytes, Any]:
        """(kind, index, encoded key, raw primary key or None); keys may be cut short."""
        kind = data.draw(st.sampled_from(kinds), label="kind")
        idx = data.draw(st.sampled_from([spec.primary, *spec.secondary]), label="index")
        if idx is spec.primary:
            value = data.draw(st.sampled_from(spec.pks), label="key")
        else:
            value = data.draw(st.sampled_from(POOLS[idx.name]), label="key")
        key = idx.encode(value)
        raw = None
        if data.draw(st.booleans(), label="cut"):
            key = key[: data.draw(st.integers(0, len(key)), label="cut_at")]
        elif idx is spec.primary and data.draw(st.booleans(), label="raw"):
            raw = value
        return kind, idx.name, key, raw

    # ----- model helpers ---------------------------------------------------
    def conflicts(self, spec: Spec, tm: TableModel, row: Row) -> bool:
        """Would ``row`` take a unique secondary key held by another row?"""
        pk = spec.primary.keys_of(row)[0]
        for idx in spec.secondary:
            if not idx.unique:
                continue
            mine = set(idx.keys_of(row))
            for other_pk, (other, _) in tm.rows.items():
                if other_pk != pk and mine & set(idx.keys_of(other)):
                    return True
        return False

    def put(self, spec: Spec, tm: TableModel, row: Row) -> None:
        """Record an upsert in the model."""
        tm.revision += 1
        tm.rows[spec.primary.keys_of(row)[0]] = (row, tm.revision)

    def remove(self, spec: Spec, tm: TableModel, pk: bytes) -> None:
        """Record a deletion in the model."""
        tm.revision += 1
        del tm.rows[pk]
        self.pending_deletes.setdefault(spec.name, []).append(tm.revision)

    def check_table(self, txn: ReadTxn, spec: Spec, tm: TableModel, where: str) -> None:
        """The whole table (rows, revisions, count, table revision) equals the model."""
        t = self.tables[spec.name]
        want = [tm.rows[pk] for pk in sorted(tm.rows)]
        assert list(t.revisions(txn)) == want, f"{where}: {spec.name} contents"
        assert t.count(txn) == len(want), f"{where}: {spec.name} count"
        assert t.revision(txn) == tm.revision, f"{where}: {spec.name} revision"

    # ----- transactions ------------------------------------------------------
    @precondition(lambda self: self.txn is None)
    @rule(data=st.data(), keep=st.booleans())
    def begin(self, data: st.DataObject, keep: bool) -> None:
        """Open a write transaction on a random non-empty subset of the tables (and maybe
        keep a read snapshot of the contents before it)."""
        if keep:
            self.keep_snapshot()
        names = data.draw(
            st.lists(st.sampled_from(list(SPEC)), min_size=1, max_size=3, unique=True),
            label="locked",
        )
        self.txn = self.db.write_txn(*(self.tables[n] for n in names))
        self.pending = {n: self.committed[n].copy() for n in names}
        self.pending_deletes = {}

    @precondition(lambda self: self.txn is not None)
    @rule(
        outcome=st.sampled_from(["commit", "commit", "commit", "abort", "raise"]),
        keep=st.booleans(),
    )
    def finish(self, outcome: str, keep: bool) -> None:
        """End the write transaction: mostly commit (maybe keeping a snapshot after it),
        sometimes abort (directly or by raising in the with block)."""
        if outcome == "commit":
            self.commit(keep)
        else:
            self.abort(via_exception=outcome == "raise")

    def commit(self, keep: bool = False) -> None:
        """Commit; the returned snapshot and the latest one show the new contents."""
        assert self.txn is not None
        snap = self.txn.commit()
        changed = {n for n, tm in self.pending.items() if tm.revision != self.committed[n].revision}
        self.committed.update(self.pending)
        for name, revs in self.pending_deletes.items():
            self.deletes[name].extend(revs)
        self.txn, self.pending, self.pending_deletes = None, {}, {}
        for spec in SPECS:
            self.check_table(snap, spec, self.committed[spec.name], "commit snapshot")
        self.after_commit(changed)
        if keep:
            self.keep_snapshot()

    def abort(self, via_exception: bool) -> None:
        """Abort (directly or by an exception in the with block): nothing changes or closes."""
        assert self.txn is not None
        open_before = [r for r in self.watches if not r.watch.closed]
        if via_exception:
            with pytest.raises(KeyError), self.txn:
                raise KeyError("abort")
        else:
            self.txn.abort()
        assert self.txn.done
        self.txn, self.pending, self.pending_deletes = None, {}, {}
        assert all(not r.watch.closed for r in open_before), "a watch closed on abort"
        self.watches = [r for r in self.watches if not r.in_write_txn]

    def after_commit(self, changed: set[str]) -> None:
        """Check watches and graveyards against the newly committed contents."""
        for rec in self.watches:
            spec = SPEC[rec.table]
            now = [
                row
                for row, _ in expected_query(
                    spec, self.committed[rec.table], rec.kind, rec.index, rec.key
                )
            ]
            if now != rec.result:
                assert rec.watch.closed, (
                    f"{rec.kind} watch on {rec.table}.{rec.index} {rec.key!r} still open: "
                    f"{rec.result} -> {now}"
                )
        # Closed watches have done their job; keep the open ones.
        self.watches = [r for r in self.watches if not r.watch.closed and not r.in_write_txn]
        latest = self.db.read_txn()
        for name in changed:
            seen = [r.seen for r in self.iters if r.table == name]
            low = min(seen) if seen else None
            unseen = 0 if low is None else sum(1 for rev in self.deletes[name] if rev > low)
            size = self.tables[name].graveyard_size(latest)
            assert size <= unseen, f"{name}: graveyard keeps {size} > {unseen} unseen deletions"

    # ----- writes ---------------------------------------------------------------
    def pick_spec(self, data: st.DataObject) -> Spec:
        """Any table."""
        spec: Spec = data.draw(st.sampled_from(SPECS), label="table")
        return spec

    def pick_locked(self, data: st.DataObject) -> Spec:
        """A table the open write transaction locked."""
        name = data.draw(st.sampled_from(sorted(self.pending)), label="table")
        return SPEC[name]

    @initialize(data=st.data())
    def populate(self, data: st.DataObject) -> None:
        """Start with an iterator on some tables and a few rows in every table."""
        for spec in SPECS:
            if data.draw(st.booleans(), label="early_iterator"):
                self.open_iterator_on(spec)
        txn = self.db.write_txn(*self.tables.values())
        self.txn, self.pending = txn, copy_model(self.committed)
        for spec in SPECS:
            for _ in range(data.draw(st.integers(0, 8), label="rows")):
                row = self.draw_row(data, spec)
                if not self.conflicts(spec, self.pending[spec.name], row):
                    self.tables[spec.name].insert(txn, row)
                    self.put(spec, self.pending[spec.name], row)
        self.commit()

    @precondition(lambda self: self.txn is not None and len(self.pending) < len(SPECS))
    @rule(data=st.data())
    def write_unlocked(self, data: st.DataObject) -> None:
        """Every kind of write to a table the transaction did not lock is refused."""
        assert self.txn is not None
        name = data.draw(st.sampled_from(sorted(set(SPEC) - set(self.pending))), label="unlocked")
        spec, t, txn = SPEC[name], self.tables[name], self.txn
        row = self.draw_row(data, spec)
        write = data.draw(
            st.sampled_from(
                [
                    lambda: t.insert(txn, row),
                    lambda: t.delete(txn, row),
                    lambda: t.modify(txn, row, lambda old, new: new),
                    lambda: t.compare_and_swap(txn, 1, row),
                    lambda: t.compare_and_delete(txn, 1, row),
                    lambda: t.delete_all(txn),
                ]
            ),
            label="write",
        )
        with pytest.raises(TableNotLockedError):
            write()

    @precondition(lambda self: self.txn is not None)
    @rule(data=st.data(), ops=st.lists(st.sampled_from(WRITE_OPS), min_size=1, max_size=4))
    def write(self, data: st.DataObject, ops: list[str]) -> None:
        """A few writes in the open transaction (inserts weighted up, delete_all down)."""
        for op in ops:
            getattr(self, op)(data)

    def insert(self, data: st.DataObject) -> None:
        """Insert a new row (replacing the row with the same primary key)."""
        assert self.txn is not None
        spec = self.pick_locked(data)
        t = self.tables[spec.name]
        row = self.draw_row(data, spec)
        tm = self.pending[spec.name]
        if self.conflicts(spec, tm, row):
            with pytest.raises(UniqueIndexConflictError):
                t.insert(self.txn, row)
            return
        old = tm.rows.get(spec.primary.keys_of(row)[0])
        assert t.insert(self.txn, row) is (old[0] if old else None)
        self.put(spec, tm, row)

    def reinsert_stored(self, data: st.DataObject) -> None:
        """Inserting the stored object itself is refused."""
        assert self.txn is not None
        spec = self.pick_locked(data)
        tm = self.pending[spec.name]
        if not tm.rows:
            return
        pk = data.draw(st.sampled_from(sorted(tm.rows)), label="stored")
        with pytest.raises(ObjectReusedError):
            self.tables[spec.name].insert(self.txn, tm.rows[pk][0])

    def modify(self, data: st.DataObject) -> None:
        """modify() merges the new row into the stored one (union of tags, old group)."""
        assert self.txn is not None
        spec = self.pick_locked(data)
        tm = self.pending[spec.name]
        t = self.tables[spec.name]
        new = self.draw_row(data, spec)
        merged_ver = next(self.versions)

        def merge(old: Row, row: Row) -> Row:
            return Row(row.pk, row.uniq, old.tags | row.tags, row.alias, old.grp, merged_ver)

        pk = spec.primary.keys_of(new)[0]
        old = tm.rows.get(pk)
        want = merge(old[0], new) if old is not None else new
        if self.conflicts(spec, tm, want):
            with pytest.raises(UniqueIndexConflictError):
                t.modify(self.txn, new, merge)
            return
        assert t.modify(self.txn, new, merge) is (old[0] if old else None)
        stored = t.get(self.txn, new.pk)
        assert stored == want
        assert stored is not None
        self.put(spec, tm, stored)

    def delete(self, data: st.DataObject) -> None:
        """Delete by primary key (any object with that key will do)."""
        assert self.txn is not None
        spec = self.pick_locked(data)
        tm = self.pending[spec.name]
        pk_value = data.draw(st.sampled_from(spec.pks), label="pk")
        pk = spec.primary.encode(pk_value)
        old = tm.rows.get(pk)
        assert self.tables[spec.name].delete(self.txn, Row(pk_value)) is (old[0] if old else None)
        if old is not None:
            self.remove(spec, tm, pk)

    def compare_and_swap(self, data: st.DataObject) -> None:
        """CAS succeeds only with the row's current revision."""
        assert self.txn is not None
        matching = data.draw(st.booleans(), label="matching")
        off = data.draw(st.integers(1, 3), label="off")
        down = data.draw(st.booleans(), label="down")
        spec = self.pick_locked(data)
        tm = self.pending[spec.name]
        t = self.tables[spec.name]
        row = self.draw_row(data, spec)
        cur = tm.rows.get(spec.primary.keys_of(row)[0])
        if cur is None:
            with pytest.raises(ObjectNotFoundError):
                t.compare_and_swap(self.txn, tm.revision, row)
            return
        rev = cur[1] if matching else cur[1] + (-off if down else off)
        if not matching:
            with pytest.raises(RevisionMismatchError):
                t.compare_and_swap(self.txn, rev, row)
        elif self.conflicts(spec, tm, row):
            with pytest.raises(UniqueIndexConflictError):
                t.compare_and_swap(self.txn, rev, row)
        else:
            assert t.compare_and_swap(self.txn, rev, row) is cur[0]
            self.put(spec, tm, row)

    def compare_and_delete(self, data: st.DataObject) -> None:
        """compare_and_delete succeeds only with the row's current revision."""
        assert self.txn is not None
        matching = data.draw(st.booleans(), label="matching")
        off = data.draw(st.integers(1, 3), label="off")
        spec = self.pick_locked(data)
        tm = self.pending[spec.name]
        t = self.tables[spec.name]
        pk_value = data.draw(st.sampled_from(spec.pks), label="pk")
        pk = spec.primary.encode(pk_value)
        cur = tm.rows.get(pk)
        if cur is None:
            with pytest.raises(ObjectNotFoundError):
                t.compare_and_delete(self.txn, 1, Row(pk_value))
        elif not matching:
            with pytest.raises(RevisionMismatchError):
                t.compare_and_delete(self.txn, cur[1] + off, Row(pk_value))
        else:
            assert t.compare_and_delete(self.txn, cur[1], Row(pk_value)) is cur[0]
            self.remove(spec, tm, pk)

    def delete_all(self, data: st.DataObject) -> None:
        """delete_all removes every row and says how many."""
        assert self.txn is not None
        spec = self.pick_locked(data)
        tm = self.pending[spec.name]
        assert self.tables[spec.name].delete_all(self.txn) == len(tm.rows)
        for pk in sorted(tm.rows):
            self.remove(spec, tm, pk)

    # ----- reads ------------------------------------------------------------------
    def keep_snapshot(self) -> None:
        """Keep a read transaction (and the model at that time) for later queries."""
        self.snapshots.append((self.db.read_txn(), copy_model(self.committed)))
        del self.snapshots[:-4]

    def pick_target(self, data: st.DataObject) -> tuple[ReadTxn, Model, str]:
        """A transaction to query: the write txn, the latest snapshot or an old one."""
        choices = ["latest"] + (["write"] if self.txn is not None else [])
        choices += [f"old{i}" for i in range(len(self.snapshots))]
        where = data.draw(st.sampled_from(choices), label="target")
        if where == "write":
            assert self.txn is not None
            return self.txn, {**self.committed, **self.pending}, where
        if where == "latest":
            return self.db.read_txn(), self.committed, where
        txn, model = self.snapshots[int(where[3:])]
        return txn, model, where

    @rule(data=st.data(), n=st.integers(1, 6))
    def query(self, data: st.DataObject, n: int) -> None:
        """Any query kind, on any index, in any transaction, equals the model's answer."""
        for _ in range(n):
            txn, model, where = self.pick_target(data)
            spec = self.pick_spec(data)
            kind, index, key, raw = self.draw_query(data, spec, QUERY_KINDS)
            want = expected_query(spec, model[spec.name], kind, index, key)
            got, plain = actual_query(self.tables[spec.name], txn, kind, index, key, raw)
            label = f"{kind} {spec.name}.{index} {key!r} in {where}"
            assert got == want, label
            assert plain == [row for row, _ in want], label

    @rule(data=st.data())
    def watch(self, data: st.DataObject) -> None:
        """Take a watch on the latest snapshot or in the write txn; it starts open."""
        in_write = self.txn is not None and data.draw(st.booleans(), label="in_write")
        spec = self.pick_spec(data)
        if in_write and spec.name not in self.pending:
            in_write = False
        txn: ReadTxn = self.txn if in_write and self.txn is not None else self.db.read_txn()
        model = self.pending if in_write else self.committed
        kind, index, key, _ = self.draw_query(data, spec, QUERY_KINDS)
        rows, w = watch_query(self.tables[spec.name], txn, kind, index, key)
        want = [row for row, _ in expected_query(spec, model[spec.name], kind, index, key)]
        assert rows == want, f"{kind} watch {spec.name}.{index} {key!r}: {rows} != {want}"
        assert not w.closed, "a watch on the latest contents must start open"
        self.watches.append(WatchRecord(w, in_write, spec.name, kind, index, key, rows))
        del self.watches[:-40]

    # ----- change iterators -------------------------------------------------------
    @rule(data=st.data(), action=st.sampled_from(["next", "next", "next", "open", "close"]))
    def changes(self, data: st.DataObject, action: str) -> None:
        """Mostly next() on an iterator; sometimes open a new one or close one."""
        if action == "open" or not self.iters:
            if self.txn is None and len(self.iters) < 5:
                self.open_iterator_on(self.pick_spec(data))
        elif action == "close":
            self.close_iterator(data)
        else:
            rec = data.draw(st.sampled_from(self.iters), label="iterator")
            for _ in range(data.draw(st.integers(1, 3), label="calls")):
                self.next_changes(data, rec)

    def open_iterator_on(self, spec: Spec) -> None:
        """Start a change iterator on ``spec``'s table (no write txn may be open)."""
        t = self.tables[spec.name]
        with self.db.write_txn(t) as txn:
            it = t.changes(txn)
        rev = self.committed[spec.name].revision
        self.iters.append(IterRecord(it, spec.name, rev, rev))
        self.after_commit(set())

    def next_changes(self, data: st.DataObject, rec: IterRecord) -> None:
        """One next() of ``rec`` on a snapshot drawn from the latest and the kept ones."""
        spec = SPEC[rec.table]
        choices = ["latest"] + [f"old{i}" for i in range(len(self.snapshots))]
        where = data.draw(st.sampled_from(choices), label="target")
        if where == "latest":
            txn, model = self.db.read_txn(), self.committed
        else:
            txn, model = self.snapshots[int(where[3:])]
        tm = model[rec.table]
        if tm.revision < rec.start:
            with pytest.raises(ValueError):
                rec.it.next(txn)
            return
        if tm.revision < rec.seen:
            # Older than what was already delivered: nothing new (or refused), no rewind.
            try:
                changes, _ = rec.it.next(txn)
                assert list(changes) == [], "an older snapshot reported changes again"
            except ValueError:
                pass
            return
        changes, _ = rec.it.next(txn)
        batch = list(changes)
        revs = [c.revision for c in batch]
        assert revs == sorted(revs) and len(set(revs)) == len(revs), "changes out of order"
        if batch and rec.started:
            assert revs[0] > rec.seen, f"a change was reported twice: {revs} after {rec.seen}"
        assert all(r <= tm.revision for r in revs)
        for c in batch:
            pk = spec.primary.keys_of(c.obj)[0]
            if c.deleted:
                rec.state.pop(pk, None)
            else:
                rec.state[pk] = c.obj
        assert rec.state == {pk: row for pk, (row, _) in tm.rows.items()}, "rebuild differs"
        rec.seen = tm.revision
        rec.started = True

    def close_iterator(self, data: st.DataObject) -> None:
        """Close an iterator; it may not be used again."""
        rec = data.draw(st.sampled_from(self.iters), label="iterator")
        rec.it.close()
        self.iters.remove(rec)
        with pytest.raises(RuntimeError):
            rec.it.next(self.db.read_txn())

    # ----- invariants -------------------------------------------------------------
    @invariant()
    def contents_match(self) -> None:
        """Latest snapshot, old snapshots and the write txn all show their model."""
        latest = self.db.read_txn()
        for spec in SPECS:
            self.check_table(latest, spec, self.committed[spec.name], "latest")
            for i, (txn, model) in enumerate(self.snapshots):
                self.check_table(txn, spec, model[spec.name], f"old{i}")
            if self.txn is not None and spec.name in self.pending:
                self.check_table(self.txn, spec, self.pending[spec.name], "write txn")

    @invariant()
    def no_watch_closes_between_commits(self) -> None:
        """Watches close only at commit: the open ones kept after a commit stay open."""
        for rec in self.watches:
            assert not rec.watch.closed, f"{rec.kind} watch on {rec.table} closed without commit"

    def teardown(self) -> None:
        """Release the write locks and the iterators."""
        if self.txn is not None:
            self.txn.abort()
        for rec in self.iters:
            rec.it.close()


SHRINK_ENV = "STATEDB_HYPOTHESIS_SHRINK"


def machine_settings(default_examples: int, steps: int) -> settings:
    """The settings of statedb's state machines. The same runs every time by default, so a
    suite run cannot fail by luck; STATEDB_HYPOTHESIS_RANDOM=1 (with more examples, from
    STATEDB_HYPOTHESIS_EXAMPLES) explores new ones. One failure is enough to report, and
    shrinking a failing run takes minutes, so it is off unless STATEDB_HYPOTHESIS_SHRINK=1
    asks for a minimal one."""
    return settings(
        max_examples=int(os.environ.get("STATEDB_HYPOTHESIS_EXAMPLES", str(default_examples))),
        stateful_step_count=steps,
        deadline=None,
        derandomize=not os.environ.get("STATEDB_HYPOTHESIS_RANDOM"),
        report_multiple_bugs=False,
        phases=[p for p in Phase if p is not Phase.shrink or bool(os.environ.get(SHRINK_ENV))],
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )


StateDBMachine.TestCase.settings = machine_settings(100, steps=50)
TestStateDB = StateDBMachine.TestCase
