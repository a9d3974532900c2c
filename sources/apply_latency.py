"""How long changes wait between arriving from the API server and being committed to the
tables: a fixed-size histogram, so it costs the same however long the agent runs.

`K8sSource` adds one sample per delivery it commits (the time from the reflector handing
the delivery over to the batch's commit, weighted by the delivery's changes). Buckets are
0.5 ms wide up to 100 ms and 10 ms wide up to 10 s (one open bucket above); quantiles
answer a bucket's upper bound.
"""

from __future__ import annotations

from typing import Any

FINE_MS = 0.5
FINE_UNTIL_MS = 100.0
COARSE_MS = 10.0
COARSE_UNTIL_MS = 10_000.0
_FINE = int(FINE_UNTIL_MS / FINE_MS)
_COARSE = int((COARSE_UNTIL_MS - FINE_UNTIL_MS) / COARSE_MS)


def bucket_of(ms: float) -> int:
    """The index of the bucket holding ``ms``."""
    if ms < FINE_UNTIL_MS:
        return max(0, int(ms / FINE_MS))
    if ms < COARSE_UNTIL_MS:
        return _FINE + int((ms - FINE_UNTIL_MS) / COARSE_MS)
    return _FINE + _COARSE


def upper_ms(index: int) -> float:
    """The upper bound of bucket ``index`` (the open bucket: its lower bound)."""
    if index < _FINE:
        return (index + 1) * FINE_MS
    if index < _FINE + _COARSE:
        return FINE_UNTIL_MS + (index - _FINE + 1) * COARSE_MS
    return COARSE_UNTIL_MS


class LatencyHistogram:
    """Counts of latencies (ms) in fixed buckets (module docstring)."""

    __slots__ = ("counts", "max_ms", "total")

    def __init__(self) -> None:
        self.counts = [0] * (_FINE + _COARSE + 1)
        self.total = 0
        self.max_ms = 0.0

    def add(self, ms: float, n: int = 1) -> None:
        """Count ``n`` changes that waited ``ms``."""
        self.counts[bucket_of(ms)] += n
        self.total += n
        if ms > self.max_ms:
            self.max_ms = ms

    def quantile(self, q: float) -> float:
        """The upper bound of the bucket holding quantile ``q`` (0 when empty)."""
        return quantile_of(self.counts, q)

    def to_json(self) -> dict[str, Any]:
        """Total, maximum, p50/p99 and the non-empty buckets (``index: count``; the
        difference of two readings is the histogram of what happened between them)."""
        return {
            "total": self.total,
            "max_ms": round(self.max_ms, 2),
            "p50_ms": self.quantile(0.5),
            "p99_ms": self.quantile(0.99),
            "buckets": {str(i): c for i, c in enumerate(self.counts) if c},
        }


def quantile_of(counts: list[int], q: float) -> float:
    """Quantile ``q`` of bucket ``counts`` laid out as `LatencyHistogram` lays them out."""
    total = sum(counts)
    if total == 0:
        return 0.0
    rank = q * total
    seen = 0
    for i, c in enumerate(counts):
        seen += c
        if seen >= rank:
            return upper_ms(i)
    return upper_ms(len(counts) - 1)
