"""Unit behaviour of the reconciler: CAS status write-back against concurrent writers, round
limits, batch partial failures, several reconcilers on one row, async targets, misbehaving
targets, health, metrics and configuration checks."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator
from dataclasses import dataclass, field

import anyio
import pytest
from anyio.from_thread import start_blocking_portal
from prometheus_client import CollectorRegistry, generate_latest

from reconciler import (
    BatchEntry,
    Config,
    PrometheusCollector,
    Reconciler,
    Status,
    StatusKind,
    StatusSet,
    status_pending,
    status_set_accessors,
)
from reconciler.clock import SystemClock
from reconciler.incremental import next_chunk_size
from statedb import DB, Index, ReadTxn, Table, keys
from tests.reconciler.helpers import (
    Harness,
    MockBatchOps,
    MockOps,
    OpError,
    TestObject,
    get_status,
    set_status,
    wait_for,
)

DONE = ("Done", "")


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_status_write_back_never_overwrites_a_newer_write(backend: str) -> None:
    ops = MockOps()
    seen: list[str] = []
    with Harness(backend=backend, ops=ops) as h:

        def concurrent_writer(txn: ReadTxn, revision: int, obj: TestObject) -> None:
            seen.append(obj.value)
            if obj.value == "v1":
                # A writer commits a newer version while v1 is being applied.
                with h.db.write_txn(h.table) as w:
                    h.table.insert(w, TestObject(1, value="v2"))

        ops.on_update = concurrent_writer
        h.insert(TestObject(1, value="v1"))
        wait_for(lambda: seen == ["v1", "v2"], f"v1 then v2 applied, got {seen}")
        h.expect_table({1: DONE})
        assert h.rows()[0].value == "v2"
        assert seen == ["v1", "v2"]


def test_stale_failure_is_not_written_over_a_newer_write() -> None:
    ops = MockOps()
    with Harness(ops=ops) as h:

        def writer(txn: ReadTxn, revision: int, obj: TestObject) -> None:
            if obj.faulty:
                with h.db.write_txn(h.table) as w:
                    h.table.insert(w, TestObject(1, value="fixed"))

        ops.on_update = writer
        h.insert(TestObject(1, faulty=True))
        h.expect_ops("update(1) fail", "update(1)")
        h.expect_table({1: DONE})
        assert h.rows()[0].value == "fixed"
        assert h.wait_reconciled() == 0


def test_round_size_bounds_each_round() -> None:
    ops = MockOps()
    done_seen: list[int] = []
    with Harness(ops=ops, incremental_round_size=3) as h:

        def count_done(txn: ReadTxn, revision: int, obj: TestObject) -> None:
            done_seen.append(
                sum(1 for o in h.table.all(txn) if o.status.kind is StatusKind.DONE)
            )

        ops.on_update = count_done
        with h.db.write_txn(h.table) as w:
            for i in range(1, 11):
                h.table.insert(w, TestObject(i))
        h.expect_table({i: DONE for i in range(1, 11)})
        # Statuses are committed after every 3 objects.
        assert done_seen == [0, 0, 0, 3, 3, 3, 6, 6, 6, 9]
        assert ops.take(10) == [f"update({i})" for i in range(1, 11)]


class ChunkRecordingOps(MockBatchOps):
    """Records each batch call: the ids, the Done rows of the snapshot, and how often
    another task of the event loop ran before it (``ticks``, counted by a ticker task)."""

    def __init__(self) -> None:
        super().__init__()
        self.ticks = 0
        self.calls: list[tuple[list[int], int, int]] = []
        self.table: Table[TestObject] | None = None

    def update_batch(self, txn: ReadTxn, batch: list[BatchEntry[TestObject]]) -> None:
        assert self.table is not None
        done = sum(1 for o in self.table.all(txn) if o.status.kind is StatusKind.DONE)
        self.calls.append(([e.obj.id for e in batch], done, self.ticks))
        super().update_batch(txn, batch)

    def delete_batch(self, txn: ReadTxn, batch: list[BatchEntry[TestObject]]) -> None:
        self.calls.append(([-e.obj.id for e in batch], -1, self.ticks))
        super().delete_batch(txn, batch)


class SteppedClock(SystemClock):
    """The real clock plus ``offset`` seconds, which a target moves to stand for its cost."""

    def __init__(self) -> None:
        self.offset = 0.0

    def now(self) -> float:
        return super().now() + self.offset


class CostlyBatchOps(MockBatchOps):
    """Records the size of each update_batch call and moves ``clock`` on by ``cost``
    seconds per object in it."""

    def __init__(self, clock: SteppedClock) -> None:
        super().__init__()
        self.clock = clock
        self.cost = 0.0
        self.sizes: list[int] = []

    def update_batch(self, txn: ReadTxn, batch: list[BatchEntry[TestObject]]) -> None:
        self.sizes.append(len(batch))
        self.clock.offset += self.cost * len(batch)
        super().update_batch(txn, batch)


def test_chunks_grow_while_cheap_within_the_budget() -> None:
    """With target_chunk_max, a round's chunks double while one takes at most half the
    budget, stay once one takes more (up to the budget), and every round starts again at
    target_chunk_size; all objects are still applied once."""
    clock = SteppedClock()
    ops = CostlyBatchOps(clock)
    with Harness(
        ops=ops, batch=True, clock=clock, target_chunk_size=2, target_chunk_max=8,
        target_chunk_budget=1.0,
    ) as h:
        with h.db.write_txn(h.table) as w:
            for i in range(1, 23):
                h.table.insert(w, TestObject(i))
        h.expect_table({i: DONE for i in range(1, 23)})
        assert ops.sizes == [2, 4, 8, 8]
        ops.sizes.clear()
        ops.cost = 0.2  # a chunk of 2 takes 0.4 s (doubles), one of 4 takes 0.8 s (stays)
        with h.db.write_txn(h.table) as w:
            for i in range(23, 33):
                h.table.insert(w, TestObject(i))
        h.expect_table({i: DONE for i in range(1, 33)})
        assert ops.sizes == [2, 4, 4]


def test_next_chunk_size_doubles_holds_and_halves_within_bounds() -> None:
    """`next_chunk_size`: at most half the budget doubles (to the maximum), more than the
    budget halves (to the minimum), in between keeps the size."""
    assert next_chunk_size(16, 0.002, 16, 256, 0.005) == 32
    assert next_chunk_size(128, 0.0025, 16, 256, 0.005) == 256
    assert next_chunk_size(256, 0.0, 16, 256, 0.005) == 256
    assert next_chunk_size(64, 0.004, 16, 256, 0.005) == 64
    assert next_chunk_size(64, 0.005, 16, 256, 0.005) == 64
    assert next_chunk_size(64, 0.006, 16, 256, 0.005) == 32
    assert next_chunk_size(16, 0.1, 16, 256, 0.005) == 16


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_round_hands_the_target_chunks_and_yields_between_them(backend: str) -> None:
    """A round of 7 changes with target_chunk_size=3 calls update_batch with 3, 3 and 1
    objects, lets other tasks run between the calls, and still commits the statuses once,
    after the last chunk; deletes are chunked the same way."""
    ops = ChunkRecordingOps()
    with Harness(backend=backend, ops=ops, batch=True, target_chunk_size=3) as h:
        ops.table = h.table

        async def ticker() -> None:
            while True:
                ops.ticks += 1
                await anyio.sleep(0)

        ticking = h.portal.start_task_soon(ticker)
        try:
            with h.db.write_txn(h.table) as w:
                for i in range(1, 8):
                    h.table.insert(w, TestObject(i))
            h.expect_table({i: DONE for i in range(1, 8)})
            ids = [c[0] for c in ops.calls]
            assert ids == [[1, 2, 3], [4, 5, 6], [7]]
            assert [c[1] for c in ops.calls] == [0, 0, 0]  # statuses: one commit, at the end
            ticks = [c[2] for c in ops.calls]
            if backend == "asyncio":
                # asyncio runs ready tasks in order, so the ticker runs at each yield; trio
                # runs a yielding task and the others of its batch in random order.
                assert ticks[0] < ticks[1] < ticks[2], ticks
            ops.calls.clear()
            with h.db.write_txn(h.table) as w:
                for i in range(1, 6):
                    h.table.delete(w, TestObject(i))
            wait_for(lambda: sum(len(c[0]) for c in ops.calls) == 5, "5 deletes")
            assert [c[0] for c in ops.calls] == [[-1, -2, -3], [-4, -5]]
            if backend == "asyncio":
                assert ops.calls[0][2] < ops.calls[1][2]
        finally:
            ticking.cancel()


class FlakyBatchOps(MockBatchOps):
    """Fails odd ids on their first attempt; records each batch."""

    def __init__(self) -> None:
        super().__init__()
        self.batches: list[list[int]] = []
        self.failed_once: set[int] = set()
        self.raise_whole_batch = False

    def update_batch(self, txn: ReadTxn, batch: list[BatchEntry[TestObject]]) -> None:
        self.batches.append([e.obj.id for e in batch])
        if self.raise_whole_batch:
            self.raise_whole_batch = False
            raise OpError("whole batch broken")
        for e in batch:
            if e.obj.id % 2 and e.obj.id not in self.failed_once:
                self.failed_once.add(e.obj.id)
                e.result = OpError(f"odd {e.obj.id}")
            else:
                self._record(f"update({e.obj.id})")


def test_batch_partial_failure_retries_only_failed_entries() -> None:
    ops = FlakyBatchOps()
    with Harness(ops=ops, batch=True) as h:
        with h.db.write_txn(h.table) as w:
            for i in range(1, 7):
                h.table.insert(w, TestObject(i))
        h.expect_table({i: DONE for i in range(1, 7)})
        assert ops.batches[0] == [1, 2, 3, 4, 5, 6]
        assert sorted(x for b in ops.batches[1:] for x in b) == [1, 3, 5]
        assert sorted(ops.take(6)) == sorted(f"update({i})" for i in range(1, 7))
        assert h.reconciler.metrics.update_errors_total == 3
        h.expect_health("level=OK")


def test_batch_that_raises_fails_every_entry_and_is_retried() -> None:
    ops = FlakyBatchOps()
    ops.raise_whole_batch = True
    ops.failed_once = {1, 3}  # odd ids already failed once: only the raise matters
    with Harness(ops=ops, batch=True) as h:
        with h.db.write_txn(h.table) as w:
            for i in (1, 2, 3):
                h.table.insert(w, TestObject(i))
        h.expect_table({1: DONE, 2: DONE, 3: DONE})
        assert ops.batches[0] == [1, 2, 3]
        assert h.reconciler.metrics.update_errors_total == 3


@dataclass(frozen=True, slots=True)
class SharedRow:
    id: int
    value: str = ""
    statuses: StatusSet = field(default_factory=StatusSet.new)


class RecordingTarget:
    def __init__(self) -> None:
        self.applied: list[tuple[int, str]] = []

    def update(self, txn: ReadTxn, revision: int, obj: SharedRow) -> None:
        self.applied.append((obj.id, obj.value))

    def delete(self, txn: ReadTxn, revision: int, obj: SharedRow) -> None:
        pass

    def prune(self, txn: ReadTxn, objects: Iterator[SharedRow]) -> None:
        pass


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_two_reconcilers_own_independent_statuses(backend: str) -> None:
    table: Table[SharedRow] = Table("shared", Index("id", key=lambda r: r.id, encode=keys.uint64))
    db = DB(table)
    targets = {"a": RecordingTarget(), "b": RecordingTarget()}
    recs = []
    for name, target in targets.items():
        get, set_ = status_set_accessors(name)
        recs.append(Reconciler(db, Config(table, target, get, set_, name=name)))

    def kinds() -> dict[str, str]:
        row = table.get(db.read_txn(), 1)
        assert row is not None
        return {n: row.statuses.get(n).kind.value for n in ("a", "b")}

    with start_blocking_portal(backend=backend) as portal:
        futures = [portal.start_task(r.run)[0] for r in recs]
        with db.write_txn(table) as w:
            table.insert(w, SharedRow(1, "x"))
        wait_for(lambda: kinds() == {"a": "Done", "b": "Done"}, f"both Done, got {kinds()}")
        # A writer marks the row pending for everyone.
        with db.write_txn(table) as w:
            row = table.get(w, 1)
            assert row is not None
            table.insert(w, dataclasses.replace(row, value="y", statuses=row.statuses.pending()))
        wait_for(lambda: kinds() == {"a": "Done", "b": "Done"} and
                 all((1, "y") in t.applied for t in targets.values()), "both applied y")
        for f in futures:
            f.cancel()
    # Each target saw each version once: another reconciler's status write is not a change.
    for t in targets.values():
        assert t.applied == [(1, "x"), (1, "y")]


class AsyncOps:
    def __init__(self) -> None:
        self.target: dict[int, str] = {}

    async def update(self, txn: ReadTxn, revision: int, obj: TestObject) -> None:
        await anyio.sleep(0)
        if obj.faulty:
            raise OpError("async update fail")
        self.target[obj.id] = obj.value

    async def delete(self, txn: ReadTxn, revision: int, obj: TestObject) -> None:
        await anyio.sleep(0)
        self.target.pop(obj.id, None)

    async def prune(self, txn: ReadTxn, objects: Iterator[TestObject]) -> None:
        await anyio.sleep(0)
        keep = {o.id for o in objects}
        for k in [k for k in self.target if k not in keep]:
            del self.target[k]


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_async_operations(backend: str) -> None:
    ops = AsyncOps()
    with Harness(backend=backend, ops=ops, prune_interval=3600.0) as h:
        ops.target[99] = "stray"
        h.insert(TestObject(1, value="a"))
        h.insert(TestObject(2, value="b"))
        h.expect_table({1: DONE, 2: DONE})
        h.reconciler.prune()
        wait_for(lambda: ops.target == {1: "a", 2: "b"}, f"target, got {ops.target}")
        h.insert(TestObject(2, faulty=True))
        h.expect_table({1: DONE, 2: ("Error", "async update fail")})
        h.delete(1)
        wait_for(lambda: 1 not in ops.target, "delete applied")
        assert h.wait_reconciled() == 1


class HostileOps:
    """A target that misbehaves in every way a target can, short of hanging."""

    def __init__(self) -> None:
        self.calls = 0

    def update(self, txn: ReadTxn, revision: int, obj: TestObject) -> object:
        self.calls += 1
        if obj.id == 1:
            raise KeyError("no such thing")
        if obj.id == 2:
            raise ValueError("")  # empty message
        return "unexpected return value"

    def delete(self, txn: ReadTxn, revision: int, obj: TestObject) -> None:
        raise RuntimeError("cannot delete")

    def prune(self, txn: ReadTxn, objects: Iterator[TestObject]) -> None:
        raise ZeroDivisionError("prune broke")


def test_nothing_a_target_does_crashes_the_reconciler() -> None:
    ops = HostileOps()
    with Harness(ops=ops, prune_interval=3600.0, health_max_messages=5) as h:
        for i in (1, 2, 3):
            h.insert(TestObject(i))
        h.expect_table({1: ("Error", "'no such thing'"), 2: ("Error", "ValueError"), 3: DONE})
        h.delete(3)
        h.reconciler.prune()
        h.expect_health(r"Degraded.*4 error")
        health = h.reconciler.health
        assert any("delete test-objects key=3: cannot delete" in e for e in health.errors)
        assert any("prune test-objects: prune broke" in e for e in health.errors)
        assert any("update test-objects key=1" in e for e in health.errors)
        # Still alive: a fresh row is reconciled.
        h.insert(TestObject(4))
        h.expect_table({1: ("Error", "'no such thing'"), 2: ("Error", "ValueError"), 4: DONE})


def test_health_lists_first_few_errors() -> None:
    with Harness() as h:
        with h.db.write_txn(h.table) as w:
            for i in range(1, 6):
                h.table.insert(w, TestObject(i, faulty=True))
        h.expect_health(r"level=Degraded message=5 error\(s\): ")
        msg = h.reconciler.health.message
        assert msg.count("update fail") == 3 and msg.endswith("and 2 more")
        assert h.reconciler.health.error_count == 5
        assert len(h.reconciler.health.errors) == 3
        assert h.wait_reconciled() == 5


def test_prometheus_collector_exposes_metrics() -> None:
    with Harness() as h:
        h.insert(TestObject(1))
        h.insert(TestObject(2, faulty=True))
        h.expect_ops("update(2) fail")
        # The op is recorded when the target is called; the metrics count it once the
        # round has written the statuses back, which the health report follows.
        h.expect_health(r"level=Degraded")
        registry = CollectorRegistry()
        registry.register(PrometheusCollector([h.reconciler.metrics]))
        text = generate_latest(registry).decode()
        assert re.search(r'statewright_reconciler_operations_total\{name="test",op="update"\} '
                         r"[1-9]", text)
        assert re.search(r'statewright_reconciler_errors_total\{name="test",op="update"\} [1-9]',
                         text)
        assert 'statewright_reconciler_current_errors{name="test"} 1.0' in text
        snap = h.reconciler.metrics.snapshot()
        assert snap["update_errors_total"] >= 1 and snap["updates_total"] >= 2
        samples = {
            (name, tuple(sorted(labels.items()))): value
            for name, labels, value in h.reconciler.metrics.samples()
        }
        mod = (("module_id", "test"),)
        assert samples[("statewright_reconciler_errors_current", mod)] == 1
        assert samples[("statewright_reconciler_errors_total", mod)] >= 1
        assert samples[("statewright_reconciler_count", mod)] >= 1
        assert ("statewright_reconciler_prune_count", mod) in samples


def test_config_validation_names_the_problem() -> None:
    table: Table[TestObject] = Table("t", Index("id", key=lambda o: o.id, encode=keys.uint64))
    db = DB(table)
    with pytest.raises(ValueError, match=r"reconciler 'x' of table 't'.*incremental_round_size"):
        Reconciler(db, Config(table, MockOps(), get_status, set_status, name="x",
                              incremental_round_size=0))
    with pytest.raises(ValueError, match="target_chunk_size must be > 0"):
        Reconciler(db, Config(table, MockOps(), get_status, set_status, target_chunk_size=0))
    with pytest.raises(ValueError, match="target_chunk_max"):
        Reconciler(
            db,
            Config(table, MockOps(), get_status, set_status, target_chunk_size=8,
                   target_chunk_max=4),
        )
    with pytest.raises(ValueError, match="target_chunk_budget must be > 0"):
        Reconciler(db, Config(table, MockOps(), get_status, set_status, target_chunk_budget=0))
    with pytest.raises(ValueError, match="retry_max_backoff"):
        Reconciler(db, Config(table, MockOps(), get_status, set_status,
                              retry_min_backoff=2.0, retry_max_backoff=1.0))
    with pytest.raises(ValueError, match="operations has no callable update"):
        Reconciler(db, Config(table, object(), get_status, set_status))  # type: ignore[arg-type]
    other: Table[TestObject] = Table("u", Index("id", key=lambda o: o.id, encode=keys.uint64))
    with pytest.raises(ValueError, match="not registered"):
        Reconciler(db, Config(other, MockOps(), get_status, set_status))


def test_status_helpers() -> None:
    a, b = status_pending(), status_pending()
    assert a.kind is StatusKind.PENDING and a.id != b.id and a.needs_work
    s = StatusSet.new()
    assert s.get("x").kind is StatusKind.PENDING
    s2 = s.set("x", dataclasses.replace(a, kind=StatusKind.DONE))
    assert s2.get("x").kind is StatusKind.DONE and s2.get("y").kind is StatusKind.PENDING
    assert s.get("x").id == s.get("y").id == s.pending_id
    assert s2.pending().get("x").kind is StatusKind.PENDING


def test_failing_status_callback_degrades_health_and_recovers() -> None:
    broken = {"on": True}

    def flaky_get_status(obj: TestObject) -> Status:
        if broken["on"] and obj.id == 2:
            raise RuntimeError("status accessor broke")
        return obj.status

    with Harness(get_object_status=flaky_get_status) as h:
        h.insert(TestObject(1))
        h.insert(TestObject(2))
        h.expect_health(r"Degraded.*round of test-objects failed: status accessor broke")
        broken["on"] = False
        # The reconciler starts over from a full listing: nothing is lost.
        h.expect_table({1: DONE, 2: DONE})
        h.expect_health(r"level=OK.*2 object")


def test_a_failing_status_write_leaves_only_its_row_pending(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A round whose updates all succeed writes every status at once; a status callback
    # that raises for one row still gets the others written, and that row reported once.
    broken = {"on": True}
    calls: list[int] = []

    def flaky_set_status(obj: TestObject, status: Status) -> TestObject:
        calls.append(obj.id)
        if broken["on"] and obj.id == 2 and status.kind is StatusKind.DONE:
            raise RuntimeError("status writer broke")
        return set_status(obj, status)

    with Harness(set_object_status=flaky_set_status) as h:
        with h.db.write_txn(h.table) as w:
            for i in (1, 2, 3):
                h.table.insert(w, TestObject(i))
        h.expect_table({1: DONE, 2: ("Pending", ""), 3: DONE})
        reports = [r for r in caplog.records if "cannot write status" in r.getMessage()]
        assert len(reports) == 1 and "key=2" in reports[0].getMessage()
        assert calls.count(1) >= 1 and calls.count(3) >= 1
        broken["on"] = False
        h.insert(TestObject(2, value="again"))
        h.expect_table({1: DONE, 2: DONE, 3: DONE})
