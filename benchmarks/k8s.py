"""Kubernetes source benchmark: API server to LB maps; prints one JSON object.

The fake API server (tests/k8s/fake_apiserver.py: HTTPS, bearer token, chunked watches)
runs in a child process, so its JSON encoding does not share the agent's interpreter.
The agent side is what the ``k8s`` component runs: `K8sSource` (four reflectors, the
batching applier, the converter) feeding a `statewright.loadbalancer.LoadBalancer` whose
reconciler writes kernel maps (memory maps where the kernel does not allow them; the
``maps`` key says which), with the garbage-collector tuning the agent uses (``tune_gc``
at start, ``initial_load_gc`` while the initial lists are applied, ``freeze_loaded`` and
``steady_gc`` once the initial state is in the maps).

Keys:

- initial_sync_s / initial_sync_services_per_s: from starting the source until every
  frontend of N Services (one ClusterIP port, an EndpointSlice of 10 endpoints each) is
  Done in the maps and the tables are initialized; the list is paginated (500 per page).
  initial_sync_cpu_s: the agent process' CPU time over the same span (all threads): what
  the sync costs whatever the machine's load (a loaded machine stretches the wall time
  far more than the CPU time); initial_sync_sys_cpu_s: the part of it spent in the
  kernel (mostly the BPF map writes). initial_sync_gc_<gen>_count / _cpu_s: the collector's
  passes per generation during the sync and their CPU time; initial_sync_gc_young_objects:
  the container objects (net) the young generation holds at the sync's end (what
  ``initial_load_gc`` let pile up unexamined; frozen, not traversed, right after).
- frontends_done / frontends_waiting_for_id / service_ids_in_use: beyond the 16-bit
  service-id space (about 65,000 frontends, as Cilium's ``rev_nat_index``) the other
  frontends wait for an id (the reconciler parks them: reconciler/waiting.py); the sync
  then ends when every frontend was attempted, and the churn changes served services only.
- rss_mb_after_sync: resident memory of the agent process after the sync, once the C
  heap's free pages are given back as the agent does (`statedb.heap_trim.trim_heap`:
  heap_trim_ms; rss_mb_after_sync_untrimmed before it);
  rss_mb_peak_sync: its peak until then (``VmHWM``); rss_mb_before_agent: before the
  load balancer and the source were made (the interpreter and its imports).
  memory_pymalloc_arenas_mb / memory_pymalloc_live_mb: Python's small-object allocator
  after the sync, its arenas and the bytes in live blocks;
  memory_malloc_heap_in_use_mb / _free_mb / memory_malloc_mmapped_mb: glibc's malloc
  (larger blocks: dict and list tables, buffers): `benchmarks.k8s_memory.allocator_figures`.
- ``--memory-breakdown`` (slow: tracemalloc): where the bytes are after the sync, per
  service: memory_by_file_ / memory_by_line_bytes_per_service (``[where, bytes per
  service, live blocks]``), memory_holders_bytes_per_service (which object types hold
  what the top lines allocated), memory_by_type_bytes_per_service (live container
  objects, shallow sizes), memory_owners_bytes_per_service (each object once, for the
  first of statedb, rows, LB Ops, writer, converter, source that reaches it),
  memory_traced_mb / _peak_mb (`benchmarks.k8s_memory`).
- ``--phases``: where the sync's CPU goes (`benchmarks.sync_phases`):
  initial_sync_phase_us_per_service (per phase, CPU microseconds per service, each
  inclusive of the phases it calls: list pages in the worker threads, the applier's
  batches and within them each kind's conversion and writes, origins and commits; the
  reconciler's Ops rounds and within them the row-to-spec step, the per-frontend
  preparation and the map writes, the status commits, the prune) and
  initial_sync_phase_calls. Two sizes in one machine state show which phase grows
  faster than the number of services.
- churn_*: the server changes one EndpointSlice (one endpoint address replaced) at
  ``--churn-rate`` events/s for ``--churn-seconds``; latency from the server creating
  the event until the new backend is in the frontend's map entries (its frontend row
  Done with the new backend, polled every millisecond: +-1 ms resolution).
  churn_kept_up is true when the backlog (events emitted but not yet in the maps)
  stayed under one second's worth of events and every event arrived.
- gc_thresholds_churn: the collector's thresholds during the churn: the agent's
  steady-state ones (`statedb.gc_tuning.steady_gc`, switched to
  after the initial sync) unless ``--no-steady-gc`` keeps tune_gc's.
- gc_young_interval_s: seconds between the timed young collections the agent runs with
  the steady-state thresholds (`statedb.gc_tuning.collect_young_periodically`;
  ``--young-interval``, 0: none).
- churn_server_late_ms_max / churn_server_late_over_stall_ms (``[at_s, ms]`` where the
  lateness first passes ``STALL_MS``): how late the fake server emitted events against
  its schedule. A late server emits the events it held up in one burst, which the agent
  works off in order: lateness here is the server's, not the agent's. The server process
  keeps its collector off during the churn (its full passes over the churned objects grew
  to 400 ms and were the whole p99 tail).
- churn_profile_*: where the churn's time goes, for finding a latency tail (figures
  of the whole churn window): ``gc_<gen>_count`` / ``gc_<gen>_cpu_ms_p50|max`` (the
  collector's passes per generation and their CPU time, ``time.thread_time`` in
  ``gc.callbacks``: CPU time, so a loaded machine does not inflate it),
  ``arrival_to_commit_ms_p50|p99`` (per write batch: from the oldest change's arrival at
  the applier to the commit), ``batch_changes_p99``, ``reconcile_rounds`` /
  ``reconcile_round_ms_max`` (the LB reconciler's metrics), ``loop_lag_ms_p99|max``
  (how late a 1 ms sleep wakes up: everything that holds the event loop), and per churn
  event the path's three stages, ``p50|p99`` each: ``emit_to_delivered_ms`` (server,
  wire, the watch thread's read, decoding, up to the reflector's delivery to the
  applier), ``delivered_to_committed_ms`` (the applier's queue and batch, the converter
  and LB writer, the commit) and ``committed_to_done_ms`` (reconciler rounds, map writes,
  the Done status, and this benchmark's 1 ms polling).
- churn time series, for telling one stall from a steady tail (times in seconds from the
  churn's start): ``churn_event_to_map_p99_ms_by_second`` (the p99 of the events emitted
  in each second), ``churn_event_to_map_p99_ms_after_first_s`` (the first second
  excluded), ``churn_stall_ms_max`` / ``churn_stall_max_at_s`` (the longest loop lag and
  when it ended), ``churn_stalls`` (every loop lag over ``STALL_MS``: ``[at_s, ms,
  cpu_ms, runqueue_ms]``, the last two how much of it the loop's thread ran and waited
  for a CPU, from /proc/thread-self/schedstat; the rest is waiting for the GIL or in
  sleep), ``churn_gc_passes_over_stall_ms`` (``[at_s, generation, cpu_ms]``).
- churn_cpu_us_per_event / churn_loop_cpu_us_per_event: CPU time of the agent process
  (all threads) and of the event loop's thread alone, per churn event (this benchmark's
  polling included): what the churn costs, whatever the machine's load.
  churn_agent_cpu_us_per_event: the process' CPU time per event less this benchmark's
  polling (churn_poll_cpu_us_per_event, the polling loop's own thread time): the agent's
  cost of one endpoint event (decoding, applier, converter, writer, reconciler, maps).
- decode_*: one list page of 500 Services decoded from the raw JSON with ``json.loads``
  versus the client's model classes (``ApiClient.deserialize``), and the models turned
  back into the dicts the converter takes (``sanitize_for_serialization``): microseconds
  per object. The reflector uses `sources.k8s_json.loads` (``decoder``: orjson where it
  is installed, else json): decode_us_per_object, and per EndpointSlice of 10 endpoints
  decode_us_per_slice against json.loads' decode_json_us_per_slice (best of five pages,
  so without most collector passes: the sync's own figure is in initial_sync_cpu_s).
  Measured in a spawned interpreter: the official client they compare with is never
  imported by the process whose resident memory is measured (the agent does not import it).

``--stall-stacks FILE``: a thread records the event loop thread's stack every millisecond
while the loop has not woken for over 15 ms, written to FILE as JSON (per stall: its start
in seconds from the churn's start and each stack's sample count). The sampling thread needs
the GIL, so samples land where the loop releases it (ctypes map calls, the switch
interval): they say which task holds the loop, not how its time splits.

Measured (2026-11-23 21:10-21:13 UTC, load 0.8-0.9): churn_event_to_map_p50_ms /
p99_ms 3.27 / 6.81, kept up (backlog at most 49), no loop stall over 20 ms, young passes
at most 2.1 ms of CPU, churn_cpu_us_per_event 617.6; initial_sync_s 2.93. Again at load
0.4: 3.24 / 6.22 ms, churn_cpu_us_per_event 549.1. With
``--young-interval 0``: p99 15.1 ms, young passes up to 31 ms. Before the fake server kept
its collector off: p99 91.9 ms (churn_server_late_ms_max 412). The base commit with only
the server's collector off (load 0.6-0.8): p99 7.46 ms, loop stalls of 32 and 65 ms from
log compactions that kept the whole log.

``--quick``: 2,000 services and 10 s of churn (well under 60 s); the full run is 10,000
services and 30 s of churn at 1,000 events/s. ``--scale``: 60,000 services and 30 s of
churn, with ``scale_targets``: each of `SCALE_TARGETS` (initial sync <= 12 s, RSS after
the sync <= 450 MB, churn p99 <= 50 ms, no loop stall over 50 ms) with its value and
whether it is met (``all_met`` also needs the churn to keep up). ``load_avg_1m_*``: the
machine's load around the run (it is shared; figures from a loaded machine are
pessimistic).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import gc
import ipaddress
import json
import multiprocessing
import multiprocessing.connection
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import anyio
import anyio.abc

from benchmarks.k8s_memory import MemoryBreakdown, allocator_figures, lb_owners
from benchmarks.lb import BACKENDS_PER_SERVICE, service_obj, slice_obj
from benchmarks.sync_phases import PhaseTimer
from bpf.probe import kernel_support
from reconciler.status import StatusKind
from sources import k8s_json, native
from sources.k8s_client import ClientSettings, K8sClient
from sources.k8s_source import K8sSource
from statedb import rowbuild
from statedb.gc_tuning import (
    STEADY_GC_THRESHOLDS,
    YOUNG_COLLECT_INTERVAL,
    collect_young_periodically,
    freeze_loaded,
    initial_load_gc,
    steady_gc,
    tune_gc,
)
from statedb.heap_trim import trim_heap
from statewright.loadbalancer import LoadBalancer, MapsPlacement
from tables.lb_config import LBConfig

NODE = "bench-node"
#: A loop lag above this (ms) is a stall: the churn_stall_* keys list them.
STALL_MS = 20.0
#: ``--scale``: services of 10 backends each, on one agent.
SCALE_SERVICES = 60_000
#: ``--scale``'s targets: each figure at most this (the churn also kept up).
SCALE_TARGETS = {
    "initial_sync_s": 12.0,
    "rss_mb_after_sync": 450.0,
    "churn_event_to_map_p99_ms": 50.0,
    "churn_stall_ms_max": 50.0,
}


def churn_ip(gen: int) -> str:
    """The endpoint address churn event ``gen`` (1-based) introduces (as
    `benchmarks.lb.slice_obj` writes it)."""
    return str(ipaddress.ip_address(int(ipaddress.ip_address("10.200.0.0")) + gen))


def churn_service(k: int, served: list[int]) -> int:
    """The service churn event ``k`` (0-based) changes, among the ``served`` ones (their
    indexes: every service's, unless some wait for an id)."""
    return served[(k * 7919) % len(served)]


# ----- the server process -----------------------------------------------------------------
def _server(conn: multiprocessing.connection.Connection, kubeconfig: str) -> None:
    """Child process: serve, and obey ("populate", n), ("churn", n, rate, s), ("stop",)."""
    from tests.k8s.fake_apiserver import FakeAPIServer

    srv = FakeAPIServer(bookmark_interval=5.0, history_limit=20_000).start()
    try:
        srv.write_kubeconfig(kubeconfig)
        conn.send(("ready",))
        while True:
            cmd = conn.recv()
            if cmd[0] == "populate":
                for i in range(cmd[1]):
                    srv.upsert(service_obj(i))
                    srv.upsert(slice_obj(i))
                srv.upsert({"kind": "Node", "metadata": {"name": NODE, "labels": {}}})
                # The real API server's collector does not stop the world: keep this
                # process' collector off the loaded objects, or its pauses would count
                # as the agent's latency.
                gc.collect()
                gc.freeze()
                conn.send(("ok",))
            elif cmd[0] == "churn":
                _, served, rate, seconds = cmd
                total = int(rate * seconds)
                times: list[float] = []
                # No collections in this process during the churn either: after the
                # freeze above, its full passes (traversing every object the churn left,
                # the watch history included) came every few seconds and grew to 400 ms
                # (churn_server_late_ms_max), and the agent then received the events held
                # up meanwhile in one burst.
                gc.disable()
                t0 = time.monotonic()
                conn.send(("started", t0))
                for k in range(total):
                    due = t0 + k / rate
                    delay = due - time.monotonic()
                    if delay > 0:
                        time.sleep(delay)
                    times.append(time.monotonic())
                    srv.upsert(slice_obj(churn_service(k, served), k + 1))
                gc.enable()
                conn.send(("done", times))
            else:
                break
    finally:
        srv.stop()


def _rss_mb(field: str = "VmRSS") -> float:
    """The process' resident set (``VmHWM``: its peak) in MB, from /proc/self/status."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return 0.0


# ----- decoding ---------------------------------------------------------------------------
def decode_figures_apart() -> dict[str, Any]:
    """`decode_figures` in a spawned interpreter (see the module doc)."""
    ctx = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=ctx) as pool:
        return pool.submit(decode_figures).result()


def decode_figures(objects: int = 500, rounds: int = 5) -> dict[str, Any]:
    """Microseconds per object: json.loads vs the client's models (and back to dicts)."""
    import kubernetes.client

    page = {
        "kind": "ServiceList",
        "apiVersion": "v1",
        "metadata": {"resourceVersion": "1"},
        "items": [service_obj(i) for i in range(objects)],
    }
    text = json.dumps(page)
    api = kubernetes.client.ApiClient()

    def best(fn: Any) -> float:
        out = []
        for _ in range(rounds):
            t = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t)
        return min(out) / objects * 1e6

    raw = best(lambda: json.loads(text))
    data = text.encode()
    agent = best(lambda: k8s_json.loads(data))
    slices = json.dumps({**page, "items": [slice_obj(i) for i in range(objects)]}).encode()
    slice_raw = best(lambda: json.loads(slices))
    slice_agent = best(lambda: k8s_json.loads(slices))
    models = best(lambda: api.deserialize(text, "V1ServiceList", "application/json"))
    back = best(
        lambda: api.sanitize_for_serialization(
            api.deserialize(text, "V1ServiceList", "application/json")
        )
    )
    api.close()
    return {
        "decoder": k8s_json.DECODER,
        "decode_json_us_per_object": round(raw, 2),
        "decode_us_per_object": round(agent, 2),
        "decode_json_us_per_slice": round(slice_raw, 2),
        "decode_us_per_slice": round(slice_agent, 2),
        "decode_models_us_per_object": round(models, 2),
        "decode_models_to_dicts_us_per_object": round(back, 2),
        "decode_models_slowdown": round(models / raw, 1),
    }


