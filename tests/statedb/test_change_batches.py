"""Large change batches: decided while they are consumed (`statedb.changes._deciding`).

A `ChangeIterator.next` over more than `statedb.changes.EAGER_RECORDS` log records decides
which to report ahead of its consumer instead of in the call. The change-iterator tests and
the state machine run again here with that threshold at 0, so every batch takes that path
and must report exactly what the eager path does.
"""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from statedb import changes
from tests.statedb import test_bulk_writes, test_changes, test_mark_seen
from tests.statedb.test_log_gaps import Row, new_db, start_changes, write
from tests.statedb.test_statemachine import StateDBMachine


@pytest.fixture(autouse=True)
def decide_while_consumed(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every batch of every test in this module takes the large-batch path."""
    monkeypatch.setattr(changes, "EAGER_RECORDS", 0)
    yield


for _module in (test_changes, test_mark_seen, test_bulk_writes):
    for _name in dir(_module):
        if _name.startswith("test_"):
            globals()[f"{_name}__large_batches"] = getattr(_module, _name)


class TestStateDBLargeBatches(StateDBMachine.TestCase):  # type: ignore[name-defined,misc]
    """The state machine, every change batch decided while consumed."""

    def setUp(self) -> None:
        self._patch = pytest.MonkeyPatch()
        self._patch.setattr(changes, "EAGER_RECORDS", 0)

    def tearDown(self) -> None:
        self._patch.undo()


def test_a_large_batch_lets_go_of_its_snapshot_once_decided() -> None:
    db, table = new_db()
    it = start_changes(db, table)
    assert list(it.next(db.read_txn())[0]) == []
    write(db, table, *(Row(i, 0) for i in range(4 * changes.DECIDE_AHEAD)))
    rtxn = db.read_txn()
    state = weakref.ref(rtxn.states[table.name])
    batch, _ = it.next(rtxn)
    del rtxn
    write(db, table, Row(100, 0))  # the DB's root moves on from the batch's snapshot
    got = [next(batch).obj for _ in range(3)]
    gc.collect()
    assert state() is not None  # 24 of 32 decided: the snapshot is still needed
    got.append(next(batch).obj)
    gc.collect()
    assert state() is None  # all 32 decided
    got += [c.obj for c in batch]
    assert got == [Row(i, 0) for i in range(4 * changes.DECIDE_AHEAD)]
    it.close()
