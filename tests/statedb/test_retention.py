"""`Table.retention`: what a table keeps beyond its rows, and how a held transaction shows.

A ReadTxn holds the state of every table it was taken from; while it is referenced, the
row versions it can see stay. The figures let an application (the agent's health, its
debug probe) notice a transaction that some code keeps by mistake.
"""

from __future__ import annotations

import gc

import pytest

from statedb import DB
from statewright.agent.components.statedb import held_snapshots
from tests.statedb.helpers import new_db, obj


def _update_all(db: DB, rounds: int, rows: int) -> None:
    (table,) = [t for t in db.tables if t.name == "t1"]
    for r in range(rounds):
        with db.write_txn(table) as txn:
            for i in range(rows):
                table.insert(txn, obj(i, f"10.0.{r % 250}.{i % 250}/32"))


def _trim(db: DB) -> None:
    """A write to the table: its transaction trims what no live snapshot needs."""
    (table,) = [t for t in db.tables if t.name == "t1"]
    with db.write_txn(table) as txn:
        table.insert(txn, obj(999, "10.9.9.9/32"))


def test_retention_without_held_snapshots_is_just_the_rows() -> None:
    db, (t1, _) = new_db("t1", "t2")
    _update_all(db, 20, 50)
    _trim(db)
    r = t1.retention(db.read_txn())
    assert r["rows"] == 51
    assert r["older_versions"] == 0
    assert r["oldest_snapshot"] == r["revision"]
    assert held_snapshots(db, db.read_txn()) == []


def test_a_held_transaction_of_another_table_shows_as_the_oldest_snapshot() -> None:
    db, (t1, t2) = new_db("t1", "t2")
    _update_all(db, 1, 50)
    held = db.read_txn()  # e.g. a loop that waits on t2 with this in a local variable
    t2.count(held)
    start = t1.revision(held)
    _update_all(db, 20, 50)
    r = t1.retention(db.read_txn())
    assert r["oldest_snapshot"] == start
    assert r["older_versions"] == 50  # every row has versions the held snapshot may need
    assert r["live_snapshots"] >= 2

    del held
    gc.collect()
    _trim(db)
    r = t1.retention(db.read_txn())
    assert r["oldest_snapshot"] == r["revision"]
    assert r["older_versions"] == 0


def test_health_names_a_snapshot_held_far_behind(monkeypatch: pytest.MonkeyPatch) -> None:
    import statewright.agent.components.statedb as component

    db, (t1, _) = new_db("t1", "t2")
    _update_all(db, 1, 10)
    held = db.read_txn()
    _update_all(db, 30, 10)
    monkeypatch.setattr(component, "HELD_SNAPSHOT_LAG", 100)
    lines = held_snapshots(db, db.read_txn())
    assert len(lines) == 1 and lines[0].startswith("table t1: a snapshot at revision ")
    assert f"revision {t1.revision(held)} is held" in lines[0]
    del held
