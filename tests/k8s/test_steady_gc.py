"""The switch to steady-state collector thresholds after the initial sync (statedb.gc_tuning)."""

from __future__ import annotations

import gc

from statedb import gc_tuning
from statedb.gc_tuning import STEADY_GC_THRESHOLDS, collector_tuned, steady_gc


def test_switches_only_a_process_tuned_for_bulk_loads() -> None:
    previous = gc.get_threshold()
    tuned = gc_tuning._tuned_threshold
    try:
        gc.set_threshold(700, 10, 10)  # CPython's defaults: a test or an embedding app
        assert not steady_gc()
        assert gc.get_threshold() == (700, 10, 10)
        gc_tuning.tune_gc(freeze=False)  # what the agent does at start
        assert steady_gc()
        assert gc.get_threshold() == STEADY_GC_THRESHOLDS
        assert collector_tuned()  # still opted in: the periodic collection keeps running
        assert not steady_gc()  # once
    finally:
        gc.set_threshold(*previous)
        gc_tuning._tuned_threshold = tuned


def test_initial_load_holds_young_passes_off_then_steady_freezes_what_was_loaded() -> None:
    previous = gc.get_threshold()
    tuned = gc_tuning._tuned_threshold
    try:
        gc.set_threshold(700, 10, 10)
        assert not gc_tuning.initial_load_gc()  # not tuned: left alone
        assert gc.get_threshold() == (700, 10, 10)
        gc_tuning.tune_gc(freeze=False)
        assert gc_tuning.initial_load_gc()
        assert gc.get_threshold()[0] == gc_tuning.INITIAL_LOAD_GEN0_THRESHOLD
        assert collector_tuned()
        loaded = [[i] for i in range(20_000)]  # young container objects, kept
        assert gc.get_count()[0] >= len(loaded)
        frozen = gc.get_freeze_count()
        assert steady_gc()
        # Frozen, not traversed: the first steady young pass does not meet them.
        assert gc.get_freeze_count() >= frozen + len(loaded)
        assert gc.get_count()[0] < 100
        assert gc.get_threshold() == STEADY_GC_THRESHOLDS
    finally:
        gc.unfreeze()
        gc.set_threshold(*previous)
        gc_tuning._tuned_threshold = tuned
