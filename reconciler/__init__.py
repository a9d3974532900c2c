"""reconciler: drives a statedb table into any target through an Operations object.

A table says what should be; a `Reconciler` makes a target (BPF maps, files,
routes, anything) match it and keeps it matching: incremental rounds from the
table's change stream, per-object retries with exponential backoff, pruning
(never before the table is initialized; periodically with ``prune_interval``,
and on request), optional refreshes, health, metrics and progress. See
docs/reconciler.md; `reconciler.testing` is a kit for testing targets and
controllers (fault injection, an in-memory target, convergence waits, a
hypothesis state machine). `status_index` indexes a table's rows by status kind
(query and watch the Pending or Error rows); `Reconciler.health_watch` closes when
health or the retry queue changes. A target that runs out of a bounded resource raises
`ResourceExhaustedError`: the object is parked until the resource has a unit free
(reconciler/waiting.py), at no cost per round meanwhile.
"""

from reconciler.clock import Clock, FakeClock, SystemClock
from reconciler.config import Config, RateLimit
from reconciler.health import Health, Level
from reconciler.metrics import Duration, PrometheusCollector, ReconcilerMetrics
from reconciler.operations import BatchEntry, BatchOperations, Operations
from reconciler.reconciler import Reconciler
from reconciler.retries import RetryItem, RetryQueue, backoff_delay
from reconciler.status import (
    Status,
    StatusKind,
    StatusSet,
    status_done,
    status_error,
    status_field_accessors,
    status_pending,
    status_refreshing,
    status_set_accessors,
)
from reconciler.status_index import (
    UnknownStatusKindError,
    rows_with_status,
    status_index,
    wait_for_status,
)
from reconciler.waiting import Resource, ResourceExhaustedError, exhausted_resource

__all__ = [
    "BatchEntry",
    "BatchOperations",
    "Clock",
    "Config",
    "Duration",
    "FakeClock",
    "Health",
    "Level",
    "Operations",
    "PrometheusCollector",
    "RateLimit",
    "Reconciler",
    "ReconcilerMetrics",
    "Resource",
    "ResourceExhaustedError",
    "RetryItem",
    "RetryQueue",
    "Status",
    "StatusKind",
    "StatusSet",
    "SystemClock",
    "UnknownStatusKindError",
    "backoff_delay",
    "exhausted_resource",
    "rows_with_status",
    "status_done",
    "status_error",
    "status_field_accessors",
    "status_index",
    "status_pending",
    "status_refreshing",
    "status_set_accessors",
    "wait_for_status",
]
