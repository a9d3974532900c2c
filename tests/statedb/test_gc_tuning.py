"""tune_gc changes only the young-generation threshold and reports what it replaced."""

from __future__ import annotations

import gc

from statedb.gc_tuning import tune_gc


def test_tune_gc_sets_threshold_and_returns_previous() -> None:
    before = gc.get_threshold()
    try:
        previous = tune_gc(12_345, freeze=False)
        assert previous == before
        assert gc.get_threshold() == (12_345, before[1], before[2])
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
