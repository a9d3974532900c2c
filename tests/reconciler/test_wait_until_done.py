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


def _clean_setup() -> tuple[DB, Table[Row], MemoryTarget[Row, str, Row], Reconciler[Row]]:
    db, table, target, _, rec = _setup(FaultPlan())
    return db, table, target, rec


def test_a_requested_prune_can_be_awaited() -> None:
    """After `rec.prune()`, `wait_until_done` returns only once the prune has run, and the
    watch `prune()` returns closes then too."""
    db, table, target, rec = _clean_setup()

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            await tg.start(rec.run)
            with db.write_txn(table) as txn:
                table.insert(txn, Row("kept"))
            await rec.wait_until_done(timeout=10)
            target.put("stale", Row("stale"))  # behind the reconciler's back
            rec.prune()
            await rec.wait_until_done(timeout=10)
            assert sorted(target.snapshot()) == ["kept"]
            target.put("stale2", Row("stale2"))
            with anyio.fail_after(10):
                await rec.prune().wait_async()
            assert sorted(target.snapshot()) == ["kept"]
            assert rec.problems() == []
            tg.cancel_scope.cancel()

    anyio.run(main)


def test_problems_is_empty_right_after_wait_until_reconciled() -> None:
    """The reconciler's own status commit is not a change "not attempted yet"; and
    `wait_until_reconciled()` with no revision means the table's revision now."""
    db, table, _, rec = _clean_setup()

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            await tg.start(rec.run)
            with db.write_txn(table) as txn:
                table.insert(txn, Row("d.txt"))
            assert await rec.wait_until_reconciled(table.revision(db.read_txn()), 10) == 0
            assert rec.problems() == []
            with db.write_txn(table) as txn:
                table.insert(txn, Row("e.txt"))
            assert await rec.wait_until_reconciled(timeout=10) == 0
            assert rec.problems() == []
            tg.cancel_scope.cancel()

    anyio.run(main)


def test_problems_render_keys_as_health_does() -> None:
    db, table, _, _, rec = _setup(FaultPlan(update=1.0))

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            await tg.start(rec.run)
            with db.write_txn(table) as txn:
                table.insert(txn, Row("d.txt"))
            await rec.wait_until_reconciled(table.revision(db.read_txn()), 10)
            with anyio.fail_after(10):
                while rec.health.ok:
                    await rec.health_watch().wait_async()
            problems = "; ".join(rec.problems())
            assert "'d.txt'" in problems and "b'd.txt'" not in problems, problems
            assert "'d.txt'" in str(rec.health)
            tg.cancel_scope.cancel()

    anyio.run(main)
