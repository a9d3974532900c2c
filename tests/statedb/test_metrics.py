"""Metrics hooks: object count, revision, graveyard size and write-transaction figures."""

from __future__ import annotations

import pytest

from tests.statedb.helpers import OBJ1, OBJ2, new_db


def test_metrics_snapshot_per_table() -> None:
    """Counts and revisions come from the snapshot; commits and aborts are counted."""
    db, (t1, t2) = new_db("t1", "t2")
    with db.write_txn(t1) as txn:
        t1.insert(txn, OBJ1)
        t1.insert(txn, OBJ2)
    with pytest.raises(RuntimeError), db.write_txn(t1, t2) as txn:
        t2.insert(txn, OBJ1)
        raise RuntimeError("abort")
    with db.write_txn(t1) as txn:
        it = t1.changes(txn)
    with db.write_txn(t1) as txn:
        t1.delete(txn, OBJ1)
    m = db.metrics.snapshot(db.read_txn())
    assert m["t1"]["objects"] == 1
    assert m["t1"]["revision"] == t1.revision(db.read_txn())
    assert m["t1"]["graveyard_objects"] == 1
    assert m["t1"]["write_txns_committed"] == 3
    assert m["t1"]["write_txns_aborted"] == 1
    assert m["t2"]["objects"] == 0 and m["t2"]["write_txns_aborted"] == 1
    for key in (
        "write_txn_lock_wait_seconds_total",
        "write_txn_lock_wait_seconds_max",
        "write_txn_duration_seconds_total",
        "write_txn_duration_seconds_max",
    ):
        assert m["t1"][key] >= 0.0
    assert m["t1"]["write_txn_duration_seconds_max"] <= m["t1"]["write_txn_duration_seconds_total"]
    it.close()
