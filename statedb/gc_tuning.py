"""Garbage-collector settings for processes that keep large statedb tables.

Every row, entry and hash-map node is a container object, so with CPython's default
thresholds the cyclic collector's full passes over a large heap dominate write-heavy
work (measured: about 2.7x fewer inserts/s at 100 rows per transaction). Rows are
immutable and free of reference cycles, so a long-running agent loses nothing by
collecting young objects less often and moving what it loaded at start-up out of the
collector's reach. This is a process-wide choice, so statedb never makes it by itself;
the application opts in with these helpers (the Statewright agent does):

- `tune_gc` at start: a raised young-generation threshold and a frozen start-up heap;
- `initial_load_gc` while a source's initial lists are applied: no young passes at the
  usual sizes, up to a bound (`INITIAL_LOAD_GEN0_THRESHOLD`);
- `freeze_loaded` after a bulk load (the agent's initial state is in the maps);
- `steady_gc` once the bulk load is done: one freeze of what was loaded, then thresholds
  for steady churn;
- `collect_young_periodically` under steady churn: timed young collections (the young
  threshold does not bound the young generation when old objects are freed as fast as
  new ones are made), each followed by a freeze of its survivors, so no middle or full
  pass ever traverses the churned state (benchmarks/soak.py: a middle pass every ~2
  minutes held the event loop 230-370 ms at 10,000 services);
- `collect_periodically` for the process's lifetime: objects frozen once stay out of
  every later collection, so a reference cycle among them would be kept forever;
  every ``interval`` seconds a forked child counts the cyclic garbage among them
  (`count_frozen_garbage`, off the event loop), and only when it has reached
  ``reclaim_bytes`` does the process itself unfreeze, run one full collection and
  freeze the survivors again (`collect_frozen`: about half a second holding the
  interpreter at 10,000 services). The garbage kept is thus bounded by
  ``reclaim_bytes``, and a process that makes no cycles never pays the full pass.

`collector_tuned` tells whether the process has opted in (`tune_gc` was called), so a
component can run the periodic collection only in a process that tuned its collector.
"""

from __future__ import annotations

import gc
import logging
import os
import select
import signal
import sys
import time
from dataclasses import dataclass
from typing import Any

import anyio

from statedb.errors import StatewrightError

log = logging.getLogger(__name__)

#: The young threshold during a bulk load: high enough that a whole write transaction of
#: rows is not traversed again and again while it is still young (benchmarks/reconciler.py's
#: bulk load measures the effect: fewer, cheaper young passes and more objects per second).
DEFAULT_GEN0_THRESHOLD = 200_000

#: The middle threshold during a bulk load: the number of young passes between two middle
#: passes. With CPython's 10, an initial sync of 60,000 services ran a middle pass over
#: every object loaded since the last one (about 1 s of CPU on the loop, a second of the
#: sync); at 1,000 none comes during a load, and `freeze_loaded` then puts what the load
#: left out of the collector's reach without traversing it.
BULK_GEN1_THRESHOLD = 1_000

#: The young threshold while a source's initial lists are applied (`initial_load_gc`).
#: What an initial sync allocates stays: the loaded rows, their index nodes, the maps'
#: state. A young pass traverses every container object allocated since the last one, so
#: at `DEFAULT_GEN0_THRESHOLD` the passes of a sync traverse the whole loaded state once
#: and free nothing (benchmarks/k8s.py at 60,000 services x 10 backends: 19 passes,
#: 0.76-0.77 s of the event loop's CPU; a 10,000-service sync with the collector off left
#: no cyclic garbage at all). A 60,000-service sync leaves 3.6 million container objects
#: (net) in the young generation, about 100 bytes of the load each: up to this many no
#: pass comes. Beyond it passes come as usual, so a load that does make cyclic garbage
#: holds at most this many unexamined objects (some 500 MB) at any time.
INITIAL_LOAD_GEN0_THRESHOLD = 5_000_000

#: Seconds between two checks of `collect_periodically` for cyclic garbage among frozen
#: objects. A full pass over a large LB state (benchmarks/lb.py's 10,000 services x 10
#: backends, about 900,000 tracked objects) holds the interpreter, and so the event loop,
#: for about half a second of CPU, so it runs only when a check finds enough garbage
#: (`DEFAULT_RECLAIM_BYTES`); a check is a fork (a few ms on the loop for the page
#: tables) and a child doing that pass on its copy.
DEFAULT_COLLECT_INTERVAL = 600.0

#: Cyclic garbage among frozen objects (bytes, ``sys.getsizeof`` of each object found)
#: from which `collect_periodically` reclaims it with a full pass.
DEFAULT_RECLAIM_BYTES = 4 * 2**20

