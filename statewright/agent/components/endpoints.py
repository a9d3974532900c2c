"""The endpoints component: IPAM, identities, the endpoints table, the endpoint (lxc) and
ipcache maps with their reconcilers, restore at start, and the endpoint/IPAM API routes.

Needs ``db`` (the statedb `DB`). When a ``node-addresses`` table is registered in it by the
time this component starts (the LB component registers it: list this component after it),
the host entries follow it; otherwise only the IPAM router addresses are host entries.
Provides ``endpoints`` (the `EndpointManager`).

Start-up order, so nothing is pruned or served too early:

1. register the tables and an initializer ``endpoint-restore`` on the two entry tables
   (the reconcilers prune only once it is done);
2. open (adopt) the pinned maps and start the two reconcilers;
3. restore IPAM, then the endpoints (tables/endpoint_manager.py: those whose interface is
   gone are removed and their addresses released), then the host and world entries;
4. complete the initializer: the reconcilers prune whatever no row explains; the
   restored endpoints go from ``restoring`` to ``regenerating``;
5. follow the node addresses (host entries) and the entry statuses (endpoints become
   ``ready`` once their entries are written); with the ``k8s`` component, follow the
   labels of this node's Pods: an endpoint's identity labels include its Pod's labels
   (`EndpointManager.sync_pod_labels`), so a label change on the Pod moves the endpoint
   to another identity; and the labels of the Namespaces (sources/k8s_namespaces.py,
   health ``endpoints/namespaces``), copied into the identities of their pods as
   ``k8s:io.cilium.k8s.namespace.labels.<key>``. With the ``k8s`` or ``kvstore``
   component identities are the cluster's (tables/cluster_identities.py); without
   either, this node's. The cluster's state comes from the backend of the mode, behind
   one interface (sources/cluster_state.py): the identity numbering (health
   ``endpoints/identities``) and the remote endpoints, one published per local pod
   endpoint and those of the other nodes' pods as ipcache entries (an initializer on the
   ipcache table until their initial list is in): CiliumIdentity and CiliumEndpoint
   objects (health ``endpoints/cilium-endpoints``) in CRD mode, etcd's keys (health
   ``endpoints/kvstore-ipcache``) in kvstore mode;
6. with the ``nodes`` component: follow the nodes table (tables/nodes.py): every address
   of the other nodes gets a remote-node ipcache entry (`EntryTables.set_nodes`), and this
   node's own Node addresses join the host entries. An initializer ``nodes`` on the
   ipcache table is done once the nodes table is initialized and those entries are
   written, so a restarted agent prunes (and rewrites) no entry of another node.

Routes follow Cilium's API: ``PUT/GET/PATCH/DELETE /endpoint/{id}``, ``GET /endpoint``,
``POST /ipam`` (``?family=ipv4|ipv6&owner=..``), ``POST /ipam/{ip}``, ``DELETE /ipam/{ip}``,
``GET /ipam``. A bad request gets a 4xx `ApiError` with the reason and changes nothing.

``DELETE /endpoint/{id}`` answers once both reconcilers have processed the removal of the
endpoint's entries (normally: they are out of the maps): the endpoint is
``disconnecting`` meanwhile, at most ``endpoint_api.DISCONNECT_TIMEOUT`` seconds. A removal
that failed is the reconcilers' to retry and shows in health; the deletion completes
anyway. The handlers are in endpoint_api.py.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import anyio

from bpf.catalog import endpoints_spec, ipcache_spec
from bpf.factory import BackendConfig, BackendKind, MapFactory
from bpf.typed_map import TypedMap
from bpfops.endpoint_ops import EndpointMapOps
from bpfops.ipcache_ops import IPCacheOps
from reconciler import Reconciler
from reconciler.health import Level
from sources.cluster_state import (
    ClusterSync,
    RemoteEndpointsSync,
    new_identity_sync,
    new_remote_endpoints,
)
from sources.k8s_client import K8sClient
from sources.k8s_node_cidrs import NodePodCIDRs, NodeSource
from statedb import DB, Table, WatchSet
from statewright.agent.components.kubernetes import K8S_SOURCE
from statewright.agent.components.kvstore import KVSTORE
from statewright.agent.components.map_reconciler import map_reconciler
from statewright.agent.components.nodes import NODES
from statewright.agent.components.statedb import DATABASE
from statewright.agent.config import DEFAULT_POD_CIDRS, DEFAULT_STATE_DIR, AgentConfig
from statewright.api_types import Route
from statewright.component import (
    DEGRADED,
    OK,
    Component,
    Health,
    Hive,
    MapView,
    Provided,
    typed_map_view,
)
from statewright.netns_cookie import netns_cookie
from statewright.sysctl_ops import ORIGINALS_FILE
from tables.cluster_identities import ClusterIdentityAllocator
from tables.endpoint_entries import EntryTables
from tables.endpoint_manager import (
    ENDPOINTS_DIR,
    EndpointManager,
    LinkCheck,
    RestoreResult,
    host_link_exists,
)
from tables.endpoints import NamedPort
from tables.identities import IdentityAllocator
from tables.ipam import IPAM, IPAMConfig
from tables.namespaces import Namespace, NamespaceObjects, namespace_labels, new_namespaces_table
from tables.nodes import Node, node_name_index

if TYPE_CHECKING:
    # Imported where the ``k8s`` component runs: these modules import the ``kubernetes``
    # package, which an agent without an API server never needs.
    from sources.k8s_namespaces import NamespaceSource
    from sources.k8s_source import SourceConfig

log = logging.getLogger("statewright.agent.endpoints")

RESTORE_INITIALIZER = "endpoint-restore"
HOST_INITIALIZER = "host-entries"
NODES_INITIALIZER = "nodes"
NODE_ADDRESSES_TABLE = "node-addresses"


@dataclass(frozen=True, slots=True)
class EndpointsConfig:
    """What the component needs from the agent's configuration."""

    pod_cidrs: tuple[str, ...] = DEFAULT_POD_CIDRS
    state_dir: str = DEFAULT_STATE_DIR
    backend: BackendKind = "auto"
    pin_dir: str = "/sys/fs/bpf/statewright"
    prune_interval: float | None = 300.0
    #: IPAM waits for the Node's spec.podCIDRs from the ``k8s`` component (no pod CIDRs
    #: configured); `pod_cidrs` is then only the fallback when that component is absent.
    pod_cidrs_from_node: bool = False
    #: This node's name (its Node's addresses are host entries, the others' remote-node).
    node_name: str = ""

    @classmethod
    def from_agent_config(cls, cfg: AgentConfig) -> EndpointsConfig:
        """The agent's ``pod-cidrs``, ``state-dir``, ``backend`` and ``pin-dir``."""
        maps = cfg.map_backend()
        return cls(pod_cidrs=tuple(cfg.pod_cidrs) or DEFAULT_POD_CIDRS, state_dir=cfg.state_dir,
                   backend=maps.backend, pin_dir=maps.pin_dir,
                   pod_cidrs_from_node=cfg.pod_cidrs_from_node, node_name=cfg.node_name)


