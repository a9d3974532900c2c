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

import bisect
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


@dataclass(frozen=True, slots=True)
class _Candidate:
    """A pod CIDR of a node as far as the node alone decides: its route, or why none."""

    version: int
    first: int
    last: int
    route: NodeRoute | None
    problem: str = ""


def _candidates(
    node: Node, local: str, local_cidrs: list[IPNetwork], connected: list[IPNetwork]
) -> list[_Candidate]:
    """Each pod CIDR of ``node`` with its route, or the reason it gets none that does not
    depend on the other nodes (overlaps between nodes are settled by `desired_routes`)."""
    out = []
    for cidr in node.pod_cidrs:
        first, last = int(cidr.network_address), int(cidr.broadcast_address)
        why = _refusal(node, cidr, local, local_cidrs, connected)
        gw = node.internal_ip(cidr.version)
        route = NodeRoute(cidr, gw, node.name) if not why and gw is not None else None
        out.append(_Candidate(cidr.version, first, last, route, why))
    return out


def desired_routes(
    nodes: Iterable[Node],
    local: str,
    connected: list[IPNetwork],
    cache: dict[str, tuple[Node, list[_Candidate]]] | None = None,
) -> tuple[dict[IPNetwork, NodeRoute], dict[str, str]]:
    """The routes to the other nodes' pod CIDRs, and per node without (some of) its
    routes the reason (see the module doc). ``cache`` (node name -> the row and its
    candidates, filled here) spares the work for rows seen before, as long as ``local``
    and ``connected`` stay the same; an unchanged node's routes are then the same
    objects as before."""
    routes: dict[IPNetwork, NodeRoute] = {}
    problems: dict[str, list[str]] = {}
    ordered = sorted(nodes, key=lambda n: n.name)
    local_cidrs = [c for n in ordered if n.name == local for c in n.pod_cidrs]
    cache = {} if cache is None else cache
    claims = _Claims()
    for node in ordered:
        if node.name == local:
            continue
        hit = cache.get(node.name)
        if hit is None or hit[0] is not node:
            hit = (node, _candidates(node, local, local_cidrs, connected))
            cache[node.name] = hit
        for cand in hit[1]:
            why = cand.problem
            if cand.route is not None:
                other = claims.overlapping(cand)
                if other is None:
                    routes[cand.route.prefix] = cand.route
                    claims.add(cand)
                    continue
                why = f"pod CIDR {cand.route.prefix} overlaps node {other.node}'s {other.prefix}"
            problems.setdefault(node.name, []).append(why)
    return routes, {name: "; ".join(why) for name, why in problems.items()}


class _Claims:
    """The routes taken so far, per family sorted by first address: they never overlap
    one another, so a new CIDR overlaps one of them only if it overlaps its neighbour
    below or above (two lookups instead of a comparison with every route)."""

    def __init__(self) -> None:
        self._starts: dict[int, list[int]] = {4: [], 6: []}
        self._taken: dict[int, list[_Candidate]] = {4: [], 6: []}

    def add(self, cand: _Candidate) -> None:
        i = bisect.bisect_left(self._starts[cand.version], cand.first)
        self._starts[cand.version].insert(i, cand.first)
        self._taken[cand.version].insert(i, cand)

    def overlapping(self, cand: _Candidate) -> NodeRoute | None:
        starts, taken = self._starts[cand.version], self._taken[cand.version]
        i = bisect.bisect_right(starts, cand.first)
        if i > 0 and taken[i - 1].last >= cand.first:
            return taken[i - 1].route
        if i < len(starts) and starts[i] <= cand.last:
            return taken[i].route
        return None


def _refusal(
    node: Node,
    cidr: IPNetwork,
    local: str,
    local_cidrs: list[IPNetwork],
    connected: list[IPNetwork],
) -> str:
    """Why ``node`` gets no route to ``cidr`` on its own account ("" when it may get one)."""
    if any(c.version == cidr.version and c.overlaps(cidr) for c in local_cidrs):
        return f"pod CIDR {cidr} overlaps this node's ({local})"
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
        #: The rows as last written (by prefix), and the per-node derivation cache with
        #: what it depends on besides the node (connected networks, this node's CIDRs).
        self._written: dict[IPNetwork, NodeRoute] = {}
        self._cache: dict[str, tuple[Node, list[_Candidate]]] = {}
        self._cache_key: tuple[list[IPNetwork], list[IPNetwork]] = ([], [])
        self._init_done: Callable[[WriteTxn], None] | None = None

    def register_initializer(self, txn: WriteTxn) -> None:
        """Keep the routes table uninitialized until `run` wrote its first rows."""
        self._init_done = self.routes.register_initializer(txn, INITIALIZER)

    def sync(self) -> int:
        """Recompute the rows and write the difference; returns rows written or deleted.

        Only rows that are new objects are written: an unchanged node's routes come back
        as the same objects from the cache (`desired_routes`), so a change of one Node
        among thousands costs the walk over the cached nodes, not a rewrite."""
        txn = self.db.read_txn()
        devices = list(self.devices.all(txn)) if self.devices is not None else []
        connected = connected_networks(devices)
        nodes = list(self.nodes.all(txn))
        local_cidrs = [c for n in nodes if n.name == self.local for c in n.pod_cidrs]
        if (connected, local_cidrs) != self._cache_key:
            self._cache, self._cache_key = {}, (connected, local_cidrs)
        want, problems = desired_routes(nodes, self.local, connected, self._cache)
        for name in set(self._cache) - {n.name for n in nodes}:
            del self._cache[name]
        for name, why in problems.items():
            if self.problems.get(name) != why:
                log.warning("node routes: node %s: %s", name, why)
        self.problems = problems
        changed = 0
        last, self._written = self._written, want
        with self.db.write_txn(self.routes) as wtxn:
            for prefix, old in last.items():
                if prefix not in want:
                    self.routes.delete(wtxn, old)
                    changed += 1
            for prefix, row in want.items():
                if last.get(prefix) is not row:
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
            del txn  # a held ReadTxn keeps old row versions (docs/statedb.md)
            self.sync()
            async with anyio.create_task_group() as tg:

                async def wait(w: Any) -> None:
                    await w.wait_async()
                    tg.cancel_scope.cancel()

                for w in watches:
                    tg.start_soon(wait, w)
