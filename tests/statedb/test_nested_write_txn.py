"""A thread holds at most one write transaction of a DB: a second one, nested, raises a
clear error naming both at once, whatever the tables, instead of deadlocking against
another thread; other threads still wait their turn."""

from __future__ import annotations

import threading
from dataclasses import dataclass

import pytest

from statedb import DB, Index, NestedWriteTxnError, StatewrightError, Table


@dataclass(frozen=True)
class Row:
    name: str


def _db() -> tuple[DB, Table[Row], Table[Row]]:
    a = Table("a", Index("name", key=lambda r: r.name))
    b = Table("b", Index("name", key=lambda r: r.name))
    return DB(a, b), a, b


def test_nested_write_txn_on_the_same_table_raises() -> None:
    db, a, b = _db()
    with db.write_txn(a) as outer:
        a.insert(outer, Row("x"))
        with pytest.raises(NestedWriteTxnError, match=r"'a', 'b' refused.*on 'a' is still open"):
            db.write_txn(b, a)
    with db.write_txn(a) as again:  # released after commit
        assert a.get(again, "x") == Row("x")


def test_nested_write_txn_on_another_table_raises_naming_both() -> None:
    db, a, b = _db()
    with db.write_txn(b) as outer:
        b.insert(outer, Row("x"))
        with pytest.raises(NestedWriteTxnError) as info:
            db.write_txn(a)
        assert isinstance(info.value, StatewrightError)
        assert info.value.held == ["b"] and info.value.requested == ["a"]
        assert "'a'" in str(info.value) and "'b'" in str(info.value)
        with pytest.raises(NestedWriteTxnError):  # not even without waiting
            db.try_write_txn(a)
    # Nothing of the refused transaction stays locked: both tables are free again.
    with db.write_txn(a, b) as txn:
        a.insert(txn, Row("y"))
    assert b.get(db.read_txn(), "x") == Row("x")


def test_the_issue_repro_cannot_deadlock() -> None:
    """Thread 1: write_txn(b) then, nested, write_txn(a); thread 2: write_txn(a, b). Before,
    each waited for the other's table for ever; now thread 1's nested one is refused."""
    db, a, b = _db()
    outcome: dict[str, object] = {}
    t1_holds_b = threading.Event()
    t2_started = threading.Event()

    def thread1() -> None:
        try:
            with db.write_txn(b) as txn:
                b.insert(txn, Row("t1"))
                t1_holds_b.set()
                t2_started.wait(5)
                with db.write_txn(a) as inner:
                    a.insert(inner, Row("t1"))
            outcome["t1"] = "nested ran"
        except NestedWriteTxnError as e:
            outcome["t1"] = e

    def thread2() -> None:
        t1_holds_b.wait(5)
        t2_started.set()
        with db.write_txn(a, b) as txn:
            a.insert(txn, Row("t2"))
        outcome["t2"] = "ok"

    threads = [threading.Thread(target=thread1), threading.Thread(target=thread2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(5)
    assert not any(th.is_alive() for th in threads), "deadlocked"
    assert isinstance(outcome["t1"], NestedWriteTxnError), outcome
    assert outcome["t2"] == "ok"
    # Thread 1's outer transaction was aborted by the error: its write is not there.
    assert b.get(db.read_txn(), "t1") is None


def test_other_threads_wait_instead_of_failing() -> None:
    db, a, _ = _db()
    done = threading.Event()
    errors: list[BaseException] = []

    def other() -> None:
        try:
            with db.write_txn(a) as txn:
                a.insert(txn, Row("from-thread"))
        except BaseException as e:  # recorded for the assertion below
            errors.append(e)
        done.set()

    with db.write_txn(a) as txn:
        a.insert(txn, Row("main"))
        th = threading.Thread(target=other)
        th.start()
        assert not done.wait(0.05)  # blocked on the lock, not refused
    th.join(10)
    assert done.is_set() and not errors
    assert a.get(db.read_txn(), "from-thread") == Row("from-thread")


def test_abort_releases_the_owner_too() -> None:
    db, a, b = _db()
    with pytest.raises(RuntimeError), db.write_txn(a):
        raise RuntimeError("give up")
    with db.write_txn(a) as txn:
        a.insert(txn, Row("after"))
    with db.write_txn(b) as txn:  # the thread holds nothing any more
        b.insert(txn, Row("after"))


def test_a_thread_may_write_again_after_commit() -> None:
    db, a, b = _db()
    for i in range(3):
        with db.write_txn(a) as txn:
            a.insert(txn, Row(str(i)))
        with db.write_txn(b) as txn:
            b.insert(txn, Row(str(i)))
    assert db.writers == {}
