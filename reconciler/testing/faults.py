"""A fault-injecting wrapper for any `Operations`: failures per operation, partial batch
failures, whole-batch failures and latency, all drawn from one seeded random generator.

The reconciler promises that nothing a target does stops it from converging once the target
works again. `FaultyOps` lets a test make a real target misbehave in every way the
reconciler must survive, without changing the target: a failure may strike *before* the
change reaches the target or *after* it was applied (the reconciler then retries a change
that already happened, which targets must tolerate: operations are idempotent).
"""

from __future__ import annotations

import inspect
import random
import threading
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import anyio

from reconciler.operations import BatchEntry, Operations
from statedb import ReadTxn, StatewrightError, Table

O = TypeVar("O")


class InjectedFault(StatewrightError):
    """A failure `FaultyOps` made up; its message says which operation and when."""


@dataclass(frozen=True, slots=True)
class FaultPlan:
    """What fails and how often; rates are probabilities in [0, 1] per call (or per batch entry).

    ``update`` / ``delete`` / ``prune``: chance that a call of that operation fails; inside
    a batch, each entry fails on its own with the update/delete rate (a partial batch
    failure). ``batch``: chance that a whole batch call raises before applying anything.
    ``after_apply``: the share of update/delete/prune failures that strike after the inner
    target applied the change (the rest strike before). ``latency``: (min, max) seconds of
    real time every call waits first; a non-zero latency makes the wrapper's methods
    asynchronous.
    """

    update: float = 0.0
    delete: float = 0.0
    prune: float = 0.0
    batch: float = 0.0
    after_apply: float = 0.5
    latency: tuple[float, float] = (0.0, 0.0)

    @classmethod
    def uniform(cls, rate: float, **changes: Any) -> FaultPlan:
        """The same failure rate for update, delete, prune and whole batches."""
        return cls(update=rate, delete=rate, prune=rate, batch=rate, **changes)

    def __post_init__(self) -> None:
        for name in ("update", "delete", "prune", "batch", "after_apply"):
            rate = getattr(self, name)
            if not 0.0 <= rate <= 1.0:
                raise ValueError(f"FaultPlan.{name} must be within [0, 1], got {rate}")
        low, high = self.latency
        if not 0.0 <= low <= high:
            raise ValueError(f"FaultPlan.latency must be (min, max) with 0 <= min <= max, got "
                             f"{self.latency}")


