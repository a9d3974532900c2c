"""Measuring a running agent from the inside, for long soak runs (benchmarks/soak.py):
how late its event loop wakes (`LoopProbe`), which stack holds the loop while it is late
(`StallSampler`), and which source lines hold the memory it gains (`MemoryTracer`).

Every figure is bounded whatever the run's length: lateness goes into a fixed histogram,
the stalls and their stacks into rings of the last `RECENT_STALLS`, and the memory trace
keeps two snapshots. The agent builds these only when the debug probe is switched on
(statewright/agent/components/debug.py); nothing here runs otherwise.
"""

from __future__ import annotations

import collections
import os
import sys
import threading
import time
import tracemalloc
from dataclasses import dataclass, field
from typing import Any

import anyio

#: Upper bounds (ms) of the lateness histogram's buckets; the last bucket is open.
LAG_BUCKETS_MS = (0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0)
#: A wake-up later than this (ms) is a stall: kept with its CPU time and stacks.
STALL_MS = 20.0
#: How many of the latest stalls (and their stacks) are kept.
RECENT_STALLS = 128


def _schedstat(fd: int) -> tuple[int, int]:
    """The calling thread's (ns on a CPU, ns waiting for one) from its open schedstat."""
    run, wait, _ = os.pread(fd, 100, 0).split()
    return int(run), int(wait)


@dataclass(slots=True)
class Stall:
    """One late wake-up: when it ended (``time.monotonic``), how late (ms), how much of
    that the loop's thread ran and waited for a CPU (ms), and its sampled stacks."""

    at: float
    ms: float
    cpu_ms: float
    runqueue_ms: float
    stacks: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """The stall as the API answers it (stacks most sampled first, at most ten)."""
        top = sorted(self.stacks.items(), key=lambda kv: -kv[1])[:10]
        return {
            "at": round(self.at, 3),
            "ms": round(self.ms, 2),
            "cpu_ms": round(self.cpu_ms, 2),
            "runqueue_ms": round(self.runqueue_ms, 2),
            "stacks": [[stack, n] for stack, n in top],
        }


