"""Every Node of the cluster from the API server, into the nodes table (tables/nodes.py).

`NodesK8sSource` lists and watches all Nodes (CRD mode's node registry,
sources/node_registry.py; in kvstore mode only this node's, ``only=NAME``)
(`sources.k8s_reflector.Reflector`, resource `nodes_resource_spec`) and writes each
delivery in one write transaction through
`tables.nodes.NodeObjects`. A Node that does not convert gets its own error in
`NodesK8sSource.errors` (``Node name`` -> message) and changes nothing: its previous
row, if any, stays until a valid version or its deletion arrives. The ``k8s``
initializer of the nodes table (`register_initializer`) is done with the initial list,
so the route reconciler prunes no route of a node that simply has not been listed yet.

It is not the Kubernetes source's own Node reflector (sources/k8s_source.py), which
follows only this node's Node (``fieldSelector=metadata.name=NODE``) for its labels and
IPAM's pod CIDRs: the LB tables do not wait for the list of every Node, and this one
does not hold the LB's initial sync back (Cilium also watches its local Node apart from
the others).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import anyio
import anyio.abc

from sources.k8s_client import K8sClient
from sources.k8s_reflector import Delta, Reflector, ReflectorConfig, ResourceSpec
from statedb import DB, Table, WriteTxn
from tables.nodes import KIND_NODE, SOURCE_K8S, Node, NodeError, NodeObjects

log = logging.getLogger(__name__)

INITIALIZER = "k8s"


def nodes_resource_spec(only: str = "") -> ResourceSpec:
    """All Nodes (cluster-scoped; the ClusterRole grants list and watch), or only the Node
    named ``only`` (``fieldSelector=metadata.name=<only>``)."""
    if only:
        return ResourceSpec("this-node", KIND_NODE, "v1", "nodes",
                            field_selector=f"metadata.name={only}")
    return ResourceSpec("all-nodes", KIND_NODE, "v1", "nodes")


class NodesK8sSource:
    """See the module doc."""

    label = "k8s"

    def __init__(
        self, db: DB, table: Table[Node], client: K8sClient,
        config: ReflectorConfig | None = None, *, only: str = "",
    ) -> None:
        self.db = db
        self.objects = NodeObjects(table, SOURCE_K8S)
        self.reflector = Reflector(client, nodes_resource_spec(only), self._deliver, config)
        #: Current error per refused Node (``Node name`` -> message).
        self.errors: dict[str, str] = {}
        self.synced = False
        self._init_done: Callable[[WriteTxn], None] | None = None

    def register_initializer(self, txn: WriteTxn) -> None:
        """Keep the nodes table uninitialized until the initial list is in."""
        self._init_done = self.objects.table.register_initializer(txn, INITIALIZER)

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Run the reflector until cancelled."""
        task_status.started()
        await self.reflector.run()

    async def _deliver(self, reflector: Reflector, deltas: list[Delta], synced: bool) -> None:
        self.apply(deltas, synced)

    def apply(self, deltas: list[Delta], synced: bool = False) -> None:
        """Write one delivery (see the module doc)."""
        with self.db.write_txn(self.objects.table) as txn:
            for d in deltas:
                ref = f"{KIND_NODE} {d.key}"
                try:
                    if d.op == "upsert":
                        self.objects.upsert(txn, d.obj)
                    else:
                        self.objects.delete(txn, d.obj)
                except NodeError as e:
                    if self.errors.get(ref) != str(e):
                        log.error("k8s nodes: %s", e)
                    self.errors[ref] = str(e)
                    continue
                self.errors.pop(ref, None)
            if synced and not self.synced:
                self.synced = True
                if self._init_done is not None:
                    self._init_done(txn)
                    self._init_done = None

    def health(self) -> tuple[bool, str]:
        """(ok, message): the reflector's state and the refused Nodes."""
        h = self.reflector.health
        ok = not h.last_error or h.synced
        what = "synced" if h.synced else "not synced"
        message = f"{h.state} ({what})"
        if not ok:
            message += f": {h.last_error}"
        if self.errors:
            first = sorted(self.errors)[0]
            ok = False
            message += f"; {len(self.errors)} Node(s) refused, e.g. {self.errors[first]}"
        return ok, message
