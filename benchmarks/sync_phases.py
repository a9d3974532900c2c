"""Where an initial sync's CPU goes, by phase: for ``benchmarks/k8s.py --phases``.

`PhaseTimer` wraps the methods of `SYNC_PHASES` for as long as it is entered and adds up
each one's CPU time (``time.thread_time`` of the thread that calls it: the event loop's
for the applier and the reconciler, a worker thread's for a list page) and its calls.
Phases nest (the converter runs inside the source's batch, the Ops' steps inside
``update_batch``): each figure is inclusive, so they do not add up. Only plain
functions are timed (a coroutine's time would include what ran while it waited). A recursive call
(the source retrying a batch's conflicts) is counted once, in the outermost call.

Comparing the per-service figures of two sizes (``--services 10000`` and ``--scale``, in
one machine state) shows which phase grows faster than the number of services. The
wrappers cost about a microsecond per call: the sync's own figures (initial_sync_s,
initial_sync_cpu_s) of a run with ``--phases`` include them.
"""

from __future__ import annotations

import functools
import inspect
import threading
import time
from collections.abc import Callable
from typing import Any

#: (module, class, method, phase name) of every phase timed, outermost first.
SYNC_PHASES: tuple[tuple[str, str, str, str], ...] = (
    ("sources.k8s_reflector", "Reflector", "_list_page", "list_page"),
    ("sources.k8s_source", "K8sSource", "apply_batch", "apply_batch"),
    ("sources.k8s_convert", "K8sConverter", "upsert_service", "apply_service"),
    ("sources.k8s_convert", "K8sConverter", "upsert_endpoint_slice", "apply_endpoint_slice"),
    ("tables.origins", "OriginRecorder", "record", "apply_origins"),
    ("statedb.txn", "WriteTxn", "commit", "commit"),
    ("bpfops.frontend_ops", "FrontendOps", "update_batch", "ops_update_batch"),
    ("bpfops.frontend_ops", "FrontendOps", "spec_of", "ops_spec"),
    ("bpfops.frontend_writer", "FrontendWriter", "prepare", "ops_prepare"),
    ("bpfops.frontend_round", "RoundWriter", "write", "ops_map_writes"),
    ("reconciler.incremental", "Incremental", "_commit_statuses", "reconcile_statuses"),
    ("bpfops.frontend_ops", "FrontendOps", "prune", "ops_prune"),
)


class PhaseTimer:
    """CPU time and calls per phase while entered (see the module doc)."""

    def __init__(
        self, phases: tuple[tuple[str, str, str, str], ...] = SYNC_PHASES
    ) -> None:
        self.phases = phases
        self.cpu_s: dict[str, float] = {}
        self.calls: dict[str, int] = {}
        self._saved: list[tuple[type, str, Any]] = []

    def __enter__(self) -> PhaseTimer:
        import importlib

        try:
            for module, cls_name, method, phase in self.phases:
                cls = getattr(importlib.import_module(module), cls_name)
                orig = cls.__dict__[method]
                timed = self._timed(orig, phase)
                self._saved.append((cls, method, orig))
                setattr(cls, method, timed)
                self.cpu_s.setdefault(phase, 0.0)
                self.calls.setdefault(phase, 0)
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        for cls, method, orig in reversed(self._saved):
            setattr(cls, method, orig)
        self._saved.clear()

    def _timed(self, fn: Callable[..., Any], phase: str) -> Callable[..., Any]:
        cpu, calls = self.cpu_s, self.calls
        # Per phase and thread: whether a call is under way (a recursive one is not
        # timed again).
        active: set[int] = set()
        clock = time.thread_time
        get_ident = threading.get_ident
        if inspect.iscoroutinefunction(fn):
            raise TypeError(f"{phase}: only plain functions are timed")

        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            me = get_ident()
            if me in active:
                return fn(*args, **kwargs)
            active.add(me)
            t = clock()
            try:
                return fn(*args, **kwargs)
            finally:
                cpu[phase] += clock() - t
                calls[phase] += 1
                active.discard(me)

        return timed

    def figures(self, services: int, prefix: str = "initial_sync_phase_") -> dict[str, Any]:
        """``<prefix>us_per_service``: each phase's CPU microseconds per service, and
        ``<prefix>calls``: its calls."""
        n = max(services, 1)
        return {
            f"{prefix}us_per_service": {
                k: round(v / n * 1e6, 1) for k, v in self.cpu_s.items()
            },
            f"{prefix}calls": dict(self.calls),
        }
