"""kvstore mode benchmark: a real 3-member etcd cluster (Debian's etcd-server) on loopback,
an agent's kvstore sources in this process; prints one JSON object.

Keys:

- initial_sync_s: from starting the agent side (session, identity and ipcache watchers)
  until every one of ``--endpoints`` remote endpoints (``ip/v1/<cluster>/<ip>`` keys,
  over ``--identities`` identity keys) is written into the ipcache map (memory map,
  through the agent's ipcache reconciler). Baseline in the same run:
  ``etcd_list_s``, one client listing the same keys (what the wire and etcd take).
- remote_endpoint_change_p50_ms / p99_ms: one key's identity changed in etcd (a put by
  another client, ``--changes`` of them at ``--rate`` per second) until the ipcache map
  holds the new identity (polled every millisecond).
- identity_agree_p50_ms / p99_ms: two agents (each its own database, allocator and etcd
  session) create an endpoint with the same new label set at the same moment; time until
  both endpoints use one number, the one etcd's first key holds.
- etcd_leader_kill_recovery_s: the etcd leader SIGKILLed; time until a key another
  client then puts is in the agent's ipcache map (re-election, the watch resumed on
  another member, the put retried).

CRD mode's figures come from benchmarks/cluster.py (the same scale through the fake API
server); run both in one session to compare (docs/cluster.md has the figures).
``--quick``: 5,000 endpoints over 500 identities, 200 changes; the full run is 50,000
over 5,000, 1,000 changes.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import anyio

from bpf.catalog import ipcache_spec
from bpf.factory import BackendConfig, MapFactory
from bpfops.ipcache_ops import IPCacheOps, ipcache_key
from sources.kvstore.etcd_client import EtcdClient, put_op
from sources.kvstore.layout import KeyLayout, labels_key
from statewright.agent.components.map_reconciler import map_reconciler
from tests.kvstore.backends import Agent, KVStoreBackend, manager, pod
from tests.kvstore.etcd_cluster import EtcdCluster


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return round(xs[min(len(xs) - 1, int(p / 100 * len(xs)))], 2) if xs else float("nan")


def ip_of(i: int) -> str:
    return str(ipaddress.IPv4Address("10.128.0.0") + i)


def pair(i: int, ident: int) -> str:
    return json.dumps({"IP": ip_of(i), "ID": ident, "HostIP": f"192.0.2.{2 + i % 200}",
                       "Key": 0, "K8sNamespace": "bench", "K8sPodName": f"p{i}"})


async def fill(client: EtcdClient, layout: KeyLayout, endpoints: int, identities: int) -> None:
    """Write the identity and ipcache keys, 128 operations a txn, 8 txns at a time."""
    ops = [put_op(layout.identity_id(1000 + n), labels_key((f"k8s:bench=i{n}",)))
           for n in range(identities)]
    ops += [put_op(layout.ip(ip_of(i)), pair(i, 1000 + i % identities)) for i in range(endpoints)]
    chunks = [ops[i:i + 128] for i in range(0, len(ops), 128)]
    limiter = anyio.CapacityLimiter(8)

    async def one(chunk: list[dict[str, Any]]) -> None:
        async with limiter:
            await client.txn([], chunk)

    async with anyio.create_task_group() as tg:
        for chunk in chunks:
            tg.start_soon(one, chunk)


class MapWatcher:
    """The agent's ipcache map and what it holds for one address."""

    def __init__(self, tmp: Path, agent: Agent) -> None:
        factory = MapFactory(BackendConfig(backend="memory", pin_dir=str(tmp / "pins")))
        self.map = factory.open_typed(ipcache_spec(max_entries=1 << 20))
        self.ops = IPCacheOps(self.map)
        self.reconciler = map_reconciler(agent.mgr.db, agent.mgr.entries.ipcache, self.ops, None)

    def identity(self, ip: str) -> int | None:
        value = self.map.lookup(ipcache_key(ipaddress.ip_network(f"{ip}/32")))
        return None if value is None else int(value.sec_identity)


async def wait(cond: Any, timeout: float, step: float = 0.001) -> None:
    with anyio.fail_after(timeout):
        while not cond():
            await anyio.sleep(step)


