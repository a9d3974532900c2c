"""Native routes to the other nodes' pods (Cilium's auto-direct-node-routes): the
``node-routes`` table, derived from the nodes and devices tables.

For every node but this one, and each of its pod CIDRs, one row: the CIDR via the
node's InternalIP of the CIDR's family. The route reconciler (statewright/node_routes.py)
writes the rows into the kernel's main routing table. A node gets no route, and a
problem saying why (`NodeRoutes.problems`, shown in the ``nodes`` health), when:

* it has no InternalIP of the CIDR's family;
* its InternalIP is not on a directly connected network: no up device of this node
  (the devices table, from netlink) has an address whose prefix holds it, so the
  kernel could not send to it without another router (that is tunnel mode's case);
* its pod CIDR overlaps this node's pod CIDRs, or another node's (the node whose name
  sorts first keeps the route: the choice is the same on every agent).

`NodeRoutes.run` recomputes the rows whenever the nodes or devices table changes and
writes only the difference, so an unchanged route is never handed to the reconciler
again. Its initializer on the ``node-routes`` table is done once the nodes and devices
tables are initialized and the first rows are written: until then the reconciler prunes
none of the routes of an earlier run.
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import anyio

from reconciler.status import Status, status_pending
from statedb import DB, Index, Table, WriteTxn
from statedb import keys as keycodec
from tables.devices import SCOPE_LINK, SCOPE_UNIVERSE, Device
from tables.l3n4 import IPAddress, IPNetwork
from tables.nodes import Node

log = logging.getLogger(__name__)

NODE_ROUTES_TABLE = "node-routes"
INITIALIZER = "node-routes"


@dataclass(frozen=True, slots=True)
class NodeRoute:
    """One desired route: a node's pod CIDR via the node's InternalIP."""

    prefix: IPNetwork
    gateway: IPAddress
    node: str
    status: Status = field(default_factory=status_pending, compare=False)

    def to_json(self) -> dict[str, Any]:
        """JSON form (``db show node-routes -o json``)."""
        return {"prefix": str(self.prefix), "gateway": str(self.gateway), "node": self.node,
                "status": str(self.status.kind)}

    @staticmethod
    def table_header() -> list[str]:
        """Columns of ``db show node-routes``."""
        return ["Prefix", "Gateway", "Node", "Status"]

    def table_row(self) -> list[str]:
        """Cells of ``db show node-routes``."""
        return [str(self.prefix), str(self.gateway), self.node, str(self.status.kind)]


node_route_prefix_index: Index[NodeRoute, IPNetwork] = Index(
    "prefix", key=lambda r: r.prefix, encode=keycodec.ip_network, parse=ipaddress.ip_network
)
node_route_node_index: Index[NodeRoute, str] = Index(
    "node", key=lambda r: r.node, encode=keycodec.string, unique=False
)


def new_node_routes_table() -> Table[NodeRoute]:
    """A new, unregistered ``node-routes`` table."""
    return Table(NODE_ROUTES_TABLE, node_route_prefix_index, node_route_node_index,
                 row_type=NodeRoute)


def connected_networks(devices: Iterable[Device]) -> list[IPNetwork]:
    """The networks of this node's up, non-loopback devices (universe and link scope
    addresses with their prefixes): where a next hop can be reached directly."""
    out: list[IPNetwork] = []
    for dev in devices:
        if not dev.up or dev.loopback:
            continue
        for a in dev.addresses:
            if a.scope not in (SCOPE_UNIVERSE, SCOPE_LINK):
                continue
            net: IPNetwork
            if a.address.version == 4:
                net = ipaddress.IPv4Network((int(a.address), a.prefixlen), strict=False)
            else:
                net = ipaddress.IPv6Network((int(a.address), a.prefixlen), strict=False)
            if net not in out:
                out.append(net)
    return out


def desired_routes(
    nodes: Iterable[Node], local: str, connected: list[IPNetwork]
) -> tuple[dict[IPNetwork, NodeRoute], dict[str, str]]:
    """The routes to the other nodes' pod CIDRs, and per node without (some of) its
    routes the reason (see the module doc)."""
    routes: dict[IPNetwork, NodeRoute] = {}
    problems: dict[str, list[str]] = {}
    ordered = sorted(nodes, key=lambda n: n.name)
    local_cidrs = [c for n in ordered if n.name == local for c in n.pod_cidrs]
    for node in ordered:
        if node.name == local:
            continue
        for cidr in node.pod_cidrs:
            why = _refusal(node, cidr, local, local_cidrs, routes, connected)
            if why:
                problems.setdefault(node.name, []).append(why)
                continue
            gw = node.internal_ip(cidr.version)
            assert gw is not None
            routes[cidr] = NodeRoute(cidr, gw, node.name)
    return routes, {name: "; ".join(why) for name, why in problems.items()}


def _refusal(
    node: Node,
    cidr: IPNetwork,
    local: str,
    local_cidrs: list[IPNetwork],
    routes: dict[IPNetwork, NodeRoute],
    connected: list[IPNetwork],
) -> str:
    """Why ``node`` gets no route to ``cidr`` ("" when it gets one)."""
    if any(c.version == cidr.version and c.overlaps(cidr) for c in local_cidrs):
        return f"pod CIDR {cidr} overlaps this node's ({local})"
    other = next(
        (r for r in routes.values() if r.prefix.version == cidr.version
         and r.prefix.overlaps(cidr)), None)
    if other is not None:
        return f"pod CIDR {cidr} overlaps node {other.node}'s {other.prefix}"
    gw = node.internal_ip(cidr.version)
    if gw is None:
        return f"no IPv{cidr.version} InternalIP for pod CIDR {cidr}"
    if not any(gw in net for net in connected if net.version == gw.version):
        return (f"InternalIP {gw} is not on a directly connected network: "
                f"no route to pod CIDR {cidr}")
    return ""


class NodeRoutes:
    """Keeps the ``node-routes`` table derived from the nodes and devices tables."""

    def __init__(
        self,
        db: DB,
        nodes: Table[Node],
        routes: Table[NodeRoute],
        local: str,
        devices: Table[Device] | None,
    ) -> None:
        self.db = db
        self.nodes = nodes
        self.routes = routes
        self.local = local
        self.devices = devices
        #: Node name -> why (some of) its routes are missing.
        self.problems: dict[str, str] = {}
        #: True once the first rows were written from initialized tables.
        self.initialized = False
        self._init_done: Callable[[WriteTxn], None] | None = None

    def register_initializer(self, txn: WriteTxn) -> None:
        """Keep the routes table uninitialized until `run` wrote its first rows."""
        self._init_done = self.routes.register_initializer(txn, INITIALIZER)

    def sync(self) -> int:
        """Recompute the rows and write the difference; returns rows written or deleted."""
        txn = self.db.read_txn()
        devices = list(self.devices.all(txn)) if self.devices is not None else []
        want, problems = desired_routes(self.nodes.all(txn), self.local,
                                        connected_networks(devices))
        for name, why in problems.items():
            if self.problems.get(name) != why:
                log.warning("node routes: node %s: %s", name, why)
        self.problems = problems
        changed = 0
        with self.db.write_txn(self.routes) as wtxn:
            for old in list(self.routes.all(wtxn)):
                if old.prefix not in want:
                    self.routes.delete(wtxn, old)
                    changed += 1
            for prefix, row in want.items():
                cur = self.routes.get(wtxn, node_route_prefix_index.query(prefix))
                if cur != row:
                    self.routes.insert(wtxn, row)
                    changed += 1
            if not self.initialized and self._sources_initialized(wtxn):
                self.initialized = True
                if self._init_done is not None:
                    self._init_done(wtxn)
                    self._init_done = None
        return changed

    def _sources_initialized(self, txn: Any) -> bool:
        tables = [self.nodes] + ([self.devices] if self.devices is not None else [])
        return all(t.initialized(txn)[0] for t in tables)

    async def run(self, *, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
        """`sync` whenever the nodes or devices table (or their initialization) changes."""
        task_status.started()
        while True:
            txn = self.db.read_txn()
            sources = [self.nodes] + ([self.devices] if self.devices is not None else [])
            watches = [t.all_watch(txn)[1] for t in sources]
            for t in sources:
                done, init_watch = t.initialized(txn)
                if not done:  # (an initialized table's watch is closed already)
                    watches.append(init_watch)
            self.sync()
            async with anyio.create_task_group() as tg:

                async def wait(w: Any) -> None:
                    await w.wait_async()
                    tg.cancel_scope.cancel()

                for w in watches:
                    tg.start_soon(wait, w)
