"""The nodes component: every node of the cluster, and native routes to their pods.

* The ``nodes`` table (tables/nodes.py) from the Node objects: of the API server (all
  Nodes, sources/k8s_nodes.py; when the ``k8s`` component runs) and of the manifest
  directory (kind ``Node``, for a setup without an API server). Each source registers
  its initializer on the table (``k8s``, ``manifests``), so what follows the table —
  the route reconciler's prune, the endpoints' remote-node ipcache entries — waits for
  the whole list.
* With ``auto-direct-node-routes: true`` (Cilium's flag of the same name; default off,
  as in Cilium, because the routes go into the node's real routing table): the
  ``node-routes`` table (tables/node_routes.py: every other node's pod CIDRs via its
  InternalIP when that address is on a directly connected network) and its reconciler,
  which writes the routes into the main routing table with the agent's own routing
  protocol number (statewright/node_routes.py). Routes stay when the agent stops (the
  pods keep their connectivity); ``statewright agent --cleanup`` removes them.

Health: ``nodes`` (how many, the Node reflector's state, refused Nodes) and
``nodes/routes`` (how many routes; Degraded naming each node that gets no route and why,
or the reconciler's errors). ``GET /nodes``: the nodes, the routes with their status, why
nodes have no route, and the route writes, adopted routes and deletions since start.

It comes after the sources (``manifests``, ``k8s``, ``netlink``: the devices table says
which networks are directly connected) and before ``endpoints`` in the component list.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from reconciler import Config, Reconciler, status_field_accessors
from reconciler.health import Level
from sources.node_registry import NodeRegistry
from statedb import DB, Table
from statewright.agent.components.kubernetes import K8S_CLIENT, K8S_SOURCE
from statewright.agent.components.kvstore import KVSTORE
from statewright.agent.components.sources import MANIFESTS
from statewright.agent.components.statedb import DATABASE
from statewright.agent.config import AgentConfig
from statewright.api_types import Request, Route
from statewright.component import DEGRADED, DISABLED, OK, Component, Health, Hive, Provided
from tables.devices import DEVICES_TABLE
from tables.node_routes import NodeRoute, NodeRoutes, new_node_routes_table
from tables.nodes import SOURCE_MANIFESTS, Node, NodeObjects, new_nodes_table

log = logging.getLogger("statewright.agent.nodes")

#: Seconds between two prunes of stray routes of the agent's protocol.
ROUTES_PRUNE_INTERVAL = 60.0

_GET_STATUS, _SET_STATUS = status_field_accessors()

_COUNT = {"type": "integer"}
NODES_SCHEMA = {
    "type": "object",
    "required": ["nodes", "routes", "problems", "route_ops"],
    "properties": {
        "nodes": {"type": "array", "items": {"type": "object", "required": ["name"]}},
        "routes": {"type": "array", "items": {"type": "object", "required": ["prefix"]}},
        "problems": {"type": "object", "additionalProperties": {"type": "string"}},
        "route_ops": {"type": "object", "properties": {
            "writes": _COUNT, "skipped": _COUNT, "deletes": _COUNT}},
    },
}


def _table(db: DB, name: str) -> Table[Any] | None:
    return next((t for t in db.tables if t.name == name), None)


@dataclass(frozen=True, slots=True)
class NodesConfig:
    """What the nodes component needs from the agent's configuration."""

    node_name: str = ""
    auto_direct_node_routes: bool = False

    @classmethod
    def from_agent_config(cls, cfg: AgentConfig) -> NodesConfig:
        """The agent's ``node-name`` and ``auto-direct-node-routes``."""
        return cls(cfg.node_name, cfg.auto_direct_node_routes)


#: The nodes table, for the components that follow the cluster's nodes.
NODES: Provided[Table[Node]] = Provided("nodes", Table)


