"""The two backends of cluster state behind one test interface, so the same tests run on
CRD mode (the fake API server) and kvstore mode (a real etcd cluster).

An `Agent` is an in-process agent's cluster half: an endpoint manager with the cluster
identity allocator, its identity sync, its remote-endpoint sync and its node registry
(sources/node_registry.py) for the backend. Both backends take this node's own Node
from the API server (the kubelet writes it): in CRD mode every agent reads every Node
there, in kvstore mode each agent publishes its own to etcd and reads the others there.
"""

from __future__ import annotations

import contextlib
import ipaddress
import random
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import anyio.abc

from sources.k8s_client import ClientSettings, K8sClient
from sources.k8s_endpoints import CiliumEndpoints
from sources.k8s_identities import ClusterIdentities
from sources.k8s_reflector import ReflectorConfig
from sources.kvstore.config import EtcdConfig
from sources.kvstore.etcd_client import EtcdClient
from sources.kvstore.identities import KVStoreIdentities
from sources.kvstore.ipcache import KVStoreEndpoints
from sources.kvstore.layout import KeyLayout, labels_of_key
from sources.kvstore.session import KVStore, KVStoreSession
from sources.node_registry import NodeRegistry, new_node_registry
from statedb import DB, InputError, Table
from tables.cluster_identities import ClusterIdentityAllocator, canonical
from tables.endpoint_entries import EntryTables, IPCacheEntry
from tables.endpoint_manager import EndpointManager
from tables.endpoints import EndpointChange
from tables.ipam import IPAM, IPAMConfig
from tables.nodes import Node, new_nodes_table
from tables.remote_endpoints import RemoteEndpointEntries
from tests.k8s.fake_apiserver import FakeAPIServer

FAST = ReflectorConfig(backoff_initial=0.05, backoff_max=0.2)
#: The address of the remote endpoint `Backend.put_bad_endpoint` writes in the tests.
BAD_IP = "10.99.0.1"


def manager(state_dir: Path, cidr: str, seed: int) -> EndpointManager:
    state_dir.mkdir(parents=True, exist_ok=True)
    db = DB()
    ipam = IPAM(db, IPAMConfig.parse((cidr,), str(state_dir)))
    ipam.restore(reserve_router=False)
    ipam.reserve_routers()
    alloc = ClusterIdentityAllocator(db, rng=random.Random(seed))
    return EndpointManager(db, ipam, alloc, str(state_dir), entries=EntryTables())


def pod(name: str, labels: list[str], ns: str = "shop") -> EndpointChange:
    return EndpointChange.parse({"k8s-pod-name": name, "k8s-namespace": ns, "labels": labels})


def ipcache(mgr: EndpointManager) -> dict[str, IPCacheEntry]:
    return {str(e.prefix): e for e in mgr.entries.ipcache.all(mgr.db.read_txn())}


@dataclass
class Agent:
    name: str
    mgr: EndpointManager
    node_ip: ipaddress.IPv4Address
    identities: Any = None
    endpoints: Any = None
    registry: NodeRegistry | None = None
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    closers: list[Callable[[], Any]] = field(default_factory=list)
    #: Set once the agent's tasks have all returned (see `_run`).
    stopped: anyio.Event = field(default_factory=anyio.Event)

    def __post_init__(self) -> None:
        names = {t.name for t in self.mgr.db.tables}
        self.nodes: Table[Node] = new_nodes_table()
        if self.nodes.name not in names:
            self.mgr.db.register(self.nodes)

    def health(self) -> list[tuple[bool, str]]:
        out = [self.identities.health(), self.endpoints.health()]
        return out + ([self.registry.health()] if self.registry is not None else [])

    def node_rows(self) -> dict[str, Node]:
        """The nodes table: name -> row."""
        return {n.name: n for n in self.nodes.all(self.mgr.db.read_txn())}

    def remote(self) -> dict[str, tuple[int, str]]:
        """The remote entries of the ipcache: address -> (identity, tunnel endpoint)."""
        return {
            k: (e.identity, str(e.tunnel_endpoint))
            for k, e in ipcache(self.mgr).items() if e.owner.startswith("cep:")
        }


