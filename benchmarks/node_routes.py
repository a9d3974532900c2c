"""Native routes to the other nodes' pod CIDRs (auto-direct-node-routes), into a kernel
routing table: the nodes table -> NodeRoutes -> the route reconciler -> RouteOps
(rtnetlink), in a network namespace the benchmark creates and deletes.

Prints one JSON object:

* ``initial_routes_s`` / ``routes_per_s``: NODES Nodes (an IPv4 and an IPv6 pod CIDR
  each: 2 x NODES routes) committed in one transaction, until every route row is Done;
  ``routes``: how many the kernel then holds of the agent's protocol;
* ``baseline_ip_batch_s``: the same routes added by one ``ip -batch`` process into a
  second namespace (the kernel's and iproute2's cost for the same work, same run);
* ``change_p50_ms`` / ``change_p99_ms``: one Node's InternalIPs changed (its two routes
  replaced), from the commit until both rows are Done, CHANGES times one after another;
* ``restart_adopt_s`` / ``restart_writes``: a new reconciler on the same rows and table
  (a restarted agent): until every row is Done, and the routes it wrote (0: adopted);
* ``remove_all_s``: every Node deleted, until the kernel holds none of our routes.

``--quick``: 200 nodes, 20 changes (seconds); otherwise 1000 nodes, 100 changes. Needs
CAP_NET_ADMIN (``ip netns add``); without it the figures are null with the reason.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import anyio

# The repository root, ahead of benchmarks/ (whose statedb.py would shadow the package).
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from reconciler import Config, Reconciler, status_field_accessors
from reconciler.status import StatusKind, status_pending
from statedb import DB
from statewright.node_routes import RTPROT_STATEWRIGHT, RouteOps
from statewright.rtnl import Rtnl
from tables.devices import Device, DeviceAddress, new_devices_table
from tables.node_routes import NodeRoutes, new_node_routes_table
from tables.nodes import INTERNAL_IP, Node, NodeIP, new_nodes_table

GET, SET = status_field_accessors()


def _node(i: int, gen: int = 0) -> Node:
    """Node ``i`` on the 10.60.0.0/16 and fd60::/64 underlay; ``gen`` moves its address."""
    host = i + 2 + gen * 2000
    v4 = ipaddress.ip_address(f"10.60.{host // 256}.{host % 256}")
    v6 = ipaddress.ip_address(f"fd60::{host:x}")
    cidrs = (ipaddress.ip_network(f"10.{100 + i // 256}.{i % 256}.0/24"),
             ipaddress.ip_network(f"fd10:{i:x}::/112"))
    return Node(f"node-{i}", (NodeIP(INTERNAL_IP, v4), NodeIP(INTERNAL_IP, v6)), cidrs)


def _ip(ns: str, *args: str, stdin: str | None = None) -> None:
    subprocess.run(["ip", "-n", ns, *args], input=stdin, text=True, check=True,
                   capture_output=True)


def _netns(tag: str) -> str:
    name = f"swbench-{tag}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    subprocess.run(["ip", "netns", "add", name], check=True, capture_output=True)
    try:
        try:
            _ip(name, "link", "add", "under0", "type", "dummy")
        except subprocess.CalledProcessError:  # a kernel without the dummy driver
            _ip(name, "link", "add", "under0", "type", "ifb")
        _ip(name, "addr", "add", "10.60.0.1/16", "dev", "under0")
        _ip(name, "addr", "add", "fd60::1/64", "dev", "under0", "nodad")
        _ip(name, "link", "set", "under0", "up")
    except BaseException:
        subprocess.run(["ip", "netns", "del", name], capture_output=True)
        raise
    return name


def _our_routes(ns: str) -> int:
    with Rtnl(f"/var/run/netns/{ns}") as rtnl:
        return sum(1 for fam in (socket.AF_INET, socket.AF_INET6) for r in rtnl.routes(fam)
                   if r.protocol == RTPROT_STATEWRIGHT)


def _baseline(nodes: list[Node]) -> float:
    ns = _netns("base")
    try:
        lines = []
        for n in nodes:
            for cidr in n.pod_cidrs:
                gw = n.internal_ip(cidr.version)
                lines.append(f"route add {cidr} via {gw} proto {RTPROT_STATEWRIGHT}")
        start = time.perf_counter()
        _ip(ns, "-batch", "-", stdin="\n".join(lines) + "\n")
        return time.perf_counter() - start
    finally:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


async def _done(db: DB, table: Any, keys: list[Any], gateways: list[Any] | None = None,
                timeout: float = 600) -> None:
    """Wait until the route rows of ``keys`` are Done (and via ``gateways`` when given)."""
    with anyio.fail_after(timeout):
        while True:
            txn = db.read_txn()
            rows = [table.get(txn, k) for k in keys]
            if all(r is not None and r.status.kind is StatusKind.DONE for r in rows) and (
                    gateways is None or [r.gateway for r in rows] == gateways):
                return
            await anyio.sleep(0.0005)


async def _run(ns: str, count: int, changes: int) -> dict[str, Any]:
    db = DB()
    nodes_t, routes_t, devices_t = new_nodes_table(), new_node_routes_table(), new_devices_table()
    db.register(nodes_t, routes_t, devices_t)
    with db.write_txn(devices_t) as txn:
        devices_t.insert(txn, Device(2, "under0", flags=("up",), addresses=(
            DeviceAddress(ipaddress.ip_address("10.60.0.1"), 16),
            DeviceAddress(ipaddress.ip_address("fd60::1"), 64))))
    writer = NodeRoutes(db, nodes_t, routes_t, "node-local", devices_t)
    path = f"/var/run/netns/{ns}"

    def reconciler(ops: RouteOps) -> Reconciler[Any]:
        return Reconciler(db, Config(table=routes_t, operations=ops, batch_operations=ops,
                                     get_object_status=GET, set_object_status=SET,
                                     name="node-routes", target_chunk_size=256,
                                     rate_limit=None))

    out: dict[str, Any] = {}
    nodes = [_node(i) for i in range(count)]
    keys = [c for n in nodes for c in n.pod_cidrs]
    ops = RouteOps(netns=path)
    async with anyio.create_task_group() as tg:
        await tg.start(writer.run)
        rec = reconciler(ops)
        await tg.start(rec.run)
        start = time.perf_counter()
        with db.write_txn(nodes_t) as txn:
            for n in nodes:
                nodes_t.insert(txn, n)
        await _done(db, routes_t, keys)
        took = time.perf_counter() - start
        out.update(initial_routes_s=round(took, 3), routes_per_s=round(len(keys) / took),
                   routes=_our_routes(ns))
        lat = []
        for k in range(changes):
            n = _node(k % count, gen=1 + k // count)
            committed = time.perf_counter()
            with db.write_txn(nodes_t) as txn:
                nodes_t.insert(txn, n)
            await _done(db, routes_t, list(n.pod_cidrs),
                        [n.internal_ip(c.version) for c in n.pod_cidrs])
            lat.append((time.perf_counter() - committed) * 1000)
        lat.sort()
        out["change_p50_ms"] = round(statistics.median(lat), 2)
        out["change_p99_ms"] = round(lat[min(len(lat) - 1, int(len(lat) * 0.99))], 2)
        tg.cancel_scope.cancel()
    # a restarted agent: the same rows Pending again, a new reconciler and Ops
    again = RouteOps(netns=path)
    async with anyio.create_task_group() as tg:
        with db.write_txn(routes_t) as txn:
            for r in list(routes_t.all(txn)):
                routes_t.insert(txn, SET(r, status_pending()))
        start = time.perf_counter()
        await tg.start(reconciler(again).run)
        await _done(db, routes_t, keys)
        out["restart_adopt_s"] = round(time.perf_counter() - start, 3)
        out["restart_writes"] = again.writes
        await tg.start(writer.run)
        start = time.perf_counter()
        with db.write_txn(nodes_t) as txn:
            for n in list(nodes_t.all(txn)):
                nodes_t.delete(txn, n)
        with anyio.fail_after(600):
            while _our_routes(ns):
                await anyio.sleep(0.01)
        out["remove_all_s"] = round(time.perf_counter() - start, 3)
        tg.cancel_scope.cancel()
    return out


def main() -> None:
    """Run the benchmark and print its JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="200 nodes, 20 changes")
    args = parser.parse_args()
    count, changes = (200, 20) if args.quick else (1000, 100)
    result: dict[str, Any] = {"nodes": count, "python": platform.python_version()}
    try:
        ns = _netns("routes")
    except (OSError, subprocess.CalledProcessError) as e:
        result["unavailable"] = f"cannot create a network namespace: {e}"
        print(json.dumps(result))
        return
    try:
        nodes = [_node(i) for i in range(count)]
        result["baseline_ip_batch_s"] = round(_baseline(nodes), 3)
        result.update(anyio.run(_run, ns, count, changes))
    finally:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
