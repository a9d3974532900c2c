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
from statedb import ReadTxn

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

    def on_initialized(self, now: float) -> None:
        """The table finished initializing: prune right away if pruning is enabled."""
        self.initialized = True
        if self.config.prune_interval is not None:
            self.next_at = now

    def request(self) -> None:
        """Ask for a prune at the next round (kept until the table is initialized)."""
        with self._lock:
            self._requested = True

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
        cfg = self.config
        with self._lock:
            self._requested = False
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
