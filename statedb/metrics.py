"""Per-table metrics of a DB: write-transaction lock wait and hold times, and table gauges."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from statedb.table import Table
    from statedb.txn import ReadTxn


@dataclass(slots=True)
class Timing:
    """Count, sum and maximum of a duration in seconds."""

    count: int = 0
    total_s: float = 0.0
    max_s: float = 0.0

    def observe(self, seconds: float) -> None:
        """Add one observation."""
        self.count += 1
        self.total_s += seconds
        if seconds > self.max_s:
            self.max_s = seconds


@dataclass(slots=True)
class TableMetrics:
    """Write-transaction figures of one table."""

    lock_wait: Timing = field(default_factory=Timing)
    txn_duration: Timing = field(default_factory=Timing)
    commits: int = 0
    aborts: int = 0


class DBMetrics:
    """Collects write-transaction timings per table; gauges are read from a snapshot."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.tables: dict[str, TableMetrics] = {}

    def record_write_txn(
        self, tables: list[Table[Any]], wait_s: float, held_s: float, outcome: str
    ) -> None:
        """Record one finished write transaction over ``tables``; called while the
        transaction still holds their locks, so no other writer updates the same figures
        meanwhile (readers take them as they are)."""
        committed = outcome == "committed"
        for t in tables:
            m = self.tables.get(t.name)
            if m is None:
                with self._lock:
                    m = self.tables.setdefault(t.name, TableMetrics())
            # Timing.observe, inlined: this runs at every commit.
            w = m.lock_wait
            w.count += 1
            w.total_s += wait_s
            if wait_s > w.max_s:
                w.max_s = wait_s
            d = m.txn_duration
            d.count += 1
            d.total_s += held_s
            if held_s > d.max_s:
                d.max_s = held_s
            if committed:
                m.commits += 1
            else:
                m.aborts += 1

    def snapshot(self, txn: ReadTxn) -> dict[str, dict[str, float]]:
        """Return every metric per table: objects, revision, graveyard size and the timings."""
        out: dict[str, dict[str, float]] = {}
        for name, st in txn.states.items():
            m = self.tables.get(name, TableMetrics())
            out[name] = {
                "objects": st.count,
                "revision": st.revision,
                "graveyard_objects": st.tombstones,
                "write_txn_lock_wait_seconds_total": m.lock_wait.total_s,
                "write_txn_lock_wait_seconds_max": m.lock_wait.max_s,
                "write_txn_duration_seconds_total": m.txn_duration.total_s,
                "write_txn_duration_seconds_max": m.txn_duration.max_s,
                "write_txns_committed": m.commits,
                "write_txns_aborted": m.aborts,
            }
        return out
