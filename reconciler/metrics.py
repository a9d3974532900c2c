"""Reconciler metrics: counters and durations of rounds, updates, deletes, prunes and errors.

`ReconcilerMetrics` is plain data (read it, or `snapshot()` it into a dict);
`PrometheusCollector` exposes any number of them through prometheus-client.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class Duration:
    """Count, sum and maximum of a duration in seconds."""

    count: int = 0
    total_s: float = 0.0
    max_s: float = 0.0

    def observe(self, seconds: float, n: int = 1) -> None:
        """Record ``n`` operations that together took ``seconds``."""
        self.count += n
        self.total_s += seconds
        if seconds > self.max_s:
            self.max_s = seconds


@dataclass(slots=True)
class ReconcilerMetrics:
    """Counters and durations of one reconciler (mutated only by its event-loop task)."""

    name: str = "reconciler"
    rounds: Duration = field(default_factory=Duration)
    updates: Duration = field(default_factory=Duration)
    deletes: Duration = field(default_factory=Duration)
    prunes: Duration = field(default_factory=Duration)
    update_errors_total: int = 0
    delete_errors_total: int = 0
    prune_errors_total: int = 0
    prune_current_errors: int = 0
    current_errors: int = 0
    #: Objects parked until a resource they failed for (ids, say) has a unit free.
    waiting: int = 0
    refreshes_total: int = 0

    @property
    def errors_total(self) -> int:
        """Every failed update and delete since start."""
        return self.update_errors_total + self.delete_errors_total

    def snapshot(self) -> dict[str, float]:
        """Every figure as a flat name -> number dict."""
        out: dict[str, float] = {}
        for label, d in (
            ("rounds", self.rounds),
            ("updates", self.updates),
            ("deletes", self.deletes),
            ("prunes", self.prunes),
        ):
            out[f"{label}_total"] = d.count
            out[f"{label}_duration_seconds_total"] = d.total_s
            out[f"{label}_duration_seconds_max"] = d.max_s
        out["update_errors_total"] = self.update_errors_total
        out["delete_errors_total"] = self.delete_errors_total
        out["errors_total"] = self.errors_total
        out["current_errors"] = self.current_errors
        out["waiting_objects"] = self.waiting
        out["prune_errors_total"] = self.prune_errors_total
        out["prune_current_errors"] = self.prune_current_errors
        out["refreshes_total"] = self.refreshes_total
        return out

    def samples(self, namespace: str = "statewright") -> list[tuple[str, dict[str, str], float]]:
        """The current values as ``(metric name, labels, value)`` samples, named like the
        reconciler metrics of Cilium's agent (``<namespace>_reconciler_count``,
        ``..._prune_count`` ...) so tooling and scripts written for those apply here.
        The label ``module_id`` is this reconciler's name; ``op`` names the operation."""
        p = f"{namespace}_reconciler"
        mod = {"module_id": self.name}
        return [
            (f"{p}_count", dict(mod), float(self.rounds.count)),
            (f"{p}_duration_seconds", {**mod, "op": "update"}, self.updates.total_s),
            (f"{p}_duration_seconds", {**mod, "op": "delete"}, self.deletes.total_s),
            (f"{p}_errors_total", dict(mod), float(self.errors_total)),
            (f"{p}_errors_current", dict(mod), float(self.current_errors)),
            (f"{p}_waiting_objects", dict(mod), float(self.waiting)),
            (f"{p}_prune_count", dict(mod), float(self.prunes.count)),
            (f"{p}_prune_errors_total", dict(mod), float(self.prune_errors_total)),
            (f"{p}_prune_duration_seconds", dict(mod), self.prunes.total_s),
        ]


class PrometheusCollector:
    """A prometheus-client collector over reconciler metrics, labelled by reconciler name.

    Register with ``prometheus_client.REGISTRY.register(PrometheusCollector([m1, m2]))``.
    """

    def __init__(self, metrics: Iterable[ReconcilerMetrics] = ()) -> None:
        self._lock = threading.Lock()
        self._metrics: list[ReconcilerMetrics] = list(metrics)

    def add(self, metrics: ReconcilerMetrics) -> None:
        """Expose one more reconciler."""
        with self._lock:
            self._metrics.append(metrics)

    def collect(self) -> Iterator[Any]:
        """Yield counter and gauge families (the prometheus-client collector protocol)."""
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        with self._lock:
            ms = list(self._metrics)
        ops = CounterMetricFamily(
            "statewright_reconciler_operations", "Operations attempted", labels=["name", "op"]
        )
        op_secs = CounterMetricFamily(
            "statewright_reconciler_operation_duration_seconds",
            "Time spent in operations", labels=["name", "op"],
        )
        errs = CounterMetricFamily(
            "statewright_reconciler_errors", "Failed operations", labels=["name", "op"]
        )
        current = GaugeMetricFamily(
            "statewright_reconciler_current_errors",
            "Objects waiting for a retry plus a failed last prune", labels=["name"],
        )
        waiting = GaugeMetricFamily(
            "statewright_reconciler_waiting_objects",
            "Objects parked until a resource they need (ids) has a unit free", labels=["name"],
        )
        for m in ms:
            for op, d, e in (
                ("round", m.rounds, 0),
                ("update", m.updates, m.update_errors_total),
                ("delete", m.deletes, m.delete_errors_total),
                ("prune", m.prunes, m.prune_errors_total),
            ):
                ops.add_metric([m.name, op], d.count)
                op_secs.add_metric([m.name, op], d.total_s)
                errs.add_metric([m.name, op], e)
            current.add_metric([m.name], m.current_errors + m.prune_current_errors)
            waiting.add_metric([m.name], m.waiting)
        yield ops
        yield op_secs
        yield errs
        yield current
        yield waiting
