"""Soak benchmark: the agent as its own process under a long endpoint churn; prints one JSON
object.

The fake API server (tests/k8s/fake_apiserver.py) runs in a child process with
``--services`` Services (one ClusterIP port, an EndpointSlice of 10 endpoints each,
benchmarks/lb.py's objects). The agent is ``statewright agent`` in a process of its own,
on kernel maps pinned under a directory of this run (no datapath attached, no netlink, no
manifests), listing and watching that server, with ``STATEWRIGHT_DEBUG_PROBE=1`` so that
it measures its own event loop (statewright/agent/components/debug.py). Once every
service is in the maps, the server replaces one endpoint address of one EndpointSlice at
``--rate`` events/s for ``--minutes``; then, churn still running, tracemalloc runs in the
agent for ``--tracemalloc-seconds`` (not part of the timed minutes: tracing slows every
allocation).

Keys:

- p99_ms_by_minute / p99_ms_worst_minute / p50_ms: event to map, from the server's write
  until the service's entries in the kernel map (``lb4_services`` slots, ``lb4_backends``)
  hold the new address, read by this process every millisecond; every ``--sample-every``-th
  event is timed (by the minute it was emitted in), into fixed-size histograms (0.1 ms
  buckets below 100 ms, 1 ms above). events_timed, events_unconfirmed (not in the map
  within 10 s).
- apply_p50_ms / apply_p99_ms / apply_p99_ms_by_minute: the agent's own part of the
  latency from a change's delivery by its watch to the commit of its batch to the tables
  (``k8s.apply_latency`` of ``/debug/probe``, 0.5 ms buckets), over the timed minutes: the
  rest of an event's latency is the server, the watch stream and the reconciler.
- stall_ms_max / stalls_over_50ms / stalls_over_20ms / loop_lag_counts: the agent's own
  event-loop lateness (a 1 ms sleep, statewright/agent/loop_probe.py) over the timed
  minutes; stalls_worst: the longest stalls (``at_s`` from the churn's start, ms, CPU ms
  of the loop's thread, run-queue ms, the stacks sampled meanwhile) for finding what held
  the loop. stall_cpu_ms_max / stalls_over_50ms_cpu: the same by the CPU time the loop's
  thread ran during each stall (/proc/thread-self/schedstat): on a loaded machine a stall
  is mostly waiting for a CPU (run queue), which is the machine's, not the agent's work.
- gc_passes_by_generation / gc_passes_longest: the agent's collector passes during the
  timed minutes, and the longest (CPU ms, objects collected, ``at_s``);
  gc_collected_by_generation / gc_cpu_ms_by_generation: the objects those passes found
  unreachable (cyclic garbage) and their CPU in all.
- rss_mb_after_sync, rss_mb_start (the churn's start), rss_mb_end,
  rss_mb_per_hour_after_warmup: the agent process' resident memory, sampled every 10 s;
  the slope is a least-squares fit after the first ``warmup_minutes`` (5; a third of the
  run when it is shorter than 10 minutes).
- tracemalloc_top: the 5 source lines whose live memory grew most in the agent during the
  second half of the traced window (the baseline snapshot is taken once every service was
  churned under tracing, so replaced state does not count as growth), from the agent's
  own snapshots (statewright/agent/loop_probe.py, MemoryTracer).
- server_late_ms_max / server_late_ms_by_minute: how far the fake server fell behind its
  schedule (a late server emits a burst that the agent then works off: lateness there is
  not the agent's, and a minute's p99 is to be read beside it).
- agent_cpu_us_per_event / agent_cpu_cores: the agent process' CPU time (all threads)
  over the timed minutes per event, and as a share of one core: what the churn costs
  whatever the machine's load.
- load_avg_1m_by_minute, load_avg_1m_at_start / _at_end: the shared machine's load.
- steal_ms_by_minute: CPU time the hypervisor took from this virtual machine each minute
  (all CPUs, /proc/stat): a stall or a late server in a minute with steal may be neither
  the agent's nor the machine's other work.

``--agent-nice N`` runs the agent at nice value N (a node agent's CPU reservation on a
machine others load: at a load average of 10 on 2 cores an agent at nice 0 gets a fraction
of the core it needs at 1,000 events/s, falls behind, and its figures measure the backlog).
``--agent-cpus LIST`` pins the agent to those CPUs (taskset), for a run where the agent has
a core of its own and the machine's other work is kept off that core (a cpuset).
``--quick``: 3 minutes, 60 s of tracemalloc. ``--seconds S`` (with ``--services`` and
``--rate``) makes a tiny run for the tests. Needs root with bpffs (kernel maps): the pins
and the agent's state are removed at the end, also on failure.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import argparse
import bisect
import contextlib
import gc
import http.client
import ipaddress
import itertools
import json
import multiprocessing
import multiprocessing.connection
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections import Counter
from typing import Any

from benchmarks.lb import BACKENDS_PER_SERVICE, service_obj, slice_obj
from sources.apply_latency import quantile_of

NODE = "bench-node"
REPO = Path(__file__).resolve().parent.parent
#: An event not in the map this long after its emission counts as unconfirmed.
CONFIRM_TIMEOUT_S = 10.0
#: Seconds between two samples of the agent's memory and loop probe.
SAMPLE_S = 10.0


def churn_ip(gen: int) -> str:
    """The endpoint address churn event ``gen`` (1-based) introduces (`slice_obj`)."""
    return str(ipaddress.ip_address(int(ipaddress.ip_address("10.200.0.0")) + gen))


def churn_service(k: int, n: int) -> int:
    """The service churn event ``k`` (0-based) changes."""
    return (k * 7919) % n


def service_ip(i: int) -> str:
    """The ClusterIP of service ``i`` (`service_obj`)."""
    return str(ipaddress.ip_address("10.96.0.0") + i + 1)


# ----- the server process -----------------------------------------------------------------
def _server(conn: multiprocessing.connection.Connection, kubeconfig: str, n: int) -> None:
    """Child process: populate, then churn on ("churn", rate, every) until ("stop",);
    sends ("emitted", [(k, when), ...]) for every ``every``-th event as it goes."""
    from tests.k8s.fake_apiserver import FakeAPIServer

    srv = FakeAPIServer(bookmark_interval=5.0, history_limit=20_000).start()
    try:
        srv.write_kubeconfig(kubeconfig)
        for i in range(n):
            srv.upsert(service_obj(i))
            srv.upsert(slice_obj(i))
        srv.upsert({"kind": "Node", "metadata": {"name": NODE, "labels": {}}})
        # The server's collector stays off the churn (benchmarks/k8s.py: its passes held
        # events back by up to 400 ms, which would count as the agent's latency).
        gc.collect()
        gc.freeze()
        conn.send(("ready",))
        cmd = conn.recv()
        if cmd[0] != "churn":
            return
        _, rate, every = cmd
        gc.disable()
        _churn(srv, conn, n, rate, every)
    finally:
        srv.stop()


def _churn(srv: Any, conn: multiprocessing.connection.Connection, n: int, rate: float,
           every: int) -> None:
    t0 = time.monotonic()
    conn.send(("started", t0))
    late_by_minute: list[float] = []
    k = 0
    while True:
        due = t0 + k / rate
        now = time.monotonic()
        if due > now:
            time.sleep(due - now)
        else:
            minute = int((due - t0) // 60)
            while len(late_by_minute) <= minute:
                late_by_minute.append(0.0)
            late_by_minute[minute] = max(late_by_minute[minute], now - due)
        if k % 50 == 0 and conn.poll():
            break
        emitted = time.monotonic()
        srv.upsert(slice_obj(churn_service(k, n), k + 1))
        # Each timed event is announced as it is emitted: the reader checks the map only
        # for events it knows of, so an announcement held back (batched) would add its
        # delay to every latency measured.
        if k % every == 0:
            conn.send(("emitted", [(k, emitted)]))
        k += 1
    with open("/proc/self/status") as f:
        rss = next((int(x.split()[1]) / 1024 for x in f if x.startswith("VmRSS:")), 0.0)
    conn.send(("stopped", k, [round(x * 1000, 1) for x in late_by_minute], round(rss, 1)))


# ----- reading the agent's maps -----------------------------------------------------------
class MapReader:
    """The agent's pinned ``lb4_services`` / ``lb4_backends``, read from this process."""

    def __init__(self, pin_dir: str) -> None:
        from bpf import lb
        from bpf.catalog import lb_specs
        from bpf.kernel_map import KernelMap
        from bpf.typed_map import TypedMap

        specs = {s.name: s for s in lb_specs()}
        self._lb = lb
        self.services = TypedMap(
            specs["lb4_services"],
            KernelMap.open_pinned(os.path.join(pin_dir, "lb4_services"), specs["lb4_services"]),
        )
        self.backends = TypedMap(
            specs["lb4_backends"],
            KernelMap.open_pinned(os.path.join(pin_dir, "lb4_backends"), specs["lb4_backends"]),
        )
        self.template: Any = None

    def complete_services(self) -> int:
        """How many frontends have every backend slot (a full pass over the map)."""
        full = 0
        for key, value in self.services.items():
            if key.backend_slot == 0 and value.count == BACKENDS_PER_SERVICE:
                full += 1
                self.template = key
        return full

    def has_backend(self, svc_ip: bytes, backend_ip: bytes) -> bool:
        """Whether the frontend at ``svc_ip`` has a backend slot with ``backend_ip``."""
        lb, t = self._lb, self.template
        master = self.services.lookup(lb.Service4Key(svc_ip, t.dport, 0, t.proto, t.scope))
        if master is None:
            return False
        for slot in range(1, master.count + 1):
            v = self.services.lookup(lb.Service4Key(svc_ip, t.dport, slot, t.proto, t.scope))
            if v is None:
                continue
            be = self.backends.lookup(v.backend_id)
            if be is not None and be.address == backend_ip:
                return True
        return False

    def close(self) -> None:
        """Close both maps."""
        self.services.close()
        self.backends.close()