class Backend:
    """One backend: start agents, read what the store holds."""

    name = ""

    async def start_agent(self, tg: anyio.abc.TaskGroup, agent: Agent) -> None:
        raise NotImplementedError

    async def identities(self) -> dict[int, tuple[str, ...]]:
        """The store's identities: number -> labels."""
        raise NotImplementedError

    async def delete_identity(self, num: int) -> None:
        """Remove identity ``num`` from the store (as the operator would)."""
        raise NotImplementedError

    async def put_bad_identity(self, name: str) -> None:
        """Write an identity named ``name`` that no agent can use."""
        raise NotImplementedError

    async def put_bad_endpoint(self, ip: str) -> str:
        """Write a remote endpoint for ``ip`` that no agent can use; returns the name the
        agents' errors give it."""
        raise NotImplementedError

    async def put_bad_node(self, name: str) -> None:
        """Write a node ``name`` that no agent can use, where agents read other nodes."""
        raise NotImplementedError

    async def delete_bad(self) -> None:
        """Remove what the ``put_bad_*`` calls wrote."""
        raise NotImplementedError

    async def stop_agent(self, agent: Agent) -> None:
        """Cancel the agent's tasks, wait until they have returned, then close its
        clients: a client closed under a task still running is a bug of the agent's
        shutdown order, which this harness must not create itself."""
        agent.scope.cancel()
        with anyio.fail_after(10):
            await agent.stopped.wait()
        for close in agent.closers:
            res = close()
            if hasattr(res, "__await__"):
                await res


async def _run(agent: Agent, runs: list[Callable[..., Any]]) -> None:
    """Run an agent's parts (and its node registry) until its scope is cancelled."""
    if agent.registry is not None:
        with agent.mgr.db.write_txn(agent.nodes) as txn:
            agent.registry.register_initializer(txn)
        runs = [*runs, agent.registry.run]
    try:
        with agent.scope:
            async with anyio.create_task_group() as inner:
                for run in runs:
                    await inner.start(run)
    finally:
        agent.stopped.set()


class CRDBackend(Backend):
    name = "crd"

    def __init__(self, apiserver: FakeAPIServer, tmp: Path) -> None:
        self.apiserver = apiserver
        self.kubeconfig = apiserver.write_kubeconfig(tmp / f"kubeconfig-{uuid.uuid4().hex[:6]}")

    async def start_agent(self, tg: anyio.abc.TaskGroup, agent: Agent) -> None:
        mgr = agent.mgr
        alloc = mgr.identities
        assert isinstance(alloc, ClusterIdentityAllocator)
        client = K8sClient(ClientSettings(kubeconfig=self.kubeconfig))
        agent.closers.append(client.close)
        agent.identities = ClusterIdentities(alloc, client, mgr.renumber_identities, FAST,
                                             retry_interval=0.2)
        rem = RemoteEndpointEntries(
            mgr.entries.ipcache, lambda k: mgr.resolve(f"pod-name:{k}") is not None)
        agent.endpoints = CiliumEndpoints(
            mgr.db, client, endpoints=mgr.endpoints, identities=alloc.table, entries=rem,
            pod_uid_of=lambda ns, n: f"uid-{ns}-{n}", node_ip=lambda: agent.node_ip,
            config=FAST, resync_interval=0.2)
        agent.registry = new_node_registry(mgr.db, agent.nodes, agent.name, client=client,
                                           reflector=FAST)
        tg.start_soon(_run, agent, [agent.identities.run, agent.endpoints.run])

    async def identities(self) -> dict[int, tuple[str, ...]]:
        from tables.cluster_identities import parse_identity_object
        out = {}
        for o in self.apiserver.objects("CiliumIdentity"):
            with contextlib.suppress(InputError):
                parsed = parse_identity_object(o)
                out[parsed.id] = parsed.labels
        return out

    async def delete_identity(self, num: int) -> None:
        self.apiserver.delete("CiliumIdentity", "", str(num))

    async def put_bad_identity(self, name: str) -> None:
        self.apiserver.upsert({"apiVersion": "cilium.io/v2", "kind": "CiliumIdentity",
                               "metadata": {"name": name}, "security-labels": ["k8s:a=b"]})

    async def put_bad_endpoint(self, ip: str) -> str:
        self.apiserver.upsert({
            "apiVersion": "cilium.io/v2", "kind": "CiliumEndpoint",
            "metadata": {"name": "bad", "namespace": "other"},
            "status": {"identity": {"id": "x"},
                       "networking": {"addressing": [{"ipv4": ip}], "node": "nowhere"}}})
        return "other/bad"

    async def put_bad_node(self, name: str) -> None:
        self.apiserver.upsert({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name},
                               "status": {"addresses": [{"type": "InternalIP",
                                                         "address": "not-an-ip"}]}})

    async def delete_bad(self) -> None:
        for kind, ns, name in (("CiliumIdentity", "", "bad"), ("CiliumEndpoint", "other", "bad"),
                               ("Node", "", "node-bad")):
            self.apiserver.delete(kind, ns, name)


