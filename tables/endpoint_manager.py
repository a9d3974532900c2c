"""EndpointManager: creates, changes, deletes and restores endpoints, keeping the endpoints
table, identities, IPAM, the desired map entries and the state directory consistent.

What one change touches, and in which order:

1. addresses (unless ``datapath-configuration.external-ipam``: another IPAM owns them and
   the agent neither allocates nor releases them): an address the request names is
   allocated to the endpoint if nobody holds it
   (an address the runtime took with ``POST /ipam`` stays with that owner); with no
   ``addressing`` at all one address per pod-CIDR family is allocated. IPAM persists each
   allocation before returning (tables/ipam.py);
2. one write transaction over ``endpoints``, ``identities``, ``endpoint-map`` and
   ``ipcache``: the endpoint row, its identity's reference, its map entries; the endpoint's
   state file (``<state_dir>/endpoints/<id>.json``, written atomically) is written before
   the commit, so the table never holds an endpoint the state directory lacks;
3. if step 2 fails, the addresses step 1 allocated are released again: a bad request
   changes nothing.

The identity is allocated for `Endpoint.identity_labels`: the request's labels, the
labels of the Kubernetes Pod (``pod_labels_of``, the Kubernetes source's; applied again by
`sync_pod_labels` whenever they change), for a pod its namespace and the namespace's
labels (``namespace_labels_of``, the namespaces table's; applied again by
`sync_namespace_labels`; unknown until a Namespace object is read, which the identity
says: tables/identities.py) and its namespace
(``k8s:io.kubernetes.pod.namespace``), as Cilium builds a pod's identity.

The lifecycle states (tables/endpoints.py) are set here:

* `create` commits the endpoint ``regenerating`` with its entries Pending; `update` moves
  it back to ``regenerating`` when its entries change;
* `mark_ready` (the component calls it whenever the entry tables change) moves a
  ``regenerating`` endpoint to ``ready`` once every entry of it is Done, i.e. written into
  the maps by the reconcilers;
* deletion has two halves: `begin_delete` marks the endpoint ``disconnecting`` and takes
  its entries out of the entry tables in one transaction; the caller waits for the
  reconcilers to remove them from the maps, then `finish_delete` releases the identity,
  the row, the state file and the addresses (`delete` does both halves at once);
* `restore` reads the state directory back at start into ``restoring`` endpoints;
  `finish_restore` moves them to ``regenerating`` once the agent's restore is complete.

The state file records the state with the rest of the endpoint whenever it is written:
at `create` and `update` (``regenerating``), at `mark_ready` (``ready``) and at
`begin_delete` (``disconnecting``), so outside a restart it says what the API says.
Restore reads only ``disconnecting`` from it (finish the deletion); any other endpoint
comes back ``restoring`` whatever its file says (its entries are checked against the maps
again before it is ``ready``), and those transient restart states are not written.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import os
import threading
import urllib.parse
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace

from reconciler.status import StatusKind
from statedb import DB, ReadTxn, Table, WriteTxn
from tables.endpoint_entries import (
    EntryTables,
    endpoint_map_ip_index,
    endpoint_owner,
    ipcache_prefix_index,
)
from tables.endpoints import (
    MAX_ENDPOINT_ID,
    MIN_ENDPOINT_ID,
    Endpoint,
    EndpointChange,
    EndpointExistsError,
    EndpointNotFoundError,
    EndpointRequestError,
    EndpointState,
    NamedPort,
    endpoint_container_index,
    endpoint_id_index,
    endpoint_ip_index,
    endpoint_pod_index,
    namespace_label_pairs,
    new_endpoints_table,
)
from tables.identities import IdentityAllocator, IdentityError, LabelError, normalize_labels
from tables.ipam import (
    IPAM,
    ROUTER_OWNER,
    AddressInUseError,
    IPAMRequestError,
    NotAllocatedError,
)
from tables.l3n4 import IPAddress
from tables.state_dir import StateDirError, read_json, remove_file, write_json_atomic

log = logging.getLogger("statewright.endpoints")

ENDPOINTS_DIR = "endpoints"

#: The labels of a Pod ``(namespace, name)``, None when unknown (the Kubernetes source).
PodLabels = Callable[[str, str], "Mapping[str, str] | None"]

#: The named container ports of a Pod ``(namespace, name)``, None when unknown.
PodPorts = Callable[[str, str], "tuple[NamedPort, ...] | None"]

#: The labels of a Namespace, None when unknown (the namespaces table).
NamespaceLabelsOf = Callable[[str], "Mapping[str, str] | None"]

#: Whether an endpoint's interface still exists (restore removes those whose does not).
LinkCheck = Callable[[Endpoint], bool]


def host_link_exists(ep: Endpoint) -> bool:
    """True when the endpoint's host-side interface exists in this network namespace with
    the same ifindex (and name, when recorded). Endpoints without an interface count as
    present (nothing can have vanished)."""
    if not ep.ifindex and not ep.interface_name:
        return True
    from pyroute2 import IPRoute

    with IPRoute() as ipr:
        try:
            if ep.ifindex:
                links = ipr.get_links(ep.ifindex)
            else:
                links = ipr.get_links(ifname=ep.interface_name)
        except Exception:  # pyroute2 raises NetlinkError (ENODEV) for a missing link
            return False
        if not links:
            return False
        name = links[0].get_attr("IFLA_IFNAME")
        return not ep.interface_name or name == ep.interface_name


@dataclass
class RestoreResult:
    """What `EndpointManager.restore` did."""

    restored: list[int] = field(default_factory=list)
    removed: list[int] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)


class EndpointManager:
    """The endpoint lifecycle over the tables (see the module doc)."""

    def __init__(
        self,
        db: DB,
        ipam: IPAM,
        identities: IdentityAllocator,
        state_dir: str | None,
        endpoints: Table[Endpoint] | None = None,
        entries: EntryTables | None = None,
        netns_cookie: Callable[[str], int] | None = None,
        pod_labels_of: PodLabels | None = None,
        namespace_labels_of: NamespaceLabelsOf | None = None,
        pod_ports_of: PodPorts | None = None,
    ) -> None:
        self.db = db
        #: The named container ports of the Pod ``(namespace, name)`` from the Kubernetes
        #: source, None when it does not know the Pod.
        self.pod_ports_of = pod_ports_of
        #: The labels of a Namespace (None when unknown); None: never known (every pod's
        #: namespace labels are unknown).
        self.namespace_labels_of = namespace_labels_of
        #: The labels of the Pod ``(namespace, name)`` from the Kubernetes source, None
        #: when it does not know the Pod; None: no Kubernetes source (request labels only).
        self.pod_labels_of = pod_labels_of
        #: Reads the cookie of a netns path (statewright.netns_cookie); None: not read.
        self.netns_cookie = netns_cookie
        self.ipam = ipam
        self.identities = identities
        self.state_dir = state_dir
        self.endpoints = endpoints or new_endpoints_table()
        self.entries = entries or EntryTables()
        for t in (self.endpoints, self.entries.endpoint_map, self.entries.ipcache):
            if t not in db.tables:
                db.register(t)
        self._lock = threading.RLock()
        #: More conditions an endpoint must meet before `mark_ready` moves it to ``ready``
        #: (e.g. the tc programs attached to its veth); whoever adds one calls
        #: `mark_ready` when it may have become true.
        self.ready_checks: list[Callable[[Endpoint], bool]] = []

    # ----- lookups ------------------------------------------------------------------------------
    def _tables(self) -> tuple[Table[object], ...]:
        return (
            self.endpoints,  # type: ignore[return-value]
            self.identities.table,
            self.entries.endpoint_map,
            self.entries.ipcache,
        )

    def all(self, txn: ReadTxn | None = None) -> list[Endpoint]:
        """Every endpoint, by id."""
        return list(self.endpoints.all(txn or self.db.read_txn()))

    def resolve(self, ref: str, txn: ReadTxn | None = None) -> Endpoint | None:
        """The endpoint ``ref`` names: a numeric id, ``container-id:<id>``,
        ``pod-name:<namespace>/<name>`` or ``cni-attachment-id:<container id>:<ifname>``.
        EndpointRequestError for a malformed reference. ``ref`` may be percent-encoded
        (``pod-name:default%2Fweb`` in a URL path)."""
        txn = txn or self.db.read_txn()
        ref = urllib.parse.unquote(ref)
        kind, sep, value = ref.partition(":")
        if not sep:
            return self.endpoints.get(txn, endpoint_id_index.query(_parse_id(ref)))
        if not value:
            raise EndpointRequestError(f"endpoint id {ref!r}: empty value after {kind!r}")
        if kind == "container-id":
            return next(iter(self.endpoints.list(txn, endpoint_container_index.query(value))), None)
        if kind == "pod-name":
            if "/" not in value:
                raise EndpointRequestError(f"endpoint id {ref!r}: want pod-name:<namespace>/<name>")
            return next(iter(self.endpoints.list(txn, endpoint_pod_index.query(value))), None)
        if kind == "cni-attachment-id":
            cid, _, ifname = value.rpartition(":")
            if not cid:
                raise EndpointRequestError(
                    f"endpoint id {ref!r}: want cni-attachment-id:<container id>:<ifname>"
                )
            for ep in self.endpoints.list(txn, endpoint_container_index.query(cid)):
                if ep.container_interface_name == ifname:
                    return ep
            return None
        raise EndpointRequestError(
            f"endpoint id {ref!r}: unknown prefix {kind!r} (numeric id, container-id:, "
            "pod-name:, cni-attachment-id:)"
        )

    def get(self, ref: str) -> Endpoint:
        """The endpoint ``ref`` names; EndpointNotFoundError when none."""
        ep = self.resolve(ref)
        if ep is None:
            raise EndpointNotFoundError(f"endpoint {ref}: not found")
        return ep

    # ----- changes ------------------------------------------------------------------------------
    def create(self, ref: str, change: EndpointChange) -> Endpoint:
        """PUT /endpoint/{ref}: create an endpoint (see the module doc). ``ref`` is a free
        numeric id, ``0`` or a prefixed reference (the agent picks the id)."""
        with self._lock:
            txn = self.db.read_txn()
            if self.resolve(ref, txn) is not None:
                raise EndpointExistsError(f"endpoint {ref}: already exists")
            ep_id = self._pick_id(ref, txn)
            ep = change.apply(Endpoint(ep_id))
            ep = self._with_pod_labels(_ids_from_ref(ep, ref))
            for ip in ep.addresses():
                other = next(iter(self.endpoints.list(txn, endpoint_ip_index.query(ip))), None)
                if other is not None:
                    raise EndpointExistsError(
                        f"endpoint {ref}: address {ip} belongs to endpoint {other.id}"
                    )
            taken = [] if ep.external_ipam else self._take_addresses(ep, change)
            try:
                ep = replace(ep, **{f"ipv{ip.version}": ip for ip in taken})  # type: ignore[arg-type]
                return self._commit_new(self._with_cookie(ep))
            except BaseException:
                for ip in taken:
                    self._release_quiet(ip)
                raise

    def _take_addresses(self, ep: Endpoint, change: EndpointChange) -> list[IPAddress]:
        """Allocate the endpoint's addresses (see the module doc); returns the ones this call
        allocated (to release on failure)."""
        owner = ep.ipam_owner
        got: list[IPAddress] = []
        try:
            if "ipv4" not in change.fields and "ipv6" not in change.fields:
                self.ipam.check_ready()  # no pod CIDRs yet: no endpoint without addresses
                for fam in self.ipam.families():
                    got.append(self.ipam.allocate_next(fam, owner))
                return got
            for ip in ep.addresses():
                held_by = self.ipam.owner_of(self.db.read_txn(), ip)
                if held_by == ROUTER_OWNER:
                    raise AddressInUseError(ip, held_by, owner)
                if held_by is None:
                    got.append(self.ipam.allocate(ip, owner))
        except BaseException:
            for ip in got:
                self._release_quiet(ip)
            raise
        return got

    def _commit_new(self, ep: Endpoint) -> Endpoint:
        with self.db.write_txn(*self._tables()) as wtxn:
            ident = self.identities.acquire(wtxn, ep.identity_labels())
            ep = replace(ep, identity=ident.id, state=EndpointState.REGENERATING)
            self.endpoints.insert(wtxn, ep)
            self.entries.set_endpoint(wtxn, ep, previous=[])
            self._persist(ep)
        log.info("endpoint %d created (%s)", ep.id, ", ".join(map(str, ep.addresses())))
        return ep

    def update(self, ref: str, change: EndpointChange) -> Endpoint:
        """PATCH /endpoint/{ref}: change the fields the request carries. Addresses cannot
        change (EndpointRequestError); new labels move the endpoint to another identity."""
        with self._lock:
            old = self.get(ref)
            if old.state is EndpointState.DISCONNECTING:
                raise EndpointExistsError(f"endpoint {ref}: is being deleted")
            new = change.apply(old)
            if new.netns_path != old.netns_path:
                new = self._with_cookie(replace(new, netns_cookie=0))
            if new.addresses() != old.addresses() or new.external_ipam != old.external_ipam:
                raise EndpointRequestError(
                    f"endpoint {ref}: addressing and external-ipam cannot change "
                    "(delete and create it again)"
                )
            if (new.pod_namespace, new.pod_name) != (old.pod_namespace, old.pod_name):
                new = self._with_pod_labels(replace(new, pod_labels=(), pod_named_ports=None))
            return self._write_change(old, new)

    def _write_change(self, old: Endpoint, new: Endpoint) -> Endpoint:
        """Commit ``new`` in place of ``old`` (the lock held): another identity when the
        identity labels changed, the entries again when they changed (``regenerating``)."""
        with self.db.write_txn(*self._tables()) as wtxn:
            if new.identity_labels() != old.identity_labels():
                ident = self.identities.acquire(wtxn, new.identity_labels())
                self.identities.release(wtxn, old.identity)
                new = replace(new, identity=ident.id)
            if new == old:
                return old
            if self.entries.set_endpoint(wtxn, new, previous=old.addresses()):
                new = replace(new, state=EndpointState.REGENERATING)
            self.endpoints.insert(wtxn, new)
            self._persist(new)
        if new.identity != old.identity:
            log.info("endpoint %d: identity %d -> %d", new.id, old.identity, new.identity)
        return new

    def set_pod_labels(self, namespace: str, name: str, labels: Mapping[str, str]) -> list[int]:
        """The Kubernetes Pod ``namespace/name`` has ``labels``: every endpoint of that pod
        takes them as its ``pod_labels`` and, when its identity labels change, moves to
        the identity of its new labels (so its policy, and the policy of the endpoints
        selecting it, follow). Returns the ids of the endpoints that changed. Labels that
        are not strings raise LabelError and change nothing."""
        pod_labels = normalize_labels(labels)
        changed = []
        with self._lock:
            txn = self.db.read_txn()
            for ep in self.endpoints.list(txn, endpoint_pod_index.query(f"{namespace}/{name}")):
                if ep.state is EndpointState.DISCONNECTING or ep.pod_labels == pod_labels:
                    continue
                if self._write_change(ep, replace(ep, pod_labels=pod_labels)) != ep:
                    changed.append(ep.id)
        return changed

    def sync_pod_labels(self) -> list[int]:
        """`set_pod_labels` for every endpoint of a pod whose labels ``pod_labels_of``
        knows (call it when the Kubernetes source's Pods change); returns the ids of the
        endpoints that changed. A Pod ``pod_labels_of`` does not know (not listed yet, or
        deleted while its endpoint lives on) leaves its endpoints' labels as they are. A
        Pod whose labels cannot be applied (`IdentityError`: malformed labels, identities
        exhausted) is logged and keeps its endpoints as they are; the others go on."""
        if self.pod_labels_of is None:
            return []
        changed = []
        with self._lock:  # an endpoint being created reads the labels before this runs
            pods = {(ep.pod_namespace, ep.pod_name) for ep in self.all() if ep.pod_name}
            for ns, name in sorted(pods):
                labels = self.pod_labels_of(ns, name)
                if labels is None:
                    continue
                try:
                    changed += self.set_pod_labels(ns, name, labels)
                except IdentityError as e:  # bad labels, identities exhausted
                    log.error("pod %s/%s: labels not applied: %s", ns, name, e)
                ports = self.pod_ports_of(ns, name) if self.pod_ports_of is not None else None
                if ports is not None:
                    changed += self._set_pod_ports(ns, name, ports)
        return sorted(set(changed))

    def _set_pod_ports(self, namespace: str, name: str, ports: tuple[NamedPort, ...]) -> list[int]:
        """Every endpoint of the Pod takes its named container ports (the lock held)."""
        changed = []
        for ep in self.endpoints.list(
            self.db.read_txn(), endpoint_pod_index.query(f"{namespace}/{name}")
        ):
            if ep.state is EndpointState.DISCONNECTING or ep.pod_named_ports == ports:
                continue
            if self._write_change(ep, replace(ep, pod_named_ports=ports)) != ep:
                changed.append(ep.id)
        return changed

    def renumber_identities(self, change: Callable[[WriteTxn], Mapping[int, int]]) -> list[int]:
        """Run ``change`` in one write transaction over the manager's tables, under its
        lock (the cluster identity allocator's ``observe``, which may move label sets to
        other numbers and returns ``{old: new}``), and move every endpoint using a moved
        number to its new one in the same transaction: its row, its map entries, its
        state file. Returns the ids of the endpoints moved."""
        moved: list[int] = []
        with self._lock, self.db.write_txn(*self._tables()) as wtxn:
            moves = change(wtxn)
            if not moves:
                return moved
            for ep in list(self.endpoints.all(wtxn)):
                new_id = moves.get(ep.identity)
                if new_id is None:
                    continue
                new = replace(ep, identity=new_id)
                live = ep.state is not EndpointState.DISCONNECTING
                changed = live and self.entries.set_endpoint(wtxn, new, previous=ep.addresses())
                if changed and ep.state is EndpointState.READY:
                    new = replace(new, state=EndpointState.REGENERATING)
                self.endpoints.insert(wtxn, new)
                self._persist(new)
                moved.append(ep.id)
                log.info("endpoint %d: identity %d -> %d (cluster)", ep.id, ep.identity, new_id)
        return moved

    def sync_namespace_labels(self) -> list[int]:
        """Give every pod's endpoint the labels ``namespace_labels_of`` says its namespace
        has now (None: unknown), moving it to the identity of its new labels when they
        changed, whether or not its Pod object is known; returns the ids of the endpoints
        that changed. Call it when the namespaces change, once their sources have
        delivered their initial state (before that, a namespace not yet read would read
        as unknown). An endpoint whose labels cannot be applied is logged and kept."""
        changed = []
        with self._lock:
            for ep in self.all():
                if not ep.pod_namespace or ep.state is EndpointState.DISCONNECTING:
                    continue
                new = self._with_namespace_labels(ep)
                if new.namespace_labels == ep.namespace_labels:
                    continue
                try:
                    if self._write_change(ep, new) != ep:
                        changed.append(ep.id)
                except IdentityError as e:
                    log.error("endpoint %d: namespace labels not applied: %s", ep.id, e)
        return changed

    def delete(self, ref: str) -> Endpoint:
        """DELETE /endpoint/{ref} without waiting for the maps: `begin_delete`, then
        `finish_delete` at once. EndpointNotFoundError when it does not exist."""
        ep, _ = self.begin_delete(ref)
        return self.finish_delete(ep)

    def begin_delete(self, ref: str) -> tuple[Endpoint, tuple[int, int]]:
        """First half of a deletion: the endpoint becomes ``disconnecting`` (also in its
        state file, so a restart finishes the deletion) and its entries leave the entry
        tables in the same transaction. Returns the endpoint and the revisions of the
        ``endpoint-map`` and ``ipcache`` tables the reconcilers must reach before its
        entries are out of the maps. An endpoint already disconnecting is returned as is.
        EndpointNotFoundError when it does not exist."""
        with self._lock:
            ep = self.get(ref)
            if ep.state is not EndpointState.DISCONNECTING:
                with self.db.write_txn(*self._tables()) as wtxn:
                    self.entries.delete_endpoint(wtxn, ep.id, previous=ep.addresses())
                    ep = replace(ep, state=EndpointState.DISCONNECTING)
                    self.endpoints.insert(wtxn, ep)
                    self._persist(ep)
            txn = self.db.read_txn()
            return ep, (self.entries.endpoint_map.revision(txn), self.entries.ipcache.revision(txn))

    def finish_delete(self, ep: Endpoint) -> Endpoint:
        """Second half: release the identity reference, remove the row and the state file,
        release the addresses. Nothing to do when another caller finished already."""
        with self._lock:
            cur = self.endpoints.get(self.db.read_txn(), endpoint_id_index.query(ep.id))
            if cur is None or cur.state is not EndpointState.DISCONNECTING:
                return ep
            self._remove(cur)
            return cur

    def _remove(self, ep: Endpoint) -> None:
        """Remove ``ep`` in one transaction (entries, identity, row, state file), then
        release its addresses."""
        with self.db.write_txn(*self._tables()) as wtxn:
            self.entries.delete_endpoint(wtxn, ep.id, previous=ep.addresses())
            self.identities.release(wtxn, ep.identity)
            self.endpoints.delete(wtxn, ep)
            if self.state_dir is not None:
                remove_file(self._state_path(ep.id))
        self._release_addresses(ep)
        log.info("endpoint %d deleted", ep.id)

    def _release_addresses(self, ep: Endpoint) -> None:
        """Release the endpoint's addresses (not those of an external IPAM)."""
        if ep.external_ipam:
            return
        for ip in ep.addresses():
            self._release_quiet(ip)

    def mark_ready(self) -> list[int]:
        """Move every ``regenerating`` endpoint whose entries are all reconciled (Done) to
        ``ready``; returns their ids. Cheap when nothing is regenerating. (``restoring``
        endpoints wait for `finish_restore`, ``disconnecting`` ones for `finish_delete`.)
        The state file is rewritten with the ``ready`` state first, so it says what the API
        says (it writes a file: call it from a worker thread); an endpoint whose file
        cannot be written stays ``regenerating``, logged, and is tried again next call."""
        txn = self.db.read_txn()
        ready: list[Endpoint] = []
        for ep in self.endpoints.all(txn):
            if (
                ep.state is EndpointState.REGENERATING
                and self._reconciled(txn, ep)
                and all(check(ep) for check in self.ready_checks)
            ):
                ready.append(ep)
        if not ready:
            return []
        done: list[int] = []
        with self._lock, self.db.write_txn(self.endpoints) as wtxn:
            for ep in ready:
                cur = self.endpoints.get(wtxn, endpoint_id_index.query(ep.id))
                if cur == ep:
                    ready_ep = replace(ep, state=EndpointState.READY)
                    try:
                        self._persist_if_changed(ready_ep)
                    except StateDirError as e:
                        log.error("endpoint %d: %s; it stays regenerating", ep.id, e)
                        continue
                    self.endpoints.insert(wtxn, ready_ep)
                    done.append(ep.id)
        return done

    def _reconciled(self, txn: ReadTxn, ep: Endpoint) -> bool:
        """Whether every entry of ``ep`` (looked up by its addresses) is Done."""
        owner = endpoint_owner(ep.id)
        for ip in ep.addresses():
            rows = (
                self.entries.endpoint_map.get(txn, endpoint_map_ip_index.query(ip)),
                self.entries.ipcache.get(txn, ipcache_prefix_index.query(ipaddress.ip_network(ip))),
            )
            for row in rows:
                if (
                    row is not None
                    and row.owner == owner
                    and row.status.kind is not StatusKind.DONE
                ):
                    return False
        return True

    def sync_host(self, host_ips: Iterable[IPAddress]) -> int:
        """Host and world entries for the node's addresses plus the IPAM router addresses
        (call it whenever the node-addresses table changes); returns rows changed."""
        txn = self.db.read_txn()
        ips = set(host_ips)
        for fam in self.ipam.families():
            router = self.ipam.router(txn, fam)
            if router is not None:
                ips.add(router)
        with self.db.write_txn(self.entries.endpoint_map, self.entries.ipcache) as wtxn:
            ordered = sorted(ips, key=lambda a: (a.version, int(a)))
            return self.entries.set_host(wtxn, ordered, self.ipam.families())

    # ----- restore ------------------------------------------------------------------------------
    def restore(self, link_exists: LinkCheck = host_link_exists) -> RestoreResult:
        """Read the endpoints of the state directory back (call it once at start, after
        IPAM's restore and before the map reconcilers prune). An endpoint whose interface
        vanished, or whose deletion was under way (``disconnecting``), is removed: its
        state file and addresses are released. The others come back ``restoring`` with
        their ids, addresses, identity numbers and map entries (the reconcilers then find
        those entries unchanged in the pinned maps and do not rewrite them). A state file
        that cannot be read is logged and left in place."""
        result = RestoreResult()
        if self.state_dir is None:
            return result
        directory = os.path.join(self.state_dir, ENDPOINTS_DIR)
        try:
            names = sorted(os.listdir(directory))
        except FileNotFoundError:
            return result
        with self._lock:
            for name in names:
                if not name.endswith(".json") or name.startswith("."):
                    continue
                path = os.path.join(directory, name)
                try:
                    ep = Endpoint.from_json(read_json(path) or {})
                except (StateDirError, EndpointRequestError) as e:
                    log.error("endpoint restore: %s: %s (file left in place)", path, e)
                    result.failed.append(f"{path}: {e}")
                    continue
                if ep.state is EndpointState.DISCONNECTING or not link_exists(ep):
                    log.info(
                        "endpoint restore: %d: %s; removing it",
                        ep.id,
                        "its deletion was under way"
                        if ep.state is EndpointState.DISCONNECTING
                        else f"interface {ep.interface_name} (ifindex {ep.ifindex}) is gone",
                    )
                    remove_file(path)
                    self._release_addresses(ep)
                    result.removed.append(ep.id)
                    continue
                for ip in [] if ep.external_ipam else ep.addresses():
                    if self.ipam.owner_of(self.db.read_txn(), ip) is None:
                        self.ipam.allocate(ip, ep.ipam_owner)
                ep = self._with_cookie(ep)  # before the transaction: it enters the netns
                with self.db.write_txn(*self._tables()) as wtxn:
                    ident = self.identities.acquire(wtxn, ep.identity_labels(), want=ep.identity)
                    if ident.id != ep.identity:
                        log.warning(
                            "endpoint restore: %d: identity %d became %d",
                            ep.id,
                            ep.identity,
                            ident.id,
                        )
                    ep = replace(ep, identity=ident.id, state=EndpointState.RESTORING)
                    self.endpoints.insert(wtxn, ep)
                    self.entries.set_endpoint(wtxn, ep, previous=[])
                result.restored.append(ep.id)
        log.info(
            "endpoint restore: %d restored, %d removed (interface gone), %d unreadable",
            len(result.restored),
            len(result.removed),
            len(result.failed),
        )
        return result

    def finish_restore(self) -> list[int]:
        """Move every ``restoring`` endpoint to ``regenerating`` (call it once the agent's
        restore is complete: host entries derived, pruning allowed); `mark_ready` then
        makes each ``ready`` once its entries are written. Returns their ids."""
        with self._lock, self.db.write_txn(self.endpoints) as wtxn:
            moved = []
            for ep in self.endpoints.all(wtxn):
                if ep.state is EndpointState.RESTORING:
                    self.endpoints.insert(wtxn, replace(ep, state=EndpointState.REGENERATING))
                    moved.append(ep.id)
        return moved

    # ----- internals ----------------------------------------------------------------------------
    def _with_namespace_labels(self, ep: Endpoint) -> Endpoint:
        """``ep`` with the labels ``namespace_labels_of`` knows for its namespace (None:
        unknown); unchanged when it is not a pod."""
        if not ep.pod_namespace:
            return ep
        labels = None
        if self.namespace_labels_of is not None:
            labels = self.namespace_labels_of(ep.pod_namespace)
        try:
            return replace(ep, namespace_labels=namespace_label_pairs(labels))
        except ValueError as e:
            log.error("endpoint %d: namespace labels not applied: %s", ep.id, e)
            return replace(ep, namespace_labels=None)

    def _with_pod_labels(self, ep: Endpoint) -> Endpoint:
        """``ep`` with the labels ``pod_labels_of`` knows for its pod and those of its
        namespace; the Pod's unchanged when there is no pod, no lookup or no such Pod (yet:
        `sync_pod_labels` applies them later)."""
        ep = self._with_namespace_labels(ep)
        if not ep.pod_name or not ep.pod_namespace:
            return ep
        if self.pod_ports_of is not None:
            ep = replace(ep, pod_named_ports=self.pod_ports_of(ep.pod_namespace, ep.pod_name))
        if self.pod_labels_of is None:
            return ep
        labels = self.pod_labels_of(ep.pod_namespace, ep.pod_name)
        if labels is None:
            return ep
        try:
            return replace(ep, pod_labels=normalize_labels(labels))
        except LabelError as e:
            log.error("endpoint %d: pod labels not applied: %s", ep.id, e)
            return ep

    def _with_cookie(self, ep: Endpoint) -> Endpoint:
        """``ep`` with the cookie of its netns path; unchanged (cookie 0) when there is no
        path or reader, or when the namespace cannot be read (logged: the endpoint works,
        but its socket-level policy is not enforced)."""
        if self.netns_cookie is None or not ep.netns_path:
            return ep
        try:
            return replace(ep, netns_cookie=self.netns_cookie(ep.netns_path))
        except OSError as e:
            log.warning("endpoint %d: no netns cookie: %s", ep.id, e)
            return ep

    def _pick_id(self, ref: str, txn: ReadTxn) -> int:
        if ":" not in ref and _parse_id(ref) != 0:
            return _parse_id(ref)  # resolve() found nothing under it: free
        for num in range(MIN_ENDPOINT_ID, MAX_ENDPOINT_ID + 1):
            if self.endpoints.get(txn, endpoint_id_index.query(num)) is None:
                return num
        raise EndpointExistsError(f"endpoints: all ids {MIN_ENDPOINT_ID}..{MAX_ENDPOINT_ID} in use")

    def _release_quiet(self, ip: IPAddress) -> None:
        """Release ``ip`` if it is allocated (never the router address)."""
        try:
            self.ipam.release(ip)
        except (NotAllocatedError, IPAMRequestError):
            pass

    def _state_path(self, ep_id: int) -> str:
        assert self.state_dir is not None
        return os.path.join(self.state_dir, ENDPOINTS_DIR, f"{ep_id}.json")

    def _persist(self, ep: Endpoint) -> None:
        if self.state_dir is not None:
            write_json_atomic(self._state_path(ep.id), ep.to_json())

    def _persist_if_changed(self, ep: Endpoint) -> None:
        """`_persist`, unless the file already holds exactly ``ep`` (a restored endpoint
        whose file says ``ready`` becomes ready again without a durable rewrite each)."""
        if self.state_dir is None:
            return
        try:
            same = read_json(self._state_path(ep.id)) == json.loads(json.dumps(ep.to_json()))
        except (OSError, ValueError, StateDirError):
            same = False  # unreadable: rewrite it
        if not same:
            self._persist(ep)


def _parse_id(text: str) -> int:
    try:
        num = int(text)
    except ValueError:
        raise EndpointRequestError(f"endpoint id {text!r}: not a number") from None
    if num != 0 and not MIN_ENDPOINT_ID <= num <= MAX_ENDPOINT_ID:
        raise EndpointRequestError(
            f"endpoint id {num}: out of range {MIN_ENDPOINT_ID}..{MAX_ENDPOINT_ID}"
        )
    return num


def _ids_from_ref(ep: Endpoint, ref: str) -> Endpoint:
    """Fill the container id (and interface) from a ``container-id:`` or
    ``cni-attachment-id:`` reference when the request body did not give them."""
    kind, _, value = ref.partition(":")
    if kind == "container-id" and not ep.container_id:
        return replace(ep, container_id=value)
    if kind == "cni-attachment-id":
        cid, _, ifname = value.rpartition(":")
        return replace(
            ep,
            container_id=ep.container_id or cid,
            container_interface_name=ep.container_interface_name or ifname,
        )
    return ep
