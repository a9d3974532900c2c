"""``Config.prune_beside_rounds``: a prune whose awaitable part is slow runs in a task of
its own; rows changed meanwhile are reconciled, no second prune starts before it ends, a
request made meanwhile is served by a later prune, and its failure reaches health."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import anyio
import pytest

from statedb import ReadTxn
from tests.reconciler.helpers import Harness, TestObject, wait_for

DONE = ("Done", "")


class SlowPruneOps:
    """Updates land at once; a prune's awaitable part waits until the test releases it
    (or fails when told to)."""

    def __init__(self) -> None:
        self.target: dict[int, str] = {}
        self.release = threading.Event()
        self.prunes_started = 0
        self.prunes_finished = 0
        self.fail = False

    def update(self, txn: ReadTxn, revision: int, obj: TestObject) -> None:
        self.target[obj.id] = obj.value

    def delete(self, txn: ReadTxn, revision: int, obj: TestObject) -> None:
        self.target.pop(obj.id, None)

    def prune(self, txn: ReadTxn, objects: Iterator[TestObject]) -> object:
        # Decided now, against the snapshot; rows written while the rest waits are not
        # among them (what "tolerate updates between the awaits" asks of a target).
        keep = {o.id for o in objects}
        stale = [k for k in self.target if k not in keep]
        self.prunes_started += 1

        async def rest() -> None:
            while not self.release.is_set():
                await anyio.sleep(0.01)
            if self.fail:
                raise RuntimeError("audit broke")
            for k in stale:
                self.target.pop(k, None)
            self.prunes_finished += 1

        return rest()


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_rounds_go_on_while_a_slow_prune_runs(backend: str) -> None:
    ops = SlowPruneOps()
    with Harness(backend=backend, ops=ops, prune_interval=None,
                 prune_beside_rounds=True) as h:
        ops.target[99] = "stray"
        h.insert(TestObject(1, value="a"))
        h.expect_table({1: DONE})
        first = h.reconciler.prune()
        wait_for(lambda: ops.prunes_started >= 1, "a prune started")
        started = ops.prunes_started
        # The prune is stuck in its awaitable part: rows still reach the target.
        h.insert(TestObject(2, value="b"))
        h.expect_table({1: DONE, 2: DONE})
        assert ops.target[2] == "b"
        # A request now is for a later prune; none starts while this one runs.
        second = h.reconciler.prune()
        h.insert(TestObject(3, value="c"))
        h.expect_table({1: DONE, 2: DONE, 3: DONE})
        assert ops.prunes_started == started
        assert not first.closed and not second.closed
        ops.release.set()
        wait_for(lambda: first.closed, "the first prune finished")
        wait_for(lambda: second.closed, "the requested prune ran after it")
        assert ops.prunes_started == started + 1
        assert 99 not in ops.target and ops.target == {1: "a", 2: "b", 3: "c"}


def test_a_failing_prune_beside_the_rounds_reaches_health() -> None:
    ops = SlowPruneOps()
    ops.fail = True
    ops.release.set()
    with Harness(ops=ops, prune_interval=None, prune_beside_rounds=True) as h:
        h.insert(TestObject(1, value="a"))
        h.expect_table({1: DONE})
        h.reconciler.prune()
        h.expect_health(r"Degraded")
        assert any("prune test-objects: audit broke" in e for e in h.reconciler.health.errors)
        ops.fail = False
        watch = h.reconciler.prune()
        wait_for(lambda: watch.closed, "the next prune ran")
        h.expect_health(r"OK")