# ----- bounded bookkeeping ------------------------------------------------------------------
class Histogram:
    """Latencies (ms) in fixed buckets: 0.1 ms wide below 100 ms, 1 ms wide above."""

    def __init__(self) -> None:
        self.counts: Counter[int] = Counter()
        self.total = 0

    def add(self, ms: float) -> None:
        """Count one latency."""
        self.counts[int(ms * 10) if ms < 100 else 1000 + int(ms) - 100] += 1
        self.total += 1

    def merge(self, other: Histogram) -> None:
        """Add ``other``'s counts."""
        self.counts.update(other.counts)
        self.total += other.total

    def quantile(self, q: float) -> float:
        """The q-quantile (upper edge of its bucket), 0.0 when empty."""
        if not self.total:
            return 0.0
        rank = max(1, int(self.total * q + 0.999999))
        seen = 0
        for b in sorted(self.counts):
            seen += self.counts[b]
            if seen >= rank:
                return round((b + 1) / 10 if b < 1000 else b - 1000 + 101, 1)
        return 0.0


def slope_per_hour(samples: list[tuple[float, float]]) -> float:
    """Least-squares slope of (seconds, MB) samples, in MB per hour."""
    if len(samples) < 2:
        return 0.0
    mx = sum(t for t, _ in samples) / len(samples)
    my = sum(v for _, v in samples) / len(samples)
    var = sum((t - mx) ** 2 for t, _ in samples)
    if var == 0:
        return 0.0
    cov = sum((t - mx) * (v - my) for t, v in samples)
    return round(cov / var * 3600, 2)


