"""Monitor benchmark (issue #31): datapath events; prints one JSON object.

- reader_events_per_s: events the agent's reader path handles per second (decode, enrich
  from statedb: endpoint, pod, labels, service; keep and count in `FlowLog`), in this
  process on tables of 1,000 endpoints and services, beside its baseline in the same run,
  ``decode_only_events_per_s`` (decoding alone).
- events_ratio: pod-to-pod TCP connections/s through a server whose ingress policy is in
  force with events off, divided by the rate with events on (1.0: events cost nothing).
  Each connection is one new flow: its first packet's policy verdict is reported, its
  other packets (SYN-ACK, ACK, data, FIN) belong to an established flow and report
  nothing. Rounds alternate off/on; medians. ``events_per_connection``: what the agent
  counted during the "on" rounds, per connection.
- lost_events: with the rate limit at ``--flood-rate`` events/s per CPU (burst 20), the
  events refused by it (or by a full ring) while clients make connections as fast as
  they can; ``flood_loop_max_stall_ms``: the agent's longest event-loop stall during that
  flood (its debug probe; 0 when none reached the 20 ms stall threshold), for the worst
  one ``flood_loop_worst_stall`` (how much of it the loop's thread ran, ``cpu_ms``, and
  waited for a CPU, ``runqueue_ms``, and its most sampled stack's last 400 characters),
  and ``flood_loop_lag_ms_max`` its largest wake-up lateness since it started.

The node, pods and agent come from tests/e2e/node_harness.py (kernel maps, the real
tc and socket programs). Needs root (CAP_BPF, CAP_NET_ADMIN), iproute2, build/lxc.o and
build/sock_lb.o; everything it creates is removed at the end, also on failure.
``--quick`` takes well under a minute. The load average is printed beside the figures.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bpf import events as bpf_events
from statedb import DB
from statewright.observe.flows import Enricher, EnrichTables
from statewright.observe.monitor import FlowLog
from tables.endpoints import Endpoint, new_endpoints_table
from tables.frontends import FrontendParams, SVCType, new_frontends_table
from tables.identities import Identity, new_identities_table
from tables.l3n4 import L3n4Addr
from tests.datapath.conftest import Client
from tests.e2e.harness import BACKEND_PORT, EnvUnavailable, ident
from tests.e2e.node_harness import NodeEnv, node_env

NAMESPACE = "bench"
POLICY = json.dumps({
    "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
    "metadata": {"name": "guarded", "namespace": NAMESPACE},
    "spec": {"podSelector": {"matchLabels": {"app": "guarded"}}, "policyTypes": ["Ingress"],
             "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "client"}}}],
                          "ports": [{"protocol": "TCP", "port": BACKEND_PORT},
                                    {"protocol": "UDP", "port": BACKEND_PORT + 1}]}]},
})
UDP_PORT = BACKEND_PORT + 1
#: A UDP echo server (argv: ip port).
ECHO = ("import socket,sys\n"
        "s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)\n"
        "s.bind((sys.argv[1],int(sys.argv[2])))\n"
        "print('ready',flush=True)\n"
        "while True:\n"
        "    d,a=s.recvfrom(2048)\n"
        "    s.sendto(d,a)\n")
#: One connected UDP socket (one flow): for each N read from stdin, N request/replies,
#: then the rate on stdout.
PINGER = ("import socket,sys,time\n"
          "s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)\n"
          "s.settimeout(5)\n"
          "s.connect((sys.argv[1],int(sys.argv[2])))\n"
          "print('ready',flush=True)\n"
          "for line in sys.stdin:\n"
          "    n=int(line)\n"
          "    t=time.perf_counter()\n"
          "    for _ in range(n):\n"
          "        s.send(b'x')\n"
          "        s.recv(64)\n"
          "    print(n/(time.perf_counter()-t),flush=True)\n")
PROBE_ENV = "STATEWRIGHT_DEBUG_PROBE"


# ----- the reader path, in process ---------------------------------------------------------
def _reader_tables(n: int) -> tuple[DB, EnrichTables]:
    endpoints, identities, frontends = (new_endpoints_table(), new_identities_table(),
                                        new_frontends_table())
    db = DB(endpoints, identities, frontends)
    from tables.frontends import new_frontend

    with db.write_txn(endpoints, identities, frontends) as txn:
        for i in range(n):
            ident_no = 10_000 + i
            ip = ipaddress.IPv4Address(int(ipaddress.IPv4Address("10.248.0.0")) + i)
            endpoints.insert(txn, Endpoint(id=i + 1, pod_name=f"pod-{i}",
                                           pod_namespace="bench", identity=ident_no, ipv4=ip))
            identities.insert(txn, Identity(ident_no, (f"k8s:app=a{i}",
                                                       "k8s:io.kubernetes.pod.namespace=bench")))
            vip = ipaddress.IPv4Address(int(ipaddress.IPv4Address("10.96.0.0")) + i)
            p = FrontendParams(L3n4Addr(vip, 80, "TCP"), SVCType.CLUSTER_IP, f"bench/svc-{i}")
            frontends.insert(txn, new_frontend(p.address, p.type, p.service_name, "", 0, None,
                                               (), 0, None, _pending()))
        txn.commit()
    return db, EnrichTables(endpoints, identities, frontends)


def _pending() -> Any:
    from reconciler.status import status_pending

    return status_pending()


def _records(n: int, endpoints: int) -> list[bytes]:
    out = []
    for i in range(n):
        a, b = i % endpoints, (i * 7 + 3) % endpoints
        src = ipaddress.IPv4Address(int(ipaddress.IPv4Address("10.248.0.0")) + a)
        dst = ipaddress.IPv4Address(int(ipaddress.IPv4Address("10.248.0.0")) + b)
        vip = ipaddress.IPv4Address(int(ipaddress.IPv4Address("10.96.0.0")) + b)
        kind = (bpf_events.EVENT_DROP, bpf_events.EVENT_POLICY, bpf_events.EVENT_TRACE)[i % 3]
        out.append(bpf_events.encode(bpf_events.RawEvent(
            time.monotonic_ns(), kind, 2 if kind == 1 else 1, 133 if kind == 1 else 0,
            1 + i % 2, 4, 6, 24, 1 + (kind == 3), 0, 0, b + 1, 40000 + i % 20000, 8080, 80,
            src, dst, vip)))
    return out


def reader_rate(n: int, endpoints: int = 1000) -> dict[str, Any]:
    """Events/s of decode + enrich + keep, and of decode alone (the baseline)."""
    db, tables = _reader_tables(endpoints)
    records = _records(n, endpoints)
    enricher = Enricher(db, tables, "bench-node")
    flog = FlowLog()
    t0 = time.perf_counter()
    for data in records:
        bpf_events.decode(data)
    decode_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    batch: list[dict[str, Any]] = []
    for data in records:
        batch.append(enricher.flow(bpf_events.decode(data)))
        if len(batch) == 64:
            flog.add(batch)
            batch = []
    flog.add(batch)
    full_s = time.perf_counter() - t0
    return {"reader_events_per_s": round(n / full_s),
            "decode_only_events_per_s": round(n / decode_s),
            "reader_events": n, "reader_endpoints": endpoints}


# ----- the datapath ------------------------------------------------------------------------
def _rate(clients: list[Client], host: str, count: int) -> float:
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


def _established_rates(env: NodeEnv, maps: bpf_events.EventMaps, server: Any, client: Any,
                       rounds: int, count: int) -> dict[str, Any]:
    """Request/replies per second over one established UDP flow, events off and on."""
    env.run_in(server, sys.executable, "-c", ECHO, server.address(4), str(UDP_PORT))
    time.sleep(0.5)
    pinger = env.run_in(client, sys.executable, "-c", PINGER, server.address(4), str(UDP_PORT))
    assert pinger.stdin is not None and pinger.stdout is not None
    if pinger.stdout.readline().strip() != "ready":
        raise RuntimeError("the UDP client did not start")

    def rate(n: int) -> float:
        assert pinger.stdin is not None and pinger.stdout is not None
        pinger.stdin.write(f"{n}\n")
        pinger.stdin.flush()
        return float(pinger.stdout.readline())

    rate(count // 5)  # the flow's first packet (its one event) and a warm-up
    off, on = [], []
    for _ in range(rounds):
        maps.configure(False, 1_000_000, 1_000_000)
        off.append(rate(count))
        maps.configure(True, 1_000_000, 1_000_000)
        on.append(rate(count))
    return {"udp_established_per_s_events_off": round(statistics.median(off)),
            "udp_established_per_s_events_on": round(statistics.median(on)),
            "events_ratio": round(statistics.median(off) / statistics.median(on), 3)}


def datapath(env: NodeEnv, clients: int, rounds: int, count: int, flood_rate: int
             ) -> dict[str, Any]:
    """events_ratio, events per connection, lost events and loop stalls under a flood."""
    guarded = env.add_pod("guarded", NAMESPACE, {"app": "guarded"})
    env.serve(guarded)
    client_pod = env.add_pod("client", NAMESPACE, {"app": "client"})
    pool = [env.client_in(client_pod) for _ in range(clients)]
    g = guarded.address(4)
    env.write("guarded", POLICY)
    api = env.api
    _wait(lambda: any(e.get("ingress_enforced") for e in
                      api.get("/policy/endpoints")["endpoints"]), "the policy in force")
    _wait(lambda: pool[0].tcp(g, BACKEND_PORT)[0].get("id") == ident(g), "guarded reachable")
    maps = bpf_events.EventMaps.open(env.pin_dir)  # the agent's pins, adopted
    try:
        rate, burst = 1_000_000, 1_000_000  # no limit: every event emitted
        _rate(pool, g, count // 5)
        off, on, events = [], [], 0
        for _ in range(rounds):
            maps.configure(False, rate, burst)
            off.append(_rate(pool, g, count))
            maps.configure(True, rate, burst)
            before = api.get("/monitor/stats")["events"]
            on.append(_rate(pool, g, count))
            time.sleep(0.3)  # the reader's last poll
            events += api.get("/monitor/stats")["events"] - before
        out: dict[str, Any] = {
            "conns_per_s_events_off": round(statistics.median(off)),
            "conns_per_s_events_on": round(statistics.median(on)),
            "events_ratio_new_flows": round(statistics.median(off) / statistics.median(on),
                                            3),
            "events_per_connection": round(events / (rounds * count * clients), 2),
        }
        before = api.get("/monitor/stats")["events"]
        out.update(_established_rates(env, maps, guarded, client_pod, rounds, count * 10))
        time.sleep(0.3)
        out["events_established_flow"] = api.get("/monitor/stats")["events"] - before
        maps.configure(True, flood_rate, 20)
        lost0 = sum(maps.lost().values())
        since_ms = time.monotonic() * 1000
        flood = _rate(pool, g, count * 2)
        time.sleep(0.3)
        probe = api.get(f"/debug/probe?since_ms={int(since_ms)}")
        stalls = [s["ms"] for s in probe["loop"]["stalls"]]
        worst = max(probe["loop"]["stalls"], key=lambda s: s["ms"], default=None)
        if worst is not None:
            # Whether the loop's thread ran (its own work) or waited for a CPU (the
            # machine's load), and the stack sampled most during it.
            out["flood_loop_worst_stall"] = {
                "ms": worst["ms"], "cpu_ms": worst["cpu_ms"],
                "runqueue_ms": worst["runqueue_ms"],
                "top_stack": worst["stacks"][0][0][-400:] if worst["stacks"] else "",
            }
        out.update({
            "flood_conns_per_s": round(flood),
            "flood_rate_limit_per_cpu": flood_rate,
            "lost_events": sum(maps.lost().values()) - lost0,
            "flood_loop_max_stall_ms": max(stalls, default=0.0),
            "flood_loop_stalls": len(stalls),
            "flood_loop_lag_ms_max": probe["loop"]["lag_ms_max"],
        })
        maps.configure(True, 1000, 200)
        return out
    finally:
        maps.close()


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print its JSON."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer connections and events")
    ap.add_argument("--clients", type=int, default=2, help="client processes")
    ap.add_argument("--flood-rate", type=int, default=50,
                    help="the per-CPU rate limit during the flood (events/s)")
    args = ap.parse_args(argv)
    rounds, count, n = (3, 200, 30_000) if args.quick else (7, 1000, 200_000)
    t0 = time.monotonic()
    out: dict[str, Any] = {"load_average_start": os.getloadavg()}
    out.update(reader_rate(n))
    os.environ[PROBE_ENV] = "1"  # the agent's loop probe, for the flood's stalls
    try:
        with node_env() as env:
            out.update(datapath(env, args.clients, rounds, count, args.flood_rate))
    except EnvUnavailable as exc:
        out["datapath_error"] = str(exc)
    out.update({"clients": args.clients, "connections_per_round_per_client": count,
                "rounds": rounds, "quick": args.quick,
                "elapsed_s": round(time.monotonic() - t0, 1),
                "load_average_end": os.getloadavg()})
    print(json.dumps(out))
    return 0 if "datapath_error" not in out else 2


if __name__ == "__main__":
    sys.exit(main())
