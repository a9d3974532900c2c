"""The public testing kit itself (`reconciler.testing`): FaultyOps injects exactly the faults
its plan and seed say, before or after applying, per batch entry or per batch, with or
without latency, over sync and async targets; MemoryTarget's model check names the
differences; wait_until_done waits for delete retries that wait_until_reconciled does not."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import anyio
import pytest

from reconciler import BatchEntry, Config, FakeClock, RateLimit, Reconciler
from reconciler.testing import (
    BackgroundReconciler,
    FaultPlan,
    FaultyOps,
    InjectedFault,
    MemoryTarget,
    ModelMismatch,
    convergence_problems,
    diff_states,
    wait_until_done,
)
from statedb import DB, ReadTxn
from tests.reconciler.helpers import TestObject, get_status, new_table, set_status

NO_TXN: Any = None
Target = MemoryTarget[TestObject, int, str]


def memory() -> Target:
    return MemoryTarget(key=lambda o: o.id, value=lambda o: o.value)


def outcomes(ops: FaultyOps[TestObject], n: int) -> list[str]:
    """Call update n times; 'ok' or the injected failure's message for each."""
    out = []
    for i in range(n):
        try:
            ops.update(NO_TXN, 0, TestObject(i, value=str(i)))
            out.append("ok")
        except InjectedFault as exc:
            out.append(str(exc))
    return out


def test_fault_plan_refuses_bad_rates() -> None:
    with pytest.raises(ValueError, match="update"):
        FaultPlan(update=1.5)
    with pytest.raises(ValueError, match="latency"):
        FaultPlan(latency=(0.2, 0.1))
    assert FaultPlan.uniform(0.3) == FaultPlan(update=0.3, delete=0.3, prune=0.3, batch=0.3)


def test_same_seed_same_faults_and_counts() -> None:
    plan = FaultPlan(update=0.5)
    a = outcomes(FaultyOps(memory(), plan, seed=7), 60)
    b = outcomes(FaultyOps(memory(), plan, seed=7), 60)
    c = outcomes(FaultyOps(memory(), plan, seed=8), 60)
    assert a == b
    assert a != c
    ops = FaultyOps(memory(), plan, seed=7)
    outcomes(ops, 60)
    assert ops.calls["update"] == 60
    assert ops.injected["update"] == sum(1 for o in a if o != "ok")
    assert 0 < ops.injected["update"] < 60


def test_failures_before_and_after_applying() -> None:
    before = memory()
    with pytest.raises(InjectedFault, match="before applying"):
        FaultyOps(before, FaultPlan(update=1.0, after_apply=0.0)).update(
            NO_TXN, 0, TestObject(1, value="x"))
    assert before.snapshot() == {}
    after = memory()
    with pytest.raises(InjectedFault, match="after applying"):
        FaultyOps(after, FaultPlan(update=1.0, after_apply=1.0)).update(
            NO_TXN, 0, TestObject(1, value="x"))
    assert after.snapshot() == {1: "x"}


def test_disabled_injects_nothing() -> None:
    target = memory()
    ops = FaultyOps(target, FaultPlan.uniform(1.0))
    ops.enabled = False
    ops.update(NO_TXN, 0, TestObject(1, value="x"))
    ops.delete(NO_TXN, 0, TestObject(1))
    ops.prune(NO_TXN, iter([]))
    assert ops.injected.total() == 0
    assert ops.prunes_ok == 1


def test_partial_batch_failures() -> None:
    """Entries fail on their own: those failing before applying are not in the target, those
    failing after are, and every other entry is applied without a result."""
    target = memory()
    ops = FaultyOps(target, FaultPlan(update=0.5), seed=3)
    batch = [BatchEntry(TestObject(i, value=str(i)), 0) for i in range(40)]
    assert ops.update_batch(NO_TXN, batch) is None
    stored = target.snapshot()
    failed_before = [e for e in batch if e.result is not None and "before" in str(e.result)]
    failed_after = [e for e in batch if e.result is not None and "after" in str(e.result)]
    ok = [e for e in batch if e.result is None]
    assert failed_before and failed_after and ok
    assert all(e.obj.id not in stored for e in failed_before)
    assert all(e.obj.id in stored for e in failed_after + ok)


def test_whole_batch_failure_touches_nothing() -> None:
    target = memory()
    ops = FaultyOps(target, FaultPlan(batch=1.0))
    with pytest.raises(InjectedFault, match="batch"):
        ops.update_batch(NO_TXN, [BatchEntry(TestObject(1), 0)])
    assert target.snapshot() == {}
    assert ops.injected["update_batch"] == 1


class PlainOps:
    """A target without batch operations whose update fails for odd ids."""

    def __init__(self) -> None:
        self.applied: list[int] = []

    def update(self, txn: ReadTxn, revision: int, obj: TestObject) -> None:
        if obj.id % 2:
            raise OSError(f"odd {obj.id}")
        self.applied.append(obj.id)

    def delete(self, txn: ReadTxn, revision: int, obj: TestObject) -> None:
        self.applied.remove(obj.id)

    def prune(self, txn: ReadTxn, objects: Iterator[TestObject]) -> None:
        pass


def test_batch_over_a_target_without_batch_operations() -> None:
    inner = PlainOps()
    ops = FaultyOps(inner)
    batch = [BatchEntry(TestObject(i), 0) for i in range(4)]
    ops.update_batch(NO_TXN, batch)
    assert inner.applied == [0, 2]
    assert [type(e.result).__name__ if e.result else None for e in batch] == [
        None, "OSError", None, "OSError"]


