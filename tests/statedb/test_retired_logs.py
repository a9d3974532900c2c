"""Logs replaced by compaction are freed a slice per commit (statedb.retired_logs), never
in one piece on the writer's path, and never while a snapshot still reads them."""

from __future__ import annotations

import gc
import itertools
from dataclasses import dataclass

import pytest

from statedb import DB, Index, Table, keys, ordered, retired_logs
from statedb.retired_logs import RetiredLogs


@dataclass(frozen=True, slots=True)
class Row:
    id: int
    value: int


BY_ID: Index[Row, int] = Index("id", key=lambda r: r.id, encode=keys.uint64)
ROWS = 2000


def _table(monkeypatch: pytest.MonkeyPatch) -> tuple[Table[Row], DB]:
    monkeypatch.setattr(ordered, "COMPACT_CHUNK", 500)
    monkeypatch.setattr(retired_logs, "FREE_CHUNK", 300)
    table: Table[Row] = Table("rows", BY_ID)
    db = DB(table)
    with db.write_txn(table) as txn:
        for i in range(ROWS):
            table.insert(txn, Row(i, 0))
    return table, db


def _churn(table: Table[Row], db: DB, value: int) -> None:
    with db.write_txn(table) as txn:
        for i in range(value % 7, ROWS, 53):
            table.insert(txn, Row(i, value))


def _until_compacted(table: Table[Row], db: DB, value: int) -> int:
    """Commit until a compaction publishes a new log; return the next value."""
    before = db.root[table.name].log
    while db.root[table.name].log is before:
        value += 1
        _churn(table, db, value)
        assert value < 5000
    return value


def test_a_replaced_log_is_freed_a_slice_per_commit(monkeypatch: pytest.MonkeyPatch) -> None:
    table, db = _table(monkeypatch)
    value = _until_compacted(table, db, 0)
    retired = table.retired_logs
    assert len(retired.logs) == 1
    # (Only through ``retired``: a reference held here would keep the log whole.)
    sizes = [retired.pending()]
    assert sizes[0] > ROWS
    while retired.logs:
        value += 1
        _churn(table, db, value)
        sizes.append(retired.pending())
        assert len(sizes) < 100
    # Each commit freed at most its budget, from the end, and the list went away at 0.
    steps = [a - b for a, b in itertools.pairwise(sizes)]
    assert max(steps) <= 300
    assert sizes[-1] == 0
    assert sum(1 for s in steps if s) >= sizes[0] // 300
    assert table.retention(db.read_txn())["retired_log_records"] == 0


def test_a_snapshot_keeps_the_old_log_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    table, db = _table(monkeypatch)
    value = 0
    _churn(table, db, value)
    snap = db.read_txn()
    seen = {r.id: r.value for r in table.all(snap)}
    value = _until_compacted(table, db, value)
    length = table.retired_logs.pending()
    for _ in range(20):
        value += 1
        _churn(table, db, value)
    # Untouched while the snapshot lives, and the snapshot still reads what it saw.
    assert len(table.retired_logs.logs) == 1
    assert table.retired_logs.pending() == length
    assert {r.id: r.value for r in table.all(snap)} == seen
    assert table.get(snap, BY_ID.query(53)) == Row(53, seen[53])
    assert table.retention(db.read_txn())["retired_log_records"] == length
    del snap
    gc.collect()
    while table.retired_logs.logs:
        value += 1
        _churn(table, db, value)
        assert value < 5000


def test_free_some_skips_logs_held_elsewhere_and_keeps_its_budget() -> None:
    retired = RetiredLogs()
    held = list(range(10))
    retired.retire(held)
    retired.retire(list(range(7)))
    retired.retire(list(range(5)))
    assert retired.free_some(4) == 4
    assert [len(x) for x in retired.logs] == [10, 3, 5]
    assert retired.free_some(6) == 6
    assert [len(x) for x in retired.logs] == [10, 2]
    assert retired.pending() == 12
    del held
    assert retired.free_some(100) == 12
    assert retired.logs == []
