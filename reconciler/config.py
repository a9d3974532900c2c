"""Configuration of one reconciler: which table, which target, how to read and write row status,
and the tuning knobs (round size, pacing, backoff, prune and refresh intervals)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from reconciler.clock import Clock, SystemClock
from reconciler.metrics import ReconcilerMetrics
from reconciler.operations import BatchOperations, Operations
from reconciler.status import Status
from statedb import Table

O = TypeVar("O")


@dataclass(frozen=True, slots=True)
class RateLimit:
    """Pace of reconciliation rounds: ``rate`` rounds per second, bursts of ``burst``."""

    rate: float = 1000.0
    burst: int = 10


@dataclass(frozen=True, slots=True)
class Config(Generic[O]):
    """Everything a `Reconciler` needs; `validate` explains what is wrong with a bad config.

    ``set_object_status`` must return a NEW row equal to the given one but with the
    status replaced (rows are immutable). Intervals are seconds; ``None`` disables
    periodic pruning / refreshing.
    """

    table: Table[O]
    operations: Operations[O]
    get_object_status: Callable[[O], Status]
    set_object_status: Callable[[O, Status], O]
    name: str = "reconciler"
    batch_operations: BatchOperations[O] | None = None
    incremental_round_size: int = 1000
    #: Objects handed to the target at a time within a round (one `BatchOperations` call,
    #: or that many `Operations` calls); the round yields to the event loop between two
    #: such chunks, so a large round does not hold the loop for its whole length.
    target_chunk_size: int = 16
    #: When above ``target_chunk_size``, the chunks of a round with `BatchOperations` grow
    #: while they are cheap, up to this many objects: a chunk that took at most half of
    #: ``target_chunk_budget`` seconds (by ``clock``) doubles the next one, one that took
    #: longer than the budget halves it, never below ``target_chunk_size``; each round
    #: starts at ``target_chunk_size``. For a target whose cost per object varies (the LB
    #: maps: a new frontend of the initial sync against a churned one): fewer, larger calls
    #: where objects are cheap, the same bound on a loop turn where they are not. None:
    #: every chunk is ``target_chunk_size``.
    target_chunk_max: int | None = None
    target_chunk_budget: float = 0.005
    rate_limit: RateLimit | None = field(default_factory=RateLimit)
    retry_min_backoff: float = 0.01
    retry_max_backoff: float = 30.0
    prune_interval: float | None = None
    #: Run the awaitable part of ``Operations.prune`` in a task of its own while the rounds
    #: go on, instead of in the round (which then waits for it): for a prune that takes
    #: long enough to hold changes back. The operations must then tolerate updates and
    #: deletes between the prune's awaits.
    prune_beside_rounds: bool = False
    refresh_interval: float | None = None
    refresh_batch_size: int = 100
    health_max_messages: int = 3
    metrics: ReconcilerMetrics | None = None
    clock: Clock = field(default_factory=SystemClock)
    #: Writers are expected to give every changed row a Pending status
    #: (``replace(row, ..., status=status_pending())``). With False (the default) a
    #: changed row that still carries Done or Error is skipped, and the reconciler logs a
    #: warning the first time it sees one (``Reconciler.skipped_settled_writes`` counts
    #: them). With True every write that reaches the reconciler is reconciled whatever its
    #: status says: the safe choice when writers may forget (the reconciler's own status
    #: writes never reach it).
    reconcile_every_change: bool = False
    #: While the table is not initialized, a changed row for which this returns True is
    #: *held*: not handed to the target and left Pending. Once the table is initialized
    #: the rows still held are handed over in the next rounds, unless a newer version or
    #: a deletion of the key came meanwhile (the change stream hands that over instead).
    #: For a target that still holds a previous run's state: e.g. the LB maps keep a
    #: restored frontend's old backends serving, rather than a frontend whose backends
    #: are not loaded yet. None: nothing is held.
    hold_until_initialized: Callable[[O], bool] | None = None

    def validate(self) -> None:
        """Raise ValueError naming the reconciler and the offending setting."""
        problems: list[str] = []
        if self.incremental_round_size <= 0:
            problems.append(
                f"incremental_round_size must be > 0, got {self.incremental_round_size}"
            )
        if self.target_chunk_size <= 0:
            problems.append(f"target_chunk_size must be > 0, got {self.target_chunk_size}")
        if self.target_chunk_max is not None and self.target_chunk_max < self.target_chunk_size:
            problems.append(
                f"target_chunk_max ({self.target_chunk_max}) must be >= target_chunk_size "
                f"({self.target_chunk_size}) or None"
            )
        if self.target_chunk_budget <= 0:
            problems.append(f"target_chunk_budget must be > 0, got {self.target_chunk_budget}")
        if self.retry_min_backoff <= 0:
            problems.append(f"retry_min_backoff must be > 0, got {self.retry_min_backoff}")
        if self.retry_max_backoff < self.retry_min_backoff:
            problems.append(
                f"retry_max_backoff ({self.retry_max_backoff}) must be >= retry_min_backoff "
                f"({self.retry_min_backoff})"
            )
        if self.prune_interval is not None and self.prune_interval <= 0:
            problems.append(f"prune_interval must be > 0 or None, got {self.prune_interval}")
        if self.refresh_interval is not None and self.refresh_interval <= 0:
            problems.append(f"refresh_interval must be > 0 or None, got {self.refresh_interval}")
        if self.refresh_batch_size <= 0:
            problems.append(f"refresh_batch_size must be > 0, got {self.refresh_batch_size}")
        for attr in ("update", "delete", "prune"):
            if not callable(getattr(self.operations, attr, None)):
                problems.append(f"operations has no callable {attr}()")
        if self.batch_operations is not None:
            for attr in ("update_batch", "delete_batch"):
                if not callable(getattr(self.batch_operations, attr, None)):
                    problems.append(f"batch_operations has no callable {attr}()")
        if problems:
            raise ValueError(
                f"reconciler {self.name!r} of table {self.table.name!r}: " + "; ".join(problems)
            )

    def with_changes(self, **changes: Any) -> Config[O]:
        """Return a copy with some settings replaced."""
        import dataclasses

        return dataclasses.replace(self, **changes)
