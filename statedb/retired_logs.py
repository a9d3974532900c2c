"""Logs replaced by compaction, freed a slice per commit (`RetiredLogs`).

A compaction publishes a new log; the old one (twice the table's rows: the live rows'
records, which the new log shares, and the gaps and deletions it left out) stays alive as
long as some snapshot of the states before the compaction does. When the last reference
went, CPython freed the whole list at once, in C, holding the interpreter lock: for
100,000 backends about 20-55 ms on the event loop every 50 s (benchmarks/soak.py), at
whatever write happened to drop it (usually the next transaction's trim).

The table keeps every replaced log here instead, and each commit frees the records of the
ones nobody else references any more, `FREE_CHUNK` at a time, from the end. A log some
reader still holds is left whole until the reader lets go: mutating a list is only safe
while no one else can see it, which the reference count tells exactly (CPython).
"""

from __future__ import annotations

import sys
from typing import Any

#: Log records a commit frees at most from the retired logs (about 0.5 ms).
FREE_CHUNK = 4096

# References to a retired log when only `RetiredLogs` holds it: its slot in ``logs`` and
# the argument of ``sys.getrefcount`` itself.
_ONLY_OURS = 2


class RetiredLogs:
    """The logs of one table that compaction replaced and that are not freed yet.

    Writer-owned: `retire` and `free_some` run under the table lock (at commit).
    `pending` may be read by anyone.
    """

    __slots__ = ("logs",)

    def __init__(self) -> None:
        self.logs: list[list[Any]] = []

    def retire(self, log: list[Any]) -> None:
        """Take over ``log``, which a compaction just replaced."""
        self.logs.append(log)

    def free_some(self, budget: int | None = None) -> int:
        """Free up to ``budget`` (default `FREE_CHUNK`) records of the retired logs no one
        else references; return how many were released."""
        if budget is None:
            budget = FREE_CHUNK
        logs = self.logs
        freed = 0
        i = 0
        while i < len(logs) and freed < budget:
            if sys.getrefcount(logs[i]) > _ONLY_OURS:
                i += 1  # a snapshot still reads it
                continue
            log = logs[i]
            k = min(budget - freed, len(log))
            del log[len(log) - k :]
            freed += k
            if not log:
                del logs[i]
        return freed

    def pending(self) -> int:
        """Records still held by the retired logs (freed or not yet freeable)."""
        return sum(len(log) for log in list(self.logs))
