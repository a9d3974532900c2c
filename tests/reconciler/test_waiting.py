"""Objects waiting for an exhausted resource: parked in the retry queue at no cost per
round, reported in health and metrics, retried only as units are freed (first parked,
first served)."""

from __future__ import annotations

import threading

import pytest

from reconciler import BatchEntry, ResourceExhaustedError, RetryQueue, exhausted_resource
from statedb import ReadTxn
from tests.reconciler.helpers import Harness, TestObject, wait_for


class Slots:
    """A resource of ``capacity`` slots held by object ids."""

    unit = "slot"

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.holders: set[int] = set()

    def available(self) -> int:
        return self.capacity - len(self.holders)


class SlotOps:
    """A target whose every object needs a slot; counts the update attempts (the work)."""

    def __init__(self, capacity: int) -> None:
        self.slots = Slots(capacity)
        self.lock = threading.Lock()
        self.attempts = 0
        self.attempted: list[int] = []

    def update(self, txn: ReadTxn, revision: int, obj: TestObject) -> None:
        with self.lock:
            self.attempts += 1
            self.attempted.append(obj.id)
        if obj.id in self.slots.holders:
            return
        if not self.slots.available():
            raise ResourceExhaustedError(f"object {obj.id}: no free slot", self.slots)
        self.slots.holders.add(obj.id)

    def delete(self, txn: ReadTxn, revision: int, obj: TestObject) -> None:
        self.slots.holders.discard(obj.id)

    def prune(self, txn: ReadTxn, objects: object) -> None:
        pass

    def update_batch(self, txn: ReadTxn, batch: list[BatchEntry[TestObject]]) -> None:
        for e in batch:
            try:
                self.update(txn, e.revision, e.obj)
            except ResourceExhaustedError as exc:
                # Wrapped with context, as targets do: the cause names the resource.
                try:
                    raise RuntimeError(f"update {e.obj.id}: {exc}") from exc
                except RuntimeError as wrapped:
                    e.result = wrapped

    def delete_batch(self, txn: ReadTxn, batch: list[BatchEntry[TestObject]]) -> None:
        for e in batch:
            self.delete(txn, e.revision, e.obj)


def _wait_waiting(h: Harness, n: int) -> None:
    wait_for(lambda: h.reconciler.metrics.waiting == n, f"{n} waiting")


@pytest.mark.parametrize("batch", [False, True], ids=["per-object", "batch"])
def test_waiting_objects_cost_nothing_per_round_and_are_reported(batch: bool) -> None:
    """The work of a round that changes one object stays one attempt however many objects
    wait; each waiting object was attempted once; health and metrics count them."""
    ops = SlotOps(capacity=10)
    with Harness(ops=ops, batch=batch) as h:
        for i in range(10):
            h.insert(TestObject(i))
        h.wait_reconciled()
        assert ops.attempts == 10
        next_id = 10
        per_round: list[int] = []
        for waiting in (50, 200, 800):
            while next_id < 10 + waiting:
                h.insert(TestObject(next_id))
                next_id += 1
            h.wait_reconciled()
            _wait_waiting(h, waiting)
            # Every waiting object was attempted exactly once.
            assert ops.attempts == 10 + waiting + len(per_round)
            # One unrelated change: its round attempts that object alone.
            before = ops.attempts
            h.insert(TestObject(3, value=f"v{waiting}"))
            h.wait_reconciled()
            per_round.append(ops.attempts - before)
        assert per_round == [1, 1, 1]
        m = h.reconciler.metrics
        assert m.waiting == 800 and m.current_errors == 0
        assert m.snapshot()["waiting_objects"] == 800
        health = h.reconciler.health
        assert not health.ok and health.waiting_count == 800 and health.error_count == 0
        assert "800 object(s) wait for a free slot (none left): 10, 11, 12 and 797 more" in (
            health.message
        )
        assert h.statuses()[10][0] == "Error" and "no free slot" in h.statuses()[10][1]
        assert any("800 object(s) waiting" in p for p in h.reconciler.problems())


