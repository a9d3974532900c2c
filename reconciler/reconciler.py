"""The Reconciler: an anyio task that keeps a target matching a table, whatever fails on the way.

Run it in a task group (``await tg.start(reconciler.run)``); cancelling the group
stops it cleanly. Each loop iteration waits for a table change, a due retry, a
prune trigger or the table's initialization, then runs one bounded incremental
round, prunes when due, and publishes health, metrics and progress.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from typing import TYPE_CHECKING, Generic, TypeVar, overload

import anyio
import anyio.abc

from reconciler.config import Config
from reconciler.health import (
    Health,
    health_degraded,
    health_ok,
    health_stopped,
    waiting_text,
)
from reconciler.incremental import Incremental, error_text
from reconciler.metrics import ReconcilerMetrics
from reconciler.prune import Pruner
from reconciler.ratelimit import RateLimiter
from reconciler.refresh import Refresher
from reconciler.retries import RetryQueue, backoff_delay
from reconciler.status import StatusKind
from statedb import DB, ReadTxn, TableNotRegisteredError, Watch, closed_watch

O = TypeVar("O")

_DONE = StatusKind.DONE

log = logging.getLogger(__name__)


class Reconciler(Generic[O]):
    """Reconciles ``config.table`` into ``config.operations``' target; see `run`."""

    if TYPE_CHECKING:
        # Two overloads, for type checking only: with a plain signature mypy infers a
        # nested ``Config(table, ops)`` from this parameter's type and, when the table's
        # rows and the Operations' rows disagree, silently takes Config[Any]; an overloaded
        # constructor has the Config inferred on its own, so the mismatch is reported.
        @overload
        def __init__(self, db: DB, config: Config[O], /) -> None: ...

        @overload
        def __init__(self, db: DB, *, config: Config[O]) -> None: ...

    def __init__(self, db: DB, config: Config[O]) -> None:
        config.validate()
        if config.table.db is not db:
            raise TableNotRegisteredError(config.table.name)
        self.db = db
        self.config = config
        self.metrics = config.metrics if config.metrics is not None else ReconcilerMetrics(
            name=config.name
        )
        self.retries = RetryQueue(config.retry_min_backoff, config.retry_max_backoff)
        self._incremental = Incremental(db, config, self.retries, self.metrics)
        self._pruner = Pruner(config, self.metrics)
        self._health = health_stopped(config.name)
        self._round_error: str | None = None
        self._lock = threading.Lock()
        self._trigger = Watch()
        self._progress = Watch()
        # Closed and replaced when health or the retry queue changed (see health_watch);
        # _health_seen is the retry queue's change count it was published at.
        self._health_watch = Watch()
        self._health_seen = self.retries.changes
        # The object count of the OK health last published (-1: none yet).
        self._ok_objects = -1
        self._running = False
        self._task_group: anyio.abc.TaskGroup | None = None

    # ----- public API ------------------------------------------------------------
    @property
    def name(self) -> str:
        """The reconciler's name (metrics, health, status sets)."""
        return self.config.name

    @property
    def health(self) -> Health:
        """The latest health report."""
        return self._health

    def health_watch(self) -> Watch:
        """A watch that closes at the next change of `health` or of the retry queue
        (`retries`: a retry added, re-queued after another failure, or cleared); each change
        closes the current watch and puts a new one in its place.

        Take the watch first, then read the state, so no change falls in between::

            while True:
                watch = rec.health_watch()
                print(rec.health, len(rec.retries))
                await watch.wait_async()

        It may be waited on from any anyio task (asyncio or trio) or thread
        (``watch.wait()``), and it also closes when the reconciler stops."""
        return self._health_watch

    @property
    def reconciled_revision(self) -> int:
        """Table revision up to which every change has been attempted (-1 before the first)."""
        return self._incremental.attempted_revision

    def prune(self) -> Watch:
        """Request a prune at the next round (deferred until the table is initialized).

        Returns a watch that closes once a prune that began after this request has run
        (successfully or not: a failure is in `health`), e.g.
        ``await rec.prune().wait_async()``; `wait_until_done` waits for it too. Safe to
        call from any thread.
        """
        watch = self._pruner.request()
        self._wake()
        return watch

    def _wake(self) -> None:
        """Have the loop run a round now (it may be asleep on its watches)."""
        with self._lock:
            trigger = self._trigger
        trigger.close()

    async def wait_until_reconciled(
        self, revision: int | None = None, timeout: float | None = None
    ) -> int:
        """Wait until every change of the table up to ``revision`` (default: the table's
        revision now) has been attempted; return how many objects are still waiting for a
        retry. Raises TimeoutError after ``timeout``."""
        if revision is None:
            revision = self.config.table.revision(self.db.read_txn())
        cm = anyio.fail_after(timeout) if timeout is not None else contextlib.nullcontext()
        with cm:
            while self._incremental.attempted_revision < revision:
                watch = self._progress
                if self._incremental.attempted_revision >= revision:
                    break
                await watch.wait_async()
        return len(self.retries)

    @property
    def held(self) -> int:
        """How many rows are held until the table is initialized (see
        `Config.hold_until_initialized`)."""
        return len(self._incremental.held)

    @property
    def skipped_settled_writes(self) -> int:
        """Changed rows skipped because a writer left them Done or Error (see
        `Config.reconcile_every_change`)."""
        return self._incremental.skipped_settled_writes

    def problems(self, limit: int = 5) -> list[str]:
        """Why the target has not converged: [] when every change of the table was
        attempted, every row's status is Done, no retry (update or delete) is pending, no
        requested prune is outstanding and health is OK; otherwise one line per reason (at
        most ``limit`` rows named, keys rendered as in health messages)."""
        cfg = self.config
        table = cfg.table
        txn = self.db.read_txn()
        out: list[str] = []
        revision = table.revision(txn)
        if self._incremental.attempted_revision < revision:
            out.append(
                f"changes up to revision {revision} not attempted yet "
                f"(attempted up to {self._incremental.attempted_revision})"
            )
        held = self._incremental.held
        if held:
            out.append(
                f"{len(held)} row(s) held until the table is initialized"
                if not self._incremental.table_initialized
                else f"{len(held)} held row(s) not handed to the target yet"
            )
        not_done = [o for o in table.all(txn) if cfg.get_object_status(o).kind is not _DONE]
        if not_done:
            shown = ", ".join(
                f"{self._incremental.key_text(o)}: {cfg.get_object_status(o)}"
                for o in not_done[:limit]
            )
            out.append(f"{len(not_done)} row(s) not Done ({shown})")
        parked = self.retries.parked
        if len(self.retries) > parked:
            out.append(f"{len(self.retries) - parked} retry(ies) pending")
        if parked:
            out.append(f"{parked} object(s) waiting for a free resource")
        if self._pruner.request_outstanding:
            out.append("a requested prune has not run yet")
        if not self._health.ok:
            out.append(f"health: {self._health}")
        return out

    async def wait_until_done(self, timeout: float | None = None) -> None:
        """Wait until the target has converged (`problems` finds none): every row Done, no
        retry pending, including deletes that failed and have no row any more. Woken by
        each round, never by polling. Raises TimeoutError naming what is left after
        ``timeout`` seconds."""
        try:
            with anyio.fail_after(timeout) if timeout is not None else contextlib.nullcontext():
                while True:
                    watch = self._progress
                    if not self.problems():
                        return
                    await watch.wait_async()
        except TimeoutError:
            raise TimeoutError(
                f"reconciler {self.name!r} not done after {timeout} s: "
                + "; ".join(self.problems())
            ) from None

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Reconcile until cancelled; signals ``task_status`` once changes are being tracked."""
        if self._running:
            raise RuntimeError(f"reconciler {self.name!r} is already running")
        self._running = True
        try:
            await self._incremental.open()
            async with anyio.create_task_group() as tg:
                self._task_group = tg
                if self.config.refresh_interval is not None:
                    tg.start_soon(Refresher(self.db, self.config, self.metrics).run)
                task_status.started()
                await self._loop()
        finally:
            self._task_group = None
            self._incremental.close()
            self._set_health(health_stopped(self.name))
            self._running = False

    # ----- the loop --------------------------------------------------------------------
    async def _loop(self) -> None:
        cfg = self.config
        clock = cfg.clock
        table = cfg.table
        limiter = (
            RateLimiter(cfg.rate_limit.rate, cfg.rate_limit.burst, clock)
            if cfg.rate_limit is not None
            else None
        )
        # No ReadTxn may stay referenced while the loop sleeps: a transaction holds the
        # snapshot of every table, and a held snapshot keeps every row version written
        # since (no trim, no log compaction) for as long as this table stays quiet.
        initialized, init_watch = table.initialized(self.db.read_txn())
        if initialized:
            self._on_initialized()
        table_watch = closed_watch()  # the first round reads every row
        failed_rounds = 0
        while True:
            if limiter is not None:
                await limiter.wait()
            # Parked objects whose resource a round freed are retried in the next round.
            if not self._incremental.backlog and not self.retries.wakeable():
                watches = [table_watch, self._trigger]
                if not initialized:
                    watches.append(init_watch)
                await clock.sleep(self._next_wake(), watches)
            with self._lock:
                if self._trigger.closed:
                    self._trigger = Watch()
            txn = self.db.read_txn()
            if not initialized:
                initialized, init_watch = table.initialized(txn)
                if initialized:
                    self._on_initialized()
            try:
                watch = await self._round(txn)
            except Exception as exc:  # a bug in user callbacks must not kill the loop
                failed_rounds += 1
                self._round_error = f"round of {table.name} failed: {error_text(exc)}"
                log.exception("reconciler %s: %s", self.name, self._round_error)
                await self._incremental.resync()
                table_watch = closed_watch()
                self._publish(txn)
                del txn
                await clock.sleep(
                    backoff_delay(failed_rounds, cfg.retry_min_backoff, cfg.retry_max_backoff)
                )
                continue
            failed_rounds = 0
            self._round_error = None
            if watch is not None:
                table_watch = watch
            self._publish(txn)
            del txn
            await anyio.lowlevel.checkpoint()

    def _on_initialized(self) -> None:
        """The table is initialized: held rows go to the target from the next round on,
        and pruning may begin."""
        self._incremental.table_initialized = True
        self._pruner.on_initialized(self.config.clock.now())

    def _next_wake(self) -> float | None:
        now = self.config.clock.now()
        times = [t for t in (self.retries.next_due(), self._pruner.wake_at()) if t is not None]
        if not times:
            return None
        return max(0.0, min(times) - now)

    async def _round(self, txn: ReadTxn) -> Watch | None:
        start = time.perf_counter()
        watch = await self._incremental.run_round(txn)
        if self._pruner.due(self.config.clock.now(), self._incremental.caught_up):
            tg = self._task_group
            if self.config.prune_beside_rounds and tg is not None:
                self._pruner.start_beside(txn, tg.start_soon, self._wake)
            else:
                await self._pruner.run(txn)
        self.metrics.rounds.observe(time.perf_counter() - start)
        return watch

    def _publish(self, txn: ReadTxn) -> None:
        shown = self.config.health_max_messages
        others = [e for e in (self._round_error, self._pruner.error) if e is not None]
        self._incremental.update_error_metrics()
        waiting = [
            waiting_text(resource, n, [self._incremental.key_text(i.obj) for i in first])
            for resource, n, first in self.retries.parked_by_resource(3)
        ]
        failing = len(self.retries) - self.metrics.waiting
        count = failing + len(others)
        if count or waiting:
            first = others + [item.error for item in self.retries.first(shown)]
            self._set_health(
                health_degraded(
                    self.name, count, first[:shown], waiting, self.metrics.waiting
                )
            )
        else:
            objects = self.config.table.count(txn)
            if objects != self._ok_objects or not self._health.ok:
                # Built only when it differs from the published one (most rounds of a
                # churn change rows, not their number).
                self._set_health(health_ok(self.name, objects))
                self._ok_objects = objects
            elif self.retries.changes != self._health_seen:
                self._set_health(self._health)
        old, self._progress = self._progress, Watch()
        old.close()

    def _set_health(self, health: Health) -> None:
        """Publish ``health``; close the health watch when it or the retry queue changed."""
        changes = self.retries.changes
        if health == self._health and changes == self._health_seen:
            return
        self._health = health
        self._health_seen = changes
        old, self._health_watch = self._health_watch, Watch()
        old.close()
