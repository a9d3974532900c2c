"""A round leaves out the rows a writer replaced or deleted while it ran (between two of its
chunks): the target gets their newer version (or their deletion) in the next round, never
the version that was already replaced; a row on which only another reconciler's status
changed is still applied, and every verdict lands on the version it is about."""

from __future__ import annotations

import dataclasses

import pytest

from reconciler import BatchEntry, StatusKind
from statedb import ReadTxn
from tests.reconciler.helpers import Harness, MockBatchOps, MockOps, TestObject

DONE = ("Done", "")


class RecordingBatchOps(MockBatchOps):
    """Records (id, value) of every object handed to update_batch; ``on_first`` runs once,
    inside the first call."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[int, str]] = []
        self.on_first: object = None

    def update_batch(self, txn: ReadTxn, batch: list[BatchEntry[TestObject]]) -> None:
        self.seen += [(e.obj.id, e.obj.value) for e in batch]
        first, self.on_first = self.on_first, None
        if callable(first):
            first()
        super().update_batch(txn, batch)


class RecordingOps(MockOps):
    """The per-object target, recording (id, value) of every update."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[int, str]] = []

    def update(self, txn: ReadTxn, revision: int, obj: TestObject) -> None:
        self.seen.append((obj.id, obj.value))
        super().update(txn, revision, obj)


def _replace_and_delete(h: Harness) -> None:
    """A writer's commit: rows 3-5 get v2 (a fresh Pending status), row 6 goes."""
    with h.db.write_txn(h.table) as w:
        for i in (3, 4, 5):
            h.table.insert(w, TestObject(i, value="v2"))
        h.table.delete(w, TestObject(6))


def _insert_six_and_check_newer_versions_applied(h: Harness, seen: list[tuple[int, str]]) -> None:
    """Insert rows 1-6 (v1) while `_replace_and_delete` runs during the round: rows 1-2 go
    in the first chunk, and only the newer versions of rows 3-5 reach the target."""
    with h.db.write_txn(h.table) as w:
        for i in range(1, 7):
            h.table.insert(w, TestObject(i, value="v1"))
    h.expect_table({i: DONE for i in range(1, 6)})
    h.wait_reconciled()
    assert seen[:2] == [(1, "v1"), (2, "v1")]
    assert sorted(seen[2:]) == [(3, "v2"), (4, "v2"), (5, "v2")]


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_batch_round_skips_rows_replaced_while_it_runs(backend: str) -> None:
    ops = RecordingBatchOps()
    with Harness(backend=backend, ops=ops, batch=True, target_chunk_size=2) as h:
        ops.on_first = lambda: _replace_and_delete(h)
        # Rows 3-6 are replaced or deleted before their chunk.
        _insert_six_and_check_newer_versions_applied(h, ops.seen)
        assert "delete(6)" in ops.take(20)
        assert {o.id: o.value for o in h.rows()} == {1: "v1", 2: "v1", 3: "v2", 4: "v2", 5: "v2"}
        assert len(h.reconciler.retries) == 0


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_per_object_round_skips_rows_replaced_while_it_runs(backend: str) -> None:
    ops = RecordingOps()
    done = False

    def writer(txn: ReadTxn, revision: int, obj: TestObject) -> None:
        nonlocal done
        if obj.id == 2 and not done:
            done = True
            _replace_and_delete(h)

    ops.on_update = writer
    with Harness(backend=backend, ops=ops, target_chunk_size=2) as h:
        _insert_six_and_check_newer_versions_applied(h, ops.seen)


def test_row_whose_own_status_did_not_change_is_still_applied() -> None:
    """A write that keeps the row's own status (another reconciler's verdict on the row, or
    a writer that left it as read) does not make the round skip it: the verdict is written
    onto the newer row, as before."""
    ops = RecordingBatchOps()
    with Harness(ops=ops, batch=True, target_chunk_size=2) as h:

        def keep_status() -> None:
            txn = h.db.read_txn()
            with h.db.write_txn(h.table) as w:
                for o in list(h.table.all(txn)):
                    if o.id in (3, 4):
                        h.table.insert(w, dataclasses.replace(o, faulty=False))

        ops.on_first = keep_status
        with h.db.write_txn(h.table) as w:
            for i in range(1, 5):
                h.table.insert(w, TestObject(i, value="v1"))
        h.expect_table({i: DONE for i in range(1, 5)})
        assert sorted(ops.seen) == [(1, "v1"), (2, "v1"), (3, "v1"), (4, "v1")]
        assert all(o.status.kind is StatusKind.DONE for o in h.rows())
