"""CPU per service of an initial sync's phases at several sizes: what grows faster.

``python benchmarks/sync_phases.py --services 10000 60000`` prints one JSON object.

For each size in turn (one process, so one machine state as far as a shared machine
allows) it runs ``benchmarks/k8s.py``'s initial sync without churn and with its phases
timed (the same as ``benchmarks/k8s.py --phases``): ``sizes`` holds each run's
initial_sync_s, initial_sync_cpu_s, initial_sync_cpu_us_per_service and
initial_sync_phase_us_per_service; ``growth`` each phase's CPU per service at the
largest size over the smallest (1.0: linear in the services), ``cpu_growth`` the same
for the whole sync's CPU; ``load_avg_1m_at_start`` / ``_at_end`` the machine's load.

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

import argparse
import functools
import inspect
import json
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

#: (module, class, method, phase name) of every phase timed, outermost first.
SYNC_PHASES: tuple[tuple[str, str, str, str], ...] = (
    ("sources.k8s_reflector", "Reflector", "_list_page", "list_page"),
    ("sources.k8s_source", "K8sSource", "apply_batch", "apply_batch"),
    ("sources.k8s_convert", "K8sConverter", "upsert_service", "apply_service"),
    ("sources.k8s_convert", "K8sConverter", "upsert_endpoint_slice", "apply_endpoint_slice"),
    ("tables.origins", "OriginRecorder", "record", "apply_origins"),
    ("tables.origins", "OriginRecorder", "record_many", "apply_origins"),
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


def growth(sizes: list[dict[str, Any]]) -> tuple[dict[str, float], float]:
    """Each phase's CPU per service at the last size over the first, and the same for the
    whole sync (`sizes` as `main` builds it)."""
    first, last = sizes[0], sizes[-1]
    key = "initial_sync_phase_us_per_service"
    phases = {
        k: round(last[key][k] / v, 2)
        for k, v in first[key].items()
        if v > 0 and k in last[key]
    }
    base = first["initial_sync_cpu_us_per_service"]
    cpu = round(last["initial_sync_cpu_us_per_service"] / base, 2) if base else 0.0
    return phases, cpu


def main(argv: list[str] | None = None) -> int:
    """Run the syncs and print the JSON figures."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument(
        "--services", type=int, nargs="+", default=[10_000, 60_000],
        help="the sizes, smallest first (default: 10000 60000)",
    )
    args = p.parse_args(argv)
    import anyio

    from benchmarks import k8s

    out: dict[str, Any] = {"load_avg_1m_at_start": round(os.getloadavg()[0], 2)}
    sizes: list[dict[str, Any]] = []
    for n in args.services:
        res = anyio.run(functools.partial(k8s.run, n, 1000.0, 0.0, phases=True))
        sizes.append(
            {
                "services": n,
                "initial_sync_s": res["initial_sync_s"],
                "initial_sync_cpu_s": res["initial_sync_cpu_s"],
                "initial_sync_cpu_us_per_service": round(
                    res["initial_sync_cpu_s"] / n * 1e6, 1
                ),
                "initial_sync_phase_us_per_service": res["initial_sync_phase_us_per_service"],
            }
        )
    out["sizes"] = sizes
    out["growth"], out["cpu_growth"] = growth(sizes)
    out["load_avg_1m_at_end"] = round(os.getloadavg()[0], 2)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
