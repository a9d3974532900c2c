"""The retry queue: failed updates and deletes, per primary key, with exponential backoff.

At most one retry is pending per key, so a newer change of a row replaces (clears)
its pending retry. The failure count of a key survives re-queueing and is reset
only by success or by a newer change, which gives the exponential backoff.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any


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


def backoff_delay(attempts: int, minimum: float, maximum: float) -> float:
    """Delay before attempt number ``attempts + 1``: minimum * 2**(attempts-1), capped."""
    if attempts <= 1:
        return minimum
    exp = min(attempts - 1, 62)
    return min(maximum, minimum * float(1 << exp))


class RetryQueue:
    """Pending retries ordered by due time; one entry per primary key."""

    def __init__(self, minimum: float, maximum: float) -> None:
        self.minimum = minimum
        self.maximum = maximum
        self._items: dict[bytes, RetryItem] = {}
        self._heap: list[tuple[float, int, bytes]] = []
        self._seq = itertools.count()
        #: Counts every change of the queue (a retry added, re-queued or cleared): the
        #: reconciler compares it between rounds to tell watchers (`Reconciler.health_watch`).
        self.changes = 0

    def __len__(self) -> int:
        return len(self._items)

    def __bool__(self) -> bool:
        return bool(self._items)

    def __contains__(self, key: bytes) -> bool:
        return key in self._items

    def get(self, key: bytes) -> RetryItem | None:
        """Return the pending retry of ``key``, if any."""
        return self._items.get(key)

    def add(
        self, key: bytes, obj: Any, revision: int, delete: bool, error: str, now: float
    ) -> RetryItem:
        """Queue (or re-queue) a retry for ``key``, backing off further on each failure."""
        prev = self._items.get(key)
        attempts = prev.attempts + 1 if prev is not None else 1
        at = now + backoff_delay(attempts, self.minimum, self.maximum)
        item = RetryItem(key, obj, revision, delete, error, attempts, at, next(self._seq))
        self._items[key] = item
        self.changes += 1
        heapq.heappush(self._heap, (at, item.seq, key))
        self._compact()
        return item

    def clear(self, key: bytes) -> None:
        """Forget the retry of ``key`` (it succeeded or a newer change supersedes it)."""
        if self._items.pop(key, None) is not None:
            self.changes += 1

    def next_due(self) -> float | None:
        """Time of the earliest pending retry, or None."""
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
            yield self._items[key]

    def first(self, n: int) -> list[RetryItem]:
        """Up to ``n`` pending retries, in the order their keys first failed (O(n), for health)."""
        return list(itertools.islice(self._items.values(), n))

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
