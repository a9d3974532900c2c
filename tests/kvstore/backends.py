"""The two backends of cluster state behind one test interface, so the same tests run on
CRD mode (the fake API server) and kvstore mode (a real etcd cluster).

An `Agent` is an in-process agent's cluster half: an endpoint manager with the cluster
identity allocator, its identity sync and its remote-endpoint sync for the backend.
"""

from __future__ import annotations

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
from sources.kvstore.session import KVStoreSession
from statedb import DB
from tables.cluster_identities import ClusterIdentityAllocator, canonical
from tables.endpoint_entries import EntryTables, IPCacheEntry
from tables.endpoint_manager import EndpointManager
from tables.endpoints import EndpointChange
from tables.ipam import IPAM, IPAMConfig
from tables.remote_endpoints import RemoteEndpointEntries
from tests.k8s.fake_apiserver import FakeAPIServer

FAST = ReflectorConfig(backoff_initial=0.05, backoff_max=0.2)


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
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    closers: list[Callable[[], Any]] = field(default_factory=list)

    def health(self) -> list[tuple[bool, str]]:
        return [self.identities.health(), self.endpoints.health()]

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

    async def stop_agent(self, agent: Agent) -> None:
        agent.scope.cancel()
        for close in agent.closers:
            res = close()
            if hasattr(res, "__await__"):
                await res


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

        async def run() -> None:
            with agent.scope:
                async with anyio.create_task_group() as inner:
                    await inner.start(agent.identities.run)
                    await inner.start(agent.endpoints.run)
        tg.start_soon(run)

    async def identities(self) -> dict[int, tuple[str, ...]]:
        from tables.cluster_identities import parse_identity_object
        return {o.id: o.labels for o in map(parse_identity_object,
                                            self.apiserver.objects("CiliumIdentity"))}


class KVStoreBackend(Backend):
    name = "kvstore"

    def __init__(self, endpoints: list[str], grace: float = 0.0, ttl: int = 5) -> None:
        self.config = EtcdConfig(tuple(endpoints), request_timeout=3.0)
        self.layout = KeyLayout(base=f"t{uuid.uuid4().hex[:8]}/cilium/state/")
        self.grace = grace
        self.ttl = ttl
        self.admin = EtcdClient(self.config)

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

        async def run() -> None:
            with agent.scope:
                async with anyio.create_task_group() as inner:
                    await inner.start(session.run)
                    await inner.start(agent.identities.run)
                    await inner.start(agent.endpoints.run)
        tg.start_soon(run)

    async def identities(self) -> dict[int, tuple[str, ...]]:
        kvs, _ = await self.admin.list_prefix(self.layout.identity_ids)
        return {int(kv.key.rsplit("/", 1)[1]): canonical(tuple(labels_of_key(kv.value.decode())))
                for kv in kvs}

    async def close(self) -> None:
        await self.admin.delete(self.layout.base, prefix=True)
        await self.admin.aclose()