#: Seconds a `count_frozen_garbage` child may take before it is killed.
COUNT_TIMEOUT = 300.0

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
#: young pass bounds that pile to what one interval allocates. A pass costs what the
#: generation holds plus some 20 us: at 0.1 s the soak's passes (10,000 services, 1,000
#: endpoint events/s) took 5-13 ms of CPU each and sat in most loop turns over 25 ms;
#: half the interval halves each pass for the same CPU in all.
YOUNG_COLLECT_INTERVAL = 0.05

# The thresholds tune_gc set, while they are still in place (see collector_tuned).
_tuned_threshold: tuple[int, ...] | None = None


def tune_gc(gen0_threshold: int = DEFAULT_GEN0_THRESHOLD, freeze: bool = True) -> tuple[int, ...]:
    """Raise the young-generation threshold (and the middle one to at least
    `BULK_GEN1_THRESHOLD`) and optionally freeze the current heap.

    Returns the previous thresholds so a caller (or a test) can restore them with
    ``gc.set_threshold(*previous)``.
    """
    global _tuned_threshold
    previous = gc.get_threshold()
    gc.set_threshold(gen0_threshold, max(previous[1], BULK_GEN1_THRESHOLD), previous[2])
    _tuned_threshold = gc.get_threshold()
    if freeze:
        gc.collect()
        gc.freeze()
    return previous


def collector_tuned() -> bool:
    """Whether `tune_gc` set the collector's current thresholds (the process opted in)."""
    return _tuned_threshold is not None and gc.get_threshold() == _tuned_threshold


def initial_load_gc(gen0_threshold: int = INITIAL_LOAD_GEN0_THRESHOLD) -> bool:
    """Raise a tuned collector's (`collector_tuned`) young threshold to ``gen0_threshold``
    while a source's initial lists are applied (see `INITIAL_LOAD_GEN0_THRESHOLD`); True
    if it did. `steady_gc` ends it. A process that kept its own thresholds (tests, an
    embedding application) is left alone; the process stays opted in."""
    global _tuned_threshold
    if not collector_tuned():
        return False
    current = gc.get_threshold()
    gc.set_threshold(gen0_threshold, *current[1:])
    _tuned_threshold = gc.get_threshold()
    return True


def steady_gc(thresholds: tuple[int, int, int] = STEADY_GC_THRESHOLDS) -> bool:
    """Switch a tuned collector (`collector_tuned`) to the steady-state ``thresholds``
    once the bulk load is done; True if it switched. What the load left in the young
    generation is frozen first (`freeze_loaded`: O(1)), or the first young pass under
    the steady thresholds would traverse all of it (after `initial_load_gc`, up to
    millions of objects: most of a second on the event loop). A process that kept its
    own thresholds (tests, an embedding application) is left alone, and the process
    stays opted in (`collector_tuned` is still true afterwards)."""
    global _tuned_threshold
    if not collector_tuned() or gc.get_threshold() == thresholds:
        return False
    gc.freeze()
    gc.set_threshold(*thresholds)
    _tuned_threshold = gc.get_threshold()
    return True


def freeze_loaded() -> int:
    """Move every object out of the collector's reach, without a collection first.

    For after a bulk load (an agent's initial sync): the loaded rows are long-lived and
    acyclic, so later collections need not traverse them again. Objects frozen here are
    still freed by reference counting; only reference cycles among them would outlive
    their use, and `collect_periodically` counts and reclaims those. A full pass before
    the freeze held the event loop for the whole heap (387 ms of CPU at 10,000 services,
    about 2 s at 60,000) and found nothing: the soak's agent collected 0 objects in it.
    Returns how many objects are frozen in total.
    """
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
    a short interval keeps every pass short. The survivors of each pass are frozen
    (``gc.freeze``): a cycle among them is left to `collect_periodically`."""
    if interval <= 0:
        raise ValueError(f"collect_young_periodically: interval must be > 0, got {interval}")
    task_status.started()
    collect, freeze = gc.collect, gc.freeze
    while True:
        await anyio.sleep(interval)
        if collector_tuned():
            collect(0)
            # O(1): the survivors join the frozen heap instead of the middle generation,
            # whose passes would traverse every churned object still alive.
            freeze()


@dataclass(frozen=True, slots=True)
class GarbageCount:
    """What a `count_frozen_garbage` child found: unreachable objects and their bytes."""

    objects: int
    bytes: int


def count_frozen_garbage(timeout: float = COUNT_TIMEOUT) -> GarbageCount | None:
    """Count the cyclic garbage of the whole heap, frozen objects included, without
    collecting it: a forked child unfreezes, runs a full collection that saves what it
    finds (``gc.DEBUG_SAVEALL``) and reports it. The caller's thread only forks (page
    tables: a few ms for a large process) and waits for the child; call it from a worker
    thread. None when the child could not tell (no fork, it failed); `CountTimedOut` when
    it took longer than ``timeout`` (then it is killed)."""
    if not hasattr(os, "fork"):
        return None
    parent = os.getpid()
    r, w = os.pipe()
    try:
        pid = os.fork()
    except OSError as e:
        os.close(r)
        os.close(w)
        log.warning("gc: cannot fork to count cyclic garbage: %s", e)
        return None
    if pid == 0:  # the child: count, report, exit without running any cleanup
        code = 1
        try:
            _die_with(parent)
            run_only_when_idle()
            os.close(r)
            gc.set_debug(gc.DEBUG_SAVEALL)
            gc.unfreeze()
            gc.collect()
            found = gc.garbage
            os.write(w, f"{len(found)} {sum(map(sys.getsizeof, found))}".encode())
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    return _child_count(pid, r, timeout)


def _die_with(parent: int) -> None:
    """In the counting child: end when ``parent`` does. The child holds every descriptor
    of its parent (an agent's pin- and state-directory locks, its API socket): outliving
    a killed agent, it would keep the agent's restart out (Linux: ``PR_SET_PDEATHSIG``;
    the signal follows the forking thread, which waits for the child)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: nothing to ask
        pass
    if os.getppid() != parent:  # it died before the request above
        os._exit(1)