async def run(args: argparse.Namespace, etcd: EtcdCluster, tmp: Path) -> dict[str, Any]:
    out: dict[str, Any] = {"endpoints": args.endpoints, "identities": args.identities}
    kv = KVStoreBackend(etcd.endpoints, ttl=15)
    admin = kv.admin
    await fill(admin, kv.layout, args.endpoints, args.identities)
    t = time.perf_counter()
    kvs, _ = await admin.list_prefix(kv.layout.ips)
    out["etcd_list_s"] = round(time.perf_counter() - t, 3)
    assert len(kvs) == args.endpoints

    a = Agent("node-a", manager(tmp / "a", "10.1.0.0/24", 1), ipaddress.IPv4Address("192.0.2.1"))
    b = Agent("node-b", manager(tmp / "b", "10.1.1.0/24", 2), ipaddress.IPv4Address("192.0.2.250"))
    maps = MapWatcher(tmp / "a", a)
    async with anyio.create_task_group() as tg:
        tg.start_soon(maps.reconciler.run)
        t = time.perf_counter()
        await kv.start_agent(tg, a)
        await wait(lambda: maps.ops.writes >= args.endpoints, 600, 0.01)
        out["initial_sync_s"] = round(time.perf_counter() - t, 3)

        rng = random.Random(1)
        lat: list[float] = []
        for n in range(args.changes):
            i = rng.randrange(args.endpoints)
            new = 1000 + (i + n + 1) % args.identities
            if new == maps.identity(ip_of(i)):
                new = 1000 + (new - 999) % args.identities
            t = time.perf_counter()
            await admin.put(kv.layout.ip(ip_of(i)), pair(i, new))
            await wait(lambda i=i, new=new: maps.identity(ip_of(i)) == new, 30)
            lat.append((time.perf_counter() - t) * 1000)
            await anyio.sleep(max(0.0, 1 / args.rate - lat[-1] / 1000))
        out["remote_endpoint_change_p50_ms"] = pct(lat, 50)
        out["remote_endpoint_change_p99_ms"] = pct(lat, 99)

        await kv.start_agent(tg, b)
        await wait(lambda: b.endpoints.synced and b.identities.synced, 600, 0.01)
        await anyio.sleep(1.0)  # b's first list is applied; let its publishers settle
        agree: list[float] = []
        for n in range(args.races):
            labels = [f"k8s:race=r{n}"]
            t = time.perf_counter()
            async with anyio.create_task_group() as racing:
                for ag in (a, b):
                    racing.start_soon(anyio.to_thread.run_sync, ag.mgr.create, "0",
                                      pod(f"{ag.name}-r{n}", labels))

            def same(n: int = n) -> bool:
                ea = a.mgr.resolve(f"pod-name:shop/node-a-r{n}")
                eb = b.mgr.resolve(f"pod-name:shop/node-b-r{n}")
                return bool(ea and eb and ea.identity == eb.identity
                            and a.identities.allocator.object_of(ea.identity) is not None)

            await wait(same, 30)
            agree.append((time.perf_counter() - t) * 1000)
        out["identity_agree_p50_ms"] = pct(agree, 50)
        out["identity_agree_p99_ms"] = pct(agree, 99)

        leader = etcd.wait_leader()
        t = time.perf_counter()
        etcd.stop_member(leader)
        i = args.endpoints  # a new key
        while True:
            try:
                await admin.put(kv.layout.ip(ip_of(i)), pair(i, 1000))
                break
            except Exception:
                await anyio.sleep(0.05)
        await wait(lambda: maps.identity(ip_of(i)) == 1000, 60)
        out["etcd_leader_kill_recovery_s"] = round(time.perf_counter() - t, 3)
        etcd.start_member(leader)
        tg.cancel_scope.cancel()
    await kv.close()
    out["load_avg_1m_end"] = round(os.getloadavg()[0], 2)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="5,000 endpoints, 500 identities")
    ap.add_argument("--endpoints", type=int, default=50_000)
    ap.add_argument("--identities", type=int, default=5_000)
    ap.add_argument("--changes", type=int, default=1_000)
    ap.add_argument("--rate", type=float, default=200.0, help="changes per second")
    ap.add_argument("--races", type=int, default=100)
    args = ap.parse_args()
    if args.quick:
        args.endpoints, args.identities, args.changes, args.races = 5_000, 500, 200, 30
    with tempfile.TemporaryDirectory(prefix="statewright-bench-kvstore-") as d:
        tmp = Path(d)
        etcd = EtcdCluster(tmp / "etcd").start()
        try:
            out = {"load_avg_1m_start": round(os.getloadavg()[0], 2)}
            out.update(anyio.run(run, args, etcd, tmp))
        finally:
            etcd.stop()
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