# ----- the agent side ---------------------------------------------------------------------
def _frontend_ok(lb: LoadBalancer, txn: Any, addr: Any, ip: Any) -> bool:
    """Whether the frontend at ``addr`` is Done with a backend at address ``ip`` (an
    ip_address: compared as it is, no string per backend on the polled path)."""
    fe = lb.frontends.get(txn, addr)
    return (
        fe is not None
        and fe.status.kind is StatusKind.DONE
        and any(b.address.address == ip for b in fe.backends)
    )


async def run(
    n: int,
    churn_rate: float,
    churn_seconds: float,
    gc_steady: bool = True,
    steady_thresholds: tuple[int, int, int] = STEADY_GC_THRESHOLDS,
    stall_stacks: str = "",
    young_interval: float = YOUNG_COLLECT_INTERVAL,
    memory_breakdown: bool = False,
    phases: bool = False,
) -> dict[str, Any]:
    """The benchmark; returns the figures."""
    tune_gc()
    result: dict[str, Any] = {"services": n, "backends_per_service": BACKENDS_PER_SERVICE}
    # Which Kubernetes converter ran: compiled (mypyc) or its source (sources/native.py).
    result["converter"] = native.describe()
    # Which row builder ran: compiled (statedb/_rowbuild.c) or Python (statedb/rowbuild.py).
    result["row_builder"] = rowbuild.WHY
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    with tempfile.TemporaryDirectory(prefix=f"statewright-k8s-bench-{os.getpid()}-") as tmp:
        kubeconfig = str(Path(tmp) / "kubeconfig")
        proc = ctx.Process(target=_server, args=(child, kubeconfig), daemon=True)
        proc.start()
        try:
            assert parent.recv() == ("ready",)
            parent.send(("populate", n))
            assert parent.recv() == ("ok",)
            result.update(
                await _agent(
                    parent,
                    kubeconfig,
                    n,
                    churn_rate,
                    churn_seconds,
                    gc_steady,
                    steady_thresholds,
                    stall_stacks,
                    young_interval,
                    memory_breakdown,
                    phases,
                )
            )
        finally:
            parent.send(("stop",))
            proc.join(timeout=30)
            if proc.is_alive():
                proc.kill()
                proc.join()
    return result