class AsyncTarget:
    """An async target over a MemoryTarget."""

    def __init__(self) -> None:
        self.inner = memory()

    async def update(self, txn: ReadTxn, revision: int, obj: TestObject) -> None:
        await anyio.sleep(0)
        self.inner.update(txn, revision, obj)

    async def delete(self, txn: ReadTxn, revision: int, obj: TestObject) -> None:
        await anyio.sleep(0)
        self.inner.delete(txn, revision, obj)

    async def prune(self, txn: ReadTxn, objects: Iterator[TestObject]) -> None:
        self.inner.prune(txn, objects)


def test_async_targets_and_latency() -> None:
    """Over an async target, or with latency, the wrapper's calls are awaitables; a failure
    after applying is raised when awaited."""

    async def main() -> None:
        target = AsyncTarget()
        ops = FaultyOps(target, FaultPlan(update=1.0, after_apply=1.0))
        result = ops.update(NO_TXN, 0, TestObject(1, value="a"))
        assert result is not None
        with pytest.raises(InjectedFault, match="after applying"):
            await result
        assert target.inner.snapshot() == {1: "a"}

        slow_target = memory()
        slow = FaultyOps(slow_target, FaultPlan(latency=(0.001, 0.002)))
        pending = slow.update(NO_TXN, 0, TestObject(2, value="b"))
        assert pending is not None and slow_target.snapshot() == {}  # applied after the wait
        await pending
        batch = [BatchEntry(TestObject(3, value="c"), 0)]
        pending = slow.update_batch(NO_TXN, batch)
        assert pending is not None
        await pending
        assert slow_target.snapshot() == {2: "b", 3: "c"}

    anyio.run(main)


def test_prune_of_an_uninitialized_table_is_recorded() -> None:
    table = new_table()
    db = DB(table)
    with db.write_txn(table) as w:
        done = table.register_initializer(w, "load")
    ops = FaultyOps(memory(), table=table)
    ops.prune(db.read_txn(), iter([]))
    assert ops.pruned_uninitialized == 1
    with db.write_txn(table) as w:
        done(w)
    ops.prune(db.read_txn(), iter([]))
    assert ops.pruned_uninitialized == 1
    assert ops.prunes_ok == 2


def test_model_check_names_the_differences() -> None:
    table = new_table()
    db = DB(table)
    with db.write_txn(table) as w:
        table.insert(w, TestObject(1, value="a"))
        table.insert(w, TestObject(2, value="b"))
    target = memory()
    target.put(2, "B")
    target.put(9, "stray")
    with pytest.raises(ModelMismatch) as err:
        target.check(db.read_txn(), table)
    assert str(err.value) == (
        "target differs from table 'test-objects': missing [1]; stray [9]; "
        "different {2: 'B' != 'b'}"
    )
    assert isinstance(err.value, AssertionError)
    target.remove(9)
    target.put(1, "a")
    target.put(2, "b")
    target.check(db.read_txn(), table)
    assert diff_states({1: "a"}, {1: "a"}) == ""


def test_wait_until_done_waits_for_delete_retries() -> None:
    """Failed deletes leave no row: wait_until_reconciled returns with retries pending, and
    wait_until_done returns only once they succeeded."""
    table = new_table()
    db = DB(table)
    target = memory()
    ops = FaultyOps(target, FaultPlan(delete=1.0, after_apply=0.0))
    clock = FakeClock()
    config: Config[TestObject] = Config(
        table, ops, get_status, set_status, name="kit", clock=clock,
        retry_min_backoff=1.0, retry_max_backoff=1.0, rate_limit=RateLimit(1000.0, 10),
    )
    with BackgroundReconciler(db, config) as bg:
        with db.write_txn(table) as w:
            for i in range(3):
                table.insert(w, TestObject(i, value=str(i)))
        bg.wait_done()
        with db.write_txn(table) as w:
            table.delete(w, TestObject(0))
        assert bg.wait_reconciled() == 1  # attempted, and the delete is waiting for a retry
        problems = convergence_problems(bg.reconciler)
        assert problems[0] == "1 retry(ies) pending", problems
        assert problems[1].startswith("health: reconciler-kit level=Degraded"), problems
        assert "delete: injected failure before applying" in problems[1], problems
        assert len(problems) == 2, problems
        with pytest.raises(TimeoutError, match="1 retry"):
            bg.wait_done(timeout=0.05)
        ops.enabled = False
        bg.wait_done(advance=lambda: clock.advance(1.0))
        assert target.snapshot() == {1: "1", 2: "2"}
        assert convergence_problems(bg.reconciler) == []


def test_wait_until_done_on_the_callers_loop() -> None:
    """The async form, with a reconciler in the caller's own task group."""

    async def main() -> None:
        table = new_table()
        db = DB(table)
        target = memory()
        ops = FaultyOps(target, FaultPlan.uniform(0.5), seed=11)
        rec = Reconciler(db, Config(table, ops, get_status, set_status, name="loop",
                                    retry_min_backoff=0.001, retry_max_backoff=0.01))
        async with anyio.create_task_group() as tg:
            await tg.start(rec.run)
            with db.write_txn(table) as w:
                for i in range(20):
                    table.insert(w, TestObject(i, value=str(i)))
            with db.write_txn(table) as w:
                for i in range(0, 20, 3):
                    table.delete(w, TestObject(i))
            ops.enabled = False
            await wait_until_done(rec, timeout=30)
            target.check(db.read_txn(), table)
            tg.cancel_scope.cancel()

    anyio.run(main)


def test_rows_change_with_replace_keeps_kit_types() -> None:
    """MemoryTarget's value function sees rows as the reconciler hands them over."""
    target = memory()
    row = dataclasses.replace(TestObject(5, value="v"))
    target.update_batch(NO_TXN, [BatchEntry(row, 1)])
    target.delete_batch(NO_TXN, [BatchEntry(row, 2)])
    assert target.history == [("update", 5), ("delete", 5)]
