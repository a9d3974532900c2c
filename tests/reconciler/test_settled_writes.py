"""A write that keeps a Done status (a `replace` that forgot ``status=status_pending()``) is
no longer dropped silently: it is logged and counted, and with
``Config(reconcile_every_change=True)`` it is reconciled."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace

import anyio
import pytest

from reconciler import Config, Reconciler, Status, status_pending
from reconciler.testing import MemoryTarget
from statedb import DB, Index, Table


@dataclass(frozen=True)
class Row:
    name: str
    text: str
    status: Status = field(default_factory=status_pending)


def _run(every_change: bool) -> tuple[dict[str, Row], int]:
    table = Table("rows", Index("name", key=lambda r: r.name))
    db = DB(table)
    target: MemoryTarget[Row, str, str] = MemoryTarget(key=lambda r: r.name,
                                                       value=lambda r: r.text)
    rec = Reconciler(db, Config(table, target, lambda r: r.status,
                                lambda r, s: replace(r, status=s),
                                reconcile_every_change=every_change))

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            await tg.start(rec.run)
            with db.write_txn(table) as txn:
                table.insert(txn, Row("a", "v1"))
            await rec.wait_until_done(timeout=10)
            with db.write_txn(table) as txn:
                done = table.get(txn, "a")
                assert done is not None
                table.insert(txn, replace(done, text="v2"))  # the status stays Done
            await rec.wait_until_reconciled(table.revision(db.read_txn()), 10)
            tg.cancel_scope.cancel()

    anyio.run(main)
    return target.snapshot(), rec.skipped_settled_writes


def test_a_done_write_is_reported_not_dropped_silently(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="reconciler"):
        snapshot, skipped = _run(every_change=False)
    assert snapshot == {"a": "v1"} and skipped == 1
    assert "kept the row's DONE status" in caplog.text and "status_pending()" in caplog.text


def test_reconcile_every_change_reconciles_it() -> None:
    snapshot, skipped = _run(every_change=True)
    assert snapshot == {"a": "v2"} and skipped == 0
