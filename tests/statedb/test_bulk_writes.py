"""Bulk paths for hot loops: change records with their keys, Table.compare_and_swap_many."""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

from hypothesis import given, settings
from hypothesis import strategies as st

from statedb import DB, Index, ObjectReusedError, ReadTxn, Table, UniqueIndexConflictError, keys
from tests.statedb.helpers import new_db, obj

R = TypeVar("R")


def revision_of(table: Table[R], txn: ReadTxn, row: Any) -> int:
    """The revision at which ``row`` is stored in ``txn``."""
    got = table.get_revision(txn, table.primary.query_bytes(table.primary_key_of(row)))
    assert got is not None
    return got[1]


def test_change_records_carry_the_encoded_primary_key() -> None:
    db, (t1,) = new_db("t1")
    with db.write_txn(t1) as txn:
        it = t1.changes(txn)
        for i in range(1, 5):
            t1.insert(txn, obj(i))
    first, _ = it.next(db.read_txn())
    got = list(first)
    assert [(r.obj.id, r.deleted) for r in got] == [(1, False), (2, False), (3, False), (4, False)]
    with db.write_txn(t1) as txn:
        t1.delete(txn, obj(2))
        t1.insert(txn, obj(3, None, "x"))
    later, _ = it.next(db.read_txn())
    got += later
    assert [(r.obj.id, r.deleted) for r in got[4:]] == [(2, True), (3, False)]
    assert all(r[2] == r.key == t1.primary_key_of(r[0]) for r in got)


def test_compare_and_swap_many_writes_unchanged_rows_only() -> None:
    db, (t1,) = new_db("t1")
    with db.write_txn(t1) as txn:
        for i in range(1, 5):
            t1.insert(txn, obj(i))
    txn = db.read_txn()
    revs = {o.id: revision_of(t1, txn, o) for o in t1.all(txn)}
    with db.write_txn(t1) as w:
        t1.insert(w, obj(2, None, "changed"))  # row 2 moves on
        t1.delete(w, obj(3))  # row 3 goes
    items = [(t1.primary_key_of(obj(i)), revs[i], obj(i, None, "swapped")) for i in range(1, 5)]
    with db.write_txn(t1) as w:
        skipped = t1.compare_and_swap_many(w, items)
    assert skipped == [(1, None), (2, None)]
    rows = {o.id: o.tags for o in t1.all(db.read_txn())}
    assert rows == {1: frozenset({"swapped"}), 2: frozenset({"changed"}), 4: frozenset({"swapped"})}


def test_compare_and_swap_many_keeps_each_version_a_held_snapshot_sees() -> None:
    # Swapped while snapshots are held: the first swap of a key keeps the replaced head
    # for them (nothing older kept yet), the second adds to what is kept.
    db, (t1,) = new_db("t1")
    with db.write_txn(t1) as w:
        for i in range(1, 4):
            t1.insert(w, obj(i, None, "v1"))
    snapshots = [db.read_txn()]
    for version in ("v2", "v3"):
        txn = db.read_txn()
        items = [
            (t1.primary_key_of(o), revision_of(t1, txn, o), obj(o.id, None, version))
            for o in t1.all(txn)
        ]
        with db.write_txn(t1) as w:
            assert t1.compare_and_swap_many(w, items) == []
        snapshots.append(db.read_txn())
    for snapshot, version in zip(snapshots, ("v1", "v2", "v3")):
        assert [(o.id, o.tags) for o in t1.all(snapshot)] == [
            (i, frozenset({version})) for i in range(1, 4)
        ]
        assert [t1.get(snapshot, i) for i in range(1, 4)] == [
            obj(i, None, version) for i in range(1, 4)
        ]


