"""The statedb component runs the periodic full collection only when configured or tuned."""

from __future__ import annotations

import gc
import weakref
from typing import Any

import anyio
import pytest

from statedb.gc_tuning import tune_gc
from statewright.agent.components.statedb import StateDBComponent
from statewright.component import OK, Hive


class _Cycle:
    def __init__(self) -> None:
        self.me = self


async def _started_tasks(component: StateDBComponent, wait: float) -> list[str]:
    """Start ``component`` alone, let it run ``wait`` seconds, return its health states."""
    hive = Hive([component])
    async with anyio.create_task_group() as tg:
        await hive.start(tg)
        await anyio.sleep(wait)
        states = [h.state for h in hive.health()]
        await hive.stop()
        tg.cancel_scope.cancel()
    return states


def test_with_an_interval_frozen_cycles_are_collected(monkeypatch: pytest.MonkeyPatch) -> None:
    # The counting child normally runs only on idle CPU time (tests/statedb/
    # test_gc_count_child.py); on a test machine kept busy by other tests it could take
    # longer than this test waits. What is tested here is that the component counts and
    # reclaims, so the child keeps the test's priority.
    import statedb.gc_tuning as gc_tuning

    monkeypatch.setattr(gc_tuning, "run_only_when_idle", lambda: None)

    async def main() -> bool:
        obj = _Cycle()
        ref = weakref.ref(obj)
        gc.freeze()
        del obj
        hive = Hive([StateDBComponent(collect_interval=0.01, reclaim_bytes=0)])
        async with anyio.create_task_group() as tg:
            await hive.start(tg)
            with anyio.fail_after(5):
                while ref() is not None:
                    await anyio.sleep(0.01)
            await hive.stop()
            tg.cancel_scope.cancel()
        return ref() is None

    try:
        assert anyio.run(main)
    finally:
        gc.unfreeze()


def test_untuned_process_keeps_its_collector_as_it_was() -> None:
    comp = StateDBComponent()

    async def main() -> bool:
        obj = _Cycle()
        ref = weakref.ref(obj)
        gc.freeze()
        del obj
        assert await _started_tasks(comp, 0.05) == [OK]
        return ref() is not None

    try:
        assert anyio.run(main)  # nothing unfroze the heap
    finally:
        gc.unfreeze()


def test_tuned_process_gets_the_default_interval(monkeypatch: pytest.MonkeyPatch) -> None:
    import statewright.agent.components.statedb as mod

    seen: list[float] = []

    async def fake(interval: float, *, task_status: Any, **_: Any) -> None:
        seen.append(interval)
        task_status.started()
        await anyio.sleep_forever()

    before = gc.get_threshold()
    monkeypatch.setattr(mod, "collect_periodically", fake)
    try:
        tune_gc(before[0] + 1, freeze=False)
        assert anyio.run(_started_tasks, StateDBComponent(), 0.01) == [OK]
    finally:
        gc.set_threshold(*before)
    assert seen == [mod.DEFAULT_COLLECT_INTERVAL]
