"""Garbage-collector settings for processes that keep large statedb tables.

Every row, entry and hash-map node is a container object, so with CPython's default
thresholds the cyclic collector's full passes over a large heap dominate write-heavy
work (measured: about 2.7x fewer inserts/s at 100 rows per transaction). Rows are
immutable and free of reference cycles, so a long-running agent loses nothing by
collecting young objects less often and moving what it loaded at start-up out of the
collector's reach. This is a process-wide choice, so statedb never makes it by itself;
the application opts in with these helpers (the Statewright agent does):

- `tune_gc` at start: a raised young-generation threshold and a frozen start-up heap;
- `freeze_loaded` after a bulk load (the agent's initial state is in the maps);
- `steady_gc` once the bulk load is done: thresholds for steady churn;
- `collect_young_periodically` under steady churn: timed young collections (the young
  threshold does not bound the young generation when old objects are freed as fast as
  new ones are made);
- `collect_periodically` for the process's lifetime: objects frozen once stay out of
  every later collection, so a reference cycle among them would be kept forever;
  every ``interval`` seconds it unfreezes, runs one full collection and freezes the
  survivors again (`collect_frozen`).

`collector_tuned` tells whether the process has opted in (`tune_gc` was called), so a
component can run the periodic collection only in a process that tuned its collector.
"""

from __future__ import annotations

import gc
import logging
import time
from dataclasses import dataclass
from typing import Any

import anyio

log = logging.getLogger(__name__)

#: The young threshold during a bulk load: high enough that a whole write transaction of
#: rows is not traversed again and again while it is still young (benchmarks/reconciler.py's
#: bulk load measures the effect: fewer, cheaper young passes and more objects per second).
DEFAULT_GEN0_THRESHOLD = 200_000

#: Seconds between two `collect_frozen` passes of `collect_periodically`. A full pass over
#: a large LB state (benchmarks/lb.py's 10,000 services x 10 backends, about 900,000
#: tracked objects) holds the interpreter, and so the event loop, for about half a second
#: of CPU: once every ten minutes costs a small fraction of a core while bounding how long
#: a frozen cycle is kept.
DEFAULT_COLLECT_INTERVAL = 600.0

#: The collector's thresholds for the steady state after a bulk load (`steady_gc`), chosen
#: with benchmarks/k8s.py (10,000 services under EndpointSlice churn). Under churn each
#: event leaves some fifty young container objects alive: with `DEFAULT_GEN0_THRESHOLD`
#: one young collection is long enough to dominate the churn latency's tail, so the young
#: threshold is small (many short passes instead of a few long ones, for somewhat more
#: collector CPU in total). The middle threshold of 1,000 keeps the middle generation
#: (which holds churned objects until they are replaced) from being traversed every ten
#: young collections, and the full collections the 25 % rule then allows after
#: `freeze_loaded`. The price: under sustained churn a middle pass comes every few minutes
#: and traverses every churned object still alive; cyclic garbage (rare: rows are acyclic)
#: waits that long.
STEADY_GC_THRESHOLDS = (5_000, 1_000, 10)

#: Seconds between two young collections of `collect_young_periodically`. The young
#: threshold counts allocations minus deallocations of container objects, and freeing an
#: old object (a row version trimmed, a replaced backend) counts as well: under churn that
#: replaces long-lived rows the count stays near zero while the new versions pile up in
#: the young generation, and the pass that finally comes traverses all of them. A timed
#: young pass bounds that pile to what one interval allocates.
YOUNG_COLLECT_INTERVAL = 0.1

# The thresholds tune_gc set, while they are still in place (see collector_tuned).
_tuned_threshold: tuple[int, ...] | None = None


def tune_gc(gen0_threshold: int = DEFAULT_GEN0_THRESHOLD, freeze: bool = True) -> tuple[int, ...]:
    """Raise the young-generation threshold and optionally freeze the current heap.

    Returns the previous thresholds so a caller (or a test) can restore them with
    ``gc.set_threshold(*previous)``.
    """
    global _tuned_threshold
    previous = gc.get_threshold()
    gc.set_threshold(gen0_threshold, previous[1], previous[2])
    _tuned_threshold = gc.get_threshold()
    if freeze:
        gc.collect()
        gc.freeze()
    return previous


def collector_tuned() -> bool:
    """Whether `tune_gc` set the collector's current thresholds (the process opted in)."""
    return _tuned_threshold is not None and gc.get_threshold() == _tuned_threshold


def steady_gc(thresholds: tuple[int, int, int] = STEADY_GC_THRESHOLDS) -> bool:
    """Switch a tuned collector (`collector_tuned`) to the steady-state ``thresholds``
    once the bulk load is done; True if it switched. A process that kept its own
    thresholds (tests, an embedding application) is left alone, and the process stays
    opted in (`collector_tuned` is still true afterwards)."""
    global _tuned_threshold
    if not collector_tuned() or gc.get_threshold() == thresholds:
        return False
    gc.set_threshold(*thresholds)
    _tuned_threshold = gc.get_threshold()
    return True


def freeze_loaded() -> int:
    """Collect once, then move every surviving object out of the collector's reach.

    For after a bulk load (an agent's initial sync): the loaded rows are long-lived and
    acyclic, so later collections need not traverse them again. Objects frozen here are
    still freed by reference counting; only reference cycles among them would outlive
    their use (`collect_frozen` reclaims those). Returns how many objects are frozen in
    total.
    """
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


@dataclass(frozen=True, slots=True)
class CollectResult:
    """What one `collect_frozen` pass did."""

    #: Unreachable objects the full collection found (cycles kept until now).
    collected: int
    #: Objects frozen again afterwards.
    frozen: int
    #: Wall time of the pass, in seconds.
    seconds: float


def collect_frozen() -> CollectResult:
    """Unfreeze, run one full collection, freeze the survivors again.

    Frees reference cycles among frozen objects (which no collection reaches while they
    are frozen) and keeps the heap out of the collector's reach afterwards. Runs on the
    calling thread; the collector holds the interpreter lock for the whole pass.
    """
    start = time.perf_counter()
    gc.unfreeze()
    collected = gc.collect()
    gc.freeze()
    return CollectResult(collected, gc.get_freeze_count(), time.perf_counter() - start)


async def collect_young_periodically(
    interval: float = YOUNG_COLLECT_INTERVAL,
    *,
    task_status: Any = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Run a young collection (``gc.collect(0)``) every ``interval`` seconds until
    cancelled, while the process keeps a tuned collector (`collector_tuned`); see
    `YOUNG_COLLECT_INTERVAL` for why. Each pass costs what the young generation holds, so
    a short interval keeps every pass short."""
    if interval <= 0:
        raise ValueError(f"collect_young_periodically: interval must be > 0, got {interval}")
    task_status.started()
    collect = gc.collect
    while True:
        await anyio.sleep(interval)
        if collector_tuned():
            collect(0)


async def collect_periodically(
    interval: float = DEFAULT_COLLECT_INTERVAL,
    *,
    task_status: Any = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Run `collect_frozen` every ``interval`` seconds until cancelled.

    Each pass is logged (at debug level, or info when it found cycles) with what it
    collected and how long it took.
    """
    if interval <= 0:
        raise ValueError(f"collect_periodically: interval must be > 0, got {interval}")
    task_status.started()
    while True:
        await anyio.sleep(interval)
        r = collect_frozen()
        level = logging.INFO if r.collected else logging.DEBUG
        log.log(level, "gc: full collection freed %d objects, %d frozen again, %.0f ms",
                r.collected, r.frozen, r.seconds * 1000)