def test_compare_and_swap_many_reports_errors_and_writes_the_rest() -> None:
    db, (t1,) = new_db("t1")
    with db.write_txn(t1) as txn:
        for i in range(1, 4):
            t1.insert(txn, obj(i))
    txn = db.read_txn()
    stored = {o.id: o for o in t1.all(txn)}
    rev = t1.revision(txn)
    revs = {i: revision_of(t1, txn, o) for i, o in stored.items()}
    items = [
        (t1.primary_key_of(stored[1]), revs[1], obj(9)),  # obj's key is not the item's key
        (t1.primary_key_of(stored[2]), revs[2], stored[2]),  # the stored object itself
        (t1.primary_key_of(stored[3]), revs[3], obj(3, None, "ok")),
    ]
    with db.write_txn(t1) as w:
        skipped = t1.compare_and_swap_many(w, items)
    assert [pos for pos, _ in skipped] == [0, 1]
    assert isinstance(skipped[0][1], ValueError) and "t1" in str(skipped[0][1])
    assert isinstance(skipped[1][1], ObjectReusedError)
    after = db.read_txn()
    assert t1.revision(after) == rev + 1
    assert {o.id: o.tags for o in t1.all(after)} == {
        1: frozenset(),
        2: frozenset(),
        3: frozenset({"ok"}),
    }


@dataclasses.dataclass(frozen=True, slots=True)
class Named:
    """A row with a unique secondary index on ``name``."""

    id: int
    name: str


def named_db() -> tuple[DB, Table[Named], Index[Named, str]]:
    """A DB with one table of Named rows: primary key id, unique index on name."""
    by_name: Index[Named, str] = Index("name", key=lambda r: r.name)
    table: Table[Named] = Table(
        "named", Index("id", key=lambda r: r.id, encode=keys.uint64), by_name
    )
    return DB(table), table, by_name


def test_compare_and_swap_many_keeps_unique_indexes() -> None:
    db, table, by_name = named_db()
    with db.write_txn(table) as w:
        table.insert(w, Named(1, "a"))
        table.insert(w, Named(2, "b"))
    txn = db.read_txn()
    items = []
    for row in table.all(txn):
        new_name = "b" if row.id == 1 else "c"  # row 1 would take row 2's name
        pk = table.primary_key_of(row)
        items.append((pk, revision_of(table, txn, row), Named(row.id, new_name)))
    with db.write_txn(table) as w:
        skipped = table.compare_and_swap_many(w, items)
    # Row 1 first: "b" is still row 2's name, a conflict; then row 2 becomes "c".
    assert len(skipped) == 1 and isinstance(skipped[0][1], UniqueIndexConflictError)
    after = db.read_txn()
    assert table.get(after, by_name.query("a")) == Named(1, "a")
    assert table.get(after, by_name.query("c")) == Named(2, "c")
    assert table.get(after, by_name.query("b")) is None


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.integers(0, 20), max_size=30),
    st.lists(st.tuples(st.integers(0, 20), st.booleans()), max_size=30),
)
def test_compare_and_swap_many_equals_one_cas_per_item(
    initial: list[int], swaps: list[tuple[int, bool]]
) -> None:
    """Same outcome as calling compare_and_swap for each item, skipping the ones it refuses."""
    results = []
    for bulk in (True, False):
        db, (t1,) = new_db("t1")
        with db.write_txn(t1) as w:
            for i in initial:
                t1.insert(w, obj(i))
        txn = db.read_txn()
        items = []
        for n, (i, stale) in enumerate(swaps):
            pk = t1.primary_key_of(obj(i))
            got = t1.get_revision(txn, t1.primary.query_bytes(pk))
            rev = (got[1] if got is not None else 1) - (1 if stale else 0)
            items.append((pk, rev, obj(i, None, f"v{n}")))
        with db.write_txn(t1) as w:
            if bulk:
                skipped = [pos for pos, _ in t1.compare_and_swap_many(w, items)]
            else:
                skipped = []
                for pos, (_, rev, o) in enumerate(items):
                    try:
                        t1.compare_and_swap(w, rev, o)
                    except Exception:
                        skipped.append(pos)
        after = db.read_txn()
        rows = sorted((o.id, tuple(o.tags)) for o in t1.all(after))
        results.append((skipped, rows, t1.revision(after)))
    assert results[0] == results[1]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 15), st.sampled_from(["a", "b", "c"])), max_size=40))
