"""Native routes to other nodes' pod CIDRs in the kernel, in a network namespace the test
creates (never the host's routing table): RouteOps (statewright/node_routes.py) alone,
then the whole chain nodes table -> NodeRoutes -> reconciler -> kernel with the devices
table from a netlink source in the same namespace."""

from __future__ import annotations

import errno
import ipaddress
import json
import subprocess
from collections.abc import Callable
from typing import Any

import anyio
import pytest

from reconciler import BatchEntry, Config, Reconciler, status_field_accessors
from statedb import DB
from statewright.node_routes import RTPROT_STATEWRIGHT, RouteConflictError, RouteOps
from tables.node_routes import NodeRoute, NodeRoutes, new_node_routes_table
from tables.nodes import INTERNAL_IP, Node, NodeIP, new_nodes_table

from .helpers import add_dummy, eventually, ip
from .test_netlink_kernel import new_source, running

pytestmark = pytest.mark.kernel

TEST_TIMEOUT = 40.0
GET, SET = status_field_accessors()


def run(test: Callable[[], Any]) -> None:
    async def main() -> None:
        with anyio.fail_after(TEST_TIMEOUT):
            await test()

    anyio.run(main)


def routes_of(ns: str, proto: str | int | None = None) -> set[tuple[str, str, str]]:
    """(destination, gateway, protocol) of the main table's routes of both families."""
    out = set()
    for fam in ("-4", "-6"):
        args = ["ip", "-j", fam, "-n", ns, "route", "show", "table", "main"]
        if proto is not None:
            args += ["proto", str(proto)]
        r = subprocess.run(args, capture_output=True, text=True, check=True)
        for entry in json.loads(r.stdout or "[]"):
            # ip -j leaves out the default protocol (boot); with a filter, the filtered one
            default = "boot" if proto is None else str(proto)
            out.add((entry["dst"], entry.get("gateway", ""), str(entry.get("protocol", default))))
    return out


def ours(ns: str) -> set[tuple[str, str]]:
    return {(dst, gw) for dst, gw, _ in routes_of(ns, RTPROT_STATEWRIGHT)}


async def underlay(ns: str) -> None:
    """A device up with 192.168.77.1/24 and fd77::1/64: the directly connected networks."""
    await add_dummy(ns, "under0")
    await ip(ns, "addr", "add", "192.168.77.1/24", "dev", "under0")
    await ip(ns, "addr", "add", "fd77::1/64", "dev", "under0", "nodad")
    await ip(ns, "link", "set", "under0", "up")
    await ip(ns, "link", "set", "lo", "up")


def row(prefix: str, gw: str, node: str = "b") -> NodeRoute:
    return NodeRoute(ipaddress.ip_network(prefix), ipaddress.ip_address(gw), node)


def test_route_ops_write_adopt_conflict_and_prune(netns: str) -> None:
    path = f"/var/run/netns/{netns}"

    async def body() -> None:
        await underlay(netns)
        # someone else's routes: one to a prefix a node claims, one unrelated
        await ip(netns, "route", "add", "10.9.9.0/24", "via", "192.168.77.9")
        await ip(netns, "route", "add", "10.8.0.0/16", "via", "192.168.77.8", "proto", "static")
        ops = RouteOps(netns=path)
        v4, v6 = row("10.1.0.0/24", "192.168.77.2"), row("fd01::/112", "fd77::2")
        taken = row("10.9.9.0/24", "192.168.77.3", "c")
        far = row("10.2.0.0/24", "10.200.0.1", "d")
        batch = [BatchEntry(r, 1) for r in (v4, v6, taken, far)]
        await ops.update_batch(None, batch)  # type: ignore[arg-type]
        assert batch[0].result is None and batch[1].result is None
        assert isinstance(batch[2].result, RouteConflictError)
        assert "protocol" in str(batch[2].result)
        assert isinstance(batch[3].result, OSError)
        assert batch[3].result.errno == errno.ENETUNREACH
        assert ours(netns) == {("10.1.0.0/24", "192.168.77.2"), ("fd01::/112", "fd77::2")}
        assert ops.writes == 2

        # a second pass (a restarted agent) finds them right: nothing rewritten
        again = RouteOps(netns=path)
        batch = [BatchEntry(r, 2) for r in (v4, v6)]
        await again.update_batch(None, batch)  # type: ignore[arg-type]
        assert (again.writes, again.skipped) == (0, 2)

        # a changed gateway replaces the route
        moved = row("10.1.0.0/24", "192.168.77.4")
        await again.update(None, 3, moved)  # type: ignore[arg-type]
        assert ("10.1.0.0/24", "192.168.77.4") in ours(netns)
        assert ("10.1.0.0/24", "192.168.77.2") not in ours(netns)

        # prune: our stray route goes, nobody else's
        await ip(netns, "route", "add", "10.5.0.0/24", "via", "192.168.77.5", "proto",
                 str(RTPROT_STATEWRIGHT))
        before = routes_of(netns)
        await again.prune(None, iter([moved, v6]))  # type: ignore[arg-type]
        after = routes_of(netns)
        assert before - after == {("10.5.0.0/24", "192.168.77.5", str(RTPROT_STATEWRIGHT))}
        assert ("10.9.9.0/24", "192.168.77.9", "boot") in after
        assert ("10.8.0.0/16", "192.168.77.8", "static") in after

        # delete: ours only, and a missing one is not an error
        await again.delete(None, 4, moved)  # type: ignore[arg-type]
        await again.delete(None, 5, moved)  # type: ignore[arg-type]
        await again.delete(None, 6, row("10.9.9.0/24", "192.168.77.9"))  # type: ignore[arg-type]
        assert ours(netns) == {("fd01::/112", "fd77::2")}
        assert ("10.9.9.0/24", "192.168.77.9", "boot") in routes_of(netns)

    run(body)