class LoopProbe:
    """A task that sleeps ``tick`` seconds again and again and records how late it wakes:
    everything that holds the event loop (a long callback, a collector pass) shows here."""

    def __init__(self, tick: float = 0.001, stall_ms: float = STALL_MS) -> None:
        self.tick = tick
        self.stall_ms = stall_ms
        self.buckets = [0] * (len(LAG_BUCKETS_MS) + 1)
        self.wakeups = 0
        self.max_ms = 0.0
        self.stalls_total = 0
        self.stalls: collections.deque[Stall] = collections.deque(maxlen=RECENT_STALLS)
        #: When the loop last woke here (``time.monotonic``), for `StallSampler`.
        self.last_wake = time.monotonic()
        self.sampler: StallSampler | None = None

    def record(self, lag_ms: float) -> None:
        """Count one wake-up ``lag_ms`` late."""
        self.wakeups += 1
        self.max_ms = max(self.max_ms, lag_ms)
        i = 0
        for bound in LAG_BUCKETS_MS:
            if lag_ms <= bound:
                break
            i += 1
        self.buckets[i] += 1

    async def run(self, *, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
        """Measure until cancelled (with a `StallSampler` thread while it runs)."""
        self.sampler = StallSampler(self)
        self.sampler.start()
        fd = os.open("/proc/thread-self/schedstat", os.O_RDONLY)
        task_status.started()
        try:
            while True:
                t = time.perf_counter()
                cpu0, wait0 = _schedstat(fd)
                await anyio.sleep(self.tick)
                self.last_wake = time.monotonic()
                lag = max(0.0, (time.perf_counter() - t - self.tick) * 1000)
                self.record(lag)
                if lag > self.stall_ms:
                    cpu1, wait1 = _schedstat(fd)
                    stall = Stall(self.last_wake, lag, (cpu1 - cpu0) / 1e6, (wait1 - wait0) / 1e6)
                    stall.stacks = self.sampler.take()
                    self.stalls_total += 1
                    self.stalls.append(stall)
                else:
                    self.sampler.discard()
        finally:
            os.close(fd)
            self.sampler.stop()

    def to_json(self, since: float = 0.0) -> dict[str, Any]:
        """The histogram, the totals and the kept stalls that ended after ``since``."""
        return {
            "tick_ms": self.tick * 1000,
            "wakeups": self.wakeups,
            "lag_ms_max": round(self.max_ms, 2),
            "lag_buckets_ms": list(LAG_BUCKETS_MS),
            "lag_counts": list(self.buckets),
            "stall_ms": self.stall_ms,
            "stalls_total": self.stalls_total,
            "stalls": [s.to_json() for s in self.stalls if s.at > since],
        }


class CollectorProbe:
    """The cyclic collector's passes, from ``gc.callbacks``: per generation how many, the
    objects they found unreachable, their CPU in all and the longest (ms,
    ``time.thread_time``), and the latest passes over ``long_ms``."""

    def __init__(self, long_ms: float = 10.0) -> None:
        self.long_ms = long_ms
        self.count = [0, 0, 0]
        self.max_ms = [0.0, 0.0, 0.0]
        self.total_ms = [0.0, 0.0, 0.0]
        self.collected = [0, 0, 0]
        self.long: collections.deque[tuple[float, int, float, int]] = collections.deque(
            maxlen=RECENT_STALLS
        )
        self._start = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._start = time.thread_time()
            return
        ms = (time.thread_time() - self._start) * 1000
        gen = info["generation"]
        collected = info.get("collected", 0)
        self.count[gen] += 1
        self.collected[gen] += collected
        self.total_ms[gen] += ms
        self.max_ms[gen] = max(self.max_ms[gen], ms)
        if ms > self.long_ms:
            self.long.append((time.monotonic(), gen, ms, collected))

    def install(self) -> None:
        """Start counting."""
        import gc

        gc.callbacks.append(self)

    def remove(self) -> None:
        """Stop counting."""
        import gc

        if self in gc.callbacks:
            gc.callbacks.remove(self)

    def to_json(self, since: float = 0.0) -> dict[str, Any]:
        """Counts, maxima and the long passes that ended after ``since``."""
        return {
            "passes": list(self.count),
            "collected": list(self.collected),
            "cpu_ms_total": [round(m, 1) for m in self.total_ms],
            "cpu_ms_max": [round(m, 2) for m in self.max_ms],
            "long_ms": self.long_ms,
            "long_passes": [
                {"at": round(at, 3), "generation": g, "cpu_ms": round(ms, 2), "collected": c}
                for at, g, ms, c in self.long
                if at > since
            ],
        }


class StallSampler:
    """A thread that, every 2 ms while the loop has not woken for over
    ``threshold_ms`` (and about once per threshold otherwise), records the loop thread's
    stack; `LoopProbe` takes the counts when the late wake-up comes. The thread needs the
    interpreter lock to sample, so samples land where the loop releases it (calls into C,
    the switch interval): they say which code holds the loop, not exactly how its time
    splits."""

    def __init__(self, probe: LoopProbe, threshold_ms: float = 15.0) -> None:
        self.probe = probe
        self.threshold_s = threshold_ms / 1000
        self._counts: dict[str, int] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._loop_ident = 0

    def start(self) -> None:
        """Sample the calling (event loop) thread from now on."""
        self._loop_ident = threading.get_ident()
        self._thread = threading.Thread(target=self._run, name="stall-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """End the sampling thread."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def take(self) -> dict[str, int]:
        """The stacks sampled since the last `take` or `discard`."""
        with self._lock:
            counts, self._counts = self._counts, {}
        return counts

    def discard(self) -> None:
        """Forget samples of a wake-up that was not a stall (cheap when there are none)."""
        if self._counts:
            with self._lock:
                self._counts = {}

    def _run(self) -> None:
        # Each check takes the interpreter lock from the loop's thread, so the thread
        # sleeps until the loop would be ``threshold_ms`` late (about one check per
        # threshold while the loop keeps waking), then samples every 2 ms.
        delay = self.threshold_s
        while not self._stop.wait(delay):
            late = time.monotonic() - self.probe.last_wake
            if late < self.threshold_s:
                delay = max(0.002, self.threshold_s - late)
                continue
            delay = 0.002
            frame = sys._current_frames().get(self._loop_ident)
            parts: list[str] = []
            while frame is not None and len(parts) < 40:
                code = frame.f_code
                parts.append(f"{os.path.basename(code.co_filename)}:{code.co_name}:{frame.f_lineno}")
                frame = frame.f_back
            parts.reverse()
            # The frames above the loop's callback dispatch are the same in every sample.
            start = max((i + 1 for i, p in enumerate(parts) if p.startswith("events.py:_run:")),
                        default=0)
            stack = ";".join(parts[start:])
            with self._lock:
                self._counts[stack] = self._counts.get(stack, 0) + 1


class MemoryTracer:
    """tracemalloc, started and compared on request: ``start`` begins tracing, the first
    ``snapshot`` afterwards is the baseline, each later one answers the source lines whose
    live memory grew most since the baseline.

    The baseline keeps only its per-line totals (a snapshot of a large heap is hundreds of
    megabytes of trace objects). Take it once everything the agent keeps replacing has
    been replaced at least once under tracing: before that, state allocated before
    tracing began and replaced since shows up as growth."""

    def __init__(self) -> None:
        self.baseline: dict[tuple[str, int], tuple[int, int]] | None = None

    def start(self, frames: int) -> dict[str, Any]:
        """Begin tracing with ``frames`` frames per allocation (a new baseline follows)."""
        if not tracemalloc.is_tracing():
            tracemalloc.start(frames)
        self.baseline = None
        return self.state()

    def stop(self) -> dict[str, Any]:
        """Stop tracing and forget the baseline."""
        tracemalloc.stop()
        self.baseline = None
        return self.state()

    def state(self) -> dict[str, Any]:
        """Whether tracing, and the tracer's own memory."""
        tracing = tracemalloc.is_tracing()
        return {
            "tracing": tracing,
            "traced_mb": round(tracemalloc.get_traced_memory()[0] / 2**20, 1) if tracing else 0.0,
            "tracer_overhead_mb": round(tracemalloc.get_tracemalloc_memory() / 2**20, 1),
            "has_baseline": self.baseline is not None,
        }

    @staticmethod
    def _by_line() -> dict[tuple[str, int], tuple[int, int]]:
        snap = tracemalloc.take_snapshot().filter_traces(
            (tracemalloc.Filter(False, tracemalloc.__file__),)
        )
        out: dict[tuple[str, int], tuple[int, int]] = {}
        for stat in snap.statistics("lineno"):
            frame = stat.traceback[0]
            out[(frame.filename, frame.lineno)] = (stat.size, stat.count)
        return out

    def snapshot(self, top: int) -> dict[str, Any]:
        """Take a snapshot: the baseline if there is none, else the ``top`` growths since
        it (by source line: size and count differences). Slow on a big heap: run it in a
        worker thread."""
        if not tracemalloc.is_tracing():
            raise RuntimeError("tracemalloc is not tracing: start it first")
        now = self._by_line()
        out = self.state()
        if self.baseline is None:
            self.baseline = now
            out["has_baseline"] = True
            out["top"] = []
            return out
        base = self.baseline
        diffs = []
        for where in now.keys() | base.keys():
            size, count = now.get(where, (0, 0))
            size0, count0 = base.get(where, (0, 0))
            diffs.append((size - size0, count - count0, size, where))
        diffs.sort(reverse=True)
        out["top"] = [
            {
                "where": f"{where[0]}:{where[1]}",
                "size_kb_diff": round(d / 1024, 1),
                "count_diff": c,
                "size_kb": round(size / 1024, 1),
            }
            for d, c, size, where in diffs[:top]
        ]
        return out


def rss_mb() -> float:
    """This process' resident memory (MB)."""
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0
