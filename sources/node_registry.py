"""The node registry: where the nodes table learns the other nodes of the cluster from.
One per mode, behind one interface, so the nodes component, the routes and the node
ipcache entries do not know which backend serves them.

* CRD mode (``identity-allocation-mode: crd``, the default): every Node object of the API
  server (sources/k8s_nodes.py, `NodesK8sSource`).
* kvstore mode: etcd's ``nodes/v1/<cluster>/<name>`` keys for the other nodes, and this
  node's own Node from the API server (only it: ``fieldSelector=metadata.name=NODE``),
  published to etcd under the agent's lease (sources/kvstore/nodes.py,
  `KVStoreNodeRegistry`). The API server is then not asked for the list of every Node.

The manifest directory's kind ``Node`` is no registry but a static source beside either
(a setup without an API server gives this node's own Node that way).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import anyio
import anyio.abc

from statedb import DB, Table, WriteTxn
from tables.nodes import Node

if TYPE_CHECKING:
    from sources.k8s_client import K8sClient
    from sources.k8s_reflector import ReflectorConfig
    from sources.kvstore.session import KVStore


class NodeRegistry(Protocol):
    """What the nodes component needs of a registry."""

    #: Where the nodes come from, for health ("k8s", "kvstore").
    label: str

    def register_initializer(self, txn: WriteTxn) -> None:
        """Keep the nodes table uninitialized until the registry's first list is in."""

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Fill and follow the nodes table until cancelled."""

    def health(self) -> tuple[bool, str]:
        """(ok, message)."""


def new_node_registry(
    db: DB, table: Table[Node], node_name: str, *, client: K8sClient | None = None,
    reflector: ReflectorConfig | None = None, kvstore: KVStore | None = None,
) -> NodeRegistry | None:
    """The registry of the mode: kvstore when ``kvstore`` is given, else the API server's
    Nodes when ``client`` is; None with neither (manifests only)."""
    if kvstore is not None:
        from sources.k8s_nodes import NodesK8sSource
        from sources.kvstore.nodes import KVStoreNodeRegistry

        local = (NodesK8sSource(db, table, client, reflector, only=node_name)
                 if client is not None else None)
        return KVStoreNodeRegistry(db, table, kvstore, local)
    if client is not None:
        from sources.k8s_nodes import NodesK8sSource

        return NodesK8sSource(db, table, client, reflector)
    return None