def node(name: str, ips: tuple[str, ...], cidrs: tuple[str, ...]) -> Node:
    return Node(
        name,
        tuple(NodeIP(INTERNAL_IP, ipaddress.ip_address(a)) for a in ips),
        tuple(ipaddress.ip_network(c) for c in cidrs),
    )


def test_nodes_to_kernel_routes_follow_nodes_and_restart(netns: str) -> None:
    path = f"/var/run/netns/{netns}"

    async def agent(db: DB, nodes: Any, ops: RouteOps, tg: Any) -> tuple[NodeRoutes, Any]:
        table = new_node_routes_table()
        db.register(table)
        devices = next(t for t in db.tables if t.name == "devices")
        writer = NodeRoutes(db, nodes, table, "a", devices)
        with db.write_txn(table) as txn:
            writer.register_initializer(txn)
        rec = Reconciler(db, Config(table=table, operations=ops, batch_operations=ops,
                                    get_object_status=GET, set_object_status=SET,
                                    name="node-routes", prune_interval=0.2))
        await tg.start(writer.run)
        await tg.start(rec.run)
        return writer, rec

    def nodes_db() -> tuple[DB, Any, Any]:
        db, _, src = new_source(netns)
        nodes = new_nodes_table()
        db.register(nodes)
        return db, nodes, src

    async def body() -> None:
        await underlay(netns)
        db, nodes, src = nodes_db()
        with db.write_txn(nodes) as txn:
            done = nodes.register_initializer(txn, "k8s")
            nodes.insert(txn, node("a", ("192.168.77.1", "fd77::1"), ("10.0.0.0/24",)))
            nodes.insert(txn, node("b", ("192.168.77.2", "fd77::2"),
                                   ("10.1.0.0/24", "fd01::/112")))
            nodes.insert(txn, node("c", ("172.30.0.3",), ("10.3.0.0/24",)))
        # a stray route of ours from an earlier run, for a node that is gone
        await ip(netns, "route", "add", "10.7.0.0/24", "via", "192.168.77.7", "proto",
                 str(RTPROT_STATEWRIGHT))
        ops = RouteOps(netns=path)
        async with running(src), anyio.create_task_group() as tg:
            writer, _ = await agent(db, nodes, ops, tg)
            await anyio.sleep(0.5)
            # not initialized: nothing pruned yet
            assert ("10.7.0.0/24", "192.168.77.7") in ours(netns)
            with db.write_txn(nodes) as txn:
                done(txn)
            want = {("10.1.0.0/24", "192.168.77.2"), ("fd01::/112", "fd77::2")}
            await eventually(lambda: _equal(ours(netns), want))
            assert "not on a directly connected network" in writer.problems["c"]
            assert "a" not in writer.problems
            # node b leaves: its routes go
            with db.write_txn(nodes) as txn:
                nodes.delete(txn, nodes.get(txn, nodes.indexes[0].query("b")))
            await eventually(lambda: _equal(ours(netns), set()))
            with db.write_txn(nodes) as txn:
                nodes.insert(txn, node("b", ("192.168.77.2", "fd77::2"),
                                       ("10.1.0.0/24", "fd01::/112")))
            await eventually(lambda: _equal(ours(netns), want))
            tg.cancel_scope.cancel()
        # a restarted agent adopts the routes: nothing removed or written again
        db2, nodes2, src2 = nodes_db()
        with db2.write_txn(nodes2) as txn:
            nodes2.insert(txn, node("a", ("192.168.77.1",), ("10.0.0.0/24",)))
            nodes2.insert(txn, node("b", ("192.168.77.2", "fd77::2"),
                                    ("10.1.0.0/24", "fd01::/112")))
        ops2 = RouteOps(netns=path)
        async with running(src2), anyio.create_task_group() as tg:
            await agent(db2, nodes2, ops2, tg)
            await eventually(lambda: _equal(ops2.skipped, 2))
            await anyio.sleep(0.5)  # prune rounds pass
            assert ours(netns) == want
            assert (ops2.writes, ops2.deletes) == (0, 0)
            tg.cancel_scope.cancel()

    run(body)


def _equal(got: Any, want: Any) -> None:
    assert got == want
