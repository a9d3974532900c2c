"""Change iterators: every upsert and deletion exactly once, in revision order, and the
graveyard of deleted rows kept only as long as some iterator still needs it."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from statedb import DB, Change, ChangeIterator, ReadTxn, Table
from tests.statedb.helpers import OBJ1, OBJ2, Obj, new_db, obj


def drain(it: ChangeIterator[Obj], txn: ReadTxn) -> list[Change[Obj]]:
    """All changes the iterator returns for ``txn``."""
    changes, _ = it.next(txn)
    return list(changes)


def summary(changes: list[Change[Obj]]) -> list[tuple[int, bool]]:
    """(id, deleted) of each change, in order."""
    return [(c.obj.id, c.deleted) for c in changes]


def start(db: DB, t: Table[Obj]) -> ChangeIterator[Obj]:
    """A change iterator created in its own committed write transaction."""
    with db.write_txn(t) as txn:
        it = t.changes(txn)
    return it


def apply(state: dict[int, Obj], changes: list[Change[Obj]]) -> None:
    """Replay changes onto a dict keyed by id."""
    for c in changes:
        if c.deleted:
            state.pop(c.obj.id, None)
        else:
            state[c.obj.id] = c.obj


def contents(t: Table[Obj], txn: ReadTxn) -> dict[int, Obj]:
    """The table as a dict keyed by id."""
    return {r.id: r for r in t.all(txn)}


def test_first_next_yields_every_row_then_only_news() -> None:
    """The first next() reports all rows as upserts; later ones what was committed since."""
    db, (t1,) = new_db("t1")
    with db.write_txn(t1) as txn:
        t1.insert(txn, OBJ1)
        t1.insert(txn, OBJ2)
    it = start(db, t1)
    first = drain(it, db.read_txn())
    assert sorted(summary(first)) == [(1, False), (2, False)]
    revs = dict(t1.revisions(db.read_txn()))
    assert {c.obj: c.revision for c in first} == revs
    assert drain(it, db.read_txn()) == []

    with db.write_txn(t1) as txn:
        t1.insert(txn, obj(3))
        t1.delete(txn, OBJ1)
        t1.insert(txn, obj(2, None, "new"))
    later = drain(it, db.read_txn())
    assert summary(later) == [(3, False), (1, True), (2, False)]
    assert [c.revision for c in later] == sorted(c.revision for c in later)
    assert later[2].obj.tags == frozenset({"new"})
    assert drain(it, db.read_txn()) == []


def test_upserts_coalesce_and_delete_reinsert_keeps_order() -> None:
    """Two upserts of one row between calls give its latest version once; a delete and a
    re-insert are both reported, deletion first."""
    db, (t1,) = new_db("t1")
    it = start(db, t1)
    assert drain(it, db.read_txn()) == []
    with db.write_txn(t1) as txn:
        t1.insert(txn, obj(1, None, "a"))
    with db.write_txn(t1) as txn:
        t1.insert(txn, obj(1, None, "b"))
    got = drain(it, db.read_txn())
    assert summary(got) == [(1, False)] and got[0].obj.tags == {"b"}
    with db.write_txn(t1) as txn:
        t1.delete(txn, obj(1))
    with db.write_txn(t1) as txn:
        t1.insert(txn, obj(1, None, "c"))
    got = drain(it, db.read_txn())
    assert summary(got) == [(1, True), (1, False)]
    assert got[0].revision < got[1].revision


def test_next_on_a_snapshot_sees_only_that_snapshot() -> None:
    """Changes committed after the snapshot given to next() come with the next call."""
    db, (t1,) = new_db("t1")
    it = start(db, t1)
    with db.write_txn(t1) as txn:
        t1.insert(txn, OBJ1)
    snap = db.read_txn()
    with db.write_txn(t1) as txn:
        t1.insert(txn, OBJ2)
    assert summary(drain(it, snap)) == [(1, False)]
    assert summary(drain(it, db.read_txn())) == [(2, False)]


def test_watch_closes_when_more_changes_arrive() -> None:
    """The watch returned by next() closes on the next commit to the table."""
    db, (t1, t2) = new_db("t1", "t2")
    it = start(db, t1)
    _, watch = it.next(db.read_txn())
    with db.write_txn(t2) as txn:
        t2.insert(txn, OBJ1)
    assert not watch.closed
    with db.write_txn(t1) as txn:
        t1.insert(txn, OBJ1)
    assert watch.closed
    changes, watch2 = it.next(db.read_txn())
    assert summary(list(changes)) == [(1, False)] and not watch2.closed


def test_interleaved_iterators_rebuild_the_table() -> None:
    """Iterators polled at different paces each see every change exactly once."""
    db, (t1,) = new_db("t1")
    fast, slow = start(db, t1), start(db, t1)
    fast_state: dict[int, Obj] = {}
    slow_state: dict[int, Obj] = {}
    seen: list[tuple[int, int]] = []
    for step in range(60):
        with db.write_txn(t1) as txn:
            t1.insert(txn, obj(step % 7, None, f"s{step}"))
            if step % 3 == 0:
                t1.delete(txn, obj((step * 5) % 7))
            if step % 17 == 16:
                t1.delete_all(txn)
        batch = drain(fast, db.read_txn())
        seen.extend((c.revision, c.obj.id) for c in batch)
        apply(fast_state, batch)
        assert fast_state == contents(t1, db.read_txn())
        if step % 5 == 4:
            apply(slow_state, drain(slow, db.read_txn()))
            assert slow_state == contents(t1, db.read_txn())
    assert len(seen) == len(set(seen))  # nothing reported twice
    assert [r for r, _ in seen] == sorted(r for r, _ in seen)


def test_graveyard_kept_until_every_iterator_saw_the_deletion() -> None:
    """Deleted rows stay in the graveyard while an iterator has not reported them."""
    db, (t1,) = new_db("t1")
    with db.write_txn(t1) as txn:
        t1.insert(txn, OBJ1)
        t1.insert(txn, OBJ2)
    # Without iterators, deletions leave nothing behind.
    with db.write_txn(t1) as txn:
        t1.delete(txn, OBJ1)
    assert t1.graveyard_size(db.read_txn()) == 0

    a, b = start(db, t1), start(db, t1)
    drain(a, db.read_txn())
    drain(b, db.read_txn())
    with db.write_txn(t1) as txn:
        t1.delete(txn, OBJ2)
    assert t1.graveyard_size(db.read_txn()) == 1
    assert summary(drain(a, db.read_txn())) == [(2, True)]
    with db.write_txn(t1) as txn:
        t1.insert(txn, obj(5))
    assert t1.graveyard_size(db.read_txn()) == 1  # b has not seen it yet
    assert summary(drain(b, db.read_txn())) == [(2, True), (5, False)]
    with db.write_txn(t1) as txn:
        t1.insert(txn, obj(6))
    assert t1.graveyard_size(db.read_txn()) == 0


def test_close_releases_the_graveyard() -> None:
    """Closing the only iterator lets the next commit drop the deletions it held."""
    db, (t1,) = new_db("t1")
    with db.write_txn(t1) as txn:
        t1.insert(txn, OBJ1)
        t1.insert(txn, OBJ2)
    it = start(db, t1)
    with db.write_txn(t1) as txn:
        t1.delete_all(txn)
    assert t1.graveyard_size(db.read_txn()) == 2
    it.close()
    it.close()  # idempotent
    assert it.closed
    with pytest.raises(RuntimeError, match="closed"):
        it.next(db.read_txn())
    with db.write_txn(t1) as txn:
        t1.insert(txn, obj(3))
    assert t1.graveyard_size(db.read_txn()) == 0


def test_forgotten_iterator_releases_the_graveyard() -> None:
    """An iterator dropped without close() stops holding deletions once collected."""
    db, (t1,) = new_db("t1")
    with db.write_txn(t1) as txn:
        t1.insert(txn, OBJ1)
    it = start(db, t1)
    with db.write_txn(t1) as txn:
        t1.delete(txn, OBJ1)
    assert t1.graveyard_size(db.read_txn()) == 1
    del it
    gc.collect()
    with db.write_txn(t1) as txn:
        t1.insert(txn, obj(3))
    assert t1.graveyard_size(db.read_txn()) == 0


def test_snapshot_older_than_the_iterator_is_refused() -> None:
    """next() with a snapshot taken before the iterator existed raises ValueError."""
    db, (t1,) = new_db("t1")
    old = db.read_txn()
    with db.write_txn(t1) as txn:
        t1.insert(txn, OBJ1)
        it = t1.changes(txn)
    with pytest.raises(ValueError, match="older than"):
        it.next(old)
    assert summary(drain(it, db.read_txn())) == [(1, False)]


def test_going_back_to_an_older_snapshot_reports_nothing_twice() -> None:
    """After next(new), next(an older snapshot) must not rewind the iterator: a later
    next(new) may not report the same changes again."""
    db, (t1,) = new_db("t1")
    it = start(db, t1)
    with db.write_txn(t1) as txn:
        t1.insert(txn, OBJ1)
    older = db.read_txn()
    with db.write_txn(t1) as txn:
        t1.insert(txn, OBJ2)
    newer = db.read_txn()
    assert sorted(summary(drain(it, newer))) == [(1, False), (2, False)]
    try:
        assert drain(it, older) == []
    except ValueError:
        pass  # refusing the older snapshot is fine too
    assert drain(it, newer) == []
    with db.write_txn(t1) as txn:
        t1.insert(txn, obj(3))
    assert summary(drain(it, db.read_txn())) == [(3, False)]


def test_changes_of_delete_all_and_many_rows() -> None:
    """delete_all reports each row's deletion; large batches come out complete and ordered."""
    db, (t1,) = new_db("t1")
    it = start(db, t1)
    state: dict[int, Obj] = {}
    with db.write_txn(t1) as txn:
        for i in range(3000):
            t1.insert(txn, obj(i, None, f"t{i % 10}"))
    batch = drain(it, db.read_txn())
    assert len(batch) == 3000
    apply(state, batch)
    with db.write_txn(t1) as txn:
        for i in range(0, 3000, 2):
            t1.delete(txn, obj(i))
        assert t1.delete_all(txn) == 1500
        t1.insert(txn, obj(10**6))
    batch = drain(it, db.read_txn())
    assert len(batch) == 3001 and sum(c.deleted for c in batch) == 3000
    assert [c.revision for c in batch] == sorted(c.revision for c in batch)
    apply(state, batch)
    assert state == contents(t1, db.read_txn()) == {10**6: obj(10**6)}


