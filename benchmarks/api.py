"""API benchmark: /health latency over the agent's unix socket, idle and under load; prints
one JSON object.

The agent runs as its own process (``statewright agent``, memory maps, a manifests
directory of ``--services`` ClusterIP services so ``/tables/frontends`` has rows). The
client opens one connection per request, as the CLI does.

Keys:

- health_p50_ms / health_p99_ms: ``GET /health`` latency, ``--requests`` one after another
  with nothing else talking to the agent.
- health_p50_ms_under_load / health_p99_ms_under_load: the same while ``--hammers`` other
  processes each loop ``GET /tables/frontends`` and ``PUT``+``DELETE /endpoint/{id}``
  (alternating) as fast as the agent answers them.
- requests_per_s: requests the hammering processes got answered per second meanwhile
  (``tables_per_s`` and ``endpoint_changes_per_s`` split it); hammer_errors counts
  answers other than success (200; 201 for the PUT).
- import_starlette_uvicorn_ms / _rss_mb: a fresh interpreter importing the ASGI stack
  (starlette's application, routing and responses, uvicorn) minus one importing nothing,
  median of 5; ``..._after_agent``: the same once the agent's other components are
  imported (asyncio, logging, ssl, http.client are shared: this is what the stack adds
  to an agent start). import_pydantic_*: the same for pydantic, what FastAPI would add on
  top of Starlette (its models are pydantic's), when pydantic is installed.
- agent_rss_mb: the agent's resident memory after the run.
- load_avg_1m_before / load_avg_1m_after: the machine's load around the run (it is shared;
  figures from a loaded machine are pessimistic).

``--quick`` is a short run (well under a minute).
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import multiprocessing
import multiprocessing.synchronize
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent

SERVICE = """\
apiVersion: v1
kind: Service
metadata: {{name: bench-{i}, namespace: bench}}
spec:
  clusterIP: 10.96.{hi}.{lo}
  ports: [{{name: http, port: 80, protocol: TCP, targetPort: 8080}}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: bench-{i}-1
  namespace: bench
  labels: {{kubernetes.io/service-name: bench-{i}}}
addressType: IPv4
endpoints:
- addresses: [10.244.{hi}.{lo}]
  conditions: {{ready: true}}
ports: [{{name: http, port: 8080, protocol: TCP}}]
"""


def request(sock_path: str, method: str, target: str, body: Any = None
            ) -> tuple[int, bytes]:
    """One request on a new connection: (status, body)."""
    conn = http.client.HTTPConnection("agent", timeout=30)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(30)
    s.connect(sock_path)
    conn.sock = s
    try:
        data = None if body is None else json.dumps(body).encode()
        conn.request(method, target, body=data)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def health_latencies(sock_path: str, n: int) -> list[float]:
    """``n`` GET /health latencies in ms."""
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        status, _ = request(sock_path, "GET", "/health")
        out.append((time.perf_counter() - t0) * 1000)
        if status != 200:
            raise RuntimeError(f"/health answered {status}")
    return out


def hammer(sock_path: str, index: int, stop: multiprocessing.synchronize.Event,
           results: Any) -> None:
    """Loop GET /tables/frontends and PUT+DELETE /endpoint/{id} until ``stop``."""
    tables = changes = errors = 0
    ep = 1000 + index
    while not stop.is_set():
        status, _ = request(sock_path, "GET", "/tables/frontends")
        tables += 1
        errors += status != 200
        status, _ = request(sock_path, "PUT", f"/endpoint/{ep}",
                            {"container-id": f"bench-{index}",
                             "interface-name": f"lxcbench{index}",
                             "k8s-pod-name": f"bench-{index}", "k8s-namespace": "bench",
                             "labels": ["k8s:app=bench"]})
        errors += status != 201  # Created, as Cilium's API
        status, _ = request(sock_path, "DELETE", f"/endpoint/{ep}")
        errors += status != 200
        changes += 2
    results.put({"tables": tables, "changes": changes, "errors": errors})


#: The ASGI stack the API server imports.
STACK = "starlette.applications, starlette.routing, starlette.responses, uvicorn"
#: What the agent imports besides its API stack (every other component).
AGENT_REST = ("statewright.agent.components.statedb, statewright.agent.components.lb, "
              "statewright.agent.components.endpoints, statewright.agent.components.kubernetes, "
              "statewright.agent.components.sources, statewright.agent.components.node")


def import_cost(modules: str, after: str = "sys") -> tuple[float, float] | None:
    """Median (ms, RSS MB) of a fresh interpreter importing ``modules`` once it imported
    ``after`` (None when one is not installed)."""
    code = (
        f"import {after}\n"
        "import resource, time\n"
        "r0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "t0 = time.perf_counter()\n"
        f"import {modules}\n"
        "t1 = time.perf_counter()\n"
        "r1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "print((t1 - t0) * 1000, (r1 - r0) / 1024)\n"
    )
    runs = []
    for _ in range(5):
        res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             cwd=REPO, timeout=60)
        if res.returncode != 0:
            return None
        ms, mb = res.stdout.split()
        runs.append((float(ms), float(mb)))
    return (statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs))


def rss_mb(pid: int) -> float:
    """Resident memory of ``pid`` in MB."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def start_agent(tmp: str, services: int) -> tuple[subprocess.Popen[bytes], str]:
    """An agent on memory maps in ``tmp`` with ``services`` services; waits for /health."""
    manifests = os.path.join(tmp, "manifests")
    os.makedirs(manifests)
    with open(os.path.join(manifests, "bench.yaml"), "w") as f:
        f.write("---\n".join(SERVICE.format(i=i, hi=1 + i // 250, lo=1 + i % 250)
                             for i in range(services)))
    sock = os.path.join(tmp, "agent.sock")
    log = open(os.path.join(tmp, "agent.log"), "wb")  # noqa: SIM115 - the agent owns it
    proc = subprocess.Popen(
        [sys.executable, "-m", "statewright", "agent", "--api-socket", sock,
         "--backend", "memory", "--pin-dir", os.path.join(tmp, "pins"),
         "--state-dir", os.path.join(tmp, "state"), "--manifests", manifests,
         "--no-netlink", "--no-sysctl"],  # a benchmark leaves the machine's settings alone
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=REPO,
    )
    log.close()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(Path(tmp, "agent.log").read_text())
        with contextlib.suppress(OSError):
            status, body = request(sock, "GET", "/tables/frontends")
            if status == 200 and len(json.loads(body)) >= services:
                return proc, sock
        time.sleep(0.1)
    stop_agent(proc)
    raise RuntimeError("the agent did not load the services within 60 s")


def stop_agent(proc: subprocess.Popen[bytes]) -> None:
    """Stop the agent this script started, by its PID."""
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


def pct(values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values``."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    """Run and print the JSON object."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a short run")
    ap.add_argument("--requests", type=int, default=0, help="health requests per phase")
    ap.add_argument("--services", type=int, default=200, help="services in the manifests")
    ap.add_argument("--hammers", type=int, default=2, help="loading processes")
    args = ap.parse_args()
    n = args.requests or (300 if args.quick else 2000)
    out: dict[str, Any] = {"load_avg_1m_before": round(os.getloadavg()[0], 2),
                           "services": args.services, "health_requests": n,
                           "hammers": args.hammers}
    tmp = tempfile.mkdtemp(prefix="sw-bench-api-")
    proc, sock = start_agent(tmp, args.services)
    try:
        health_latencies(sock, 20)  # warm up
        idle = health_latencies(sock, n)
        out["health_p50_ms"] = round(statistics.median(idle), 3)
        out["health_p99_ms"] = round(pct(idle, 0.99), 3)

        ctx = multiprocessing.get_context("spawn")
        stop = ctx.Event()
        results = ctx.Queue()
        workers = [ctx.Process(target=hammer, args=(sock, i, stop, results))
                   for i in range(args.hammers)]
        for w in workers:
            w.start()
        time.sleep(1.0)  # the hammers are running
        t0 = time.perf_counter()
        loaded = health_latencies(sock, n)
        elapsed = time.perf_counter() - t0
        stop.set()
        got = [results.get(timeout=60) for _ in workers]
        for w in workers:
            w.join(timeout=30)
        # The hammers ran about 1 s before and until their last request after the phase.
        tables = sum(g["tables"] for g in got)
        changes = sum(g["changes"] for g in got)
        span = elapsed + 1.0
        out["health_p50_ms_under_load"] = round(statistics.median(loaded), 3)
        out["health_p99_ms_under_load"] = round(pct(loaded, 0.99), 3)
        out["requests_per_s"] = round((tables + changes) / span, 1)
        out["tables_per_s"] = round(tables / span, 1)
        out["endpoint_changes_per_s"] = round(changes / span, 1)
        out["hammer_errors"] = sum(g["errors"] for g in got)
        out["agent_rss_mb"] = round(rss_mb(proc.pid), 1)
    finally:
        stop_agent(proc)
        shutil.rmtree(tmp, ignore_errors=True)
    base = import_cost("sys") or (0.0, 0.0)
    for key, modules, after in (
        ("import_starlette_uvicorn", STACK, "sys"),
        ("import_starlette_uvicorn_after_agent", STACK, AGENT_REST),
        ("import_pydantic", "pydantic", "sys"),
        ("import_pydantic_after_agent", "pydantic", AGENT_REST),
    ):
        cost = import_cost(modules, after)
        if cost is not None:
            sub = base if after == "sys" else (0.0, 0.0)
            out[f"{key}_ms"] = round(cost[0] - sub[0], 1)
            out[f"{key}_rss_mb"] = round(cost[1] - sub[1], 1)
    out["load_avg_1m_after"] = round(os.getloadavg()[0], 2)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
