"""The k8s component's switch to steady-state collector thresholds after the sync."""

from __future__ import annotations

import gc

from statedb.gc_tuning import DEFAULT_GEN0_THRESHOLD
from statewright.agent.components.kubernetes import STEADY_GC_THRESHOLDS, steady_gc


def test_switches_only_a_process_tuned_for_bulk_loads() -> None:
    previous = gc.get_threshold()
    try:
        gc.set_threshold(700, 10, 10)  # CPython's defaults: a test or an embedding app
        assert not steady_gc()
        assert gc.get_threshold() == (700, 10, 10)
        gc.set_threshold(DEFAULT_GEN0_THRESHOLD, 10, 10)  # what tune_gc sets
        assert steady_gc()
        assert gc.get_threshold() == STEADY_GC_THRESHOLDS
        assert not steady_gc()  # once
    finally:
        gc.set_threshold(*previous)
