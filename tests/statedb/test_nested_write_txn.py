"""A second write transaction on a table from the thread whose write transaction holds it
raises a clear error at once instead of deadlocking; other threads still wait their turn."""

from __future__ import annotations

import threading
from dataclasses import dataclass

import pytest

from statedb import DB, Index, NestedWriteTxnError, Table


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
        with pytest.raises(NestedWriteTxnError, match="'a' is already locked"):
            db.write_txn(b, a)
        # Nothing of the refused transaction stays locked: b is free for this thread.
        with db.write_txn(b) as inner:
            b.insert(inner, Row("y"))
    with db.write_txn(a) as again:  # released after commit
        assert a.get(again, "x") == Row("x")


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
    db, a, _ = _db()
    with pytest.raises(RuntimeError), db.write_txn(a):
        raise RuntimeError("give up")
    with db.write_txn(a) as txn:
        a.insert(txn, Row("after"))
