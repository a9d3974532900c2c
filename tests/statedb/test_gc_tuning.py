"""tune_gc raises the young and middle thresholds and reports what it replaced."""

from __future__ import annotations

import functools
import gc

import pytest

from statedb.gc_tuning import BULK_GEN1_THRESHOLD, tune_gc


def test_tune_gc_sets_threshold_and_returns_previous() -> None:
    before = gc.get_threshold()
    try:
        previous = tune_gc(12_345, freeze=False)
        assert previous == before
        # The middle threshold is raised too: no middle pass during a bulk load.
        assert gc.get_threshold() == (12_345, max(before[1], BULK_GEN1_THRESHOLD), before[2])
    finally:
        gc.set_threshold(*before)


def test_freeze_loaded_moves_survivors_out_of_reach() -> None:
    from statedb.gc_tuning import freeze_loaded

    before = gc.get_freeze_count()
    kept = [[i] for i in range(1000)]  # container objects the collector tracks
    try:
        frozen = freeze_loaded()
        assert frozen >= before + len(kept)
        assert kept[999] == [999]  # frozen, not freed
    finally:
        gc.unfreeze()


def test_collector_tuned_follows_tune_gc_and_a_reset() -> None:
    from statedb.gc_tuning import collector_tuned

    before = gc.get_threshold()
    try:
        tune_gc(before[0] + 1, freeze=False)
        assert collector_tuned()
        gc.set_threshold(*before)  # the application changed its mind
        assert not collector_tuned()
    finally:
        gc.set_threshold(*before)


class _Cycle:
    """A container in a reference cycle with itself."""

    def __init__(self) -> None:
        self.me = self


def test_collect_frozen_frees_a_cycle_that_was_frozen_and_refreezes() -> None:
    import weakref

    from statedb.gc_tuning import collect_frozen

    try:
        obj = _Cycle()
        ref = weakref.ref(obj)
        gc.freeze()
        del obj
        gc.collect()
        assert ref() is not None  # frozen: no collection reaches it
        kept = [[i] for i in range(100)]
        result = collect_frozen()
        assert ref() is None
        assert result.collected >= 1
        assert result.frozen == gc.get_freeze_count() >= len(kept)
        assert result.seconds >= 0
    finally:
        gc.unfreeze()


def test_collect_periodically_runs_passes_until_cancelled() -> None:
    import weakref

    import anyio

    from statedb.gc_tuning import collect_periodically

    async def main() -> bool:
        obj = _Cycle()
        ref = weakref.ref(obj)
        gc.freeze()
        del obj
        async with anyio.create_task_group() as tg:
            await tg.start(functools.partial(collect_periodically, 0.01, reclaim_bytes=0))
            with anyio.fail_after(5):
                while ref() is not None:
                    await anyio.sleep(0.01)
            tg.cancel_scope.cancel()
        return ref() is None

    try:
        assert anyio.run(main)
    finally:
        gc.unfreeze()


def test_count_frozen_garbage_counts_in_a_child_and_frees_nothing_here() -> None:
    import weakref

    from statedb.gc_tuning import count_frozen_garbage

    try:
        cycles = [_Cycle() for _ in range(50)]
        refs = [weakref.ref(c) for c in cycles]
        gc.freeze()
        del cycles
        found = count_frozen_garbage(timeout=60)
        assert found is not None
        assert found.objects >= 50 and found.bytes > 0
        assert all(r() is not None for r in refs)  # counted in the child only
    finally:
        gc.unfreeze()
        gc.collect()


def test_collect_periodically_leaves_garbage_under_the_threshold() -> None:
    """A little frozen cyclic garbage does not buy a full pass in the process (which
    would hold the interpreter for the whole heap); it is reclaimed once it counts."""
    import weakref

    import anyio

    from statedb.gc_tuning import collect_periodically

    full_passes: list[int] = []

    def note(phase: str, info: dict[str, int]) -> None:
        if phase == "start" and info["generation"] == 2:
            full_passes.append(1)

    async def main(reclaim_bytes: int) -> bool:
        obj = _Cycle()
        ref = weakref.ref(obj)
        gc.freeze()
        del obj
        gc.callbacks.append(note)
        try:
            async with anyio.create_task_group() as tg:
                await tg.start(
                    functools.partial(collect_periodically, 0.05, reclaim_bytes=reclaim_bytes)
                )
                await anyio.sleep(1.0)
                tg.cancel_scope.cancel()
        finally:
            gc.callbacks.remove(note)
        return ref() is None

    try:
        assert not anyio.run(main, 1 << 30)
        assert full_passes == []
        assert anyio.run(main, 1)
        assert full_passes
    finally:
        gc.unfreeze()
        gc.collect()


def test_collect_periodically_skips_a_round_whose_count_timed_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A count that timed out (a busy CPU starved the idle-priority child) does not make
    the process run the full pass itself: that round is skipped."""
    import anyio

    from statedb import gc_tuning

    counts: list[int] = []

    def timed_out(timeout: float = 0.0) -> None:
        counts.append(1)
        raise gc_tuning.CountTimedOut("gc: the cyclic-garbage count took over 300 s: killed")

    def full_pass() -> None:
        raise AssertionError("a full collection after a timed-out count")

    monkeypatch.setattr(gc_tuning, "count_frozen_garbage", timed_out)
    monkeypatch.setattr(gc_tuning, "collect_frozen", full_pass)

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            await tg.start(functools.partial(gc_tuning.collect_periodically, 0.02))
            await anyio.sleep(0.3)
            tg.cancel_scope.cancel()

    anyio.run(main)
    assert len(counts) >= 3


def test_collect_periodically_refuses_a_non_positive_interval() -> None:
    import anyio
    import pytest

    from statedb.gc_tuning import collect_periodically

    with pytest.raises(ValueError, match="interval"):
        anyio.run(collect_periodically, 0)


def test_collect_young_periodically_runs_young_passes_only_while_tuned() -> None:
    import anyio

    from statedb.gc_tuning import collect_young_periodically

    passes: list[int] = []

    def note(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            passes.append(info["generation"])

    async def main(tuned: bool) -> list[int]:
        passes.clear()
        before = gc.get_threshold()
        try:
            # A young threshold no allocation here reaches: every pass is a timed one.
            if tuned:
                tune_gc(10_000_000, freeze=False)
            else:
                gc.set_threshold(9_000_000, before[1], before[2])
            gc.callbacks.append(note)
            async with anyio.create_task_group() as tg:
                await tg.start(collect_young_periodically, 0.01)
                await anyio.sleep(0.2)
                tg.cancel_scope.cancel()
        finally:
            gc.callbacks.remove(note)
            gc.set_threshold(*before)
        return list(passes)

    frozen_before = gc.get_freeze_count()
    try:
        tuned = anyio.run(main, True)
        assert tuned.count(0) >= 3
        # The survivors of the timed passes are frozen: no middle pass traverses them.
        assert gc.get_freeze_count() > frozen_before
        assert gc.get_count()[1] < 10
    finally:
        gc.unfreeze()
    # A process that did not opt in keeps its collector to itself.
    assert anyio.run(main, False) == []


def test_collect_young_periodically_refuses_a_non_positive_interval() -> None:
    import anyio
    import pytest

    from statedb.gc_tuning import collect_young_periodically

    with pytest.raises(ValueError, match="interval"):
        anyio.run(collect_young_periodically, 0)
