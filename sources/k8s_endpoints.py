"""CiliumEndpoints through the API server: every agent watches those of the whole
cluster (remote pods into the ipcache, tables/remote_endpoints.py) and keeps one for each
of its own pod endpoints.

* **watch**: a `sources.k8s_reflector.Reflector` over every CiliumEndpoint; each delivery
  is applied in a worker thread, in one write transaction on the ``ipcache`` table
  (`RemoteEndpointEntries.apply`, given each object's last change only: an object created
  and deleted in one delivery must not stay, `sources.k8s_identities.net_changes`). The
  objects' resourceVersions and statuses are kept (`served`): what the publisher compares
  with and updates from. The ipcache table's initializer ``ciliumendpoints`` is done with
  the initial list, so a restarted agent prunes no remote entry before it has read them.
* **publish**: for each local endpoint of a pod (``pod_name`` and ``pod_namespace``) whose
  Pod's uid the Kubernetes source knows (the ownerReference that makes Kubernetes delete
  the object with its Pod), a CiliumEndpoint ``<namespace>/<pod>`` with ``status.id``,
  ``status.identity`` {id, labels}, ``status.networking`` {addressing [{ipv4, ipv6}],
  node: this node's address} and ``status.state``. After the initial list only: an object
  the server already holds as wanted is not written again (a restarted agent re-confirms
  its endpoints without a write); a different one is updated with the served
  resourceVersion; objects this node published for endpoints that are gone are deleted
  (also those left from before a restart: ``networking.node`` is this node's address and
  no local endpoint has the name). Each request is tried ``attempts`` times (backoff);
  what still fails is retried at the next pass (every ``resync_interval`` seconds, and
  whenever the endpoints or identities change) and shown in health. All of it runs in
  worker threads, never in the CNI call.
"""

from __future__ import annotations

import ipaddress
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.abc
import urllib3

from sources.k8s_client import K8sClient, resource_path
from sources.k8s_http import K8sApiError, describe_error
from sources.k8s_identities import GROUP, VERSION, net_changes
from sources.k8s_reflector import Delta, Reflector, ReflectorConfig, ResourceSpec
from statedb import DB, Table, WriteTxn
from tables.endpoints import Endpoint, EndpointState
from tables.identities import Identity, identity_id_index
from tables.l3n4 import IPAddress
from tables.remote_endpoints import KIND, RemoteEndpointEntries

log = logging.getLogger(__name__)

PLURAL = "ciliumendpoints"
API_VERSION = f"{GROUP}/{VERSION}"
INITIALIZER = "ciliumendpoints"


def endpoint_resource_spec() -> ResourceSpec:
    """Every CiliumEndpoint of the cluster."""
    return ResourceSpec(PLURAL, KIND, f"{GROUP}/{VERSION}", PLURAL)


def cilium_endpoint_status(
    ep: Endpoint, identity: Identity | None, node: IPAddress
) -> dict[str, Any]:
    """The ``status`` of the CiliumEndpoint of ``ep`` (upstream's field names)."""
    pair = {f"ipv{ip.version}": str(ip) for ip in ep.addresses()}
    return {
        "id": ep.id,
        "identity": {
            "id": ep.identity,
            "labels": list(identity.labels) if identity is not None else [],
        },
        "networking": {"addressing": [pair] if pair else [], "node": str(node)},
        "state": ep.state.value,
    }


def cilium_endpoint_object(
    ep: Endpoint, status: Mapping[str, Any], pod_uid: str
) -> dict[str, Any]:
    """The whole CiliumEndpoint of ``ep``, owned by its Pod."""
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": KIND,
        "metadata": {
            "name": ep.pod_name,
            "namespace": ep.pod_namespace,
            "ownerReferences": [
                {"apiVersion": "v1", "kind": "Pod", "name": ep.pod_name, "uid": pod_uid}
            ],
        },
        "status": dict(status),
    }


@dataclass(slots=True)
class Served:
    """A CiliumEndpoint as the server holds it (from the watch)."""

    resource_version: str
    status: Any
    owners: Any
    node: str