#: The endpoint manager, for the components that follow the endpoints.
ENDPOINTS: Provided[EndpointManager] = Provided("endpoints", EndpointManager)


class EndpointsComponent(Component):
    """See the module doc."""

    name = "endpoints"
    needs = (DATABASE,)
    provides = (ENDPOINTS,)
    uses = (K8S_SOURCE, NODES, KVSTORE)

    def __init__(self, config: EndpointsConfig, link_exists: LinkCheck = host_link_exists) -> None:
        self.config = config
        self.link_exists = link_exists
        self.manager: EndpointManager | None = None
        self.ipam: IPAM | None = None
        self.maps: dict[str, TypedMap[Any, Any]] = {}
        self.ops: dict[str, EndpointMapOps | IPCacheOps] = {}
        self.reconcilers: dict[str, Reconciler[Any]] = {}
        self.restore_result = RestoreResult()
        self.maps_kind = ""
        #: IPAM's pod CIDRs following the Node (with the ``k8s`` component), else None.
        self.node_cidrs: NodePodCIDRs | None = None
        #: The namespaces table: each Namespace's labels, for pod identities.
        self.namespaces: Table[Namespace] | None = None
        #: The Namespaces of the API server (with the ``k8s`` component).
        self.namespace_source: NamespaceSource | None = None
        #: The cluster's identity numbering, of the mode (sources/cluster_state.py:
        #: CiliumIdentities with the ``k8s`` component, etcd's keys with ``kvstore``).
        self.identity_sync: ClusterSync | None = None
        #: The remote endpoints and this node's published, of the mode (CiliumEndpoints,
        #: or etcd's ipcache keys).
        self.remote_endpoints: RemoteEndpointsSync | None = None
        #: The nodes table (with the ``nodes`` component), for node ipcache entries.
        self.nodes: Table[Node] | None = None
        self._nodes_done: Callable[[Any], None] | None = None
        self._host_done: Callable[[Any], object] | None = None

    # ----- lifecycle ----------------------------------------------------------------------------
    async def start(self, hive: Hive) -> None:
        """Steps 1-5 of the module doc."""
        db = hive.get(self, DATABASE)
        cfg = self.config
        ipam_config, source = self._ipam_config(hive)
        ipam = IPAM(db, ipam_config)
        if source is not None:
            configured = () if cfg.pod_cidrs_from_node else cfg.pod_cidrs
            self.node_cidrs = NodePodCIDRs(ipam, source, configured)
        pods = _pod_label_source(hive, self)
        kv = hive.find(self, KVSTORE)
        # With an API server or a kvstore the numbering is the cluster's (CiliumIdentity
        # objects, or etcd's keys); without either (manifests only) it is this node's.
        cluster = pods is not None or kv is not None
        identities = ClusterIdentityAllocator(db) if cluster else IdentityAllocator(db)
        entries = EntryTables()
        namespaces = self._namespaces(hive, db, pods)
        manager = EndpointManager(
            db,
            ipam,
            identities,
            cfg.state_dir,
            entries=entries,
            netns_cookie=netns_cookie,
            pod_labels_of=pods.pod_labels_of if pods is not None else None,
            pod_ports_of=getattr(pods, "pod_ports_of", None),
            namespace_labels_of=lambda ns: namespace_labels(db.read_txn(), namespaces, ns),
        )
        self.nodes = hive.find(self, NODES)
        with db.write_txn(entries.endpoint_map, entries.ipcache) as txn:
            done_endpoint_map = entries.endpoint_map.register_initializer(txn, RESTORE_INITIALIZER)
            done_ipc = entries.ipcache.register_initializer(txn, RESTORE_INITIALIZER)
            if self.nodes is not None:
                self._nodes_done = entries.ipcache.register_initializer(txn, NODES_INITIALIZER)
            host_done = [t.register_initializer(txn, HOST_INITIALIZER)
                         for t in (entries.endpoint_map, entries.ipcache)]
        self._host_done = lambda wtxn: [done(wtxn) for done in host_done]
        self.ipam, self.manager = ipam, manager
        self.remote_endpoints = new_remote_endpoints(db, manager, self._node_ip(db, pods),
                                                     k8s=pods, kvstore=kv)

        factory = MapFactory(BackendConfig(backend=cfg.backend, pin_dir=cfg.pin_dir))
        self.maps_kind = factory.kind
        endpoint_map = factory.open_typed(endpoints_spec())
        try:
            ipc_map = factory.open_typed(ipcache_spec())
        except BaseException:
            endpoint_map.close()
            raise
        self.maps = {"endpoints": endpoint_map, "ipcache": ipc_map}
        try:
            await self._start_with_maps(hive, db, manager, entries, done_endpoint_map, done_ipc)
        except BaseException:
            await self.stop()
            raise

    async def _start_with_maps(
        self,
        hive: Hive,
        db: DB,
        manager: EndpointManager,
        entries: EntryTables,
        done_endpoint_map: Callable[[Any], None],
        done_ipc: Callable[[Any], None],
    ) -> None:
        """Steps 2 (reconcilers) to 5 of the module doc, once the maps are open."""
        cfg, ipam = self.config, manager.ipam
        endpoint_map, ipc_map = self.maps["endpoints"], self.maps["ipcache"]
        ep_ops, ipc_ops = EndpointMapOps(endpoint_map), IPCacheOps(ipc_map)
        self.ops = {"endpoint-map": ep_ops, "ipcache": ipc_ops}
        self.reconcilers = {
            "endpoint-map": map_reconciler(db, entries.endpoint_map, ep_ops, cfg.prune_interval),
            "ipcache": map_reconciler(db, entries.ipcache, ipc_ops, cfg.prune_interval),
        }
        for name, rec in self.reconcilers.items():
            await hive.spawn(self, rec.run, label=f"{self.name}-{name}")

        def restore() -> None:
            # endpoints claim their addresses before the router addresses are reserved
            ipam.restore(reserve_router=False)
            self.restore_result = manager.restore(self.link_exists)
            ipam.reserve_routers()
            self._sync_host(db, manager)

        await anyio.to_thread.run_sync(restore)
        with db.write_txn(entries.endpoint_map, entries.ipcache) as txn:
            done_endpoint_map(txn)
            done_ipc(txn)
        manager.finish_restore()
        await hive.spawn(self, self._follow_node_addresses(db, manager), label="endpoints-host")
        await hive.spawn(self, self._follow_entries(db, manager), label="endpoints-ready")
        if self.nodes is not None:
            await hive.spawn(self, self._follow_nodes(db, manager, self.nodes),
                             label="endpoints-nodes")
        if self.node_cidrs is not None:
            self.node_cidrs.on_change = lambda: self._sync_host(db, manager)
            await hive.spawn(self, self.node_cidrs.run, label="endpoints-pod-cidrs")
        pods = _pod_label_source(hive, self)
        self.identity_sync = new_identity_sync(manager, k8s=pods,
                                               kvstore=hive.find(self, KVSTORE))
        for sync in (self.identity_sync, self.remote_endpoints):
            if sync is not None:
                await hive.spawn(self, sync.run, label=f"endpoints-{sync.health_name}")
        if pods is not None:
            follow_pods = _follow_labels(pods.wait_pod_labels, manager)
            await hive.spawn(self, follow_pods, label="endpoints-pod-labels")
        if self.namespace_source is not None:
            await hive.spawn(self, self.namespace_source.run, label="endpoints-namespaces")
        assert self.namespaces is not None
        await hive.spawn(self, _follow_namespaces(db, self.namespaces, manager),
                         label="endpoints-namespace-labels")
        hive.provide(self, ENDPOINTS, manager)

    def _node_ip(self, db: DB, pods: PodLabelSource | None) -> Callable[[], Any]:
        """This node's address as other nodes reach its pods: the Node's InternalIP,
        else the lowest host address."""
        def node_ip() -> Any:
            ip = None
            if pods is not None:  # the k8s component runs: its modules are imported
                from sources.k8s_endpoints import node_internal_ip

                ip = node_internal_ip(getattr(pods, "node", None))
            if ip is None:
                ips = sorted(self._host_ips(db), key=lambda a: (a.version, int(a)))
                ip = ips[0] if ips else None
            return ip
        return node_ip

    def _namespaces(self, hive: Hive, db: DB, pods: PodLabelSource | None) -> Table[Namespace]:
        """The namespaces table, registered, with its sources: the manifest source's
        Namespace objects (when the agent has one) and the API server's (with the ``k8s``
        component); each holds an initializer until its initial state is in."""
        table = new_namespaces_table()
        db.register(table)
        self.namespaces = table
        manifests = next(
            (getattr(c, "source", None) for c in hive.components if c.name == "manifests"), None
        )
        if manifests is not None:
            with db.write_txn(table) as txn:
                done = table.register_initializer(txn, "manifests")

            def manifests_in() -> None:
                with db.write_txn(table) as wtxn:
                    done(wtxn)

            manifests.add_kind_handler(NamespaceObjects(table), on_synced=manifests_in)
        if pods is not None:
            from sources.k8s_namespaces import NamespaceSource

            self.namespace_source = NamespaceSource(pods.client, db, table, pods.config.reflector)
            with db.write_txn(table) as txn:
                self.namespace_source.register_initializer(txn)
        return table

    def _ipam_config(self, hive: Hive) -> tuple[IPAMConfig, NodeSource | None]:
        """IPAM's configuration: the configured pod CIDRs, or none yet (pending) when they
        come from the Node; and the ``k8s`` component's source (None without it), which
        `node_cidrs` follows (sources/k8s_node_cidrs.py)."""
        cfg = self.config
        source: NodeSource | None = hive.find(self, K8S_SOURCE)
        if cfg.pod_cidrs_from_node and source is None:
            log.warning("endpoints: no Kubernetes source for the Node's pod CIDRs; using %s",
                        ", ".join(cfg.pod_cidrs))
        if cfg.pod_cidrs_from_node and source is not None:
            pending = f"Node {source.node_name}'s spec.podCIDRs"
            return IPAMConfig(state_dir=cfg.state_dir, pending=pending), source
        return IPAMConfig.parse(cfg.pod_cidrs, cfg.state_dir), source

    async def stop(self) -> None:
        """Close the maps (their pins stay: the next start adopts them)."""
        for m in self.maps.values():
            m.close()
        self.maps = {}

    def _host_ips(self, db: DB) -> list[Any]:
        """This node's addresses: the node-addresses table's and its Node object's."""
        txn = db.read_txn()
        table = _node_addresses(db)
        ips = [na.address for na in table.all(txn)] if table is not None else []
        if self.nodes is not None:
            local = self.nodes.get(txn, node_name_index.query(self.config.node_name))
            if local is not None:
                ips += [ip for ip in local.ips() if ip not in ips]
        return ips

    def _sync_host(self, db: DB, manager: EndpointManager) -> None:
        """The host entries (`EndpointManager.sync_host`); once they are complete — the
        node-addresses and nodes tables initialized, IPAM's pod CIDRs known (its router
        addresses and the world entries' families) — the ``host-entries`` initializer, so
        that no host or world entry of the pinned maps is pruned and written again after
        a restart. Called from the event loop and from worker threads."""
        manager.sync_host(self._host_ips(db))
        if self._host_done is None:
            return
        txn = db.read_txn()
        tables = [t for t in (_node_addresses(db), self.nodes) if t is not None]
        if manager.ipam.pending or not all(t.initialized(txn)[0] for t in tables):
            return
        entries = manager.entries
        with db.write_txn(entries.endpoint_map, entries.ipcache) as wtxn:
            done, self._host_done = self._host_done, None
            if done is not None:
                done(wtxn)

    def _follow_nodes(
        self, db: DB, manager: EndpointManager, nodes: Table[Node]
    ) -> Callable[..., Awaitable[None]]:
        entries = manager.entries

        async def follow(*, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
            """Remote-node entries and host entries whenever the nodes table changes; the
            ``nodes`` initializer once the table is initialized and they are written."""
            task_status.started()
            last: dict[str, Node] = {}  # the nodes as their entries were last written
            while True:
                txn = db.read_txn()
                rows, watch = nodes.all_watch(txn)
                ready, init_watch = nodes.initialized(txn)
                with db.write_txn(entries.endpoint_map, entries.ipcache) as wtxn:
                    entries.set_nodes(wtxn, rows, self.config.node_name, last)
                    if ready and self._nodes_done is not None:
                        self._nodes_done(wtxn)
                        self._nodes_done = None
                del txn, rows, wtxn  # a held ReadTxn keeps old row versions (docs/statedb.md)
                self._sync_host(db, manager)
                await (watch if ready else _Either(watch, init_watch)).wait_async()

        return follow

    def _follow_node_addresses(
        self, db: DB, manager: EndpointManager
    ) -> Callable[..., Awaitable[None]]:
        async def follow(*, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
            task_status.started()
            table = _node_addresses(db)
            if table is None:
                return
            while True:
                txn = db.read_txn()
                _, watch = table.all_watch(txn)
                ready, init_watch = table.initialized(txn)
                del txn  # a held ReadTxn keeps old row versions (docs/statedb.md)
                self._sync_host(db, manager)
                # also wake when the table becomes initialized
                await (watch if ready else _Either(watch, init_watch)).wait_async()

        return follow

    def _follow_entries(self, db: DB, manager: EndpointManager) -> Callable[..., Awaitable[None]]:
        entries = manager.entries

        async def follow(*, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
            task_status.started()
            while True:
                txn = db.read_txn()
                _, w1 = entries.endpoint_map.all_watch(txn)
                _, w2 = entries.ipcache.all_watch(txn)
                _, w3 = manager.endpoints.all_watch(txn)
                del txn  # a held ReadTxn keeps old row versions (docs/statedb.md)
                await anyio.to_thread.run_sync(manager.mark_ready)  # writes state files
                # The timeout is also a slow safety net if a watch is missed.
                await WatchSet((w1, w2, w3)).wait_async(timeout=5.0)

        return follow

    # ----- reporting ----------------------------------------------------------------------------
    def health(self) -> list[Health]:
        """One line: maps kind, endpoints, reconcilers' state."""
        if self.manager is None:
            return [Health(self.name, DEGRADED, "not started")]
        bad = [
            f"{n}: {r.health.message}"
            for n, r in self.reconcilers.items()
            if r.health.level is not Level.OK
        ]
        n = len(self.manager.all())
        r = self.restore_result
        restored = f"restored {len(r.restored)}, removed {len(r.removed)} at start"
        if r.failed:
            bad.append(f"{len(r.failed)} endpoint state file(s) unreadable: {r.failed[0]}")
        if self.ipam is not None and self.ipam.state_error:
            bad.append(self.ipam.state_error)
        cidrs = self._pod_cidrs_health()
        if self.namespace_source is not None:
            ok, message = self.namespace_source.health()
            cidrs.append(Health(f"{self.name}/namespaces", OK if ok else DEGRADED, message))
        for sync in (self.identity_sync, self.remote_endpoints):
            if sync is not None:
                ok, message = sync.health()
                cidrs.append(Health(f"{self.name}/{sync.health_name}", OK if ok else DEGRADED,
                                    message))
        if bad:
            return [Health(self.name, DEGRADED, "; ".join(bad)), *cidrs]
        return [Health(self.name, OK, f"{n} endpoint(s), {self.maps_kind} maps; {restored}"),
                *cidrs]

    def _pod_cidrs_health(self) -> list[Health]:
        """``endpoints/pod-cidrs`` when the Kubernetes source runs (where IPAM's pod CIDRs
        come from, waiting for the Node, a mismatch, allocations kept outside them), else
        only while allocations are kept outside the configured CIDRs."""
        if self.node_cidrs is None:
            return self._configured_cidrs_health()
        ok, message = self.node_cidrs.health()
        return [Health(f"{self.name}/pod-cidrs", OK if ok else DEGRADED, message)]

    def _configured_cidrs_health(self) -> list[Health]:
        """``endpoints/pod-cidrs`` Degraded while allocations are held outside the configured
        pod CIDRs (the CIDRs changed across a restart; their owners keep them until they
        release them); nothing when there are none."""
        if self.ipam is None:
            return []
        kept = self.ipam.outside_pod_cidrs()
        if not kept:
            return []
        current = ", ".join(str(c) for c in self.ipam.config.pod_cidrs)
        example = ", ".join(f"{a.ip} ({a.owner})" for a in kept[:3])
        return [Health(
            f"{self.name}/pod-cidrs", DEGRADED,
            f"configured: {current}; {len(kept)} allocation(s) outside them kept until "
            f"released, e.g. {example}",
        )]

    def bpf_maps(self) -> Sequence[MapView]:
        """The endpoints (lxc) and ipcache maps."""
        return [typed_map_view(m, self.maps_kind) for _, m in sorted(self.maps.items())]

    def cleanup(self) -> list[str]:
        """Unpin the endpoints and ipcache maps (kernel pins under the pin directory).
        The state directory stays while it records endpoints (their pods still use the
        addresses: a later agent restores them); without endpoints it is removed."""
        removed = []
        for name in ("endpoints", "ipcache"):
            path = os.path.join(self.config.pin_dir, name)
            if os.path.exists(path):
                os.unlink(path)
                removed.append(f"pin {path}")
        state = self.config.state_dir
        records = os.path.join(state, ENDPOINTS_DIR)
        # (recorded sysctl originals not yet restored keep it too: the sysctl component,
        # cleaned up first, removes their file once they are back)
        sysctls = os.path.join(state, ORIGINALS_FILE)
        if os.path.isdir(state) and not os.path.exists(sysctls) and not (
                os.path.isdir(records) and any(n.endswith(".json") for n in os.listdir(records))):
            shutil.rmtree(state)
            removed.append(state)
        return removed

    # ----- API ------------------------------------------------------------------------------

    def routes(self) -> Sequence[Route]:
        """The endpoint, ipcache and IPAM routes (statewright/agent/components/endpoint_api.py)."""
        from statewright.agent.components.endpoint_api import EndpointAPI

        return EndpointAPI(self).routes()


class PodLabelSource(Protocol):
    """What the endpoints read of the Kubernetes source (sources/k8s_source.py): the
    labels of this node's Pods and a wait for their changes; its client and reflector
    timing, for the Namespace reflector."""

    pod_labels_generation: int
    client: K8sClient
    config: SourceConfig

    def pod_labels_of(self, namespace: str, name: str) -> dict[str, str] | None: ...

    def pod_ports_of(self, namespace: str, name: str) -> tuple[NamedPort, ...] | None: ...

    def pod_uid_of(self, namespace: str, name: str) -> str | None: ...

    async def wait_pod_labels(self, after: int = 0) -> int: ...


def _pod_label_source(hive: Hive, user: Component) -> PodLabelSource | None:
    """The ``k8s`` component's source when it runs (it provides Pod labels), else None."""
    return hive.find(user, K8S_SOURCE)


def _follow_labels(
    wait: Callable[[int], Awaitable[int]], manager: EndpointManager
) -> Callable[..., Awaitable[None]]:
    async def follow(*, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
        """Whenever ``wait`` reports a change (Pod or Namespace labels):
        `EndpointManager.sync_pod_labels` in a worker thread (it writes state files)."""
        task_status.started()
        seen = 0
        while True:
            seen = await wait(seen)
            changed = await anyio.to_thread.run_sync(manager.sync_pod_labels)
            if changed:
                log.info("endpoints: label changes moved endpoints %s to other identities",
                         changed)

    return follow


class _Either:
    """A watch that closes when either of two closes."""

    def __init__(self, a: Any, b: Any) -> None:
        self.a, self.b = a, b

    async def wait_async(self) -> None:
        async with anyio.create_task_group() as tg:

            async def one(w: Any) -> None:
                await w.wait_async()
                tg.cancel_scope.cancel()

            tg.start_soon(one, self.a)
            tg.start_soon(one, self.b)


def _follow_namespaces(
    db: DB, table: Table[Namespace], manager: EndpointManager
) -> Callable[..., Awaitable[None]]:
    async def follow(*, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
        """Whenever the namespaces table changes, once its sources are all in:
        `EndpointManager.sync_namespace_labels` in a worker thread (it writes state
        files)."""
        task_status.started()
        while True:
            txn = db.read_txn()
            _, watch = table.all_watch(txn)
            ready, init_watch = table.initialized(txn)
            del txn  # a held ReadTxn keeps old row versions (docs/statedb.md)
            if not ready:
                await init_watch.wait_async()
                continue
            changed = await anyio.to_thread.run_sync(manager.sync_namespace_labels)
            if changed:
                log.info("endpoints: namespace label changes moved endpoints %s to other "
                         "identities", changed)
            await watch.wait_async()

    return follow


def _node_addresses(db: DB) -> Table[Any] | None:
    for t in db.tables:
        if t.name == NODE_ADDRESSES_TABLE:
            return t
    return None