def test_a_freed_unit_wakes_one_waiting_object_first_parked_first() -> None:
    ops = SlotOps(capacity=3)
    with Harness(ops=ops, batch=True) as h:
        for i in range(8):
            h.insert(TestObject(i))
        h.wait_reconciled()
        wait_for(lambda: h.reconciler.metrics.waiting == 5, "5 waiting")
        before = ops.attempts
        h.delete(1)
        wait_for(lambda: h.statuses().get(3, ("",))[0] == "Done", "object 3 Done")
        wait_for(lambda: h.reconciler.metrics.waiting == 4, "4 waiting")
        # The freed slot went to the first waiting object, and to it alone.
        assert ops.attempted[before:] == [3]
        h.delete(0)
        h.delete(2)
        wait_for(lambda: h.reconciler.metrics.waiting == 2, "2 waiting")
        assert sorted(ops.attempted[before + 1 :]) == [4, 5]
        statuses = h.statuses()
        assert [i for i, s in sorted(statuses.items()) if s[0] == "Done"] == [3, 4, 5]
        # Deleting waiting objects ends their wait.
        h.delete(6)
        h.delete(7)
        wait_for(lambda: h.reconciler.metrics.waiting == 0, "none waiting")
        wait_for(lambda: h.reconciler.health.ok, "health OK")


def test_a_changed_waiting_object_is_attempted_once_more() -> None:
    ops = SlotOps(capacity=1)
    with Harness(ops=ops) as h:
        h.insert(TestObject(0))
        h.insert(TestObject(1))
        h.wait_reconciled()
        wait_for(lambda: h.reconciler.metrics.waiting == 1, "1 waiting")
        before = ops.attempts
        h.insert(TestObject(1, value="changed"))
        h.wait_reconciled()
        wait_for(lambda: h.reconciler.metrics.waiting == 1, "still waiting")
        assert ops.attempts == before + 1


class _Pool:
    unit = "thing"

    def __init__(self, free: int) -> None:
        self.free = free

    def available(self) -> int:
        return self.free


def test_queue_parks_and_wakes_as_many_as_are_available() -> None:
    q = RetryQueue(1.0, 10.0)
    pool = _Pool(0)
    for k in (b"a", b"b", b"c"):
        q.add(k, k, 1, False, "none left", now=0.0, waits_for=pool)
    q.add(b"x", "x", 1, False, "other", now=0.0)
    assert len(q) == 4 and q.parked == 3 and b"a" in q
    assert q.next_due() == 1.0  # parked keys have no due time
    assert not q.wakeable() and q.wake(5.0) == 0
    assert [i.key for i in q.first(10)] == [b"x"]
    ((res, n, first),) = q.parked_by_resource(2)
    assert res is pool and n == 3 and [i.key for i in first] == [b"a", b"b"]
    pool.free = 2
    assert q.wakeable()
    assert q.wake(5.0) == 2
    # Woken but not tried yet: they use up the units, so nothing more wakes.
    assert not q.wakeable() and q.wake(5.0) == 0
    assert [i.key for i in q.pop_due(5.0, 10)] == [b"x", b"a", b"b"]
    # Tried (and so no longer counted as woken): the pool's units are free to wake more.
    assert q.wake(5.0) == 1 and q.parked == 0
    q.clear(b"c")
    assert q.wake(5.0) == 0
    # A parked key failing again for another reason is scheduled with backoff.
    q.add(b"a", "a", 2, False, "none left", now=6.0, waits_for=pool)
    item = q.add(b"a", "a", 3, False, "map error", now=6.0)
    assert q.parked == 0 and item.attempts == 3 and item.retry_at == pytest.approx(10.0)


def test_exhausted_resource_follows_the_causes() -> None:
    pool = _Pool(0)
    try:
        try:
            raise ResourceExhaustedError("none", pool)
        except ResourceExhaustedError as inner:
            raise ValueError("wrapped") from inner
    except ValueError as outer:
        assert exhausted_resource(outer) is pool
    assert exhausted_resource(ValueError("plain")) is None
