"""The Go reconciler's script scenarios (incremental, batching, pruning, prune_empty, refresh),
restated step by step against the Python reconciler on both anyio backends."""

from __future__ import annotations

import pytest
from anyio.from_thread import start_blocking_portal

from reconciler import Status, StatusKind
from tests.reconciler.helpers import Harness, TestObject

BACKENDS = ["asyncio", "trio"]

DONE = ("Done", "")


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def _incremental_steps(h: Harness) -> None:
    # Step 1: three healthy rows are updated and marked Done.
    h.insert(TestObject(1))
    h.insert(TestObject(2))
    h.insert(TestObject(3))
    h.expect_table({1: DONE, 2: DONE, 3: DONE})
    h.expect_ops("update(1)", "update(2)", "update(3)")
    h.expect_health(r"level=OK.*message=OK, 3 object")

    # Step 2: row 1 becomes faulty; it fails, is marked Error and is retried.
    h.insert(TestObject(1, faulty=True))
    h.expect_ops("update(1) fail", "update(1) fail")
    h.expect_table({1: ("Error", "update fail"), 2: DONE, 3: DONE})
    h.expect_health(r"level=Degraded.*1 error")

    # Step 3: row 1 healthy again.
    h.insert(TestObject(1))
    h.expect_table({1: DONE, 2: DONE, 3: DONE})
    h.expect_ops("update(1)")
    h.expect_health(r"level=OK")

    # Step 4: delete rows 1 and 2.
    h.delete(1)
    h.delete(2)
    h.expect_table({3: DONE})
    h.expect_ops("delete(1)", "delete(2)")

    # Step 5: deleting row 3 with a faulty target fails and is retried.
    h.ops.faulty = True
    h.delete(3)
    h.expect_table({})
    h.expect_ops("delete(3) fail")
    h.expect_health(r"level=Degraded.*1 error")

    # Step 6: the target recovers; the retried delete succeeds.
    h.ops.faulty = False
    h.expect_ops("delete(3)")
    h.expect_health(r"level=OK.*message=OK, 0 object")

    # Metrics: rounds ran, no current errors, some errors in total, timed updates/deletes.
    m = h.reconciler.metrics
    assert m.rounds.count > 0
    assert m.current_errors == 0
    assert m.errors_total > 0
    assert m.updates.count > 0 and m.updates.total_s > 0
    assert m.deletes.count > 0 and m.deletes.total_s > 0


def test_incremental(backend: str) -> None:
    with Harness(backend=backend) as h:
        _incremental_steps(h)


def test_batching(backend: str) -> None:
    with Harness(backend=backend, batch=True) as h:
        _incremental_steps(h)


def test_prune_empty(backend: str) -> None:
    with Harness(backend=backend, initializer=True, prune_interval=3600.0) as h:
        h.wait_reconciled()
        assert h.ops.take(1) == []
        # Pruning happens once the table is initialized, even with no rows.
        h.mark_init()
        h.expect_ops("prune(n=0)")
        h.expect_health(r"level=OK")


def test_pruning(backend: str) -> None:
    with Harness(backend=backend, initializer=True, prune_interval=3600.0) as h:
        # A prune requested before initialization does nothing yet.
        h.insert(TestObject(1))
        h.expect_ops("update(1)")
        h.reconciler.prune()
        h.insert(TestObject(2))
        h.expect_ops("update(2)", "update(1)")
        h.wait_reconciled()
        h.expect_health(r"level=OK")
        assert not any(op.startswith("prune") for op in h.ops.take(100))

        # Initialization prunes at once.
        h.mark_init()
        h.expect_ops("prune(n=2)")
        h.expect_health(r"level=OK")
        assert h.reconciler.metrics.prunes.count > 0

        # A failing prune degrades health.
        h.ops.faulty = True
        h.reconciler.prune()
        h.expect_ops("prune(n=2) fail")
        h.expect_health(r"level=Degraded.*message=.*prune fail")
        assert h.reconciler.metrics.prune_current_errors == 1

        # Pruning again with a healthy target recovers.
        h.ops.faulty = False
        h.reconciler.prune()
        h.expect_ops("prune(n=2)")
        h.expect_health(r"level=OK")
        assert h.reconciler.metrics.prune_current_errors == 0

        # Delete a row; the prune no longer includes it.
        h.delete(1)
        h.reconciler.prune()
        h.expect_ops("prune(n=1)", "delete(1)")

        # Prune with no rows left.
        h.delete(2)
        h.reconciler.prune()
        h.expect_ops("prune(n=0)", "delete(2)", "prune(n=1)")

        m = h.reconciler.metrics
        assert m.prunes.count > 0 and m.prunes.total_s > 0
        assert m.prune_current_errors == 0
        assert m.prune_errors_total == 1
        assert m.rounds.count > 0
        assert m.current_errors == 0
        assert m.errors_total == 0
        assert m.updates.total_s > 0 and m.deletes.total_s > 0


OLD = 946_715_410.0  # 2000-01-01T10:10:10+02:00


def _old_done(obj_id: int) -> TestObject:
    return TestObject(obj_id, status=Status(StatusKind.DONE, OLD))


def test_refresh(backend: str) -> None:
    with Harness(backend=backend, refresh_interval=3600.0) as h:
        # Step 1: a new row is updated once.
        h.insert(TestObject(1))
        h.expect_ops("update(1)")
        h.expect_table({1: DONE})

        # Step 2: a Done row last updated long ago is refreshed.
        h.insert(_old_done(1))
        h.expect_ops("update-refresh(1)")
        h.expect_table({1: DONE})

        # Step 3: refreshing against a faulty target fails and is retried.
        h.ops.faulty = True
        h.insert(_old_done(1))
        h.expect_ops("update-refresh(1) fail", "update-refresh(1) fail")
        h.expect_table({1: ("Error", "update fail")})
        h.expect_health(r"Degraded")

        # Step 4: healthy again.
        h.ops.faulty = False
        h.insert(_old_done(1))
        h.expect_ops("update-refresh(1)")
        h.expect_table({1: DONE})
        h.expect_health(r"OK, 1 object")
        assert h.reconciler.metrics.refreshes_total >= 2


def test_stopping_the_task_group_stops_the_reconciler(backend: str) -> None:
    h = Harness(backend=backend)
    h.insert(TestObject(1))
    h.expect_ops("update(1)")
    h.close()
    assert str(h.reconciler.health).endswith("stopped")
    # Writes after the stop are not reconciled...
    h.insert(TestObject(2))
    assert "update(2)" not in h.ops.take(100)
    # ...until the same reconciler runs again in a new task group.
    with start_blocking_portal(backend=backend) as portal:
        future, _ = portal.start_task(h.reconciler.run)
        h.portal = portal
        h.expect_ops("update(2)")
        h.expect_table({1: DONE, 2: DONE})
        future.cancel()