class _UnixHTTP(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self.unix_path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.unix_path)


def api(sock: str, path: str, body: Any = None, timeout: float = 120.0) -> Any:
    """GET (or POST ``body``) ``path`` on the agent's socket; the decoded JSON answer."""
    conn = _UnixHTTP(sock, timeout)
    try:
        if body is None:
            conn.request("GET", path)
        else:
            conn.request("POST", path, json.dumps(body),
                         {"Content-Type": "application/json"})
        resp = conn.getresponse()
        data = resp.read()
        if resp.status != 200:
            raise RuntimeError(f"agent {path}: {resp.status} {data[:300]!r}")
        return json.loads(data)
    finally:
        conn.close()


def _steal_ms() -> float:
    """The machine's steal time so far, all CPUs, in ms (0 where /proc/stat has none)."""
    with open("/proc/stat") as f:
        fields = f.readline().split()
    steal = int(fields[8]) if len(fields) > 8 else 0
    return steal * 1000 / os.sysconf("SC_CLK_TCK")


def _agent_cpu_s(pid: int) -> float:
    """CPU seconds (user + system, all threads) the agent process used so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _agent_rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


# ----- the run ------------------------------------------------------------------------------
class Run:
    """One soak run's places, processes and figures."""

    def __init__(self, args: argparse.Namespace, tmp: Path) -> None:
        self.args = args
        self.tmp = tmp
        self.sock = str(tmp / "agent.sock")
        self.pin_dir = f"/sys/fs/bpf/statewright-soak-{os.getpid()}"
        self.config = tmp / "agent.yaml"
        self.agent: subprocess.Popen[bytes] | None = None
        self.out: dict[str, Any] = {}

    def write_config(self, kubeconfig: str) -> None:
        n = self.args.services
        entries = 1 << max(16, (n * (BACKENDS_PER_SERVICE + 1) * 2).bit_length())
        cfg = {
            "backend": "kernel",
            "pin-dir": self.pin_dir,
            "state-dir": str(self.tmp / "state"),
            "api-socket": self.sock,
            "manifests": [],
            "k8s-kubeconfig": kubeconfig,
            "node-name": NODE,
            "datapath": False,
            "endpoint-datapath": False,
            "netlink": False,
            "sysctl": False,  # a benchmark leaves the machine's kernel settings alone
            "lb-flags": [f"--bpf-lb-map-max={entries}"],
        }
        self.config.write_text(json.dumps(cfg))

    def start_agent(self) -> None:
        env = {**os.environ, "STATEWRIGHT_DEBUG_PROBE": "1"}
        log = open(self.tmp / "agent.log", "ab")  # noqa: SIM115 - handed to the process
        nice = ["nice", "-n", str(self.args.agent_nice)] if self.args.agent_nice else []
        pin = ["taskset", "-c", self.args.agent_cpus] if self.args.agent_cpus else []
        argv = [sys.executable, "-m", "statewright", "agent", "--config", str(self.config)]
        self.agent = subprocess.Popen(
            [*pin, *nice, *argv],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=REPO, env=env,
        )
        log.close()

    def stop_agent(self) -> None:
        if self.agent is not None and self.agent.poll() is None:
            os.kill(self.agent.pid, signal.SIGTERM)
            try:
                self.agent.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.kill(self.agent.pid, signal.SIGKILL)
                self.agent.wait(timeout=10)
        subprocess.run(
            [sys.executable, "-m", "statewright", "agent", "--cleanup", "--config",
             str(self.config)],
            cwd=REPO, capture_output=True, timeout=120, check=False,
        )
        shutil.rmtree(self.pin_dir, ignore_errors=True)

    def log_tail(self) -> str:
        with contextlib.suppress(OSError):
            return (self.tmp / "agent.log").read_text(errors="replace")[-3000:]
        return ""

    def wait_synced(self, timeout: float) -> MapReader:
        """Until every service has all its backends in the kernel map."""
        assert self.agent is not None
        deadline = time.monotonic() + timeout
        reader: MapReader | None = None
        while True:
            if self.agent.poll() is not None:
                raise RuntimeError(f"the agent exited with {self.agent.returncode}:\n"
                                   f"{self.log_tail()}")
            if reader is None and os.path.exists(os.path.join(self.pin_dir, "lb4_backends")):
                with contextlib.suppress(Exception):
                    reader = MapReader(self.pin_dir)
            if reader is not None and reader.complete_services() >= self.args.services:
                return reader
            if time.monotonic() > deadline:
                raise RuntimeError(f"the agent did not sync within {timeout} s:\n"
                                   f"{self.log_tail()}")
            time.sleep(0.5)


