"""Datapath benchmark (issue #29): the per-endpoint tc programs and connection tracking;
prints one JSON object.

- policy_ratio: pod-to-pod TCP connections/s (connect, read the server's reply, close)
  from a client pod to a server pod that no policy selects, divided by the rate to a
  server pod whose ingress policy is in force (it allows the client's identity on the
  port): what the policy lookup of every new flow costs (1.0: nothing). Both servers sit
  behind the same tc programs and CT; rounds alternate between them, the figures are the
  medians of the rounds. The node, pods and agent come from tests/e2e/node_harness.py.
- ct_gc_1m_entries_s: one garbage collection (bpfops/conntrack.CTMaps.gc) of an IPv4 CT
  map of 1,000,000 entries of which half are expired, against its baseline measured in
  the same run, ``ct_dump_1m_entries_s``: one batch read of the same map, the floor of
  any collection that reads the map from user space.
- nodeport_ratio_vs_direct: TCP connections/s (connect, read the server's greeting,
  close) from clients outside the node (a namespace on the node's external device
  ``ext0``, tests/e2e/outside.py) to a pod's server reached directly (routed by the
  node), divided by the rate through a NodePort on the node's ``ext0`` address (DNAT by
  bpf/nodeport.c): what the north-south translation costs (1.0: nothing). Both go
  through the same devices and programs; rounds alternate, medians of the rounds.

Needs root (CAP_BPF, CAP_NET_ADMIN), iproute2 and build/lxc.o, build/nodeport.o,
build/sock_lb.o;
everything it creates (namespaces, cgroup, pins, maps, processes) is removed at the end,
also on failure. ``--quick`` takes well under a minute.

Measured on the 2-core development machine (Nov 2026, kernel 6.18, shared and loaded):
see docs/datapath.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import struct
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bpf import ct
from bpf.catalog import ct_specs
from bpf.kernel_map import KernelMap
from bpf.typed_map import TypedMap
from bpfops.conntrack import CTMaps
from tests.datapath.conftest import Client
from tests.e2e.harness import BACKEND_PORT, EnvUnavailable, ident, service_manifest
from tests.e2e.node_harness import NodeEnv, node_env
from tests.e2e.outside import NODE_SIDE, ProbeClient, plug_outside, serve_probe

NAMESPACE = "bench"
POLICY = json.dumps({
    "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
    "metadata": {"name": "guarded", "namespace": NAMESPACE},
    "spec": {"podSelector": {"matchLabels": {"app": "guarded"}}, "policyTypes": ["Ingress"],
             "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "client"}}}],
                          "ports": [{"protocol": "TCP", "port": BACKEND_PORT}]}]},
})


def _rate(clients: list[Client], host: str, count: int) -> float:
    """Connections/s of all clients together, each making ``count`` connections."""
    errors: list[str] = []

    def run(c: Client) -> None:
        for r in c.tcp(host, BACKEND_PORT, count=count):
            if r.get("id") != ident(host):
                errors.append(str(r))

    threads = [threading.Thread(target=run, args=(c,)) for c in clients]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - t0
    if errors:
        raise RuntimeError(f"connections to {host} failed: {errors[:3]}")
    return len(clients) * count / elapsed


def _wait(ok: Any, what: str, bound: float = 30.0) -> None:
    deadline = time.monotonic() + bound
    while not ok():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: not within {bound} s")
        time.sleep(0.05)


def policy_rates(env: NodeEnv, clients: int, rounds: int, count: int) -> dict[str, Any]:
    """Median connections/s to the open and to the guarded server (module doc)."""
    open_pod = env.add_pod("open", NAMESPACE, {"app": "open"})
    guarded = env.add_pod("guarded", NAMESPACE, {"app": "guarded"})
    env.serve(open_pod)
    env.serve(guarded)
    client_pod = env.add_pod("client", NAMESPACE, {"app": "client"})
    pool = [env.client_in(client_pod) for _ in range(clients)]
    o, g = open_pod.address(4), guarded.address(4)
    env.write("guarded", POLICY)
    modes = env.api
    _wait(lambda: any(e.get("ingress_enforced") for e in
                      modes.get("/policy/endpoints")["endpoints"]), "the policy in force")
    _wait(lambda: pool[0].tcp(g, BACKEND_PORT)[0].get("id") == ident(g), "guarded reachable")
    _rate(pool, o, count // 5)  # warm-up
    _rate(pool, g, count // 5)
    free, policed = [], []
    for _ in range(rounds):
        free.append(_rate(pool, o, count))
        policed.append(_rate(pool, g, count))
    f, p = statistics.median(free), statistics.median(policed)
    drops = {d["reason"]: d["packets"] for d in env.api.get("/ct/stats")["drops"]}
    return {"conns_per_s_no_policy": round(f), "conns_per_s_policy": round(p),
            "policy_ratio": round(f / p, 3), "drops_during_run": drops}


NODE_PORT = 30080


def _probe_rate(pool: list[ProbeClient], host: str, port: int, seconds: float) -> float:
    """Connections/s of all probe clients together for ``seconds``."""
    results: list[dict[str, Any]] = []

    def run(c: ProbeClient) -> None:
        results.append(c.call(timeout=seconds + 30, op="rate", host=host, port=port,
                              seconds=seconds))

    threads = [threading.Thread(target=run, args=(c,)) for c in pool]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    bad = [r for r in results if "count" not in r]
    if bad or len(results) != len(pool):
        raise RuntimeError(f"connections to {host}:{port} failed: {bad[:3]}")
    return sum(r["count"] / r["seconds"] for r in results)


def nodeport_rates(env: NodeEnv, clients: int, rounds: int, seconds: float) -> dict[str, Any]:
    """Median connections/s from outside to a pod directly and through a NodePort."""
    outside = plug_outside(env._stack, env.ns, env.tag)
    pod = env.add_pod("np-server", NAMESPACE, {"app": "np"})
    serve_probe(env._stack, pod.netns, [pod.address(4)])
    direct = pod.address(4)
    env.write("np", service_manifest("np", "10.96.0.80", [direct], node_port=NODE_PORT))
    pool = [outside.client() for _ in range(clients)]
    _wait(lambda: pool[0].call(op="tcp", host=NODE_SIDE[0], port=NODE_PORT).get("id")
          == ident(direct), "the NodePort served from outside", 60.0)
    _probe_rate(pool, direct, BACKEND_PORT, seconds / 3)  # warm-up
    _probe_rate(pool, NODE_SIDE[0], NODE_PORT, seconds / 3)
    plain, translated = [], []
    for _ in range(rounds):
        plain.append(_probe_rate(pool, direct, BACKEND_PORT, seconds))
        translated.append(_probe_rate(pool, NODE_SIDE[0], NODE_PORT, seconds))
    d, n = statistics.median(plain), statistics.median(translated)
    return {"conns_per_s_direct": round(d), "conns_per_s_nodeport": round(n),
            "nodeport_ratio_vs_direct": round(d / n, 3)}


def ct_gc(entries: int) -> dict[str, Any]:
    """One GC of a CT map of ``entries`` entries, half expired, and one batch read of it."""
    spec4, spec6 = ct_specs(entries + 1024)
    m4 = TypedMap(spec4, KernelMap.create(spec4))
    m6 = TypedMap(spec6, KernelMap.create(spec6))
    try:
        pack = struct.Struct("<IIHHBB").pack
        keys = b"".join(pack(i, 0x0A000001, 80, i & 0xFFFF, 6, 0) for i in range(entries))
        live = ct.CT_ENTRY.encode(ct.CTEntry(lifetime=2000, packets=1))
        dead = ct.CT_ENTRY.encode(ct.CTEntry(lifetime=10, packets=1))
        m4.backend.update_batch(keys, (live + dead) * (entries // 2) + live * (entries % 2))
        t0 = time.perf_counter()
        read = sum(len(k) for k, _ in m4.backend.dump_chunks(8192)) // spec4.key_size
        dump_s = time.perf_counter() - t0
        maps = CTMaps(m4, m6)
        t0 = time.perf_counter()
        removed = maps.gc(now=1000)
        gc_s = time.perf_counter() - t0
    finally:
        m4.close()
        m6.close()
    if read != entries or removed != entries // 2:
        raise RuntimeError(f"ct gc: read {read}, removed {removed} of {entries}")
    return {"ct_gc_1m_entries_s": round(gc_s * 1_000_000 / entries, 3),
            "ct_dump_1m_entries_s": round(dump_s * 1_000_000 / entries, 3),
            "ct_gc_entries": entries, "ct_gc_removed": removed}


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print its JSON."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer connections")
    ap.add_argument("--clients", type=int, default=2, help="client processes for the rates")
    args = ap.parse_args(argv)
    rounds, count = (3, 300) if args.quick else (7, 1500)
    seconds = 1.0 if args.quick else 3.0
    t0 = time.monotonic()
    try:
        with node_env({"netlink": True}) as env:
            rates = policy_rates(env, args.clients, rounds, count)
            rates.update(nodeport_rates(env, args.clients, rounds, seconds))
    except EnvUnavailable as exc:
        print(json.dumps({"error": str(exc)}))
        return 2
    out = {
        **rates,
        **ct_gc(1_000_000),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "clients": args.clients,
        "connections_per_round_per_client": count,
        "rounds": rounds,
        "quick": args.quick,
        "elapsed_s": round(time.monotonic() - t0, 1),
    }
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