def test_insert_many_equals_one_insert_per_object(rows: list[tuple[int, str]]) -> None:
    """Same rows, revisions and change stream as calling insert for each object."""
    results = []
    for bulk in (True, False):
        db, (t1,) = new_db("t1")
        with db.write_txn(t1) as w:
            it = t1.changes(w)
        objs = [obj(i, None, tag) for i, tag in rows]
        with db.write_txn(t1) as w:
            if bulk:
                assert t1.insert_many(w, objs) == len(objs)
            else:
                for o in objs:
                    t1.insert(w, o)
        txn = db.read_txn()
        records, _ = it.next(txn)
        results.append(
            (
                [(o.id, o.tags) for o in t1.all(txn)],
                t1.revision(txn),
                [(r.obj.id, r.revision, r.deleted) for r in records],
                [(o.id, sorted(o.tags)) for o in t1.list(txn, t1.index("tags").query("b"))],
            )
        )
    assert results[0] == results[1]


def test_insert_many_with_unique_secondary_index_and_errors() -> None:
    db, table, by_name = named_db()
    with db.write_txn(table) as w:
        assert table.insert_many(w, [Named(1, "a"), Named(2, "b")]) == 2
    with db.write_txn(table) as w:
        try:
            table.insert_many(w, [Named(3, "c"), Named(4, "a")])
        except UniqueIndexConflictError:
            pass
        else:
            raise AssertionError("expected a unique index conflict")
        assert table.get(w, by_name.query("c")) == Named(3, "c")  # written before the error
        w.abort()
    db2, (t1,) = new_db("t1")
    first = obj(1)
    with db2.write_txn(t1) as w:
        t1.insert_many(w, [first])
    with db2.write_txn(t1) as w:
        try:
            t1.insert_many(w, [obj(2), first])
        except ObjectReusedError:
            pass
        else:
            raise AssertionError("expected ObjectReusedError")
        assert t1.revision(w) == 2  # obj(2) stays written in this transaction
    assert sorted(o.id for o in t1.all(db2.read_txn())) == [1, 2]


@settings(max_examples=80, deadline=None)
@given(
    st.sets(st.integers(0, 12), max_size=8),
    st.sets(st.integers(0, 12), max_size=6),
    st.sets(st.integers(0, 12), max_size=6),
    st.lists(st.integers(0, 12), max_size=30),
)
def test_insert_new_equals_get_then_insert(
    committed: set[int], deleted_before: set[int], deleted_now: set[int], ids: list[int]
) -> None:
    """Table.insert_new, resumed after each object it stops at, writes what a lookup then
    an insert of each absent object writes: the same rows, count, revisions and change
    stream, over committed rows, deletions a snapshot still reads and the transaction's
    own deletions and writes (a repeated id is present by then)."""
    results = []
    for bulk in ("keys", True, False):
        db, (t1,) = new_db("t1")
        with db.write_txn(t1) as w:
            it = t1.changes(w)
            for i in sorted(committed):
                t1.insert(w, obj(i, None, "old"))
        with db.write_txn(t1) as w:
            for i in sorted(deleted_before):
                t1.delete(w, obj(i))
        snapshot = db.read_txn()  # keeps the committed deletions' records readable
        objs = [obj(i, None, "new", str(k)) for k, i in enumerate(ids)]
        skipped: list[int] = []
        with db.write_txn(t1) as w:
            for i in sorted(deleted_now):
                t1.delete(w, obj(i))
            if bulk:
                pks = [t1.primary_key_of(o) for o in objs] if bulk == "keys" else []
                pos = t1.insert_new(w, objs, 0, pks)
                while pos < len(objs):
                    skipped.append(pos)
                    pos = t1.insert_new(w, objs, pos + 1, pks)
            else:
                for pos, o in enumerate(objs):
                    if t1.get(w, o.id) is None:
                        t1.insert(w, o)
                    else:
                        skipped.append(pos)
            in_txn = (t1.count(w), t1.revision(w))
        txn = db.read_txn()
        records, _ = it.next(txn)
        results.append(
            (
                skipped,
                in_txn,
                sorted((o.id, tuple(sorted(o.tags))) for o in t1.all(txn)),
                t1.count(txn),
                [(r.obj.id, r.revision, r.deleted) for r in records],
                sorted(o.id for o in t1.all(snapshot)),
            )
        )
    assert results[0] == results[1] == results[2]