async def _agent(
    conn: multiprocessing.connection.Connection,
    kubeconfig: str,
    n: int,
    churn_rate: float,
    churn_seconds: float,
    gc_steady: bool,
    steady_thresholds: tuple[int, int, int],
    stall_stacks: str,
    young_interval: float,
    memory_breakdown: bool = False,
    phases: bool = False,
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    out["rss_mb_before_agent"] = round(_rss_mb(), 1)
    tuned = gc.get_threshold()  # tune_gc's (``--no-steady-gc`` keeps them for the churn)
    breakdown = MemoryBreakdown() if memory_breakdown else None
    if breakdown is not None:
        breakdown.start()
    backend = "kernel" if kernel_support().ok else "memory"
    entries = 1 << max(16, (n * (BACKENDS_PER_SERVICE + 1) * 2).bit_length())
    cfg = LBConfig.from_flags([f"--bpf-lb-map-max={entries}"], LBConfig(node_name=NODE))
    lb = LoadBalancer(cfg, MapsPlacement(backend=backend, pin_dir=""))
    lb.open_maps()
    lb.build_reconciler()
    out["maps"] = lb.maps_kind
    client = K8sClient(ClientSettings(kubeconfig=kubeconfig, qps=50, burst=100))
    profile = _Profile()
    if stall_stacks:
        profile.sampler = _StallSampler(stall_stacks)
    source = K8sSource(
        lb.writer, client, node_name=NODE, converter=lb.converter, on_applied=profile.applied
    )
    for r in source.reflectors:
        r.deliver = profile.tracing(r.deliver)
    with lb.writer.write_txn() as txn:
        source.register_initializer(txn)
    # As the agent does (its component's start returns): a finished transaction kept in
    # this coroutine would hold the tables' first snapshots, and so every row version since.
    del txn
    try:
        async with anyio.create_task_group() as tg:
            await tg.start(lb.run)
            timer = PhaseTimer() if phases else None
            with timer if timer is not None else contextlib.nullcontext():
                out.update(await _initial_sync(tg, lb, source, n))
            if timer is not None:
                out.update(timer.figures(n))
            # As the agent does once the initial state is in the maps (components/lb.py's
            # freeze, the k8s component's switch to steady-state collector thresholds,
            # which freezes too): no collection of what was loaded.
            freeze_loaded()
            steady_gc(steady_thresholds if gc_steady else tuned)
            out["rss_mb_after_sync_untrimmed"] = round(_rss_mb(), 1)
            # As the agent does once the initial state is in the maps (components/lb.py).
            t_trim = time.perf_counter()
            trim_heap()
            out["heap_trim_ms"] = round((time.perf_counter() - t_trim) * 1000, 1)
            out["rss_mb_after_sync"] = round(_rss_mb(), 1)
            out["rss_mb_peak_sync"] = round(_rss_mb("VmHWM"), 1)
            out.update({f"memory_{k}": v for k, v in allocator_figures().items()})
            if breakdown is not None:
                out.update(breakdown.figures(n, lb_owners(lb, source)))
            if gc_steady and young_interval > 0:
                await tg.start(collect_young_periodically, young_interval)
            out["gc_thresholds_churn"] = list(gc.get_threshold())
            out["gc_young_interval_s"] = young_interval if gc_steady else 0
            if churn_seconds > 0:
                # Only services whose frontend is in the maps churn (beyond the id space
                # the others wait for an id).
                served = _served_services(lb)
                # Built before the measuring starts: the benchmark's own work, not the
                # agent's (72 ms of the loop at 60,000 services). No snapshot kept for the
                # churn: it would hold every row version written meanwhile.
                profile.addr_of = {
                    f.service_name: f.address for f in lb.frontends.all(lb.db.read_txn())
                }
                async with profile.measuring(lb):
                    out.update(
                        await _churn(conn, lb, served, churn_rate, churn_seconds, profile)
                    )
                out.update(profile.figures())
            tg.cancel_scope.cancel()
    finally:
        client.close()
        lb.close_maps()
    return out


async def _initial_sync(
    tg: anyio.abc.TaskGroup, lb: LoadBalancer, source: K8sSource, n: int
) -> dict[str, Any]:
    """Start the source and wait until every frontend was attempted (Done, or waiting
    for a service id beyond the id space); the initial_sync_* figures."""
    out: dict[str, Any] = {}
    gc.collect()
    t0 = time.perf_counter()
    cpu0 = time.process_time()
    sys0 = os.times().system
    with _GCTimer() as collector:
        # As the k8s component does before it starts the source.
        initial_load_gc()
        await tg.start(source.run)
        while not source.synced:
            await anyio.sleep(0.005)
        assert lb.reconciler is not None
        rev = lb.frontends.revision(lb.db.read_txn())
        await lb.reconciler.wait_until_reconciled(rev)
    elapsed = time.perf_counter() - t0
    out["initial_sync_gc_young_objects"] = gc.get_count()[0]
    out["initial_sync_s"] = round(elapsed, 3)
    out["initial_sync_cpu_s"] = round(time.process_time() - cpu0, 3)
    out["initial_sync_sys_cpu_s"] = round(os.times().system - sys0, 3)
    done = sum(1 for f in lb.frontends.all(lb.db.read_txn()) if f.status.kind is StatusKind.DONE)
    waiting = lb.reconciler.metrics.waiting
    out["frontends_done"] = done
    out["frontends_waiting_for_id"] = waiting
    out["service_ids_in_use"] = len(lb.ops.service_ids)
    if done + waiting != n or (waiting and done != lb.ops.service_ids.span):
        problems = "; ".join(lb.reconciler.problems())
        raise RuntimeError(
            f"{done} of {n} frontends Done and {waiting} waiting after the sync: {problems}"
        )
    out["initial_sync_services_per_s"] = round(done / elapsed)
    out.update(collector.figures("initial_sync_gc_"))
    return out


def _served_services(lb: LoadBalancer) -> list[int]:
    """The indexes of the services whose frontend is Done (in the maps)."""
    return sorted(
        int(f.service_name.rsplit("-", 1)[1])
        for f in lb.frontends.all(lb.db.read_txn())
        if f.status.kind is StatusKind.DONE
    )


class _GCTimer:
    """The collector's passes per generation and their CPU time while entered
    (``gc.callbacks``; ``time.thread_time``, so a loaded machine does not inflate it)."""

    def __init__(self) -> None:
        self.count = [0, 0, 0]
        self.cpu_s = [0.0, 0.0, 0.0]
        self._start = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._start = time.thread_time()
        else:
            gen = info["generation"]
            self.count[gen] += 1
            self.cpu_s[gen] += time.thread_time() - self._start

    def __enter__(self) -> _GCTimer:
        gc.callbacks.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self)

    def figures(self, prefix: str) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for gen in range(3):
            out[f"{prefix}{gen}_count"] = self.count[gen]
            out[f"{prefix}{gen}_cpu_s"] = round(self.cpu_s[gen], 3)
        return out


