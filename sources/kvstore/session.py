"""The agent's etcd session: one lease kept alive by heartbeat, and the keys the agent owns
attached to it.

Every key an agent writes for itself (its identity references, its endpoints' ipcache
keys, its node) goes through `KVStoreSession.put`, which remembers it. The lease is
renewed every ``ttl / 3`` seconds. When etcd says the lease is gone (the agent was cut off
longer than the TTL) or the agent starts afresh, a new lease is granted and every owned key
is written again under it: a put over an existing key changes only its lease, so the
other agents see no delete. A crashed agent's keys disappear when its lease expires; the
watchers (sources/kvstore/watcher.py) wait a grace period before acting on such a delete,
so an agent restarted within it causes no flap.

`health()` reports: connected (the last request answered), leader known, the lease and
its TTL, the last error and since when.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import anyio
import anyio.abc

from sources.kvstore.etcd_client import EtcdClient, KVStoreError
from sources.kvstore.layout import KeyLayout

log = logging.getLogger(__name__)


@dataclass
class SessionHealth:
    """What `KVStoreSession.health` reports."""

    connected: bool = False
    leader: bool = False
    lease: int = 0
    lease_ttl: int = 0
    leases_granted: int = 0
    owned_keys: int = 0
    last_error: str = ""
    #: time.time() of the last change of `connected` (or of the first error).
    since: float = 0.0

    @property
    def ok(self) -> bool:
        return self.connected and self.leader and self.lease != 0

    def message(self) -> str:
        state = "connected" if self.connected else "disconnected"
        parts = [
            f"{state} since {time.strftime('%H:%M:%S', time.gmtime(self.since))}Z",
            "leader known" if self.leader else "no leader",
            f"lease {self.lease:x} (ttl {self.lease_ttl}s)" if self.lease else "no lease",
            f"{self.owned_keys} keys owned",
        ]
        if self.last_error:
            parts.append(f"last error: {self.last_error}")
        return "; ".join(parts)


class KVStoreSession:
    """See the module doc."""

    def __init__(self, client: EtcdClient, ttl: int = 15, retry_interval: float = 0.5) -> None:
        self.client = client
        self.ttl = ttl
        self.retry_interval = retry_interval
        self.lease = 0
        self._owned: dict[str, str] = {}
        self._dirty: set[str] = set()
        self._wake = anyio.Event()
        self._ready = anyio.Event()
        self._health = SessionHealth(since=time.time())

    # ----- owned keys -------------------------------------------------------------------------
    def owned(self) -> dict[str, str]:
        return dict(self._owned)

    async def put(self, key: str, value: str) -> None:
        """Own ``key`` with ``value``: written under the lease now if possible, else as
        soon as etcd answers again."""
        if self._owned.get(key) == value and key not in self._dirty:
            return
        self._owned[key] = value
        self._dirty.add(key)
        await self._flush_one(key)

    async def delete(self, key: str) -> None:
        """Stop owning ``key`` and delete it (later, if etcd does not answer now)."""
        if key not in self._owned:
            return
        del self._owned[key]
        self._dirty.add(key)
        await self._flush_one(key)

    async def _flush_one(self, key: str) -> None:
        if not self.lease:
            self._wake.set()
            return
        try:
            if key in self._owned:
                await self.client.put(key, self._owned[key], self.lease)
            else:
                await self.client.delete(key)
        except KVStoreError as e:
            self._failed(e)
            self._wake.set()
            return
        self._dirty.discard(key)

    async def _flush(self) -> None:
        for key in sorted(self._dirty):
            if key in self._owned:
                await self.client.put(key, self._owned[key], self.lease)
            else:
                await self.client.delete(key)
            self._dirty.discard(key)

    # ----- the lease --------------------------------------------------------------------------
    async def wait_ready(self) -> None:
        """Until the first lease is granted."""
        await self._ready.wait()

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Keep the lease (and the owned keys) alive until cancelled."""
        task_status.started()
        interval = max(self.ttl / 3, 0.2)
        while True:
            try:
                await self._beat()
                delay = interval if not self._dirty else self.retry_interval
            except KVStoreError as e:
                self._failed(e)
                delay = self.retry_interval
            self._wake = anyio.Event()
            with anyio.move_on_after(delay):
                await self._wake.wait()

    async def _beat(self) -> None:
        ttl = await self.client.lease_keepalive(self.lease) if self.lease else 0
        if not ttl:
            if self.lease:
                log.warning("kvstore: lease %x expired; owned keys written under a new one",
                            self.lease)
            self.lease = await self.client.lease_grant(self.ttl)
            self._health.leases_granted += 1
            ttl = self.ttl
            self._dirty |= set(self._owned)
        await self._flush()
        status = await self.client.status()
        self._ready.set()
        h = self._health
        if not h.connected:
            h.since = time.time()
        h.connected, h.leader, h.lease, h.lease_ttl = True, bool(int(status.get("leader", 0))), \
            self.lease, ttl
        h.last_error = ""

    def _failed(self, e: BaseException) -> None:
        h = self._health
        if h.connected or not h.last_error:
            h.since = time.time()
            log.warning("kvstore: %s", e)
        h.connected, h.leader, h.last_error = False, False, str(e)

    def health(self) -> SessionHealth:
        h = self._health
        h.owned_keys = len(self._owned)
        return SessionHealth(**vars(h))

    async def close(self, revoke: bool = True) -> None:
        """Revoke the lease (the owned keys go at once), when etcd answers."""
        if revoke and self.lease:
            try:
                with anyio.fail_after(2):
                    await self.client.lease_revoke(self.lease)
            except (KVStoreError, TimeoutError):
                pass
        self.lease = 0


@dataclass
class KVStore:
    """What the cluster code of kvstore mode shares: the session (and its client), the
    key layout, this node's name and the grace period watchers give deletes."""

    session: KVStoreSession
    layout: KeyLayout
    node_name: str
    grace: float

    @property
    def client(self) -> EtcdClient:
        return self.session.client
