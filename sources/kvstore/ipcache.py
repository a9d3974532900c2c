"""Remote endpoints through etcd (kvstore mode): the same ipcache logic as CRD mode
(`tables.remote_endpoints.RemoteEndpointEntries`), fed from ``ip/v1/<cluster>/<ip>`` keys
instead of CiliumEndpoint objects; this node's endpoints published there.

* **watch**: `sources.kvstore.watcher.PrefixWatcher` over ``ip/v1/<cluster>/``, with the
  grace period for deletes (a restarted agent's keys come back without a flap). Each key
  is one object for `RemoteEndpointEntries` (named by the address; the oldest key wins a
  contested address, by creation revision); a value that is not Cilium's IPIdentityPair
  JSON gets its own error and changes nothing. Deliveries are written in a worker thread,
  one write transaction on ``ipcache`` each. The ipcache's initializer ``kvstore-ipcache``
  is done with the first list, so a restarted agent prunes no remote entry before it has
  read them; an etcd outage delivers nothing, so the entries (and the map) stay.
* **publish**: every local endpoint with an identity and addresses owns
  ``ip/v1/<cluster>/<ip>`` -> ``{"IP", "ID", "HostIP", "Key": 0, "K8sNamespace",
  "K8sPodName"}`` under this node's lease (sources/kvstore/session.py); the keys of
  endpoints gone are deleted. The loop wakes on every change of the endpoints table.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from typing import Any

import anyio
import anyio.abc

from sources.kvstore.etcd_client import KeyValue, KVStoreError
from sources.kvstore.layout import KeyLayout
from sources.kvstore.session import KVStoreSession
from sources.kvstore.watcher import PrefixWatcher
from statedb import DB, Table, WriteTxn
from tables.endpoint_entries import IPCacheEntry
from tables.endpoints import Endpoint, EndpointState
from tables.l3n4 import IPAddress
from tables.remote_endpoints import RemoteEndpointEntries

log = logging.getLogger(__name__)

INITIALIZER = "kvstore-ipcache"


def ip_identity_pair(ep: Endpoint, ip: IPAddress, node: IPAddress) -> str:
    """The value of ``ip/v1/<cluster>/<ip>`` for ``ep``'s address ``ip``."""
    return json.dumps({
        "IP": str(ip), "ID": ep.identity, "HostIP": str(node), "Key": 0,
        "K8sNamespace": ep.pod_namespace, "K8sPodName": ep.pod_name,
    }, sort_keys=True)


def endpoint_object_of(kv: KeyValue) -> dict[str, Any]:
    """The CiliumEndpoint-shaped object of an ipcache key (what RemoteEndpointEntries
    parses); a value that is not a JSON object yields one that fails that parse."""
    try:
        pair = json.loads(kv.value)
    except ValueError:
        pair = None
    if not isinstance(pair, dict):
        return {"status": f"not an IPIdentityPair JSON object: {kv.value[:60]!r}"}
    ip = pair.get("IP")
    fam = "ipv6" if isinstance(ip, str) and ":" in ip else "ipv4"
    return {
        "metadata": {"creationTimestamp": f"{kv.create_revision:020d}"},
        "status": {
            "identity": {"id": pair.get("ID")},
            "networking": {"addressing": [{fam: ip}], "node": pair.get("HostIP")},
        },
    }


class KVStoreEndpoints:
    """See the module doc."""

    #: The health line under the endpoints component (sources/cluster_state.py).
    health_name = "kvstore-ipcache"

    def __init__(
        self,
        db: DB,
        session: KVStoreSession,
        ipcache: Table[IPCacheEntry],
        endpoints: Table[Endpoint],
        node_ip: Callable[[], IPAddress | None],
        layout: KeyLayout | None = None,
        *,
        grace: float = 0.0,
        retry_interval: float = 1.0,
    ) -> None:
        self.db = db
        self.session = session
        self.endpoints = endpoints
        self.node_ip = node_ip
        self.layout = layout or KeyLayout()
        self.retry_interval = retry_interval
        self.entries = RemoteEndpointEntries(ipcache, self._is_local)
        self.watcher = PrefixWatcher(session.client, self.layout.ips, self._deliver, grace=grace)
        self.last_error = ""
        self._published: set[str] = set()
        self._init_done: Callable[[WriteTxn], None] | None = None

    def register_initializer(self, txn: WriteTxn) -> None:
        """Keep the ipcache uninitialized (no prune) until the first list is in."""
        self._init_done = self.entries.ipcache.register_initializer(txn, INITIALIZER)

    @property
    def synced(self) -> bool:
        return self.watcher.synced

    def _is_local(self, key: str) -> bool:
        return self.layout.ip(key) in self._published

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        async with anyio.create_task_group() as tg:
            await tg.start(self.watcher.run)
            tg.start_soon(self._publish_loop)
            task_status.started()

    # ----- the watch ----------------------------------------------------------------------------
    async def _deliver(self, ups: Mapping[str, KeyValue], dels: list[str], synced: bool) -> None:
        n = len(self.layout.ips)
        upserts = [(k[n:], endpoint_object_of(kv)) for k, kv in ups.items()]
        deletes = [k[n:] for k in dels]
        await anyio.to_thread.run_sync(self.apply, upserts, deletes, synced)

    def apply(self, upserts: list[tuple[str, dict[str, Any]]], deletes: list[str],
              synced: bool) -> int:
        """Write one delivery into the ipcache table; returns the rows written."""
        with self.db.write_txn(self.entries.ipcache) as txn:
            written = self.entries.apply(txn, upserts, deletes)
            if synced and self._init_done is not None:
                self._init_done(txn)
                self._init_done = None
        return written

    # ----- publishing ---------------------------------------------------------------------------
    def desired(self) -> dict[str, str]:
        """The keys this node wants: ``ip/v1/<cluster>/<ip>`` -> value."""
        node = self.node_ip()
        if node is None:
            return {}
        out: dict[str, str] = {}
        for ep in self.endpoints.all(self.db.read_txn()):
            if not ep.identity or ep.state is EndpointState.DISCONNECTING:
                continue
            for ip in ep.addresses():
                out[self.layout.ip(str(ip))] = ip_identity_pair(ep, ip, node)
        return out

    async def publish(self) -> None:
        want = self.desired()
        self._published = set(want)
        for key, value in want.items():
            await self.session.put(key, value)
        for key in self.session.owned():
            if key.startswith(self.layout.ips) and key not in want:
                await self.session.delete(key)

    async def _publish_loop(self) -> None:
        while True:
            _, watch = self.endpoints.all_watch(self.db.read_txn())
            try:
                await self.publish()
                self.last_error = ""
            except KVStoreError as e:
                if str(e) != self.last_error:
                    log.warning("kvstore: publishing endpoints: %s", e)
                self.last_error = str(e)
            with anyio.move_on_after(self.retry_interval):
                await watch.wait_async()

    def health(self) -> tuple[bool, str]:
        """(ok, message) for the ``endpoints/remote`` health line."""
        h = self.watcher.health()
        parts = [f"kvstore {h.message()}", f"{len(self.entries)} remote endpoints",
                 f"{len(self._published)} keys published"]
        ok = h.synced and h.connected and not self.entries.errors
        if self.entries.conflicts:
            parts.append(f"{len(self.entries.conflicts)} contested addresses")
        if self.entries.errors:
            first = sorted(self.entries.errors)[0]
            parts.append(f"{len(self.entries.errors)} refused, e.g. {self.entries.errors[first]}")
        if self.last_error:
            ok = False
            parts.append(self.last_error)
        return ok, "; ".join(parts)
