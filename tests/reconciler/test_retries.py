"""Retry queue and backoff: pure queue behaviour, and backoff timing of a running reconciler
driven by a fake clock."""

from __future__ import annotations

import pytest

from reconciler import FakeClock, RetryQueue, backoff_delay
from statedb import ReadTxn
from tests.reconciler.helpers import Harness, MockOps, OpError, TestObject, wait_for


def test_backoff_delay_doubles_and_caps() -> None:
    assert [backoff_delay(n, 1.0, 8.0) for n in range(1, 7)] == [1, 2, 4, 8, 8, 8]
    assert backoff_delay(10_000, 0.01, 30.0) == 30.0


def test_queue_orders_by_due_time_and_keeps_one_entry_per_key() -> None:
    q = RetryQueue(1.0, 100.0)
    q.add(b"a", "A", 1, False, "err a", now=0.0)
    q.add(b"b", "B", 2, True, "err b", now=0.5)
    assert q.next_due() == 1.0
    assert [i.key for i in q.pop_due(1.2, 10)] == [b"a"]
    # Re-adding the same key backs off further and replaces the old entry.
    item = q.add(b"a", "A2", 3, False, "err a2", now=1.2)
    assert item.attempts == 2 and item.retry_at == pytest.approx(3.2)
    assert len(q) == 2
    assert [i.key for i in q.pop_due(10.0, 10)] == [b"b", b"a"]
    assert q.get(b"a") is not None and q.get(b"a").obj == "A2"  # type: ignore[union-attr]


def test_clear_drops_pending_retry_and_resets_backoff() -> None:
    q = RetryQueue(1.0, 100.0)
    q.add(b"k", 1, 1, False, "e", now=0.0)
    q.add(b"k", 1, 1, False, "e", now=0.0)
    q.clear(b"k")
    assert not q and q.next_due() is None
    assert list(q.pop_due(1e9, 10)) == []
    assert q.add(b"k", 1, 1, False, "e", now=0.0).attempts == 1


def test_pop_due_respects_limit() -> None:
    q = RetryQueue(1.0, 1.0)
    for i in range(10):
        q.add(bytes([i]), i, i, False, "e", now=0.0)
    assert len(list(q.pop_due(5.0, 4))) == 4
    assert len(list(q.pop_due(5.0, 100))) == 6


class TimedOps(MockOps):
    """Records the fake time of every update of row 1."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__()
        self.clock = clock
        self.attempt_times: list[float] = []

    def update(self, txn: ReadTxn, revision: int, obj: TestObject) -> None:
        if obj.id == 1:
            self.attempt_times.append(self.clock.now())
        super().update(txn, revision, obj)


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_backoff_timing_with_fake_clock(backend: str) -> None:
    clock = FakeClock(start=100.0)
    ops = TimedOps(clock)
    with Harness(
        backend=backend, ops=ops, clock=clock, rate_limit=None,
        retry_min_backoff=1.0, retry_max_backoff=8.0,
    ) as h:
        h.insert(TestObject(1, faulty=True))
        wait_for(lambda: len(ops.attempt_times) == 1, "first attempt")
        gaps = [1.0, 2.0, 4.0, 8.0, 8.0]
        sync_id = 1000
        key = h.table.primary_key_of(TestObject(1))
        for n, gap in enumerate(gaps, start=2):
            # The target is called before the round writes the verdict back and re-queues
            # the retry (the old item stays known until then): wait for the re-queued one.
            def queued(n: int = n) -> bool:
                item = h.reconciler.retries.get(key)
                return item is not None and item.attempts == n - 1

            wait_for(queued, f"retry {n} queued")
            item = h.reconciler.retries.get(key)
            assert item is not None
            assert item.retry_at == pytest.approx(ops.attempt_times[-1] + gap)
            # Just before the retry is due nothing happens: a round forced by an
            # unrelated write must not retry row 1.
            clock.advance(gap - 0.25)
            sync_id += 1
            h.wait_reconciled(h.insert(TestObject(sync_id)))
            h.expect_ops(f"update({sync_id})")
            assert len(ops.attempt_times) == n - 1
            # Once due, it is retried.
            clock.advance(0.25)
            wait_for(lambda n=n: len(ops.attempt_times) == n, f"attempt {n}")  # type: ignore[misc]
        first = ops.attempt_times[0]
        assert [t - first for t in ops.attempt_times] == pytest.approx([0, 1, 3, 7, 15, 23])


class DeleteFaultOps(MockOps):
    """Deletes fail while ``fail_deletes`` is set; a dict models the target."""

    def __init__(self) -> None:
        super().__init__()
        self.fail_deletes = False
        self.target: dict[int, str] = {}

    def update(self, txn: ReadTxn, revision: int, obj: TestObject) -> None:
        super().update(txn, revision, obj)
        self.target[obj.id] = obj.value

    def delete(self, txn: ReadTxn, revision: int, obj: TestObject) -> None:
        if self.fail_deletes:
            self._record(f"delete({obj.id}) fail")
            raise OpError("delete fail")
        super().delete(txn, revision, obj)
        self.target.pop(obj.id, None)


@pytest.mark.parametrize("batch", [False, True])
def test_retried_delete_never_undoes_a_later_insert(batch: bool) -> None:
    clock = FakeClock()
    ops = DeleteFaultOps()
    if batch:
        from tests.reconciler.helpers import MockBatchOps

        class BatchDeleteFaultOps(DeleteFaultOps, MockBatchOps):
            pass

        ops = BatchDeleteFaultOps()
    with Harness(
        ops=ops, batch=batch, clock=clock, rate_limit=None,
        retry_min_backoff=1.0, retry_max_backoff=1.0,
    ) as h:
        h.insert(TestObject(1, value="v1"))
        h.expect_ops("update(1)")
        ops.fail_deletes = True
        h.delete(1)
        h.expect_ops("delete(1) fail")
        # The op is recorded before the round queues its retry: wait for the queue.
        wait_for(lambda: len(h.reconciler.retries) == 1, "the failed delete queued for retry")
        # The key comes back before the delete is retried.
        h.insert(TestObject(1, value="v2"))
        h.expect_ops("update(1)")
        h.expect_table({1: ("Done", "")})
        ops.fail_deletes = False
        for _ in range(3):
            clock.advance(5.0)
            h.wait_reconciled(h.insert(TestObject(50 + _)))
        assert "delete(1)" not in ops.take(100)
        assert ops.target[1] == "v2"
        assert len(h.reconciler.retries) == 0
        h.expect_health("level=OK")


def test_newer_change_replaces_pending_retry() -> None:
    clock = FakeClock()
    with Harness(clock=clock, rate_limit=None, retry_min_backoff=10.0,
                 retry_max_backoff=10.0) as h:
        h.insert(TestObject(1, faulty=True))
        h.expect_ops("update(1) fail")
        # The op is recorded before the round queues its retry: wait for the queue.
        wait_for(lambda: len(h.reconciler.retries) == 1, "the failed update queued for retry")
        # The fixed row is applied at once, without waiting for the backoff.
        h.insert(TestObject(1))
        h.expect_ops("update(1)")
        h.expect_table({1: ("Done", "")})
        # The status commit is visible before the round clears the retry: wait for it.
        wait_for(lambda: len(h.reconciler.retries) == 0, "the retry dropped")
        assert h.wait_reconciled() == 0
