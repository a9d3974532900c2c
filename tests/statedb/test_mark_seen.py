"""ChangeIterator.mark_seen: a writer skips its own commits, never anyone else's."""

from __future__ import annotations

from statedb import ChangeIterator, ReadTxn
from tests.statedb.helpers import OBJ1, OBJ2, Obj, new_db, obj


def ids(it: ChangeIterator[Obj], txn: ReadTxn) -> list[tuple[int, bool]]:
    """(id, deleted) of every change the iterator returns for ``txn``."""
    changes, _ = it.next(txn)
    return [(c.obj.id, c.deleted) for c in changes]


def test_own_commit_is_skipped_when_the_iterator_stands_at_its_base() -> None:
    db, (t1,) = new_db("t1")
    with db.write_txn(t1) as txn:
        it = t1.changes(txn)
        t1.insert(txn, OBJ1)
    assert ids(it, db.read_txn()) == [(1, False)]
    with db.write_txn(t1) as txn:
        base = t1.revision(txn)
        t1.insert(txn, OBJ2)
        t1.delete(txn, OBJ1)
        own = t1.revision(txn)
    assert it.mark_seen(base, own)
    assert ids(it, db.read_txn()) == []
    with db.write_txn(t1) as txn:
        t1.insert(txn, obj(3))
    assert ids(it, db.read_txn()) == [(3, False)]


def test_refused_when_other_commits_may_be_in_between() -> None:
    db, (t1,) = new_db("t1")
    with db.write_txn(t1) as txn:
        it = t1.changes(txn)
    assert not it.mark_seen(0, 5)  # before the first next(): nothing is skipped
    assert ids(it, db.read_txn()) == []
    with db.write_txn(t1) as txn:  # someone else's commit, not yet read
        t1.insert(txn, OBJ1)
    with db.write_txn(t1) as txn:
        base = t1.revision(txn)
        t1.insert(txn, OBJ2)
        own = t1.revision(txn)
    assert not it.mark_seen(base, own)
    assert ids(it, db.read_txn()) == [(1, False), (2, False)]
