"""Garbage-collector settings for processes that keep large statedb tables.

Every row, entry and hash-map node is a container object, so with CPython's default
thresholds the cyclic collector's full passes over a large heap dominate write-heavy
work (measured: about 2.7x fewer inserts/s at 100 rows per transaction). Rows are
immutable and free of reference cycles, so a long-running agent loses nothing by
collecting young objects less often and moving what it loaded at start-up out of the
collector's reach. This is a process-wide choice, so statedb never makes it by itself:
the application calls `tune_gc` (the Statewright agent does at start) and `freeze_loaded`
after a bulk load (the agent does once its initial state is in the maps).
"""

from __future__ import annotations

import gc

#: Measured with benchmarks/reconciler.py's bulk load (200,000 rows, writer thread +
#: reconciler): 50,000 -> 100k objects/s, 635 ms in the collector (one 195 ms young-and-middle
#: pass); 200,000 -> 125k objects/s, 278 ms. Most young passes take 0.1-0.2 ms either way;
#: the longest (a whole 10,000-row transaction still young) took 48 vs 98 ms.
DEFAULT_GEN0_THRESHOLD = 200_000


def tune_gc(gen0_threshold: int = DEFAULT_GEN0_THRESHOLD, freeze: bool = True) -> tuple[int, ...]:
    """Raise the young-generation threshold and optionally freeze the current heap.

    Returns the previous thresholds so a caller (or a test) can restore them with
    ``gc.set_threshold(*previous)``.
    """
    previous = gc.get_threshold()
    gc.set_threshold(gen0_threshold, previous[1], previous[2])
    if freeze:
        gc.collect()
        gc.freeze()
    return previous


def freeze_loaded() -> int:
    """Collect once, then move every surviving object out of the collector's reach.

    For after a bulk load (an agent's initial sync): the loaded rows are long-lived and
    acyclic, so later collections need not traverse them again. Objects frozen here are
    still freed by reference counting; only reference cycles among them would outlive
    their use. Returns how many objects are frozen in total.
    """
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