class Churn:
    """The churn's bookkeeping: pending timed events, per-minute histograms, samples."""

    def __init__(self, run: Run, reader: MapReader, conn: multiprocessing.connection.Connection,
                 t0: float) -> None:
        self.run = run
        self.reader = reader
        self.conn = conn
        self.t0 = t0
        self.n = run.args.services
        self.pending: list[tuple[int, float]] = []
        self.lock = threading.Lock()
        self.minutes: list[Histogram] = []
        self.unconfirmed = 0
        self.recording = True
        self.stopped: tuple[Any, ...] | None = None
        self.reader_thread = threading.Thread(target=self._receive, daemon=True)
        self.reader_thread.start()

    def _receive(self) -> None:
        while True:
            try:
                msg = self.conn.recv()
            except (EOFError, OSError):
                return
            if msg[0] == "emitted":
                with self.lock:
                    self.pending.extend(msg[1])
            elif msg[0] == "stopped":
                self.stopped = msg
                return

    def poll(self) -> None:
        """Check the pending events against the map once."""
        with self.lock:
            pending, self.pending = self.pending, []
        keep: list[tuple[int, float]] = []
        now = time.monotonic()
        for k, emitted in pending:
            svc = ipaddress.ip_address(service_ip(churn_service(k, self.n))).packed
            new = ipaddress.ip_address(churn_ip(k + 1)).packed
            if self.reader.has_backend(svc, new):
                self._record(emitted, (now - emitted) * 1000)
            elif now - emitted > CONFIRM_TIMEOUT_S:
                if self.recording:
                    self.unconfirmed += 1
            else:
                keep.append((k, emitted))
        if keep:
            with self.lock:
                self.pending[:0] = keep

    def _record(self, emitted: float, ms: float) -> None:
        if not self.recording:
            return
        minute = int((emitted - self.t0) // 60)
        while len(self.minutes) <= minute:
            self.minutes.append(Histogram())
        self.minutes[minute].add(ms)

    def run_for(self, seconds: float, on_sample: Any) -> None:
        """Poll every millisecond for ``seconds``; ``on_sample()`` every `SAMPLE_S`."""
        end = time.monotonic() + seconds
        next_sample = time.monotonic() + min(SAMPLE_S, seconds)
        while True:
            now = time.monotonic()
            if now >= end:
                break
            if self.run.agent is not None and self.run.agent.poll() is not None:
                raise RuntimeError(f"the agent exited with {self.run.agent.returncode}:\n"
                                   f"{self.run.log_tail()}")
            self.poll()
            if now >= next_sample:
                on_sample()
                next_sample += SAMPLE_S
            time.sleep(0.001)


class Probe:
    """The agent's loop probe and memory, sampled every `SAMPLE_S` (bounded: the kept
    stalls are the longest `KEEP_STALLS`)."""

    KEEP_STALLS = 12

    def __init__(self, run: Run, t0: float) -> None:
        self.run = run
        self.t0 = t0
        self.since = 0.0
        self.base_counts: list[int] | None = None
        self.counts: list[int] = []
        self.buckets: list[float] = []
        self.stall_max = 0.0
        self.over50 = 0
        self.over20 = 0
        self.cpu_max = 0.0
        self.cpu_over50 = 0
        self.worst: list[dict[str, Any]] = []
        self.last_stall_at = 0.0
        self.last_gc_at = 0.0
        self.rss: list[tuple[float, float]] = []
        self.loads: list[float] = []
        # The machine's steal time (ms, all CPUs) at the start of each minute, and now.
        self.steal_marks: list[float] = []
        self.steal_now = 0.0
        self.gc_base: list[int] = [0, 0, 0]
        self.gc_passes: list[int] = [0, 0, 0]
        self.gc_totals_base: dict[str, list[float]] = {}
        self.gc_totals: dict[str, list[float]] = {}
        self.gc_long: list[dict[str, Any]] = []
        # The agent's delivery-to-commit histogram: its reading at the churn's start and
        # at the start of each minute since (bucket index -> count, cumulative).
        self.apply_marks: list[dict[str, int]] = []
        self.apply_now: dict[str, int] = {}

    def start(self) -> None:
        doc = api(self.run.sock, "/debug/probe")
        self.since = self.last_stall_at = self.last_gc_at = time.monotonic()
        self.base_counts = doc["loop"]["lag_counts"]
        self.gc_base = doc["gc"]["passes"]
        self.gc_totals_base = self._gc_totals(doc)
        self.buckets = doc["loop"]["lag_buckets_ms"]
        self.apply_now = self._apply_buckets(doc)
        self.apply_marks = [self.apply_now]

    def sample(self) -> None:
        assert self.run.agent is not None
        now = time.monotonic()
        self.rss.append((now - self.t0, _agent_rss_mb(self.run.agent.pid)))
        if int((now - self.t0) // 60) >= len(self.loads):
            self.loads.append(round(os.getloadavg()[0], 2))
        steal = _steal_ms()
        if int((now - self.t0) // 60) >= len(self.steal_marks):
            self.steal_marks.append(steal)
        self.steal_now = steal
        doc = api(self.run.sock, f"/debug/probe?since_ms={int(self.since * 1000)}")
        loop = doc["loop"]
        self.apply_now = self._apply_buckets(doc)
        if int((now - self.t0) // 60) >= len(self.apply_marks):
            self.apply_marks.append(self.apply_now)
        assert self.base_counts is not None
        self.counts = [a - b for a, b in zip(loop["lag_counts"], self.base_counts)]
        self.gc_passes = [a - b for a, b in zip(doc["gc"]["passes"], self.gc_base)]
        self.gc_totals = {
            k: [round(a - b, 1) for a, b in zip(v, self.gc_totals_base.get(k, [0, 0, 0]))]
            for k, v in self._gc_totals(doc).items()
        }
        # ``since_ms`` is whole milliseconds: what one sample returned last may come back
        # in the next one, so each list is cut at the newest entry already counted.
        gc_cut, stall_cut = self.last_gc_at, self.last_stall_at
        for p in doc["gc"]["long_passes"]:
            if p["at"] > gc_cut:
                self.last_gc_at = max(self.last_gc_at, p["at"])
                p["at_s"] = round(p.pop("at") - self.t0, 1)
                bisect.insort(self.gc_long, p, key=lambda x: -x["cpu_ms"])
                del self.gc_long[self.KEEP_STALLS:]
        for s in loop["stalls"]:
            if s["at"] <= stall_cut:
                continue
            self.last_stall_at = max(self.last_stall_at, s["at"])
            self.since = max(self.since, s["at"])
            ms = s["ms"]
            self.stall_max = max(self.stall_max, ms)
            self.over20 += ms > 20
            self.over50 += ms > 50
            self.cpu_max = max(self.cpu_max, s["cpu_ms"])
            self.cpu_over50 += s["cpu_ms"] > 50
            s["stacks"] = s["stacks"][:3]
            s["at_s"] = round(s.pop("at") - self.t0, 1)
            bisect.insort(self.worst, s, key=lambda x: -x["ms"])
            del self.worst[self.KEEP_STALLS:]


    @staticmethod
    def _gc_totals(doc: dict[str, Any]) -> dict[str, list[float]]:
        return {k: doc["gc"][k] for k in ("collected", "cpu_ms_total") if k in doc["gc"]}

    @staticmethod
    def _apply_buckets(doc: dict[str, Any]) -> dict[str, int]:
        return dict(doc.get("k8s", {}).get("apply_latency", {}).get("buckets", {}))

    def apply_figures(self) -> dict[str, Any]:
        """Delivery to commit in the agent over the timed minutes: p50, p99, p99 by minute."""
        marks = [*self.apply_marks, self.apply_now]
        if len(marks) > 2 and marks[-1] is marks[-2]:  # the last sample began a minute
            marks.pop()

        def p(a: dict[str, int], b: dict[str, int], q: float) -> float:
            diff = [0] * (1 + max((int(k) for k in b), default=0))
            for k, v in b.items():
                diff[int(k)] = v - a.get(k, 0)
            return quantile_of(diff, q)

        first, last = marks[0], marks[-1]
        return {
            "apply_p50_ms": p(first, last, 0.5),
            "apply_p99_ms": p(first, last, 0.99),
            "apply_p99_ms_by_minute": [p(a, b, 0.99) for a, b in itertools.pairwise(marks)],
        }


def _figures(churn: Churn, probe: Probe, warmup_s: float) -> dict[str, Any]:
    out: dict[str, Any] = {}
    every = Histogram()
    for h in churn.minutes:
        every.merge(h)
    by_minute = [h.quantile(0.99) for h in churn.minutes]
    out["p99_ms_by_minute"] = by_minute
    out["p99_ms_worst_minute"] = max(by_minute, default=0.0)
    out["p50_ms"] = every.quantile(0.5)
    out["p99_ms"] = every.quantile(0.99)
    out["events_timed"] = every.total
    out["events_unconfirmed"] = churn.unconfirmed
    out.update(probe.apply_figures())
    out["stall_ms_max"] = round(probe.stall_max, 1)
    out["stalls_over_50ms"] = probe.over50
    out["stalls_over_20ms"] = probe.over20
    out["stall_cpu_ms_max"] = round(probe.cpu_max, 1)
    out["stalls_over_50ms_cpu"] = probe.cpu_over50
    out["loop_lag_buckets_ms"] = probe.buckets
    out["loop_lag_counts"] = probe.counts
    out["stalls_worst"] = probe.worst
    out["gc_passes_by_generation"] = probe.gc_passes
    out["gc_collected_by_generation"] = probe.gc_totals.get("collected", [])
    out["gc_cpu_ms_by_generation"] = probe.gc_totals.get("cpu_ms_total", [])
    out["gc_passes_longest"] = probe.gc_long
    out["rss_mb_start"] = round(probe.rss[0][1], 1) if probe.rss else 0.0
    out["rss_mb_end"] = round(probe.rss[-1][1], 1) if probe.rss else 0.0
    out["warmup_minutes"] = round(warmup_s / 60, 2)
    out["rss_mb_per_hour_after_warmup"] = slope_per_hour(
        [(t, v) for t, v in probe.rss if t >= warmup_s]
    )
    out["rss_mb_by_minute"] = [
        round(v, 1) for i, (t, v) in enumerate(probe.rss)
        if i == 0 or int(t // 60) != int(probe.rss[i - 1][0] // 60)
    ]
    out["load_avg_1m_by_minute"] = probe.loads
    marks = [*probe.steal_marks, probe.steal_now]
    out["steal_ms_by_minute"] = [round(b - a, 1) for a, b in itertools.pairwise(marks)][
        : len(probe.loads)
    ]
    return out


def _tracemalloc(run: Run, churn: Churn, seconds: float) -> list[dict[str, Any]]:
    """tracemalloc in the agent for ``seconds`` (the churn running): its top growths."""
    api(run.sock, "/debug/tracemalloc", {"action": "start", "frames": 1})
    try:
        # The baseline once every service was churned under tracing (see MemoryTracer).
        first = min(1.5 * run.args.services / run.args.rate + 5, seconds / 2)
        churn.run_for(first, lambda: None)
        api(run.sock, "/debug/tracemalloc", {"action": "snapshot"}, timeout=900)
        churn.run_for(seconds - first, lambda: None)
        doc = api(run.sock, "/debug/tracemalloc", {"action": "snapshot", "top": 5},
                  timeout=900)
    finally:
        api(run.sock, "/debug/tracemalloc", {"action": "stop"})
    return list(doc["top"])


def soak(args: argparse.Namespace) -> dict[str, Any]:
    """The whole run (module docstring); returns the figures."""
    from bpf.probe import kernel_support

    support = kernel_support()
    if not support.ok:
        raise SystemExit(f"soak: needs kernel maps: {support.reason}")
    out: dict[str, Any] = {"services": args.services, "rate": args.rate,
                           "seconds": args.seconds, "agent_nice": args.agent_nice,
                           "agent_cpus": args.agent_cpus}
    ctx = multiprocessing.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix=f"statewright-soak-{os.getpid()}-") as tmp_s:
        tmp = Path(tmp_s)
        run = Run(args, tmp)
        parent, child = ctx.Pipe()
        kubeconfig = str(tmp / "kubeconfig")
        server = ctx.Process(target=_server, args=(child, kubeconfig, args.services),
                             daemon=True)
        server.start()
        reader: MapReader | None = None
        try:
            if parent.recv() != ("ready",):
                raise RuntimeError("the fake API server did not start")
            run.write_config(kubeconfig)
            t_start = time.monotonic()
            run.start_agent()
            reader = run.wait_synced(timeout=max(120.0, args.services / 50))
            out["initial_sync_s"] = round(time.monotonic() - t_start, 1)
            assert run.agent is not None
            out["rss_mb_after_sync"] = round(_agent_rss_mb(run.agent.pid), 1)
            out.update(_churn_phase(args, run, reader, parent))
        finally:
            # The agent before the API server it lists from: SIGTERM during the agent's
            # start (a soak stopped early) is acted on once the start is done, which
            # with the server gone waits out the retries (10 s).
            if reader is not None:
                reader.close()
            try:
                run.stop_agent()
            finally:
                with contextlib.suppress(Exception):
                    parent.send(("stop",))
                server.join(timeout=30)
                if server.is_alive():
                    server.kill()
                    server.join()
    return out


def _churn_phase(args: argparse.Namespace, run: Run, reader: MapReader,
                 conn: multiprocessing.connection.Connection) -> dict[str, Any]:
    conn.send(("churn", args.rate, args.sample_every))
    msg = conn.recv()
    assert msg[0] == "started", msg
    t0 = msg[1]
    churn = Churn(run, reader, conn, t0)
    probe = Probe(run, t0)
    probe.start()
    probe.sample()
    assert run.agent is not None
    cpu0 = _agent_cpu_s(run.agent.pid)
    churn.run_for(args.seconds, probe.sample)
    cpu = _agent_cpu_s(run.agent.pid) - cpu0
    probe.sample()
    warmup_s = 300.0 if args.seconds >= 600 else args.seconds / 3
    out = _figures(churn, probe, warmup_s)
    # What the churn costs the agent, whatever the machine's load: CPU per event, and
    # the share of one core it needs at this rate.
    out["agent_cpu_us_per_event"] = round(cpu / (args.seconds * args.rate) * 1e6, 1)
    out["agent_cpu_cores"] = round(cpu / args.seconds, 2)
    churn.recording = False
    if args.tracemalloc_seconds > 0:
        out["tracemalloc_seconds"] = args.tracemalloc_seconds
        try:
            out["tracemalloc_top"] = _tracemalloc(run, churn, args.tracemalloc_seconds)
        except (OSError, RuntimeError) as e:  # the timed figures stand without it
            out["tracemalloc_top"] = []
            out["tracemalloc_error"] = str(e)
    conn.send(("stop",))
    churn.reader_thread.join(timeout=30)
    if churn.stopped is not None:
        out["churn_events"] = churn.stopped[1]
        out["server_late_ms_max"] = max(churn.stopped[2], default=0.0)
        out["server_late_ms_by_minute"] = churn.stopped[2]
        out["server_rss_mb_end"] = churn.stopped[3]
    return out


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--minutes", type=float, default=30.0, help="timed churn (default 30)")
    p.add_argument("--quick", action="store_true", help="3 minutes, 60 s of tracemalloc")
    p.add_argument("--seconds", type=float, default=0.0,
                   help="timed churn in seconds (overrides --minutes; for tiny test runs)")
    p.add_argument("--services", type=int, default=10_000)
    p.add_argument("--rate", type=float, default=1000.0, help="endpoint events per second")
    p.add_argument("--sample-every", type=int, default=10,
                   help="time every N-th event against the map")
    p.add_argument("--tracemalloc-seconds", type=float, default=None,
                   help="tracemalloc window after the timed churn (default 120, --quick 60; "
                   "0: none)")
    p.add_argument("--agent-nice", type=int, default=0,
                   help="run the agent at this nice value (e.g. -10: the CPU share a node "
                   "agent gets from its reservation on a machine loaded by others)")
    p.add_argument("--agent-cpus", default="",
                   help="run the agent on these CPUs only (taskset list, e.g. 1: a core "
                   "reserved for the agent; other work kept off it is the caller's part)")
    args = p.parse_args(argv)
    if args.quick:
        args.minutes = 3.0
    if not args.seconds:
        args.seconds = args.minutes * 60
    if args.tracemalloc_seconds is None:
        args.tracemalloc_seconds = 60.0 if args.quick or args.seconds < 600 else 120.0
    return args


def _exit_on_sigterm(signum: int, frame: Any) -> None:
    """SIGTERM (``timeout``, ``kill``) ends the run like Ctrl-C: through `soak`'s cleanup,
    which stops the agent and the fake server and removes the pinned maps."""
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    """Run and print the JSON figures."""
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    result: dict[str, Any] = {"load_avg_1m_at_start": round(os.getloadavg()[0], 2)}
    result.update(soak(args))
    result["load_avg_1m_at_end"] = round(os.getloadavg()[0], 2)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