class NodesComponent(Component):
    """See the module doc."""

    name = "nodes"
    needs = (DATABASE,)
    provides = (NODES,)
    uses = (MANIFESTS, K8S_SOURCE, K8S_CLIENT, KVSTORE)

    def __init__(self, config: NodesConfig) -> None:
        self.config = config
        self.db: DB | None = None
        self.table: Table[Node] | None = None
        self.routes_table: Table[NodeRoute] | None = None
        #: The node registry of the mode (CRD: the API server's Nodes; kvstore: etcd's).
        self.registry: NodeRegistry | None = None
        self.route_writer: NodeRoutes | None = None
        self.route_ops: Any = None  # statewright.node_routes.RouteOps
        self.reconciler: Reconciler[NodeRoute] | None = None

    async def start(self, hive: Hive) -> None:
        """Register the tables, hand kind Node to the manifest source, start the Node
        reflector, and (with auto-direct-node-routes) the routes and their reconciler."""
        db = hive.get(self, DATABASE)
        self.db = db
        table = new_nodes_table()
        db.register(table)
        self.table = table
        manifests = hive.find(self, MANIFESTS)
        if manifests is not None:
            with db.write_txn(table) as txn:
                done = table.register_initializer(txn, "manifests")

            def manifests_in() -> None:
                with db.write_txn(table) as wtxn:
                    done(wtxn)

            manifests.add_kind_handler(NodeObjects(table, SOURCE_MANIFESTS),
                                       on_synced=manifests_in)
        await self._start_registry(hive, db, table)
        hive.provide(self, NODES, table)
        if self.config.auto_direct_node_routes:
            await self._start_routes(hive, db, table)

    async def _start_registry(self, hive: Hive, db: DB, table: Table[Node]) -> None:
        """The node registry of the mode (sources/node_registry.py): the API server's
        Nodes (CRD mode) or etcd's node keys (kvstore mode); none with manifests only."""
        from sources.node_registry import new_node_registry

        k8s_source = hive.find(self, K8S_SOURCE)
        self.registry = new_node_registry(
            db, table, self.config.node_name, client=hive.find(self, K8S_CLIENT),
            reflector=k8s_source.config.reflector if k8s_source is not None else None,
            kvstore=hive.find(self, KVSTORE))
        if self.registry is None:
            return
        with db.write_txn(table) as txn:
            self.registry.register_initializer(txn)
        await hive.spawn(self, self.registry.run, label=f"nodes-{self.registry.label}")

    async def _start_routes(self, hive: Hive, db: DB, table: Table[Node]) -> None:
        from statewright.node_routes import RouteOps

        routes_table = new_node_routes_table()
        db.register(routes_table)
        self.routes_table = routes_table
        devices = _table(db, DEVICES_TABLE)
        if devices is None:
            log.warning("nodes: no devices table (netlink off): every peer counts as "
                        "not directly connected, no route is written")
        self.route_writer = NodeRoutes(db, table, routes_table, self.config.node_name, devices)
        with db.write_txn(routes_table) as txn:
            self.route_writer.register_initializer(txn)
        self.route_ops = RouteOps()
        self.reconciler = Reconciler(db, Config(
            table=routes_table,
            operations=self.route_ops,
            batch_operations=self.route_ops,
            get_object_status=_GET_STATUS,
            set_object_status=_SET_STATUS,
            name=routes_table.name,
            target_chunk_size=256,
            prune_interval=ROUTES_PRUNE_INTERVAL,
        ))
        await hive.spawn(self, self.route_writer.run, label="nodes-routes")
        await hive.spawn(self, self.reconciler.run, label="nodes-routes-reconciler")

    # ----- reporting ----------------------------------------------------------------------
    def health(self) -> list[Health]:
        """``nodes`` and ``nodes/routes`` (see the module doc)."""
        if self.table is None:
            return [Health(self.name, DEGRADED, "not started")]
        return [self._nodes_health(), self._routes_health()]

    def _nodes_health(self) -> Health:
        assert self.table is not None and self.db is not None
        message = f"{self.table.count(self.db.read_txn())} node(s)"
        ok = True
        if self.registry is not None:
            ok, why = self.registry.health()
            message += f"; {self.registry.label}: {why}"
        return Health(self.name, OK if ok else DEGRADED, message)

    def _routes_health(self) -> Health:
        name = f"{self.name}/routes"
        if not self.config.auto_direct_node_routes:
            return Health(name, DISABLED, "auto-direct-node-routes: false")
        routes, rec = self.route_writer, self.reconciler
        if routes is None or rec is None or self.routes_table is None:
            return Health(name, DEGRADED, "not started")
        problems = [f"node {n}: {why}" for n, why in sorted(routes.problems.items())]
        if rec.health.level is not Level.OK:
            problems.append(f"reconciler: {rec.health.message}")
        count = self.routes_table.count(routes.db.read_txn())
        if problems:
            return Health(name, DEGRADED, f"{count} route(s); " + "; ".join(problems))
        return Health(name, OK, f"{count} route(s) to other nodes' pod CIDRs")

    def routes(self) -> Sequence[Route]:
        """``/nodes`` (see the module doc)."""
        return (Route("/nodes", self._status, response=NODES_SCHEMA,
                      summary="the cluster's nodes, the routes to their pods, route writes"),)

    async def _status(self, _req: Request) -> Any:
        db, writer = self.db, self.route_writer
        txn = db.read_txn() if db is not None else None
        nodes = ([n.to_json() for n in self.table.all(txn)]
                 if self.table is not None and txn is not None else [])
        routes = ([r.to_json() for r in self.routes_table.all(txn)]
                  if self.routes_table is not None and txn is not None else [])
        return {
            "nodes": nodes,
            "routes": routes,
            "problems": dict(writer.problems) if writer is not None else {},
            "route_ops": self.routes_stats(),
        }

    def cleanup(self) -> list[str]:
        """Delete the routes of the agent's routing protocol (auto-direct-node-routes)."""
        if not self.config.auto_direct_node_routes:
            return []
        from statewright.node_routes import RTPROT_STATEWRIGHT
        from statewright.rtnl import Rtnl

        removed = []
        with Rtnl() as rtnl:
            for fam in (socket.AF_INET, socket.AF_INET6):
                for r in rtnl.routes(fam):
                    if r.protocol == RTPROT_STATEWRIGHT and rtnl.delete_route(
                            r.dst, r.prefixlen, r.gateway, RTPROT_STATEWRIGHT):
                        removed.append(f"route {r.dst}/{r.prefixlen} via {r.gateway}")
        return removed

    def routes_stats(self) -> dict[str, Any]:
        """The route writes, adopted routes and deletions so far (tests, benchmarks)."""
        return self.route_ops.stats() if self.route_ops is not None else {}

