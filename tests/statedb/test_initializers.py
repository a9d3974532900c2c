"""Table initializers: a table is initialized once every registered initializer is done."""

from __future__ import annotations

import threading

import pytest

from statedb import TableNotLockedError
from tests.statedb.helpers import OBJ1, new_db


def test_new_table_is_initialized() -> None:
    """Without initializers a table is initialized and its watch is already closed."""
    db, (t1,) = new_db("t1")
    done, watch = t1.initialized(db.read_txn())
    assert done and watch.closed
    assert t1.pending_initializers(db.read_txn()) == []


def test_initializers_complete_one_by_one() -> None:
    """The watch closes when the last pending initializer is done, not before."""
    db, (t1,) = new_db("t1")
    before = db.read_txn()
    with db.write_txn(t1) as txn:
        done_a = t1.register_initializer(txn, "a")
        done_b = t1.register_initializer(txn, "b")
        assert t1.initialized(txn)[0] is False  # the write txn sees its own registration
        assert t1.initialized(before)[0] is True  # older snapshots do not
    ok, watch = t1.initialized(db.read_txn())
    assert not ok and not watch.closed
    assert t1.pending_initializers(db.read_txn()) == ["a", "b"]

    with db.write_txn(t1) as txn:
        done_a(txn)
        t1.insert(txn, OBJ1)
    assert not watch.closed
    assert t1.pending_initializers(db.read_txn()) == ["b"]

    with db.write_txn(t1) as txn:
        done_b(txn)
        assert t1.initialized(txn)[0] is True
        assert not watch.closed  # only the commit closes it
    assert watch.closed
    ok_now, watch_now = t1.initialized(db.read_txn())
    assert ok_now and watch_now.closed

    with db.write_txn(t1) as txn:
        done_b(txn)  # calling it again is harmless
    assert t1.initialized(db.read_txn())[0] is True


def test_initializer_done_in_an_aborted_txn_does_not_count() -> None:
    """Marking done in a transaction that aborts leaves the table uninitialized."""
    db, (t1,) = new_db("t1")
    with db.write_txn(t1) as txn:
        done = t1.register_initializer(txn, "sync")
    _, watch = t1.initialized(db.read_txn())
    txn2 = db.write_txn(t1)
    done(txn2)
    txn2.abort()
    assert not watch.closed
    assert t1.initialized(db.read_txn())[0] is False
    with db.write_txn(t1) as txn3:
        done(txn3)
    assert watch.closed and t1.initialized(db.read_txn())[0]


def test_registering_in_an_aborted_txn_does_not_count() -> None:
    """An initializer registered in an aborted transaction does not block the table."""
    db, (t1,) = new_db("t1")
    txn = db.write_txn(t1)
    t1.register_initializer(txn, "x")
    txn.abort()
    assert t1.initialized(db.read_txn())[0] is True


def test_stale_snapshot_gets_a_closed_watch() -> None:
    """A snapshot taken before initialization completed gets a closed watch afterwards."""
    db, (t1,) = new_db("t1")
    with db.write_txn(t1) as txn:
        done = t1.register_initializer(txn, "x")
    old = db.read_txn()
    with db.write_txn(t1) as txn:
        done(txn)
    ok, watch = t1.initialized(old)
    assert not ok and watch.closed


def test_reinitialization_gets_a_fresh_watch() -> None:
    """A new initializer after completion makes the table uninitialized with an open watch."""
    db, (t1,) = new_db("t1")
    with db.write_txn(t1) as txn:
        first = t1.register_initializer(txn, "first")
    with db.write_txn(t1) as txn:
        first(txn)
    with db.write_txn(t1) as txn:
        second = t1.register_initializer(txn, "second")
    ok, watch = t1.initialized(db.read_txn())
    assert not ok and not watch.closed
    with db.write_txn(t1) as txn:
        second(txn)
    assert watch.closed


def test_done_needs_the_table_locked() -> None:
    """The done function writes the table, so its transaction must lock it."""
    db, (t1, t2) = new_db("t1", "t2")
    with db.write_txn(t1) as txn:
        done = t1.register_initializer(txn, "x")
    with db.write_txn(t2) as txn, pytest.raises(TableNotLockedError):
        done(txn)


def test_waiting_for_initialization_from_a_thread() -> None:
    """A thread blocked on the initialized watch wakes when the initializer is done."""
    db, (t1,) = new_db("t1")
    with db.write_txn(t1) as txn:
        done = t1.register_initializer(txn, "sync")
    _, watch = t1.initialized(db.read_txn())
    woke = threading.Event()

    def waiter() -> None:
        if watch.wait(30):  # a hang guard, not a timing assertion
            woke.set()

    th = threading.Thread(target=waiter)
    th.start()
    with db.write_txn(t1) as txn:
        done(txn)
    th.join(30)
    assert woke.is_set()
