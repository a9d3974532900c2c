"""Endpoints benchmark; prints one JSON object.

- cni_add_p50_ms / cni_add_p99_ms: ``statewright-cni ADD`` run as a runtime runs it (a new
  process with CNI_* variables and the configuration on stdin, inside a "node" network
  namespace created here) until the agent reports the endpoint ``ready`` (its map entries
  written), pods one after another. The plugin enters the node namespace with
  ``nsenter --net`` (a runtime runs it in its own namespace with no wrapper);
  ``--ip-netns-exec`` uses ``ip netns exec`` instead, which also makes a mount namespace
  and remounts /sys per call (the harness of the figures before 2026-11-23 17:20 UTC);
- cni_add_concurrent_p99_ms: the same with ``--concurrent`` pods started at once;
- endpoints_per_s: synthetic endpoints (one IPv4 address each, 4 identities) written into
  the desired-entry tables in transactions of 1,000 and reconciled into the endpoint (lxc)
  and ipcache maps by the generic reconciler: endpoints / seconds from the first write to
  every entry Done (kernel maps when permitted, memory maps otherwise: ``maps`` says which);
- restore_1000_s: an agent start with 1,000 endpoints in its state directory (written here
  as a previous agent leaves them) until every restored endpoint is ``ready`` again.

The agent is the endpoints component on a unix socket (tests/endpoints/agent_server.py).
Needs root for the CNI figures (network namespaces; otherwise they are null with the
reason). Everything created (namespaces, pins, state directories) is removed at the end,
also on failure. ``--quick``: 20 sequential and 10 concurrent pods, 2,000 synthetic
endpoints (well under 60 s).
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bpf import catalog
from bpf.factory import BackendConfig, MapFactory
from bpfops.endpoint_ops import EndpointMapOps
from bpfops.ipcache_ops import IPCacheOps
from reconciler import Config, Reconciler
from reconciler.status import StatusKind
from statedb import DB
from statewright.agent.components.endpoints import EndpointsConfig
from tables.endpoint_entries import EntryTables
from tables.endpoints import Endpoint, EndpointState, endpoint_container_index
from tables.state_dir import write_json_atomic
from tests.endpoints.agent_server import AgentUnderTest
from tests.pins import remove_memory_pins, remove_pin_dir

PID = os.getpid()
CONF = {"cniVersion": "1.0.0", "name": "statewright", "type": "statewright-cni"}


def percentile(values: list[float], q: float) -> float:
    """The q-quantile (nearest rank) of ``values``."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def plugin() -> list[str]:
    script = os.path.join(os.path.dirname(sys.executable), "statewright-cni")
    return [script] if os.path.exists(script) else [sys.executable, "-m", "statewright.cni"]


