"""The retry queue: failed updates and deletes, per primary key, with exponential backoff.

At most one retry is pending per key, so a newer change of a row replaces (clears)
its pending retry. The failure count of a key survives re-queueing and is reset
only by success or by a newer change, which gives the exponential backoff.

A failure for lack of a resource (reconciler/waiting.py) is *parked* instead: it has no
due time and waits, in the order it came, until `wake` finds units of its resource
available and schedules that many of the parked keys for now. Parked keys cost nothing
until then, however many there are.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

from reconciler.waiting import Resource


@dataclass(frozen=True, slots=True)
class RetryItem:
    """A failed operation waiting for its next attempt."""

    key: bytes
    obj: Any
    revision: int
    delete: bool
    error: str
    attempts: int
    retry_at: float
    seq: int
    #: The exhausted resource it waits for (parked until `RetryQueue.wake`), or None.
    waits_for: Any = None


def backoff_delay(attempts: int, minimum: float, maximum: float) -> float:
    """Delay before attempt number ``attempts + 1``: minimum * 2**(attempts-1), capped."""
    if attempts <= 1:
        return minimum
    exp = min(attempts - 1, 62)
    return min(maximum, minimum * float(1 << exp))


class RetryQueue:
    """Pending retries ordered by due time, and parked ones by resource; one entry per
    primary key."""

    def __init__(self, minimum: float, maximum: float) -> None:
        self.minimum = minimum
        self.maximum = maximum
        # Scheduled retries (with a due time), in the order their keys first failed.
        self._items: dict[bytes, RetryItem] = {}
        self._heap: list[tuple[float, int, bytes]] = []
        self._seq = itertools.count()
        # Parked retries per resource, in the order they were parked; the resource of
        # each parked key; how many keys woken per resource are still scheduled.
        self._parked: dict[Any, dict[bytes, RetryItem]] = {}
        self._parked_on: dict[bytes, Any] = {}
        self._woken: dict[Any, int] = {}
        #: Counts every change of the queue (a retry added, re-queued or cleared): the
        #: reconciler compares it between rounds to tell watchers (`Reconciler.health_watch`).
        self.changes = 0

    def __len__(self) -> int:
        return len(self._items) + len(self._parked_on)

    def __bool__(self) -> bool:
        return bool(self._items) or bool(self._parked_on)

    def __contains__(self, key: bytes) -> bool:
        return key in self._items or key in self._parked_on

    def get(self, key: bytes) -> RetryItem | None:
        """Return the pending retry of ``key`` (scheduled or parked), if any."""
        item = self._items.get(key)
        if item is None and key in self._parked_on:
            return self._parked[self._parked_on[key]][key]
        return item

    def add(
        self,
        key: bytes,
        obj: Any,
        revision: int,
        delete: bool,
        error: str,
        now: float,
        waits_for: Resource | None = None,
    ) -> RetryItem:
        """Queue (or re-queue) a retry for ``key``, backing off further on each failure;
        given ``waits_for``, park it until that resource has a unit free (`wake`)."""
        prev = self._take(key)
        attempts = prev.attempts + 1 if prev is not None else 1
        self.changes += 1
        if waits_for is not None:
            item = RetryItem(
                key, obj, revision, delete, error, attempts, math.inf, next(self._seq), waits_for
            )
            self._parked.setdefault(waits_for, {})[key] = item
            self._parked_on[key] = waits_for
            return item
        at = now + backoff_delay(attempts, self.minimum, self.maximum)
        item = RetryItem(key, obj, revision, delete, error, attempts, at, next(self._seq))
        self._items[key] = item
        heapq.heappush(self._heap, (at, item.seq, key))
        self._compact()
        return item

    def clear(self, key: bytes) -> None:
        """Forget the retry of ``key`` (it succeeded or a newer change supersedes it)."""
        if self._take(key) is not None:
            self.changes += 1

    def _take(self, key: bytes) -> RetryItem | None:
        """Remove ``key``'s retry wherever it is (its heap entry, if any, goes stale)."""
        res = self._parked_on.pop(key, None)
        if res is not None:
            parked = self._parked[res]
            item = parked.pop(key)
            if not parked:
                del self._parked[res]
            return item
        scheduled = self._items.pop(key, None)
        if scheduled is not None and scheduled.waits_for is not None:
            self._unwoken(scheduled.waits_for)
        return scheduled

    def _unwoken(self, res: Any) -> None:
        left = self._woken.get(res, 0) - 1
        if left > 0:
            self._woken[res] = left
        else:
            self._woken.pop(res, None)

    def next_due(self) -> float | None:
        """Time of the earliest scheduled retry, or None (parked ones have none)."""
        self._drop_stale()
        return self._heap[0][0] if self._heap else None

    def pop_due(self, now: float, limit: int) -> Iterator[RetryItem]:
        """Yield up to ``limit`` retries due at ``now``, removing them from the queue's schedule.

        A yielded item stays known (for its failure count) until `add` or `clear`.
        """
        n = 0
        while n < limit:
            self._drop_stale()
            if not self._heap or self._heap[0][0] > now:
                return
            _, _, key = heapq.heappop(self._heap)
            n += 1
            item = self._items[key]
            if item.waits_for is not None:
                # Woken and now tried: no longer counted as woken.
                self._unwoken(item.waits_for)
                item = replace(item, waits_for=None)
                self._items[key] = item
            yield item

    def first(self, n: int) -> list[RetryItem]:
        """Up to ``n`` scheduled retries, in the order their keys first failed (O(n), for
        health; parked ones: `parked_by_resource`)."""
        return list(itertools.islice(self._items.values(), n))

    # ----- parked retries ---------------------------------------------------------------
    @property
    def parked(self) -> int:
        """How many keys are parked (waiting for a resource)."""
        return len(self._parked_on)

    def parked_by_resource(self, n: int) -> list[tuple[Resource, int, list[RetryItem]]]:
        """Per resource with parked keys: it, how many, and the first ``n`` parked (for
        health; O(resources * n))."""
        return [
            (res, len(items), list(itertools.islice(items.values(), n)))
            for res, items in self._parked.items()
        ]

    def wakeable(self) -> bool:
        """Whether `wake` would schedule a parked key now."""
        return any(self._room(res) > 0 for res in self._parked)

    def _room(self, res: Any) -> int:
        try:
            free = int(res.available())
        except Exception:  # a broken resource wakes its keys one at a time
            free = 1
        return free - self._woken.get(res, 0)

    def wake(self, now: float) -> int:
        """Schedule for ``now`` as many parked keys of each resource (first parked first)
        as it has units available, less those woken before and not tried yet; returns how
        many. O(resources + woken keys): parked keys that stay parked cost nothing."""
        woken = 0
        for res in list(self._parked):
            room = self._room(res)
            if room <= 0:
                continue
            parked = self._parked[res]
            for key in list(itertools.islice(parked, room)):
                item = replace(parked.pop(key), retry_at=now, seq=next(self._seq))
                del self._parked_on[key]
                self._items[key] = item
                heapq.heappush(self._heap, (now, item.seq, key))
                woken += 1
                self._woken[res] = self._woken.get(res, 0) + 1
            if not parked:
                del self._parked[res]
        if woken:
            self.changes += 1
        return woken

    def _drop_stale(self) -> None:
        heap, items = self._heap, self._items
        while heap:
            _, seq, key = heap[0]
            item = items.get(key)
            if item is not None and item.seq == seq:
                return
            heapq.heappop(heap)

    def _compact(self) -> None:
        if len(self._heap) > 2 * len(self._items) + 64:
            self._heap = [(i.retry_at, i.seq, i.key) for i in self._items.values()]
            heapq.heapify(self._heap)