class KVStoreBackend(Backend):
    name = "kvstore"

    def __init__(self, endpoints: list[str], grace: float = 0.0, ttl: int = 5,
                 apiserver: FakeAPIServer | None = None, tmp: Path | None = None,
                 config: EtcdConfig | None = None, admin: EtcdConfig | None = None) -> None:
        """``apiserver`` (and ``tmp`` for its kubeconfig): where agents read their own
        Node; without it they run no node registry. ``config``: the agents' etcd
        configuration (TLS, auth), ``admin`` the test's own (default: ``config``)."""
        self.apiserver = apiserver
        self.kubeconfig = (apiserver.write_kubeconfig(tmp / f"kubeconfig-{uuid.uuid4().hex[:6]}")
                           if apiserver is not None and tmp is not None else "")
        self.config = config or EtcdConfig(tuple(endpoints), request_timeout=3.0)
        self.layout = KeyLayout(base=f"t{uuid.uuid4().hex[:8]}/cilium/state/")
        self.grace = grace
        self.ttl = ttl
        self.admin = EtcdClient(admin or self.config)

    def session_for(self, agent: Agent, config: EtcdConfig | None = None) -> KVStoreSession:
        return KVStoreSession(EtcdClient(config or self.config), ttl=self.ttl,
                              retry_interval=0.1)

    async def start_agent(
        self, tg: anyio.abc.TaskGroup, agent: Agent, config: EtcdConfig | None = None
    ) -> None:
        mgr = agent.mgr
        alloc = mgr.identities
        assert isinstance(alloc, ClusterIdentityAllocator)
        session = self.session_for(agent, config)
        agent.closers.append(session.client.aclose)
        agent.identities = KVStoreIdentities(alloc, session, mgr.renumber_identities,
                                             agent.name, self.layout, grace=self.grace,
                                             retry_interval=0.2)
        agent.endpoints = KVStoreEndpoints(mgr.db, session, mgr.entries.ipcache, mgr.endpoints,
                                           lambda: agent.node_ip, self.layout,
                                           grace=self.grace, retry_interval=0.2)
        agent.session = session  # type: ignore[attr-defined]
        if self.kubeconfig:
            client = K8sClient(ClientSettings(kubeconfig=self.kubeconfig))
            agent.closers.append(client.close)
            kv = KVStore(session, self.layout, agent.name, self.grace)
            agent.registry = new_node_registry(mgr.db, agent.nodes, agent.name, client=client,
                                               reflector=FAST, kvstore=kv)
        tg.start_soon(_run, agent, [session.run, agent.identities.run, agent.endpoints.run])

    async def identities(self) -> dict[int, tuple[str, ...]]:
        kvs, _ = await self.admin.list_prefix(self.layout.identity_ids)
        return {int(kv.key.rsplit("/", 1)[1]): canonical(tuple(labels_of_key(kv.value.decode())))
                for kv in kvs}

    async def delete_identity(self, num: int) -> None:
        await self.admin.delete(self.layout.identity_id(num))

    async def put_bad_identity(self, name: str) -> None:
        await self.admin.put(self.layout.identity_ids + name, "")

    async def put_bad_endpoint(self, ip: str) -> str:
        await self.admin.put(self.layout.ip(ip), "{not json")
        return ip

    async def put_bad_node(self, name: str) -> None:
        await self.admin.put(self.layout.node(name), "[]")

    async def delete_bad(self) -> None:
        for key in (self.layout.identity_ids + "bad", self.layout.ip(BAD_IP),
                    self.layout.node("node-bad")):
            await self.admin.delete(key)

    async def close(self) -> None:
        await self.admin.delete(self.layout.base, prefix=True)
        await self.admin.aclose()
