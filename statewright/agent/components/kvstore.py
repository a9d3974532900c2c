"""The kvstore component: with ``identity-allocation-mode: kvstore`` the agent's etcd
session (sources/kvstore/session.py) and what the cluster code needs to use it.

It provides ``kvstore`` (a `KVStore`): the endpoints component then takes identities and
remote endpoints from etcd instead of CiliumIdentity and CiliumEndpoint objects, the
nodes component the other nodes (sources/kvstore/nodes.py). The agent starts whether or
not etcd answers: the session keeps trying and health says why it is degraded, and an
etcd outage changes no table. In CRD mode (the default) the component is disabled.
"""

from __future__ import annotations

import anyio

from sources.kvstore.config import EtcdConfig, parse_kvstore_opts
from sources.kvstore.etcd_client import EtcdClient
from sources.kvstore.layout import KeyLayout
from sources.kvstore.session import KVStore, KVStoreSession
from statewright.agent.config import AgentConfig
from statewright.component import DEGRADED, DISABLED, OK, Component, Health, Hive, Provided

__all__ = ["KVSTORE", "KVStore", "KVStoreComponent"]

KVSTORE: Provided[KVStore] = Provided("kvstore", KVStore)


class KVStoreComponent(Component):
    """See the module doc."""

    name = "kvstore"
    provides = ("kvstore",)

    def __init__(self, config: AgentConfig) -> None:
        self.config = config
        self.kvstore: KVStore | None = None
        self._etcd: EtcdConfig | None = None

    @property
    def enabled(self) -> bool:
        return self.config.identity_allocation_mode == "kvstore"

    async def start(self, hive: Hive) -> None:
        if not self.enabled:
            return
        cfg = self.config
        self._etcd = parse_kvstore_opts(cfg.kvstore_opt)
        session = KVStoreSession(EtcdClient(self._etcd), ttl=cfg.kvstore_lease_ttl)
        # A restarted agent's keys come back within one TTL: watchers wait that long
        # before acting on a delete.
        self.kvstore = KVStore(session, KeyLayout(cluster=cfg.cluster_name), cfg.node_name,
                               grace=float(cfg.kvstore_lease_ttl))
        await hive.spawn(self, session.run, label="kvstore-session")
        hive.provide(KVSTORE.name, self.kvstore)

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
