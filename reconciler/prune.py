"""Pruning: a full reconciliation that hands every desired row to ``Operations.prune`` so the
target drops whatever is not in the table.

It never runs before the table is initialized (an uninitialized table would make the
target drop everything), and the first one waits until every change up to the round's
snapshot went to the target (no backlog, no held row): a row not written yet is one the
target has no record of, and a target that restored a previous run's state (the LB maps'
entries and ids) would drop what it kept for that row. With ``prune_interval`` set it runs
in the first round after initialization that is caught up, and then every
``prune_interval``; with ``None`` only on request (``Reconciler.prune``). A failure is
reported in health and tried again at the next prune.

A prune that returns an awaitable is awaited by the round that started it, so the rounds
wait for it; with ``Config.prune_beside_rounds`` it runs in a task of its own while the
rounds go on (an operation whose prune takes seconds, e.g. a dump of every map entry,
then does not hold back the changes meanwhile; it must tolerate updates between its
awaits). No second prune starts until it has finished.
"""

from __future__ import annotations

import inspect
import logging
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any, Generic, TypeVar

from reconciler.config import Config
from reconciler.incremental import error_text
from reconciler.metrics import ReconcilerMetrics
from reconciler.operations import settle
from statedb import ReadTxn, Watch

O = TypeVar("O")

log = logging.getLogger(__name__)


class Pruner(Generic[O]):
    """Decides when to prune and runs the prune operation."""

    def __init__(self, config: Config[O], metrics: ReconcilerMetrics) -> None:
        self.config = config
        self.metrics = metrics
        self.initialized = False
        self.error: str | None = None
        self.next_at: float | None = None
        self._lock = threading.Lock()
        self._requested = False
        # Closed once the prune that serves the outstanding request(s) has run; the run's
        # own watch is moved to _running while it runs, so a request made meanwhile waits
        # for the next prune (the running one may have read the table before it).
        self._request_watch: Watch | None = None
        self._running: Watch | None = None
        self._busy = False
        #: A prune has begun since the reconciler started.
        self.pruned = False

    def on_initialized(self, now: float) -> None:
        """The table finished initializing: prune right away if pruning is enabled."""
        self.initialized = True
        if self.config.prune_interval is not None:
            self.next_at = now

    def request(self) -> Watch:
        """Ask for a prune at the next round (kept until the table is initialized); the
        returned watch closes when a prune that started after this request has run."""
        with self._lock:
            self._requested = True
            if self._request_watch is None:
                self._request_watch = Watch()
            return self._request_watch

    @property
    def request_outstanding(self) -> bool:
        """True from a `request` until the prune serving it has run."""
        with self._lock:
            return self._request_watch is not None or self._running is not None

    def due(self, now: float, caught_up: bool = True) -> bool:
        """True when the table is initialized, no prune is running beside the rounds, and
        a prune is requested or scheduled. The first prune also waits until the
        reconciler is ``caught_up`` (every change up to its last round's snapshot went to
        the target, no row is held): until a row was written the target has no record of
        it, and the prune would drop what a previous run left for it (see the module
        doc)."""
        if not self.initialized or self._busy or (not caught_up and not self.pruned):
            return False
        with self._lock:
            if self._requested:
                return True
        return self.next_at is not None and now >= self.next_at

    def wake_at(self) -> float | None:
        """When the next scheduled prune is due (None when none is, or not initialized)."""
        return self.next_at if self.initialized else None

    @property
    def busy(self) -> bool:
        """True while a prune started by `start_beside` has not finished."""
        return self._busy

    async def run(self, txn: ReadTxn) -> bool:
        """Prune against snapshot ``txn``; return True on success."""
        start = self._begin()
        ok = False
        try:
            await settle(self.config.operations.prune(txn, self.config.table.all(txn)))
            ok = True
        except Exception as exc:
            self._failed(exc)
        finally:
            self._end(start, ok)
        return ok

    def start_beside(
        self,
        txn: ReadTxn,
        spawn: Callable[[Callable[[], Coroutine[Any, Any, None]]], object],
        on_done: Callable[[], None],
    ) -> None:
        """Begin a prune against ``txn`` whose awaitable part (if ``Operations.prune``
        returns one) runs in a task of its own, started with ``spawn``, while the rounds go
        on (``Config.prune_beside_rounds``); ``on_done`` is called when it has finished. The
        synchronous part of ``prune`` runs here, in the round."""
        start = self._begin()
        try:
            pending = self.config.operations.prune(txn, self.config.table.all(txn))
        except Exception as exc:
            self._failed(exc)
            self._end(start, False)
            return
        if pending is None or not inspect.isawaitable(pending):
            self._end(start, True)
            return
        self._busy = True

        async def finish() -> None:
            ok = False
            try:
                await pending
                ok = True
            except Exception as exc:
                self._failed(exc)
            finally:
                self._busy = False
                self._end(start, ok)
                on_done()

        spawn(finish)

    def _begin(self) -> float:
        self.pruned = True
        with self._lock:
            self._requested = False
            self._running, self._request_watch = self._request_watch, None
        if self.config.prune_interval is not None:
            self.next_at = self.config.clock.now() + self.config.prune_interval
        return time.perf_counter()

    def _failed(self, exc: Exception) -> None:
        self.error = f"prune {self.config.table.name}: {error_text(exc)}"
        log.warning("reconciler %s: %s", self.config.name, self.error)
        self.metrics.prune_errors_total += 1
        self.metrics.prune_current_errors = 1

    def _end(self, start: float, ok: bool) -> None:
        if ok:
            self.error = None
            self.metrics.prune_current_errors = 0
        self.metrics.prunes.observe(time.perf_counter() - start)
        with self._lock:
            served, self._running = self._running, None
        if served is not None:
            served.close()
