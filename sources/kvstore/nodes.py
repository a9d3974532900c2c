"""The node registry through etcd (kvstore mode): ``nodes/v1/<cluster>/<name>``.

* **publish**: this node's row of the nodes table (from the API server's or the
  manifests' Node) is written as ``{"Name", "Cluster", "IPAddresses": [{"Type", "IP"}],
  "IPv4AllocCIDR", "IPv6AllocCIDR", "Labels"}`` under the agent's lease, again whenever
  the row changes; deleted when the row goes (this node's Node deleted).
* **watch**: every other node's key becomes a Node object for
  `tables.nodes.NodeObjects` (source ``kvstore``), so routes and node ipcache entries
  follow as in CRD mode. A delete waits out the grace period (a restarting agent does not
  make its node vanish); a value that is not such JSON gets its own error and changes
  nothing. The nodes table's initializer ``kvstore`` is done with the first list.

`KVStoreNodeRegistry` is kvstore mode's node registry (sources/node_registry.py): these
keys for the other nodes, and this node's own Node from the API server (a Node reflector
restricted to it), when the agent has one.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc

from sources.kvstore.etcd_client import KeyValue, KVStoreError
from sources.kvstore.layout import KeyLayout
from sources.kvstore.session import KVStore, KVStoreSession
from sources.kvstore.watcher import PrefixWatcher
from statedb import DB, Table, WriteTxn
from tables.nodes import Node, NodeError, NodeObjects, node_name_index

if TYPE_CHECKING:
    from sources.k8s_nodes import NodesK8sSource

log = logging.getLogger(__name__)

SOURCE_KVSTORE = "kvstore"
INITIALIZER = "kvstore"


def node_value(node: Node, cluster: str) -> str:
    """The value of ``nodes/v1/<cluster>/<name>`` for ``node``."""
    v4 = [str(c) for c in node.pod_cidrs if c.version == 4]
    v6 = [str(c) for c in node.pod_cidrs if c.version == 6]
    return json.dumps({
        "Name": node.name, "Cluster": cluster,
        "IPAddresses": [{"Type": a.type, "IP": str(a.ip)} for a in node.addresses],
        "IPv4AllocCIDR": v4[0] if v4 else None, "IPv6AllocCIDR": v6[0] if v6 else None,
        "Labels": dict(node.labels),
    }, sort_keys=True)


def node_object_of(name: str, value: bytes) -> dict[str, Any]:
    """The Node object of a node key's value; NodeError when it is not such JSON."""
    try:
        raw = json.loads(value)
    except ValueError:
        raw = None
    if not isinstance(raw, Mapping) or not isinstance(raw.get("IPAddresses", []), list):
        raise NodeError("not a node JSON object", obj=f"kvstore node {name}")
    addresses = [{"type": a.get("Type"), "address": a.get("IP")}
                 for a in raw.get("IPAddresses") or [] if isinstance(a, Mapping)]
    cidrs = [c for c in (raw.get("IPv4AllocCIDR"), raw.get("IPv6AllocCIDR")) if c]
    labels = raw.get("Labels") if isinstance(raw.get("Labels"), Mapping) else {}
    return {"metadata": {"name": name, "labels": labels},
            "status": {"addresses": addresses}, "spec": {"podCIDRs": cidrs}}


class KVStoreNodes:
    """See the module doc."""

    def __init__(
        self, db: DB, table: Table[Node], session: KVStoreSession, node_name: str,
        layout: KeyLayout | None = None, *, grace: float = 0.0,
        retry_interval: float = 1.0,
    ) -> None:
        self.db = db
        self.table = table
        self.session = session
        self.node_name = node_name
        self.layout = layout or KeyLayout()
        self.retry_interval = retry_interval
        self.objects = NodeObjects(table, SOURCE_KVSTORE)
        self.watcher = PrefixWatcher(session.client, self.layout.nodes, self._deliver,
                                     grace=grace)
        #: Current error per refused key (node name -> message).
        self.errors: dict[str, str] = {}
        self.last_error = ""
        self._init_done: Callable[[WriteTxn], None] | None = None

    def register_initializer(self, txn: WriteTxn) -> None:
        self._init_done = self.table.register_initializer(txn, INITIALIZER)

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        async with anyio.create_task_group() as tg:
            await tg.start(self.watcher.run)
            tg.start_soon(self._publish_loop)
            task_status.started()

    async def _deliver(self, ups: Mapping[str, KeyValue], dels: list[str], synced: bool) -> None:
        n = len(self.layout.nodes)
        await anyio.to_thread.run_sync(
            self.apply, {k[n:]: kv.value for k, kv in ups.items()}, [k[n:] for k in dels], synced)

    def apply(self, upserts: Mapping[str, bytes], deletes: list[str], synced: bool) -> None:
        """Write one delivery into the nodes table (this node's own key is skipped)."""
        with self.db.write_txn(self.table) as txn:
            for name in deletes:
                self.errors.pop(name, None)
                if name != self.node_name:
                    self.objects.delete(txn, {"metadata": {"name": name}})
            for name, value in upserts.items():
                if name == self.node_name:
                    continue
                try:
                    self.objects.upsert(txn, node_object_of(name, value))
                except NodeError as e:
                    self.errors[name] = str(e)
                    continue
                self.errors.pop(name, None)
            if synced and self._init_done is not None:
                self._init_done(txn)
                self._init_done = None

    async def _publish_loop(self) -> None:
        key = self.layout.node(self.node_name)
        while True:
            txn = self.db.read_txn()
            row, watch = self.table.get_watch(txn, node_name_index.query(self.node_name))
            del txn  # a held ReadTxn keeps old row versions (docs/statedb.md)
            try:
                if row is not None and row.source != SOURCE_KVSTORE:
                    await self.session.put(key, node_value(row, self.layout.cluster))
                elif row is None and key in self.session.owned():
                    await self.session.delete(key)  # this node's Node was deleted
                self.last_error = ""
            except KVStoreError as e:
                self.last_error = f"publishing node {self.node_name}: {e}"
            with anyio.move_on_after(self.retry_interval):
                await watch.wait_async()

    def health(self) -> tuple[bool, str]:
        h = self.watcher.health()
        parts = [h.message()]
        ok = h.synced and h.connected and not self.errors and not self.last_error
        if self.errors:
            first = sorted(self.errors)[0]
            parts.append(f"{len(self.errors)} refused, e.g. {self.errors[first]}")
        if self.last_error:
            parts.append(self.last_error)
        return ok, "; ".join(parts)


class KVStoreNodeRegistry:
    """kvstore mode's node registry (module doc): `KVStoreNodes` and, with an API
    server, ``local`` (a `NodesK8sSource` of this node's Node only)."""

    label = "kvstore"

    def __init__(self, db: DB, table: Table[Node], kv: KVStore,
                 local: NodesK8sSource | None = None) -> None:
        self.nodes = KVStoreNodes(db, table, kv.session, kv.node_name, kv.layout,
                                  grace=kv.grace)
        self.local = local

    def register_initializer(self, txn: WriteTxn) -> None:
        self.nodes.register_initializer(txn)
        if self.local is not None:
            self.local.register_initializer(txn)

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        async with anyio.create_task_group() as tg:
            if self.local is not None:
                await tg.start(self.local.run)
            await tg.start(self.nodes.run)
            task_status.started()

    def health(self) -> tuple[bool, str]:
        ok, message = self.nodes.health()
        if self.local is not None:
            local_ok, why = self.local.health()
            ok = ok and local_ok
            message += f"; this node from k8s: {why}"
        return ok, message
