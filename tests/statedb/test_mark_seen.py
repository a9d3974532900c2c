"""ChangeIterator.mark_seen: a writer skips its own commits, never anyone else's."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

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


def test_refused_before_the_first_next_and_for_delivered_revisions() -> None:
    db, (t1,) = new_db("t1")
    with db.write_txn(t1) as txn:
        it = t1.changes(txn)
        t1.insert(txn, OBJ1)
    assert not it.mark_seen(0, 1)  # the first next() lists every row, own writes too
    assert ids(it, db.read_txn()) == [(1, False)]
    assert not it.mark_seen(0, 1)  # already delivered


def test_other_commits_around_an_own_range_are_still_reported() -> None:
    """The own range is skipped wherever it lies; commits before and after it are not."""
    db, (t1,) = new_db("t1")
    with db.write_txn(t1) as txn:
        it = t1.changes(txn)
    assert ids(it, db.read_txn()) == []
    with db.write_txn(t1) as txn:  # someone else's commit, not yet read
        t1.insert(txn, OBJ1)
    with db.write_txn(t1) as txn:  # our own
        base = t1.revision(txn)
        t1.insert(txn, OBJ2)
        t1.insert(txn, obj(4))
        own = t1.revision(txn)
    assert it.mark_seen(base, own)
    with db.write_txn(t1) as txn:  # someone else's again, after ours
        t1.insert(txn, obj(3))
        t1.delete(txn, obj(4))  # supersedes part of our range: the deletion is reported
    assert ids(it, db.read_txn()) == [(1, False), (3, False), (4, True)]
    with db.write_txn(t1) as txn:
        t1.insert(txn, obj(5))
    assert ids(it, db.read_txn()) == [(5, False)]


@settings(max_examples=80, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.tuples(st.just("other"), st.integers(1, 8), st.booleans()),
            st.tuples(st.just("own"), st.integers(1, 8), st.just(False)),
            st.tuples(st.just("next"), st.just(0), st.just(False)),
        ),
        max_size=40,
    )
)
def test_own_ranges_anywhere_hide_exactly_the_own_writes(
    steps: list[tuple[str, int, bool]],
) -> None:
    """Own transactions (each marked seen) and others' commits in any order: every next()
    reports exactly the others' changes since the previous one (latest per key), as a
    reference iterator does once the own writes are taken out. Own writes only touch keys
    whose last change was delivered already, as the reconciler's compare-and-swap ensures."""
    db, (t1,) = new_db("t1")
    with db.write_txn(t1) as txn:
        it = t1.changes(txn)
    ids(it, db.read_txn())  # the first next(): nothing yet
    # Others' changes not yet delivered, in order: every deletion, and the latest upsert
    # of each key (an upsert is superseded by any later write of its key).
    pending: list[tuple[int, bool]] = []
    version = 0
    for kind, key, delete in steps:
        if kind == "next":
            assert ids(it, db.read_txn()) == pending
            pending = []
        elif kind == "other":
            with db.write_txn(t1) as txn:
                if delete:
                    if t1.delete(txn, obj(key)) is not None:
                        pending = [p for p in pending if p != (key, False)] + [(key, True)]
                else:
                    version += 1
                    t1.insert(txn, obj(key, None, f"v{version}"))
                    pending = [p for p in pending if p != (key, False)] + [(key, False)]
        elif all(k != key for k, _ in pending):
            with db.write_txn(t1) as txn:
                base = t1.revision(txn)
                version += 1
                t1.insert(txn, obj(key, None, f"own{version}"))
                own = t1.revision(txn)
            assert it.mark_seen(base, own)