def _ids(rows: Iterator[Obj]) -> list[int]:
    return [r.id for r in rows]


def test_iterator_in_a_write_txn_sees_later_commits_only() -> None:
    """An iterator made in a write txn with uncommitted writes still reports them once
    they are committed (as part of the first next())."""
    db, (t1,) = new_db("t1")
    with db.write_txn(t1) as txn:
        t1.insert(txn, OBJ1)
        it = t1.changes(txn)
        t1.insert(txn, OBJ2)
    assert sorted(summary(drain(it, db.read_txn()))) == [(1, False), (2, False)]
    assert _ids(t1.all(db.read_txn())) == [1, 2]


def test_changes_are_typed_records_with_the_encoded_primary_key() -> None:
    """next() yields `Change` records: obj, revision, key (the encoded primary key), deleted;
    a named tuple of (obj, revision, key)."""
    db, (t1,) = new_db("t1")
    it = start(db, t1)
    assert drain(it, db.read_txn()) == []  # the first call: every row (none yet)
    with db.write_txn(t1) as txn:
        t1.insert(txn, OBJ1)
        t1.insert(txn, OBJ2)
    with db.write_txn(t1) as txn:
        t1.delete(txn, OBJ1)
    rtxn = db.read_txn()
    got = drain(it, rtxn)
    assert all(isinstance(c, Change) for c in got)
    assert [(c.obj, c.key, c.deleted) for c in got] == [
        (OBJ2, t1.primary_key_of(OBJ2), False),
        (OBJ1, t1.primary_key_of(OBJ1), True),
    ]
    assert got[0].revision == dict(t1.revisions(rtxn))[OBJ2]
    assert got[1].revision == t1.revision(rtxn)
    assert tuple(got[0]) == (got[0].obj, got[0].revision, got[0].key)
    assert Change(OBJ2, 7, b"k").deleted is False
    assert Change.deletion(OBJ2, 7, b"k").deleted is True