def cni_figures(sequential: int, concurrent: int, ip_netns_exec: bool = False) -> dict[str, Any]:
    """ADD-to-ready latencies in network namespaces (module doc)."""
    if os.geteuid() != 0:
        return {
            "cni_add_p50_ms": None,
            "cni_add_p99_ms": None,
            "cni_add_concurrent_p99_ms": None,
            "cni_skipped": "needs root (netns)",
        }
    state = tempfile.mkdtemp(prefix=f"sw-bench-ep-{PID}-")
    pin_dir = f"/memory/sw-bench-ep-{PID}"
    node = f"swbench-node-{PID}"
    pods = [f"swbench-pod{i}-{PID}" for i in range(sequential + concurrent)]
    agent = AgentUnderTest(
        EndpointsConfig(("10.99.0.0/16",), state, "memory", pin_dir, prune_interval=None),
        os.path.join(state, "agent.sock"),
    )
    created: list[str] = []
    try:
        for ns in [node, *pods]:
            subprocess.run(["ip", "netns", "add", ns], check=True)
            created.append(ns)
        subprocess.run(["ip", "-n", node, "link", "set", "lo", "up"], check=True)
        agent.start()
        mgr = agent.comp.manager
        assert mgr is not None
        conf = json.dumps({**CONF, "agent-socket": agent.socket})

        def add(i: int) -> float:
            env = {
                "PATH": os.environ["PATH"],
                "CNI_COMMAND": "ADD",
                "CNI_CONTAINERID": f"bench{i}",
                "CNI_IFNAME": "eth0",
                "CNI_NETNS": f"/var/run/netns/{pods[i]}",
                "CNI_PATH": "/usr/lib/cni",
            }
            enter = (["ip", "netns", "exec", node] if ip_netns_exec
                     else ["nsenter", f"--net=/var/run/netns/{node}"])
            start = time.perf_counter()
            proc = subprocess.run(
                [*enter, *plugin()],
                input=conf,
                env=env,
                capture_output=True,
                text=True,
                timeout=120,
            )
            if proc.returncode != 0:
                raise RuntimeError(f"ADD {i}: {proc.stdout} {proc.stderr}")
            # wait on the endpoints table's watch (no polling: the agent shares this process)
            query = endpoint_container_index.query(f"bench{i}")
            while True:
                rows, watch = mgr.endpoints.list_watch(mgr.db.read_txn(), query)
                if any(e.state is EndpointState.READY for e in rows):
                    break
                watch.wait(5.0)
            return (time.perf_counter() - start) * 1000

        seq = [add(i) for i in range(sequential)]
        conc: list[float] = []
        lock = threading.Lock()

        errors: list[str] = []

        def run(i: int) -> None:
            try:
                ms = add(i)
            except Exception as e:
                with lock:
                    errors.append(str(e))
                return
            with lock:
                conc.append(ms)

        threads = [threading.Thread(target=run, args=(sequential + j,)) for j in range(concurrent)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise RuntimeError(f"{len(errors)} concurrent ADD(s) failed: {errors[0]}")
        return {
            "cni_add_p50_ms": round(statistics.median(seq), 1),
            "cni_add_p99_ms": round(percentile(seq, 0.99), 1),
            "cni_add_concurrent_p99_ms": round(percentile(conc, 0.99), 1),
        }
    finally:
        agent.stop()
        for ns in created:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        remove_memory_pins(pin_dir)
        shutil.rmtree(state, ignore_errors=True)


def synthetic_figure(count: int) -> dict[str, Any]:
    """endpoints_per_s (module doc)."""
    pin_dir = f"/sys/fs/bpf/sw-bench-ep-{PID}"
    factory = MapFactory(BackendConfig(backend="auto", pin_dir=pin_dir, pin=False))
    endpoint_map = factory.open_typed(catalog.endpoints_spec())
    ipc_map = factory.open_typed(catalog.ipcache_spec())
    db = DB()
    entries = EntryTables()
    db.register(entries.endpoint_map, entries.ipcache)

    def cfg(table: Any, ops: Any) -> Config[Any]:
        return Config(
            table=table,
            operations=ops,
            get_object_status=lambda r: r.status,
            set_object_status=lambda r, s: replace(r, status=s),
            name=table.name,
        )

    base = int(ipaddress.IPv4Address("10.128.0.0"))
    eps = [
        Endpoint(
            1 + i % 4095,
            ifindex=1000 + i,
            mac="0a:00:00:00:00:01",
            ipv4=ipaddress.IPv4Address(base + i + 1),
            identity=256 + i % 4,
        )
        for i in range(count)
    ]

    async def main() -> float:
        recs = [
            Reconciler(db, cfg(entries.endpoint_map, EndpointMapOps(endpoint_map))),
            Reconciler(db, cfg(entries.ipcache, IPCacheOps(ipc_map))),
        ]
        async with anyio.create_task_group() as tg:
            for r in recs:
                await tg.start(r.run)
            start = time.perf_counter()
            for i in range(0, count, 1000):
                with db.write_txn(entries.endpoint_map, entries.ipcache) as txn:
                    for n, ep in enumerate(eps[i : i + 1000]):
                        # distinct owners: endpoint ids wrap at 4095, entries must not
                        entries.set_endpoint(txn, replace(ep, id=i + n + 1), previous=[])
                await anyio.sleep(0)
            await recs[0].wait_until_reconciled(entries.endpoint_map.revision(db.read_txn()))
            await recs[1].wait_until_reconciled(entries.ipcache.revision(db.read_txn()))
            elapsed = time.perf_counter() - start
            rtxn = db.read_txn()
            assert all(r.status.kind is StatusKind.DONE for r in entries.endpoint_map.all(rtxn))
            tg.cancel_scope.cancel()
        return elapsed

    try:
        elapsed = anyio.run(main)
        assert endpoint_map.count() == count and ipc_map.count() == count
    finally:
        endpoint_map.close()
        ipc_map.close()
        remove_pin_dir(pin_dir)
    return {"endpoints_per_s": round(count / elapsed), "maps": factory.kind}


def restore_figure(count: int = 1000) -> dict[str, Any]:
    """restore_1000_s (module doc)."""
    state = tempfile.mkdtemp(prefix=f"sw-bench-restore-{PID}-")
    pin_dir = f"/memory/sw-bench-restore-{PID}"
    base = int(ipaddress.IPv4Address("10.98.0.0"))
    allocations = {}
    for i in range(1, count + 1):
        ip = ipaddress.IPv4Address(base + i + 1)
        ep = Endpoint(
            i,
            container_id=f"c{i}",
            ifindex=0,
            ipv4=ip,
            labels=(f"k8s:app=a{i % 7}",),
            identity=256 + i % 7,
            state=EndpointState.READY,
        )
        write_json_atomic(os.path.join(state, "endpoints", f"{i}.json"), ep.to_json())
        allocations[str(ip)] = ep.ipam_owner
    allocations[str(ipaddress.IPv4Address(base + 1))] = "router"
    write_json_atomic(
        os.path.join(state, "ipam.json"), {"version": 1, "allocations": allocations, "cursors": {}}
    )
    agent = AgentUnderTest(
        EndpointsConfig(("10.98.0.0/16",), state, "memory", pin_dir, prune_interval=None),
        os.path.join(state, "agent.sock"),
    )
    try:
        start = time.perf_counter()
        agent.start()
        mgr = agent.comp.manager
        assert mgr is not None
        while True:
            rows, watch = mgr.endpoints.all_watch(mgr.db.read_txn())
            if all(e.state is EndpointState.READY for e in rows):
                break
            watch.wait(5.0)
        elapsed = time.perf_counter() - start
        assert len(agent.comp.restore_result.restored) == count
    finally:
        agent.stop()
        remove_memory_pins(pin_dir)
        shutil.rmtree(state, ignore_errors=True)
    return {"restore_1000_s": round(elapsed, 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--ip-netns-exec", action="store_true",
                        help="run the plugin through `ip netns exec` (the older harness)")
    args = parser.parse_args()
    sequential, concurrent, synthetic = (20, 10, 2000) if args.quick else (100, 20, 10000)
    out: dict[str, Any] = {"quick": args.quick, "cni_enter": (
        "ip-netns-exec" if args.ip_netns_exec else "nsenter")}
    out.update(cni_figures(sequential, concurrent, args.ip_netns_exec))
    out.update(synthetic_figure(synthetic))
    out.update(restore_figure())
    print(json.dumps(out))


if __name__ == "__main__":
    main()
