"""Rows held until the table is initialized (``Config.hold_until_initialized``), and the first
prune waiting until every change went to the target.

A held row is not handed to the target and stays Pending; once the table is initialized it
is handed over, unless a newer version or a deletion of its key came meanwhile (then only
that goes). The first prune runs only once no change waits for a round and no row is held:
a prune before that would drop what the target kept for rows it has not seen yet."""

from __future__ import annotations

import pytest

from tests.reconciler.helpers import Harness, TestObject, wait_for

BACKENDS = ["asyncio", "trio"]
DONE = ("Done", "")
PENDING = ("Pending", "")


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def _empty(o: TestObject) -> bool:
    """The rows the tests hold: value "empty" (a frontend with no backends, say)."""
    return o.value == "empty"


def _updates(h: Harness) -> list[str]:
    return [op for op in h.ops.take(1000) if op.startswith("update")]


@pytest.mark.parametrize("batch", [False, True])
def test_held_rows_wait_for_initialization(backend: str, batch: bool) -> None:
    with Harness(
        backend=backend, batch=batch, initializer=True, hold_until_initialized=_empty
    ) as h:
        h.insert(TestObject(1, value="empty"))
        h.insert(TestObject(2, value="full"))
        h.expect_ops("update(2)")
        h.expect_table({1: PENDING, 2: DONE})
        assert _updates(h) == ["update(2)"]
        assert h.reconciler.held == 1
        problems = h.reconciler.problems()
        assert "1 row(s) held until the table is initialized" in problems
        h.expect_health(r"level=OK")

        h.mark_init()
        h.expect_table({1: DONE, 2: DONE})
        assert sorted(_updates(h)) == ["update(1)", "update(2)"]
        assert h.reconciler.held == 0
        wait_for(lambda: h.reconciler.problems() == [], "no problems")


def test_a_held_change_is_not_attempted(backend: str) -> None:
    """`reconciled_revision` stays before a held row's change until it is handed over."""
    with Harness(backend=backend, initializer=True, hold_until_initialized=_empty) as h:
        before = h.insert(TestObject(2))
        h.wait_reconciled(before)
        held_at = h.insert(TestObject(1, value="empty"))
        h.insert(TestObject(3))
        h.expect_ops("update(3)")
        wait_for(lambda: h.reconciler.held == 1, "row 1 held")
        assert h.reconciler.reconciled_revision < held_at
        h.mark_init()
        h.wait_reconciled()
        assert h.statuses()[1] == DONE


def test_a_newer_version_replaces_the_held_one(backend: str) -> None:
    with Harness(backend=backend, initializer=True, hold_until_initialized=_empty) as h:
        h.insert(TestObject(1, value="empty"))
        h.insert(TestObject(2, value="empty"))
        wait_for(lambda: h.reconciler.held == 2, "two rows held")
        # Row 1 gets what it lacked: it goes at once; row 2 is held again, as a newer version.
        h.insert(TestObject(1, value="full"))
        h.insert(TestObject(2, value="empty", faulty=False))
        h.expect_ops("update(1)")
        h.expect_table({1: DONE, 2: PENDING})
        h.mark_init()
        h.expect_table({1: DONE, 2: DONE})
        assert sorted(_updates(h)) == ["update(1)", "update(2)"]


def test_a_deleted_held_row_is_never_handed_over(backend: str) -> None:
    with Harness(backend=backend, initializer=True, hold_until_initialized=_empty) as h:
        h.insert(TestObject(1, value="empty"))
        h.insert(TestObject(2))
        h.expect_ops("update(2)")
        h.delete(1)
        h.expect_ops("update(2)", "delete(1)")
        assert h.reconciler.held == 0
        h.mark_init()
        h.insert(TestObject(3))
        h.expect_ops("update(3)")
        assert _updates(h) == ["update(2)", "update(3)"]


def test_nothing_is_held_once_initialized(backend: str) -> None:
    with Harness(backend=backend, initializer=True, hold_until_initialized=_empty) as h:
        h.mark_init()
        h.insert(TestObject(1, value="empty"))
        h.expect_ops("update(1)")
        h.expect_table({1: DONE})


def test_more_held_rows_than_a_round_all_go_then_the_first_prune(backend: str) -> None:
    with Harness(
        backend=backend,
        initializer=True,
        hold_until_initialized=_empty,
        incremental_round_size=3,
        prune_interval=3600.0,
    ) as h:
        with h.db.write_txn(h.table) as w:
            for i in range(1, 11):
                h.table.insert(w, TestObject(i, value="empty"))
        wait_for(lambda: h.reconciler.held == 10, "ten rows held")
        assert _updates(h) == []
        h.mark_init()
        h.expect_table({i: DONE for i in range(1, 11)})
        h.expect_ops("prune(n=10)")
        history = h.ops.take(1000)
        assert history.index("prune(n=10)") == len(history) - 1
        assert sorted(_updates(h)) == sorted(f"update({i})" for i in range(1, 11))


def test_the_first_prune_waits_for_the_backlog(backend: str) -> None:
    """The table is initialized with more changes than a round takes: the first prune comes
    after the last of them went to the target, not after the first round."""
    with Harness(
        backend=backend, initializer=True, incremental_round_size=2, prune_interval=3600.0
    ) as h:
        assert h._mark_init is not None
        with h.db.write_txn(h.table) as w:
            for i in range(1, 13):
                h.table.insert(w, TestObject(i))
            h._mark_init(w)
        h.expect_table({i: DONE for i in range(1, 13)})
        wait_for(lambda: any(op.startswith("prune") for op in h.ops.take(100)), "a prune")
        history = h.ops.take(1000)
        prune = history.index("prune(n=12)")
        assert all(history.index(f"update({i})") < prune for i in range(1, 13)), history