class CiliumEndpoints:
    """See the module doc."""

    #: The health line under the endpoints component (sources/cluster_state.py).
    health_name = "cilium-endpoints"

    def __init__(
        self,
        db: DB,
        client: K8sClient,
        *,
        endpoints: Table[Endpoint],
        identities: Table[Identity],
        entries: RemoteEndpointEntries,
        pod_uid_of: Callable[[str, str], str | None],
        node_ip: Callable[[], IPAddress | None],
        config: ReflectorConfig | None = None,
        attempts: int = 3,
        resync_interval: float = 5.0,
        request_timeout: float = 10.0,
    ) -> None:
        self.db = db
        self.client = client
        self.endpoints = endpoints
        self.identities = identities
        self.entries = entries
        self.pod_uid_of = pod_uid_of
        self.node_ip = node_ip
        self.attempts = attempts
        self.resync_interval = resync_interval
        self.request_timeout = request_timeout
        self.reflector = Reflector(client, endpoint_resource_spec(), self._deliver, config)
        #: Every CiliumEndpoint the server holds, by ``namespace/name``.
        self.served: dict[str, Served] = {}
        self.synced = False
        self._init_done: Callable[[WriteTxn], None] | None = None
        #: Current error per object this node publishes (``namespace/name`` -> message).
        self.publish_errors: dict[str, str] = {}
        self.writes = 0
        #: Local endpoints waiting for their Pod's uid.
        self.waiting: list[str] = []

    def register_initializer(self, txn: WriteTxn) -> None:
        """Keep the ipcache table uninitialized until the initial list is applied."""
        self._init_done = self.entries.ipcache.register_initializer(txn, INITIALIZER)

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Watch and publish until cancelled."""
        async with anyio.create_task_group() as tg:
            tg.start_soon(self.reflector.run, name="k8s reflector ciliumendpoints")
            tg.start_soon(self._publish_loop, name="ciliumendpoint publisher")
            task_status.started()

    # ----- the watch ------------------------------------------------------------------------
    async def _deliver(self, _r: Reflector, deltas: list[Delta], synced: bool) -> None:
        await anyio.to_thread.run_sync(self.apply, deltas, synced)

    def apply(self, deltas: list[Delta], synced: bool) -> int:
        """Apply one delivery; returns the ipcache rows written."""
        for d in deltas:
            if d.op == "upsert":
                self._serve(d.key, d.obj)
            else:
                self.served.pop(d.key, None)
        upserts, dels = net_changes(deltas)
        ups = [(d.key, d.obj) for d in upserts]
        with self.db.write_txn(self.entries.ipcache) as txn:
            written = self.entries.apply(txn, ups, dels)
            if synced:
                self.synced = True
                if self._init_done is not None:
                    self._init_done(txn)
                    self._init_done = None
        return written

    def _serve(self, key: str, obj: Mapping[str, Any]) -> None:
        """Note ``obj`` as the server's version of ``key`` (from the watch or a write's
        answer), unless a newer version is noted already."""
        meta = obj.get("metadata") or {}
        rv = str(meta.get("resourceVersion", ""))
        have = self.served.get(key)
        if have is not None and rv.isdigit() and have.resource_version.isdigit() and (
            int(rv) < int(have.resource_version)
        ):
            return
        status = obj.get("status")
        net = status.get("networking") if isinstance(status, Mapping) else None
        node = net.get("node") if isinstance(net, Mapping) else ""
        self.served[key] = Served(rv, status, meta.get("ownerReferences"), str(node or ""))

    # ----- publishing -----------------------------------------------------------------------
    async def _publish_loop(self) -> None:
        while True:
            txn = self.db.read_txn()
            _, w1 = self.endpoints.all_watch(txn)
            _, w2 = self.identities.all_watch(txn)
            del txn  # a held ReadTxn keeps old row versions (docs/statedb.md)
            if self.synced:
                await anyio.to_thread.run_sync(self.publish)
            with anyio.move_on_after(self.resync_interval if self.synced else 0.05):
                async with anyio.create_task_group() as tg:

                    async def wait(w: Any) -> None:
                        await w.wait_async()
                        tg.cancel_scope.cancel()

                    for w in (w1, w2):
                        tg.start_soon(wait, w)

    def desired(self) -> dict[str, dict[str, Any]]:
        """The CiliumEndpoints this node wants: ``namespace/name`` -> object."""
        node = self.node_ip()
        txn = self.db.read_txn()
        out: dict[str, dict[str, Any]] = {}
        waiting = []
        if node is None:
            return out
        for ep in self.endpoints.all(txn):
            if not ep.pod_name or not ep.pod_namespace or not ep.identity:
                continue
            if ep.state is EndpointState.DISCONNECTING:
                continue
            key = f"{ep.pod_namespace}/{ep.pod_name}"
            uid = self.pod_uid_of(ep.pod_namespace, ep.pod_name)
            if uid is None:
                waiting.append(key)
                continue
            ident = self.identities.get(txn, identity_id_index.query(ep.identity))
            out[key] = cilium_endpoint_object(ep, cilium_endpoint_status(ep, ident, node), uid)
        self.waiting = waiting
        return out

    def publish(self) -> int:
        """One pass (blocking: a worker thread): create, update and delete what differs
        from the server; returns the requests that succeeded."""
        want = self.desired()
        node = self.node_ip()
        done = 0
        for key, obj in want.items():
            have = self.served.get(key)
            if have is not None and have.status == obj["status"] and (
                have.owners == obj["metadata"]["ownerReferences"]
            ):
                self.publish_errors.pop(key, None)
                continue
            done += self._write(key, obj)
        for key, have in list(self.served.items()):
            if key not in want and node is not None and have.node == str(node) and (
                key not in self.waiting
            ):
                done += self._delete(key)
        for key in [k for k in self.publish_errors if k not in want and k in self.served]:
            if self.served[key].node != str(node):
                self.publish_errors.pop(key, None)
        return done

    def _write(self, key: str, obj: dict[str, Any]) -> int:
        ns, name = key.split("/", 1)
        for attempt in range(self.attempts):
            have = self.served.get(key)
            try:
                if have is None:
                    got = self.client.create(
                        resource_path(API_VERSION, PLURAL, ns), obj,
                        timeout=self.request_timeout,
                    )
                else:
                    body = {**obj, "metadata": {**obj["metadata"],
                                                "resourceVersion": have.resource_version}}
                    got = self.client.replace(
                        resource_path(API_VERSION, PLURAL, ns, name), body,
                        timeout=self.request_timeout,
                    )
            except (K8sApiError, urllib3.exceptions.HTTPError, OSError) as e:
                # 409 (exists, or a stale version) and 404 (deleted meanwhile): the watch
                # brings the server's version; try again from it.
                self._failed(key, e, attempt)
                continue
            if isinstance(got, Mapping):
                self._serve(key, got)
            self.publish_errors.pop(key, None)
            self.writes += 1
            return 1
        return 0

    def _delete(self, key: str) -> int:
        ns, name = key.split("/", 1)
        for attempt in range(self.attempts):
            try:
                self.client.delete(
                    resource_path(API_VERSION, PLURAL, ns, name), timeout=self.request_timeout
                )
            except K8sApiError as e:
                if e.status == 404:
                    break
                self._failed(key, e, attempt)
                continue
            except (urllib3.exceptions.HTTPError, OSError) as e:
                self._failed(key, e, attempt)
                continue
            self.served.pop(key, None)
            self.publish_errors.pop(key, None)
            self.writes += 1
            return 1
        return 0

    def _failed(self, key: str, e: BaseException, attempt: int) -> None:
        msg = f"{KIND} {key}: {describe_error(e)}"
        if self.publish_errors.get(key) != msg:
            log.warning("endpoints: %s", msg)
        self.publish_errors[key] = msg
        if attempt + 1 < self.attempts:
            time.sleep(min(0.1 * 2**attempt, 1.0))

    # ----- reporting ----------------------------------------------------------------------------
    def health(self) -> tuple[bool, str]:
        """(ok, message) for the ``endpoints/cilium-endpoints`` health line."""
        h = self.reflector.health
        parts = [
            f"{h.state} ({'synced' if h.synced else 'not synced'})",
            f"{len(self.entries)} remote",
        ]
        ok = not (h.last_error and not h.synced)
        if h.last_error and not h.synced:
            parts.append(h.last_error)
        if self.waiting:
            parts.append(f"{len(self.waiting)} waiting for their Pod, e.g. {self.waiting[0]}")
        for what, errs in (("not published", self.publish_errors),
                           ("refused", self.entries.errors)):
            if errs:
                ok = False
                first = sorted(errs)[0]
                parts.append(f"{len(errs)} {what}, e.g. {errs[first]}")
        if self.entries.conflicts:
            ok = False
            ip, keys = sorted(self.entries.conflicts.items(), key=lambda kv: str(kv[0]))[0]
            parts.append(f"{len(self.entries.conflicts)} address(es) claimed twice, e.g. "
                         f"{ip}: {' wins over '.join(keys)}")
        return ok, "; ".join(parts)


def node_internal_ip(node: Mapping[str, Any] | None) -> IPAddress | None:
    """The first InternalIP (IPv4 preferred) of a Node object, None without one."""
    if not node:
        return None
    status = node.get("status") or {}
    found: list[IPAddress] = []
    for a in status.get("addresses") or []:
        if isinstance(a, Mapping) and a.get("type") == "InternalIP":
            try:
                found.append(ipaddress.ip_address(str(a.get("address", ""))))
            except ValueError:
                continue
    found.sort(key=lambda ip: ip.version)
    return found[0] if found else None
