"""Pruning: a full reconciliation that hands every desired row to ``Operations.prune`` so the
target drops whatever is not in the table.

It never runs before the table is initialized (an uninitialized table would make the
target drop everything). With ``prune_interval`` set it runs in the first round after
initialization and then every ``prune_interval``; with ``None`` only on request
(``Reconciler.prune``). A failure is reported in health and tried again at the next prune.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Generic, TypeVar

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

    def due(self, now: float) -> bool:
        """True when the table is initialized and a prune is requested or scheduled."""
        if not self.initialized:
            return False
        with self._lock:
            if self._requested:
                return True
        return self.next_at is not None and now >= self.next_at

    def wake_at(self) -> float | None:
        """When the next scheduled prune is due (None when none is, or not initialized)."""
        return self.next_at if self.initialized else None

    async def run(self, txn: ReadTxn) -> bool:
        """Prune against snapshot ``txn``; return True on success."""
        with self._lock:
            self._requested = False
            self._running, self._request_watch = self._request_watch, None
        try:
            return await self._run(txn)
        finally:
            with self._lock:
                served, self._running = self._running, None
            if served is not None:
                served.close()

    async def _run(self, txn: ReadTxn) -> bool:
        cfg = self.config
        if cfg.prune_interval is not None:
            self.next_at = cfg.clock.now() + cfg.prune_interval
        start = time.perf_counter()
        try:
            await settle(cfg.operations.prune(txn, cfg.table.all(txn)))
        except Exception as exc:
            self.error = f"prune {cfg.table.name}: {error_text(exc)}"
            log.warning("reconciler %s: %s", cfg.name, self.error)
            self.metrics.prune_errors_total += 1
            self.metrics.prune_current_errors = 1
            ok = False
        else:
            self.error = None
            self.metrics.prune_current_errors = 0
            ok = True
        self.metrics.prunes.observe(time.perf_counter() - start)
        return ok