_CHURN_BASE = int(ipaddress.ip_address("10.200.0.0"))


def _churn_generation(obj: Any) -> int:
    """The churn generation an EndpointSlice carries (its first address, see `churn_ip`),
    0 for anything else."""
    try:
        first = obj["endpoints"][0]["addresses"][0]
    except (KeyError, IndexError, TypeError):
        return 0
    if not isinstance(first, str) or not first.startswith("10.200."):
        return 0
    # 10.200.H.L is generation H * 256 + L (`churn_ip`); parsed by hand because this runs
    # on the event loop for every delta the agent receives.
    high, _, low = first[7:].partition(".")
    try:
        return int(high) * 256 + int(low)
    except ValueError:
        return int(ipaddress.ip_address(first)) - _CHURN_BASE


def _pct(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(len(ordered) * q))], 2)


def _schedstat(fd: int) -> tuple[int, int]:
    """The calling thread's (ns on a CPU, ns waiting in the run queue) from the open
    /proc/thread-self/schedstat."""
    run, wait, _ = os.pread(fd, 100, 0).split()
    return int(run), int(wait)


class _Profile:
    """The churn_profile_* figures (module docstring)."""

    def __init__(self) -> None:
        self.active = False
        self.gc: dict[int, list[float]] = {0: [], 1: [], 2: []}
        self.commits: list[float] = []
        self.batch_sizes: list[int] = []
        self.lag: list[float] = []
        #: (when, ms, of which ran on a CPU, of which waited for a CPU) of each loop stall
        #: over `STALL_MS` (when: time.monotonic at its end).
        self.stalls: list[tuple[float, float, float, float]] = []
        #: (when, generation, cpu ms) of each collector pass (time.monotonic at its end).
        self.gc_passes: list[tuple[float, int, float]] = []
        self._gc_start = 0.0
        self._rounds = (0, 0.0)
        self.lb: LoadBalancer | None = None
        #: Churn generation -> when it was delivered to the applier / committed.
        self.delivered: dict[int, float] = {}
        self.committed: dict[int, float] = {}
        #: When the loop last woke in `_lagger` (time.monotonic), for `_StallSampler`.
        self.tick = 0.0
        self.sampler: _StallSampler | None = None
        #: Service name -> its frontend's address, for polling the churned frontends.
        self.addr_of: dict[str, Any] = {}

    def applied(self, deltas: list[Any], oldest: float) -> None:
        if self.active:
            now = time.monotonic()
            self.commits.append((now - oldest) * 1000)
            self.batch_sizes.append(len(deltas))
            for d in deltas:
                gen = _churn_generation(d.obj)
                if gen:
                    self.committed.setdefault(gen, now)

    def tracing(self, deliver: Any) -> Any:
        """Wrap a reflector's delivery callback: note when each churn event is delivered."""

        async def traced(reflector: Any, deltas: list[Any], synced: bool) -> None:
            if self.active:
                now = time.monotonic()
                for d in deltas:
                    gen = _churn_generation(d.obj)
                    if gen:
                        self.delivered.setdefault(gen, now)
            await deliver(reflector, deltas, synced)

        return traced

    def stages(self, emitted: list[float], confirmed: list[float]) -> dict[str, float]:
        """Per-event stage latencies (event k is churn generation k + 1)."""
        a: list[float] = []
        b: list[float] = []
        c: list[float] = []
        for k, (e, done) in enumerate(zip(emitted, confirmed)):
            dv, cm = self.delivered.get(k + 1), self.committed.get(k + 1)
            if dv is None or cm is None:
                continue
            a.append((dv - e) * 1000)
            b.append((cm - dv) * 1000)
            c.append((done - cm) * 1000)
        out: dict[str, float] = {}
        for name, values in (
            ("emit_to_delivered_ms", a),
            ("delivered_to_committed_ms", b),
            ("committed_to_done_ms", c),
        ):
            out[f"churn_profile_{name}_p50"] = _pct(values, 0.5)
            out[f"churn_profile_{name}_p99"] = _pct(values, 0.99)
        return out

    def _gc(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._gc_start = time.thread_time()
        elif self.active:
            cpu = (time.thread_time() - self._gc_start) * 1000
            self.gc[info["generation"]].append(cpu)
            self.gc_passes.append((time.monotonic(), info["generation"], cpu))

    async def _lagger(self) -> None:
        """Sample the loop's lag every millisecond; for a stall, note how much of it the
        loop's thread ran (CPU) and waited for a CPU (the kernel's run-queue delay)."""
        fd = os.open("/proc/thread-self/schedstat", os.O_RDONLY)
        try:
            while True:
                t = time.perf_counter()
                cpu0, wait0 = _schedstat(fd)
                await anyio.sleep(0.001)
                self.tick = time.monotonic()
                lag = max(0.0, (time.perf_counter() - t) * 1000 - 1)
                self.lag.append(lag)
                if lag > STALL_MS:
                    cpu1, wait1 = _schedstat(fd)
                    self.stalls.append(
                        (time.monotonic(), lag, (cpu1 - cpu0) / 1e6, (wait1 - wait0) / 1e6)
                    )
        finally:
            os.close(fd)

    @contextlib.asynccontextmanager
    async def measuring(self, lb: LoadBalancer) -> AsyncIterator[None]:
        self.lb = lb
        assert lb.reconciler is not None
        rounds = lb.reconciler.metrics.rounds
        self._rounds = (rounds.count, rounds.max_s)
        rounds.max_s = 0.0  # the initial sync's rounds are not the churn's
        gc.callbacks.append(self._gc)
        self.active = True
        self.tick = time.monotonic()
        if self.sampler is not None:
            self.sampler.start(self)
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._lagger)
                yield
                tg.cancel_scope.cancel()
        finally:
            self.active = False
            gc.callbacks.remove(self._gc)
            if self.sampler is not None:
                self.sampler.stop()

    def figures(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        p = "churn_profile_"
        for gen, pauses in self.gc.items():
            out[f"{p}gc_{gen}_count"] = len(pauses)
            out[f"{p}gc_{gen}_cpu_ms_p50"] = _pct(pauses, 0.5)
            out[f"{p}gc_{gen}_cpu_ms_max"] = round(max(pauses, default=0.0), 2)
        out[f"{p}arrival_to_commit_ms_p50"] = _pct(self.commits, 0.5)
        out[f"{p}arrival_to_commit_ms_p99"] = _pct(self.commits, 0.99)
        out[f"{p}batch_changes_p99"] = _pct([float(b) for b in self.batch_sizes], 0.99)
        if self.lb is not None and self.lb.reconciler is not None:
            rounds = self.lb.reconciler.metrics.rounds
            out[f"{p}reconcile_rounds"] = rounds.count - self._rounds[0]
            out[f"{p}reconcile_round_ms_max"] = round(rounds.max_s * 1000, 2)
        out[f"{p}loop_lag_ms_p99"] = _pct(self.lag, 0.99)
        out[f"{p}loop_lag_ms_max"] = round(max(self.lag, default=0.0), 2)
        return out


class _StallSampler:
    """``--stall-stacks``: a thread that, every millisecond while the event loop has not
    woken for over ``threshold_ms``, records the loop thread's stack; written as JSON
    (per stall: when it started, from the churn's start, and its stacks' sample counts)
    for finding what holds the loop."""

    def __init__(self, path: str, threshold_ms: float = 15.0) -> None:
        self.path = path
        self.threshold_s = threshold_ms / 1000
        self.samples: list[tuple[float, str]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._loop_ident = 0
        self.t0 = 0.0

    def start(self, profile: _Profile) -> None:
        self._loop_ident = threading.get_ident()
        self.t0 = time.monotonic()
        self._thread = threading.Thread(target=self._run, args=(profile,), daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _run(self, profile: _Profile) -> None:
        while not self._stop.wait(0.001):
            now = time.monotonic()
            if now - profile.tick < self.threshold_s:
                continue
            frame = sys._current_frames().get(self._loop_ident)
            stack: list[str] = []
            while frame is not None:
                code = frame.f_code
                stack.append(f"{Path(code.co_filename).name}:{code.co_name}:{frame.f_lineno}")
                frame = frame.f_back
            self.samples.append((profile.tick, ";".join(reversed(stack))))

    def write(self, t0: float) -> None:
        stalls: dict[float, dict[str, int]] = {}
        for tick, stack in self.samples:
            counts = stalls.setdefault(tick, {})
            counts[stack] = counts.get(stack, 0) + 1
        doc = [
            {
                "from_s": round(tick - t0, 3),
                "samples": sum(c.values()),
                "stacks": sorted(c.items(), key=lambda kv: -kv[1]),
            }
            for tick, c in sorted(stalls.items())
        ]
        Path(self.path).write_text(json.dumps(doc, indent=1))


async def _churn(
    conn: multiprocessing.connection.Connection,
    lb: LoadBalancer,
    served: list[int],
    rate: float,
    seconds: float,
    profile: _Profile,
) -> dict[str, Any]:
    addr_of = profile.addr_of
    total = int(rate * seconds)
    conn.send(("churn", served, rate, seconds))
    msg = await anyio.to_thread.run_sync(conn.recv)
    assert msg[0] == "started"
    t0 = msg[1]
    cpu0, loop_cpu0 = time.process_time(), time.thread_time()
    confirmed: list[float] = []
    max_backlog = 0
    deadline = t0 + seconds + 10.0
    # CPU time of this benchmark's own polling (the loop body below), taken off the
    # process' for churn_agent_cpu_us_per_event.
    poll_cpu = 0.0
    while len(confirmed) < total and time.monotonic() < deadline:
        await anyio.sleep(0.001)
        poll0 = time.thread_time()
        now = time.monotonic()
        emitted = min(total, int((now - t0) * rate) + 1)
        snap = lb.db.read_txn()
        while len(confirmed) < emitted:
            k = len(confirmed)
            svc = f"bench/svc-{churn_service(k, served)}"
            if not _frontend_ok(lb, snap, addr_of[svc], ipaddress.ip_address(churn_ip(k + 1))):
                break
            confirmed.append(now)
        max_backlog = max(max_backlog, emitted - len(confirmed))
        poll_cpu += time.thread_time() - poll0
    cpu, loop_cpu = time.process_time() - cpu0, time.thread_time() - loop_cpu0
    msg = await anyio.to_thread.run_sync(conn.recv)
    assert msg[0] == "done"
    emitted_at: list[float] = msg[1]
    lat = sorted((c - e) * 1000 for c, e in zip(confirmed, emitted_at))
    out: dict[str, Any] = {
        "churn_events": total,
        "churn_events_applied": len(confirmed),
        "churn_max_backlog": max_backlog,
        "churn_kept_up": len(confirmed) == total and max_backlog <= rate,
        # CPU time per event (all the agent's threads / the event loop's thread alone,
        # this benchmark's polling included): what the churn costs on any machine.
        "churn_cpu_us_per_event": round(cpu / total * 1e6, 1),
        "churn_loop_cpu_us_per_event": round(loop_cpu / total * 1e6, 1),
        # The same without the polling's own CPU time: the agent's cost of an event.
        "churn_agent_cpu_us_per_event": round((cpu - poll_cpu) / total * 1e6, 1),
        "churn_poll_cpu_us_per_event": round(poll_cpu / total * 1e6, 1),
    }
    if lat:
        out["churn_event_to_map_p50_ms"] = round(statistics.median(lat), 2)
        out["churn_event_to_map_p99_ms"] = round(lat[min(len(lat) - 1, int(len(lat) * 0.99))], 2)
    out.update(profile.stages(emitted_at, confirmed))
    out.update(_time_series(t0, emitted_at, confirmed, profile))
    # How late the server emitted events against its schedule: a late server catches up
    # in a burst, which the agent then works off in order.
    late = [(e - (t0 + k / rate)) * 1000 for k, e in enumerate(emitted_at)]
    out["churn_server_late_ms_max"] = round(max(late, default=0.0), 1)
    out["churn_server_late_over_stall_ms"] = [
        [round(emitted_at[k] - t0, 3), round(ms, 1)]
        for k, ms in enumerate(late)
        if ms > STALL_MS and (k == 0 or late[k - 1] <= STALL_MS)
    ]
    if profile.sampler is not None:
        profile.sampler.stop()
        profile.sampler.write(t0)
    return out


def _time_series(
    t0: float, emitted_at: list[float], confirmed: list[float], profile: _Profile
) -> dict[str, Any]:
    """Where in the churn the tail is: latency by emit second, the loop's stalls and the
    collector's long passes, times in seconds from the churn's start."""
    by_second: dict[int, list[float]] = {}
    for e, c in zip(emitted_at, confirmed):
        by_second.setdefault(int(e - t0), []).append((c - e) * 1000)
    after = [v for sec, vals in by_second.items() if sec >= 1 for v in vals]
    out: dict[str, Any] = {
        "churn_event_to_map_p99_ms_after_first_s": _pct(after, 0.99),
        "churn_event_to_map_p99_ms_by_second": [
            _pct(by_second[sec], 0.99) for sec in sorted(by_second)
        ],
    }
    worst = max(profile.stalls, key=lambda s: s[1], default=None)
    out["churn_stall_ms_max"] = round(worst[1], 2) if worst else 0.0
    out["churn_stall_max_at_s"] = round(worst[0] - t0, 3) if worst else None
    out["churn_stalls"] = [
        [round(w - t0, 3), round(ms, 1), round(cpu, 1), round(wait, 1)]
        for w, ms, cpu, wait in profile.stalls
    ]
    out["churn_gc_passes_over_stall_ms"] = [
        [round(w - t0, 3), g, round(ms, 1)] for w, g, ms in profile.gc_passes if ms > STALL_MS
    ]
    return out


def scale_verdict(result: dict[str, Any]) -> dict[str, Any]:
    """Each `SCALE_TARGETS` figure: its value, its bound and whether it is met."""
    out: dict[str, Any] = {}
    for key, bound in SCALE_TARGETS.items():
        value = result.get(key)
        out[key] = {"value": value, "max": bound, "met": value is not None and value <= bound}
    out["all_met"] = all(v["met"] for v in out.values()) and bool(result.get("churn_kept_up"))
    return out


def main(argv: list[str] | None = None) -> int:
    """Run and print the JSON figures."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="2,000 services, 10 s of churn")
    p.add_argument(
        "--scale",
        action="store_true",
        help=f"{SCALE_SERVICES:,} services, 30 s of churn, the scale targets checked "
        "(scale_targets)",
    )
    p.add_argument("--services", type=int, default=0)
    p.add_argument("--churn-rate", type=float, default=1000.0)
    p.add_argument("--churn-seconds", type=float, default=0.0)
    p.add_argument("--decode-only", action="store_true")
    p.add_argument(
        "--no-steady-gc",
        action="store_true",
        help="keep tune_gc's thresholds during the churn (the agent's setting before "
        "steady_gc)",
    )
    p.add_argument(
        "--steady-gc-young",
        type=int,
        default=STEADY_GC_THRESHOLDS[0],
        help="the young-generation threshold of the steady-state collector settings "
        "(for measuring others than the agent's)",
    )
    p.add_argument(
        "--young-interval",
        type=float,
        default=YOUNG_COLLECT_INTERVAL,
        help="seconds between the timed young collections of the steady state "
        "(collect_young_periodically, as the agent runs them); 0: none",
    )
    p.add_argument(
        "--stall-stacks",
        default="",
        metavar="FILE",
        help="write the event loop's stacks sampled during its stalls to FILE (JSON)",
    )
    p.add_argument(
        "--memory-breakdown",
        action="store_true",
        help="trace the agent's allocations (tracemalloc) and report where the bytes are "
        "after the sync, per service (memory_* keys; tracing slows the sync and adds to "
        "the resident set)",
    )
    p.add_argument(
        "--phases",
        action="store_true",
        help="time the initial sync's phases (CPU per service: list pages, the applier "
        "and converter, the reconciler and the Ops; initial_sync_phase_* keys; the "
        "timing adds about a microsecond per call)",
    )
    args = p.parse_args(argv)
    n = args.services or (SCALE_SERVICES if args.scale else 2000 if args.quick else 10_000)
    seconds = args.churn_seconds or (10.0 if args.quick else 30.0)
    # The machine is shared: its load says how far the figures are from an idle run.
    result: dict[str, Any] = {"load_avg_1m_at_start": round(os.getloadavg()[0], 2)}
    result.update(decode_figures_apart())
    if not args.decode_only:
        steady = (args.steady_gc_young, *STEADY_GC_THRESHOLDS[1:])
        result.update(
            anyio.run(
                run,
                n,
                args.churn_rate,
                seconds,
                not args.no_steady_gc,
                steady,
                args.stall_stacks,
                args.young_interval,
                args.memory_breakdown,
                args.phases,
            )
        )
    result["load_avg_1m_at_end"] = round(os.getloadavg()[0], 2)
    if args.scale and not args.decode_only:
        result["scale_targets"] = scale_verdict(result)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