_PR_SET_PDEATHSIG = 1


def run_only_when_idle() -> None:
    """Let the calling process run only on CPU time no other process wants (Linux's
    ``SCHED_IDLE`` policy; where that is refused, nice 19).

    For the counting child of `count_frozen_garbage`. A forked child inherits the agent's
    priority and CPU affinity: on a core reserved for the agent it took half of that core
    from the event loop for as long as its full collection ran (in the soak, loop stalls
    of 50-60 ms every 10 minutes, half of them waiting for the CPU). At ``SCHED_IDLE`` a
    waking agent thread preempts it at once; it only takes longer on a busy core, within
    its `COUNT_TIMEOUT`."""
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
        return
    except (AttributeError, OSError):  # no such policy here: the weakest nice instead
        pass
    try:
        os.nice(19)
    except OSError:
        pass


class CountTimedOut(StatewrightError):
    """The counting child did not report within its timeout (killed): on a CPU kept busy
    by others it runs only in the gaps (`run_only_when_idle`)."""


def _child_count(pid: int, r: int, timeout: float) -> GarbageCount | None:
    """Read the child's report, reap it; kill it after ``timeout`` and raise
    `CountTimedOut`."""
    data = b""
    deadline = time.monotonic() + timeout
    timed_out = False
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([r], [], [], left)[0]:
                os.kill(pid, signal.SIGKILL)
                timed_out = True
                break
            chunk = os.read(r, 4096)
            if not chunk:
                break
            data += chunk
    finally:
        os.close(r)
        os.waitpid(pid, 0)
    if timed_out:
        raise CountTimedOut(f"gc: the cyclic-garbage count took over {timeout:g} s: killed")
    parts = data.split()
    if len(parts) != 2:
        return None
    return GarbageCount(int(parts[0]), int(parts[1]))


async def collect_periodically(
    interval: float = DEFAULT_COLLECT_INTERVAL,
    *,
    reclaim_bytes: int = DEFAULT_RECLAIM_BYTES,
    task_status: Any = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Every ``interval`` seconds until cancelled, count the cyclic garbage among frozen
    objects in a forked child (`count_frozen_garbage`, waited for in a worker thread) and
    reclaim it with `collect_frozen` once it reaches ``reclaim_bytes`` (0: whenever there
    is any), or when it could not be counted (no fork, a failed child). A count that timed
    out (`CountTimedOut`: the CPU was busy) skips that round: a full pass on the loop is
    the last thing a busy agent needs, and the next interval counts again.

    Each reclaiming pass is logged (at info level when it found cycles) with what it
    collected and how long it took; a check that reclaims nothing at debug level.
    """
    if interval <= 0:
        raise ValueError(f"collect_periodically: interval must be > 0, got {interval}")
    task_status.started()
    while True:
        await anyio.sleep(interval)
        try:
            found = await anyio.to_thread.run_sync(count_frozen_garbage)
        except CountTimedOut as e:
            log.warning("%s; no full collection this round", e)
            continue
        if found is not None and (found.objects == 0 or found.bytes < reclaim_bytes):
            log.debug("gc: %d objects (%d bytes) of cyclic garbage, under %d: left",
                      found.objects, found.bytes, reclaim_bytes)
            continue
        r = collect_frozen()
        level = logging.INFO if r.collected else logging.DEBUG
        log.log(level, "gc: full collection freed %d objects, %d frozen again, %.0f ms",
                r.collected, r.frozen, r.seconds * 1000)