class FaultyOps(Generic[O]):
    """Wraps ``inner`` (any `Operations`, optionally also `BatchOperations`) and injects the
    failures of ``plan``. Deterministic for a given ``seed`` and sequence of calls.

    It offers ``update_batch`` / ``delete_batch`` whatever ``inner`` offers: when ``inner``
    has no batch form, the entries are applied one by one with ``update`` / ``delete``. Give
    it to a `Config` as ``operations`` and, to test the batch path, as ``batch_operations``.

    ``enabled`` switches injection off and on (e.g. off to let the reconciler converge).
    ``table``, when given, makes `prune` record a prune of an uninitialized table (which the
    reconciler must never do) in ``pruned_uninitialized``. ``calls`` counts the calls per
    operation, ``injected`` the failures made up per operation (a batch entry counts under
    ``update`` / ``delete``, the batch call itself under ``update_batch`` / ``delete_batch``),
    ``prunes_ok`` the prunes that succeeded. Safe to use from several threads.
    """

    def __init__(
        self,
        inner: Operations[O],
        plan: FaultPlan | None = None,
        *,
        seed: int = 0,
        table: Table[O] | None = None,
    ) -> None:
        self.inner = inner
        self.plan = plan if plan is not None else FaultPlan()
        self.enabled = True
        self.table = table
        self.calls: Counter[str] = Counter()
        self.injected: Counter[str] = Counter()
        self.prunes_ok = 0
        self.pruned_uninitialized = 0
        self._rng = random.Random(seed)
        self._lock = threading.Lock()

    # ----- decisions -------------------------------------------------------------------
    def _roll(self, rate: float) -> bool:
        """One draw: True with probability ``rate`` while injection is enabled."""
        with self._lock:
            return self.enabled and rate > 0.0 and self._rng.random() < rate

    def _fault(self, op: str, rate: float) -> tuple[bool, bool]:
        """Count a call of ``op`` and decide (fail before applying, fail after applying)."""
        with self._lock:
            self.calls[op] += 1
            if not (self.enabled and rate > 0.0 and self._rng.random() < rate):
                return False, False
            self.injected[op] += 1
            after = self._rng.random() < self.plan.after_apply
            return not after, after

    def _delay(self) -> float:
        low, high = self.plan.latency
        if high <= 0.0:
            return 0.0
        with self._lock:
            return self._rng.uniform(low, high)

    def _call(
        self,
        op: str,
        rate: float,
        call: Callable[[], Awaitable[None] | None],
        on_success: Callable[[], None] | None = None,
    ) -> Awaitable[None] | None:
        """Run ``call`` under the injected faults; sync when ``call`` is and no latency."""
        before, after = self._fault(op, rate)
        delay = self._delay()
        if delay > 0.0:
            return self._delayed(delay, op, before, after, call, on_success)
        if before:
            raise InjectedFault(f"{op}: injected failure before applying")
        result = call()
        if result is not None and inspect.isawaitable(result):
            return self._finish(result, op, after, on_success)
        if after:
            raise InjectedFault(f"{op}: injected failure after applying")
        if on_success is not None:
            on_success()
        return None

    async def _delayed(
        self,
        delay: float,
        op: str,
        before: bool,
        after: bool,
        call: Callable[[], Awaitable[None] | None],
        on_success: Callable[[], None] | None,
    ) -> None:
        await anyio.sleep(delay)
        if before:
            raise InjectedFault(f"{op}: injected failure before applying")
        result = call()
        await self._finish(result, op, after, on_success)

    @staticmethod
    async def _finish(
        result: Awaitable[None] | None,
        op: str,
        after: bool,
        on_success: Callable[[], None] | None,
    ) -> None:
        if result is not None and inspect.isawaitable(result):
            await result
        if after:
            raise InjectedFault(f"{op}: injected failure after applying")
        if on_success is not None:
            on_success()

    # ----- Operations ------------------------------------------------------------------
    def update(self, txn: ReadTxn, revision: int, obj: O) -> Awaitable[None] | None:
        """``inner.update``, failing with the plan's update rate."""
        return self._call(
            "update", self.plan.update,
            lambda: self.inner.update(txn, revision, obj),
        )

    def delete(self, txn: ReadTxn, revision: int, obj: O) -> Awaitable[None] | None:
        """``inner.delete``, failing with the plan's delete rate."""
        return self._call(
            "delete", self.plan.delete,
            lambda: self.inner.delete(txn, revision, obj),
        )

    def prune(self, txn: ReadTxn, objects: Iterator[O]) -> Awaitable[None] | None:
        """``inner.prune``, failing with the plan's prune rate; notes a premature prune."""
        if self.table is not None and not self.table.initialized(txn)[0]:
            with self._lock:
                self.pruned_uninitialized += 1

        def succeeded() -> None:
            with self._lock:
                self.prunes_ok += 1

        return self._call(
            "prune", self.plan.prune, lambda: self.inner.prune(txn, objects), succeeded
        )

    # ----- BatchOperations -------------------------------------------------------------
    def update_batch(self, txn: ReadTxn, batch: list[BatchEntry[O]]) -> Awaitable[None] | None:
        """The batch form of `update`: a whole batch may fail, and each entry on its own."""
        return self._batch("update", txn, batch)

    def delete_batch(self, txn: ReadTxn, batch: list[BatchEntry[O]]) -> Awaitable[None] | None:
        """The batch form of `delete`: a whole batch may fail, and each entry on its own."""
        return self._batch("delete", txn, batch)

    def _batch(
        self, op: str, txn: ReadTxn, batch: list[BatchEntry[O]]
    ) -> Awaitable[None] | None:
        rate = self.plan.update if op == "update" else self.plan.delete
        with self._lock:
            self.calls[f"{op}_batch"] += 1
        if self._roll(self.plan.batch):
            with self._lock:
                self.injected[f"{op}_batch"] += 1
            raise InjectedFault(f"{op}_batch of {len(batch)}: injected failure of the batch")
        # Entries failing before applying are kept from the inner target; those failing
        # after are applied, then marked failed.
        fail_before: list[BatchEntry[O]] = []
        fail_after: list[BatchEntry[O]] = []
        passed: list[BatchEntry[O]] = []
        for entry in batch:
            before, after = self._fault(op, rate)
            if before:
                fail_before.append(entry)
                continue
            if after:
                fail_after.append(entry)
            passed.append(entry)
        inner_batch = getattr(self.inner, f"{op}_batch", None)
        delay = self._delay()

        def mark() -> None:
            for entry in fail_before:
                entry.result = InjectedFault(f"{op}: injected failure before applying")
            for entry in fail_after:
                if entry.result is None:
                    entry.result = InjectedFault(f"{op}: injected failure after applying")

        def apply() -> Awaitable[None] | None:
            if inner_batch is not None:
                return inner_batch(txn, passed) if passed else None
            return self._one_by_one(op, txn, passed)

        if delay > 0.0:
            return self._batch_async(delay, apply, mark)
        result = apply()
        if result is not None and inspect.isawaitable(result):
            return self._batch_async(0.0, lambda: result, mark)
        mark()
        return None

    @staticmethod
    async def _batch_async(
        delay: float, apply: Callable[[], Awaitable[None] | None], mark: Callable[[], None]
    ) -> None:
        if delay > 0.0:
            await anyio.sleep(delay)
        result = apply()
        if result is not None and inspect.isawaitable(result):
            await result
        mark()

    def _one_by_one(
        self, op: str, txn: ReadTxn, entries: list[BatchEntry[O]]
    ) -> Awaitable[None] | None:
        """Apply entries with the inner per-object operation, each with its own result."""
        method = self.inner.update if op == "update" else self.inner.delete
        pending: list[tuple[BatchEntry[O], Awaitable[None]]] = []
        for entry in entries:
            try:
                result = method(txn, entry.revision, entry.obj)
            except Exception as exc:
                entry.result = exc
                continue
            if result is not None and inspect.isawaitable(result):
                pending.append((entry, result))
        if not pending:
            return None

        async def settle_all() -> None:
            for entry, awaitable in pending:
                try:
                    await awaitable
                except Exception as exc:
                    entry.result = exc

        return settle_all()