def test_insert_new_with_a_unique_secondary_index() -> None:
    db, table, by_name = named_db()
    with db.write_txn(table) as w:
        table.insert(w, Named(2, "b"))
    rows = [Named(1, "a"), Named(2, "x"), Named(3, "c")]
    with db.write_txn(table) as w:
        assert table.insert_new(w, rows) == 1  # a row has id 2
        assert table.insert_new(w, rows, 2) == 3
        try:
            table.insert_new(w, [Named(4, "a")])
        except UniqueIndexConflictError:
            pass
        else:
            raise AssertionError("expected a unique index conflict")
    after = db.read_txn()
    assert sorted((r.id, r.name) for r in table.all(after)) == [(1, "a"), (2, "b"), (3, "c")]
    assert table.get(after, by_name.query("c")) == Named(3, "c")


class _SelfKey(bytes):
    """A key type that is its own encoding."""


@dataclasses.dataclass(frozen=True)
class _Keyed:
    key: _SelfKey
    value: int


def test_a_self_encoded_key_skips_the_encoder() -> None:
    calls: list[object] = []

    def encode(value: Any) -> bytes:
        calls.append(value)
        return bytes(value)

    keys.self_encoding(encode, _SelfKey)
    table: Table[_Keyed] = Table("keyed", Index("key", key=lambda r: r.key, encode=encode))
    db = DB(table)
    a, b, c = _SelfKey(b"a"), _SelfKey(b"b"), _SelfKey(b"c")
    with db.write_txn(table) as w:
        table.insert(w, _Keyed(a, 1))
        table.insert_many(w, [_Keyed(b, 2)])
        assert table.insert_new(w, [_Keyed(c, 3), _Keyed(a, 4)]) == 1
        table.delete(w, _Keyed(b, 2))
    txn = db.read_txn()
    assert table.get(txn, a) == _Keyed(a, 1)
    assert table.get(txn, b) is None
    assert table.get_many(txn, [c, b, a]) == [_Keyed(c, 3), None, _Keyed(a, 1)]
    assert [r.value for r in table.all(txn)] == [1, 3]
    assert calls == []
    assert table.get(txn, b"c") == _Keyed(c, 3)  # any other key type is encoded
    assert calls == [b"c"] and type(calls[0]) is bytes


@settings(max_examples=60, deadline=None)
@given(
    st.sets(st.integers(0, 10), max_size=8),
    st.lists(st.tuples(st.booleans(), st.integers(0, 10)), max_size=12),
    st.lists(st.integers(0, 12), max_size=12),
)
def test_get_many_equals_get_per_key(
    committed: set[int], writes: list[tuple[bool, int]], keys_: list[int]
) -> None:
    """Table.get_many answers as get does per key: in a snapshot taken before a write
    transaction (while it is under way and after its commit), in the transaction itself
    and in a snapshot after it."""
    db, (t1,) = new_db("t1")
    with db.write_txn(t1) as w:
        for i in sorted(committed):
            t1.insert(w, obj(i, None, "old"))
    before = db.read_txn()
    w = db.write_txn(t1)
    for k, (delete, i) in enumerate(writes):
        if delete:
            t1.delete(w, obj(i))
        else:
            t1.insert(w, obj(i, None, f"new{k}"))
    for txn in (before, w):
        assert t1.get_many(txn, keys_) == [t1.get(txn, i) for i in keys_]
    w.commit()
    for txn in (before, db.read_txn()):
        assert t1.get_many(txn, keys_) == [t1.get(txn, i) for i in keys_]
