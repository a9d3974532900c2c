"""The kvstore component: with ``identity-allocation-mode: kvstore`` the agent's etcd
session (sources/kvstore/session.py) and what the cluster code needs to use it.

It provides ``kvstore`` (a `KVStore`): the endpoints component then takes identities and
remote endpoints from etcd instead of CiliumIdentity and CiliumEndpoint objects, the
nodes component the other nodes (sources/kvstore/nodes.py). The agent starts whether or
not etcd answers: the session keeps trying and health says why it is degraded, and an
etcd outage changes no table. In CRD mode (the default) the component is disabled.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import anyio

from sources.kvstore.config import EtcdConfig, parse_kvstore_opts
from sources.kvstore.etcd_client import EtcdClient
from sources.kvstore.layout import KeyLayout
from sources.kvstore.session import KVStore, KVStoreSession
from statewright.agent.config import AgentConfig
from statewright.component import DEGRADED, DISABLED, OK, Component, Health, Hive, Provided

__all__ = ["KVSTORE", "KVStore", "KVStoreComponent"]

KVSTORE: Provided[KVStore] = Provided("kvstore", KVStore)


@dataclass(frozen=True, slots=True)
class KVStoreComponentConfig:
    """What the kvstore component needs from the agent's configuration (it runs only
    with identity-allocation-mode kvstore)."""

    enabled: bool = False
    kvstore_opt: Mapping[str, str] = field(default_factory=dict)
    lease_ttl: int = 15
    cluster_name: str = "default"
    node_name: str = ""

    @classmethod
    def from_agent_config(cls, cfg: AgentConfig) -> KVStoreComponentConfig:
        """The agent's ``identity-allocation-mode``, ``kvstore-opt``, ``kvstore-lease-ttl``,
        ``cluster-name`` and ``node-name``."""
        return cls(cfg.identity_allocation_mode == "kvstore", cfg.kvstore_opt,
                   cfg.kvstore_lease_ttl, cfg.cluster_name, cfg.node_name)


class KVStoreComponent(Component):
    """See the module doc."""

    name = "kvstore"
    provides = (KVSTORE,)

    def __init__(self, config: KVStoreComponentConfig) -> None:
        self.config = config
        self.kvstore: KVStore | None = None
        self._etcd: EtcdConfig | None = None

    @property
    def enabled(self) -> bool:
        return self.config.enabled

    async def start(self, hive: Hive) -> None:
        if not self.enabled:
            return
        cfg = self.config
        self._etcd = parse_kvstore_opts(cfg.kvstore_opt)
        session = KVStoreSession(EtcdClient(self._etcd), ttl=cfg.lease_ttl)
        # A restarted agent's keys come back within one TTL: watchers wait that long
        # before acting on a delete.
        self.kvstore = KVStore(session, KeyLayout(cluster=cfg.cluster_name), cfg.node_name,
                               grace=float(cfg.lease_ttl))
        await hive.spawn(self, session.run, label="kvstore-session")
        hive.provide(self, KVSTORE, self.kvstore)

    async def stop(self) -> None:
        kv, self.kvstore = self.kvstore, None
        if kv is None:
            return
        with anyio.CancelScope(shield=True):
            # The lease stays: a restart within its TTL re-creates the keys without the
            # other nodes seeing them go (`--cleanup` and a real shutdown are the same here).
            await kv.session.close(revoke=False)
            await kv.client.aclose()

    def health(self) -> list[Health]:
        if not self.enabled:
            return [Health(self.name, DISABLED, "identity-allocation-mode: crd")]
        if self.kvstore is None or self._etcd is None:
            return [Health(self.name, DEGRADED, "not started")]
        h = self.kvstore.session.health()
        where = ", ".join(self._etcd.endpoints)
        return [Health(self.name, OK if h.ok else DEGRADED, f"etcd {where}: {h.message()}")]
