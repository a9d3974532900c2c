"""Clocks: where the reconciler reads time and waits, so tests can drive backoff with a fake clock.

Waiting always means "until this much clock time passed or one of these watches
closed"; the system clock maps that onto `WatchSet.wait_async` with a timeout,
the fake clock onto a watch that closes whenever the test advances time.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Protocol

import anyio

from statedb import Watch, WatchSet


class Clock(Protocol):
    """Time source of a reconciler: monotonic time for scheduling, wall time for statuses."""

    def now(self) -> float:
        """Monotonic seconds, for backoff, prune and rate-limit schedules."""
        ...

    def wall(self) -> float:
        """Wall-clock seconds since the epoch, stored in statuses."""
        ...

    async def sleep(self, delay: float | None, watches: Sequence[Watch] = ()) -> None:
        """Return once ``delay`` seconds of this clock passed (None: never) or a watch closed."""
        ...


class SystemClock:
    """The real clock."""

    def now(self) -> float:
        """Monotonic seconds (time.monotonic)."""
        return time.monotonic()

    def wall(self) -> float:
        """Epoch seconds (time.time)."""
        return time.time()

    async def sleep(self, delay: float | None, watches: Sequence[Watch] = ()) -> None:
        """Wait on ``watches`` with ``delay`` as timeout (anyio.move_on_after inside WatchSet)."""
        if delay is not None and delay <= 0:
            return
        if watches:
            await WatchSet(watches).wait_async(delay)
        elif delay is not None:
            await anyio.sleep(delay)
        else:
            await anyio.sleep_forever()


class FakeClock:
    """A clock that only moves when `advance` is called (from any thread)."""

    def __init__(self, start: float = 1000.0, wall_offset: float = 1_700_000_000.0) -> None:
        self._now = start
        self._wall_offset = wall_offset
        self._lock = threading.Lock()
        self._advanced = Watch()

    def now(self) -> float:
        """The fake monotonic time."""
        return self._now

    def wall(self) -> float:
        """The fake wall time: a fixed offset plus the fake monotonic time."""
        return self._wall_offset + self._now

    def advance(self, seconds: float) -> None:
        """Move time forward and wake every sleeper so it re-checks its deadline."""
        if seconds < 0:
            raise ValueError(f"FakeClock.advance: negative step {seconds}")
        with self._lock:
            self._now += seconds
            old, self._advanced = self._advanced, Watch()
        old.close()

    async def sleep(self, delay: float | None, watches: Sequence[Watch] = ()) -> None:
        """Wait until fake time reaches now + ``delay`` or one of ``watches`` closes."""
        deadline = None if delay is None else self._now + delay
        while deadline is None or self._now < deadline:
            if any(w.closed for w in watches):
                return
            with self._lock:
                advanced = self._advanced
            if deadline is not None and self._now >= deadline:
                return
            await WatchSet([*watches, advanced]).wait_async()
