"""Reconciler.wait_until_done: returns once every row is Done and no retry is pending
(failed deletes included, which have no row), and names what is left on timeout."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import anyio
import pytest

from reconciler import Config, Reconciler, Status, status_pending
from reconciler.testing import FaultPlan, FaultyOps, MemoryTarget
from statedb import DB, Index, Table


@dataclass(frozen=True)
class Row:
    name: str
    status: Status = field(default_factory=status_pending)


def _setup(plan: FaultPlan) -> tuple[DB, Table[Row], MemoryTarget[Row, str, Row], FaultyOps[Row],
                                     Reconciler[Row]]:
    table = Table("rows", Index("name", key=lambda r: r.name))
    db = DB(table)
    target: MemoryTarget[Row, str, Row] = MemoryTarget(key=lambda r: r.name)
    ops = FaultyOps(target, plan, seed=3)
    rec = Reconciler(db, Config(table, ops, lambda r: r.status,
                                lambda r, s: replace(r, status=s),
                                retry_min_backoff=0.001, retry_max_backoff=0.01))
    return db, table, target, ops, rec


def test_waits_through_retries_of_updates_and_deletes() -> None:
    db, table, target, ops, rec = _setup(FaultPlan(update=0.5, delete=0.5))

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            await tg.start(rec.run)
            with db.write_txn(table) as txn:
                for i in range(50):
                    table.insert(txn, Row(f"r{i}"))
            await rec.wait_until_done(timeout=20)
            assert sorted(target.snapshot()) == sorted(f"r{i}" for i in range(50))
            with db.write_txn(table) as txn:
                for i in range(25):
                    table.delete(txn, Row(f"r{i}"))
            # Failed deletes have no row left: only the retry queue shows them.
            await rec.wait_until_done(timeout=20)
            assert sorted(target.snapshot()) == sorted(f"r{i}" for i in range(25, 50))
            assert rec.problems() == []
            tg.cancel_scope.cancel()

    anyio.run(main)
    assert ops.injected  # faults did happen, so the waits had retries to wait for


def test_times_out_naming_what_is_left() -> None:
    db, table, _, _, rec = _setup(FaultPlan(update=1.0))

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            await tg.start(rec.run)
            with db.write_txn(table) as txn:
                table.insert(txn, Row("stuck"))
            with pytest.raises(TimeoutError, match=r"not done after 0\.3 s: .*retry"):
                await rec.wait_until_done(timeout=0.3)
            tg.cancel_scope.cancel()

    anyio.run(main)
