"""The cluster state the endpoints component shares with the other nodes, one backend per
mode behind one interface: the identities' numbering and the remote endpoints (this
node's published, the others' into the ipcache). The endpoints component holds what
`new_identity_sync` and `new_remote_endpoints` return and does not know which backend
serves it; the node registry is the same for the nodes component
(sources/node_registry.py).

* CRD mode (with an API server): CiliumIdentity objects (sources/k8s_identities.py,
  health ``endpoints/identities``) and CiliumEndpoints (sources/k8s_endpoints.py, health
  ``endpoints/cilium-endpoints``).
* kvstore mode: etcd's identity keys (sources/kvstore/identities.py, health
  ``endpoints/identities``) and ipcache keys (sources/kvstore/ipcache.py, health
  ``endpoints/kvstore-ipcache``).

Without either (manifests only) there is nothing to share: the identities are this
node's own (tables/identities.py) and there are no remote endpoints.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import anyio
import anyio.abc

from statedb import DB, WriteTxn
from tables.cluster_identities import ClusterIdentityAllocator
from tables.endpoint_manager import EndpointManager
from tables.l3n4 import IPAddress
from tables.remote_endpoints import RemoteEndpointEntries

if TYPE_CHECKING:
    from sources.k8s_client import K8sClient
    from sources.k8s_source import SourceConfig
    from sources.kvstore.session import KVStore


class ClusterSync(Protocol):
    """One backend's part of the cluster state, run by the endpoints component."""

    #: Its health line, under the endpoints component's name.
    health_name: str

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Follow the backend (and publish this node's part) until cancelled."""

    def health(self) -> tuple[bool, str]:
        """(ok, message)."""


class RemoteEndpointsSync(ClusterSync, Protocol):
    def register_initializer(self, txn: WriteTxn) -> None:
        """Keep the ipcache uninitialized (no prune) until the backend's first list."""


class K8sCluster(Protocol):
    """What CRD mode needs of the Kubernetes source."""

    client: K8sClient
    config: SourceConfig

    def pod_uid_of(self, namespace: str, name: str) -> str | None: ...


def new_identity_sync(
    manager: EndpointManager, *, k8s: K8sCluster | None = None, kvstore: KVStore | None = None
) -> ClusterSync | None:
    """The identity numbering of the mode (``manager`` has a `ClusterIdentityAllocator`
    when there is one): kvstore when ``kvstore`` is given, else the API server's."""
    alloc = manager.identities
    if not isinstance(alloc, ClusterIdentityAllocator):
        return None
    if kvstore is not None:
        from sources.kvstore.identities import KVStoreIdentities

        return KVStoreIdentities(alloc, kvstore.session, manager.renumber_identities,
                                 kvstore.node_name, kvstore.layout, grace=kvstore.grace)
    if k8s is not None:
        from sources.k8s_identities import ClusterIdentities

        return ClusterIdentities(alloc, k8s.client, manager.renumber_identities,
                                 k8s.config.reflector)
    return None


def new_remote_endpoints(
    db: DB, manager: EndpointManager, node_ip: Callable[[], IPAddress | None], *,
    k8s: K8sCluster | None = None, kvstore: KVStore | None = None,
) -> RemoteEndpointsSync | None:
    """The remote endpoints of the mode, its initializer registered on the ipcache."""
    sync: Any
    ipcache = manager.entries.ipcache
    if kvstore is not None:
        from sources.kvstore.ipcache import KVStoreEndpoints

        sync = KVStoreEndpoints(db, kvstore.session, ipcache, manager.endpoints, node_ip,
                                kvstore.layout, grace=kvstore.grace)
    elif k8s is not None:
        from sources.k8s_endpoints import CiliumEndpoints

        def is_local(key: str) -> bool:
            return manager.resolve(f"pod-name:{key}") is not None

        sync = CiliumEndpoints(
            db, k8s.client, endpoints=manager.endpoints, identities=manager.identities.table,
            entries=RemoteEndpointEntries(ipcache, is_local), pod_uid_of=k8s.pod_uid_of,
            node_ip=node_ip, config=k8s.config.reflector)
    else:
        return None
    with db.write_txn(ipcache) as txn:
        sync.register_initializer(txn)
    result: RemoteEndpointsSync = sync
    return result
