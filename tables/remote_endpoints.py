"""Remote endpoints: the pods of other nodes, from their CiliumEndpoint objects, as
ipcache entries (the ``ipcache`` table of tables/endpoint_entries.py, written into the
map by the existing ipcache reconciler).

A CiliumEndpoint (cilium.io/v2, namespaced, named like its pod) carries what another
node needs to know of a pod: ``status.identity.id``, ``status.networking.addressing``
(``[{ipv4, ipv6}]``) and ``status.networking.node`` (the hosting node's address). Each
address becomes a ``/32`` or ``/128`` entry with the identity and the node's address as
tunnel endpoint, owned ``cep:<namespace>/<name>``.

* **Conflicts**: two CiliumEndpoints claiming one address: the one created first
  (``creationTimestamp``, then ``namespace/name``) has the entry, whatever order they
  arrive in; the conflict is listed in `conflicts` (health) until one goes. An entry of
  this node (a local endpoint, the host, a node address) always wins: a remote claim on it
  is a conflict too, and yields.
* **Malformed objects** get their own error in `errors` and change nothing: the object's
  last good version stays in force until a good one or its deletion arrives.
* The CiliumEndpoints of this node's own endpoints (``is_local``) make no entry: the local
  endpoint's entry is the truth.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from statedb import Table, WriteTxn
from statedb.errors import InputError
from tables.endpoint_entries import IPCacheEntry, ipcache_prefix_index
from tables.identities import MAX_ALLOCATED_IDENTITY
from tables.l3n4 import IPAddress, IPNetwork

KIND = "CiliumEndpoint"
OWNER_PREFIX = "cep:"


class EndpointObjectError(InputError):
    """A CiliumEndpoint that cannot be used (the message names it and the field)."""


@dataclass(frozen=True, slots=True)
class RemoteEndpoint:
    """What a CiliumEndpoint says about its pod."""

    key: str  # namespace/name
    identity: int
    addresses: tuple[IPAddress, ...]
    node: IPAddress
    created: str

    @property
    def rank(self) -> tuple[str, str]:
        """Lower wins a contested address."""
        return (self.created, self.key)


def _host_net(ip: IPAddress) -> IPNetwork:
    return ipaddress.ip_network(ip)


def parse_endpoint_object(key: str, obj: Mapping[str, Any]) -> RemoteEndpoint:
    """The `RemoteEndpoint` of a CiliumEndpoint; EndpointObjectError when malformed."""
    ref = f"{KIND} {key}"
    status = obj.get("status")
    if not isinstance(status, Mapping):
        raise EndpointObjectError(f"{ref}: status: missing")
    ident = status.get("identity")
    num = ident.get("id") if isinstance(ident, Mapping) else None
    if not isinstance(num, int) or isinstance(num, bool) or not 0 < num <= MAX_ALLOCATED_IDENTITY:
        raise EndpointObjectError(f"{ref}: status.identity.id: not an identity number: {num!r}")
    net = status.get("networking")
    if not isinstance(net, Mapping):
        raise EndpointObjectError(f"{ref}: status.networking: missing")
    try:
        node = ipaddress.ip_address(net.get("node"))  # type: ignore[arg-type]
    except ValueError:
        raise EndpointObjectError(
            f"{ref}: status.networking.node: not an address: {net.get('node')!r}"
        ) from None
    addressing = net.get("addressing")
    if not isinstance(addressing, list):
        raise EndpointObjectError(f"{ref}: status.networking.addressing: must be a list")
    addrs: list[IPAddress] = []
    for i, pair in enumerate(addressing):
        if not isinstance(pair, Mapping):
            raise EndpointObjectError(f"{ref}: status.networking.addressing[{i}]: not an object")
        for fam in ("ipv4", "ipv6"):
            raw = pair.get(fam)
            if raw in (None, ""):
                continue
            try:
                ip = ipaddress.ip_address(raw)
            except ValueError:
                raise EndpointObjectError(
                    f"{ref}: status.networking.addressing[{i}].{fam}: not an address: {raw!r}"
                ) from None
            if ip.version != int(fam[-1]):
                raise EndpointObjectError(
                    f"{ref}: status.networking.addressing[{i}].{fam}: {raw} is not {fam}"
                )
            addrs.append(ip)
    meta = obj.get("metadata") or {}
    created = meta.get("creationTimestamp") if isinstance(meta, Mapping) else ""
    return RemoteEndpoint(key, num, tuple(addrs), node, created if isinstance(created, str) else "")


class RemoteEndpointEntries:
    """Keeps the ``cep:`` entries of the ipcache table equal to the CiliumEndpoints seen
    (see the module doc). `apply` runs in the caller's write transaction on ``ipcache``."""

    def __init__(
        self, ipcache: Table[IPCacheEntry], is_local: Callable[[str], bool] = lambda _k: False
    ) -> None:
        self.ipcache = ipcache
        #: Whether ``namespace/name`` is the CiliumEndpoint of one of this node's endpoints.
        self.is_local = is_local
        self._endpoints: dict[str, RemoteEndpoint] = {}
        self._claims: dict[IPAddress, set[str]] = {}
        #: Current error per malformed object (``namespace/name`` -> message).
        self.errors: dict[str, str] = {}
        #: Contested addresses -> the claiming objects, winner first.
        self.conflicts: dict[IPAddress, list[str]] = {}

    def __len__(self) -> int:
        return len(self._endpoints)

    def get(self, key: str) -> RemoteEndpoint | None:
        """The remote endpoint ``namespace/name`` as applied."""
        return self._endpoints.get(key)

    def apply(
        self,
        txn: WriteTxn,
        upserts: Iterable[tuple[str, Mapping[str, Any]]] = (),
        deletes: Iterable[str] = (),
    ) -> int:
        """Apply the watch's changes; returns how many ipcache rows were written."""
        touched: set[IPAddress] = set()
        for key in deletes:
            self.errors.pop(key, None)
            self._drop(key, touched)
        for key, obj in upserts:
            if self.is_local(key):
                self.errors.pop(key, None)
                self._drop(key, touched)
                continue
            try:
                ep = parse_endpoint_object(key, obj)
            except EndpointObjectError as e:
                self.errors[key] = str(e)
                continue
            self.errors.pop(key, None)
            old = self._endpoints.get(key)
            if old == ep:
                continue
            self._drop(key, touched)
            self._endpoints[key] = ep
            for ip in ep.addresses:
                self._claims.setdefault(ip, set()).add(key)
                touched.add(ip)
        return sum(self._settle(txn, ip) for ip in touched)

    def _drop(self, key: str, touched: set[IPAddress]) -> None:
        old = self._endpoints.pop(key, None)
        if old is None:
            return
        for ip in old.addresses:
            keys = self._claims.get(ip)
            if keys is not None:
                keys.discard(key)
                if not keys:
                    del self._claims[ip]
            touched.add(ip)

    def _settle(self, txn: WriteTxn, ip: IPAddress) -> int:
        """Write (or delete) the entry of ``ip`` for its winning claim; count rows."""
        net = _host_net(ip)
        cur = self.ipcache.get(txn, ipcache_prefix_index.query(net))
        claims = sorted((self._endpoints[k] for k in self._claims.get(ip, ())),
                        key=lambda e: e.rank)
        foreign = cur is not None and not cur.owner.startswith(OWNER_PREFIX)
        if len(claims) > 1 or (claims and foreign):
            who = [k.rank[1] for k in claims]
            self.conflicts[ip] = [cur.owner, *who] if foreign and cur is not None else who
        else:
            self.conflicts.pop(ip, None)
        if foreign:
            return 0  # this node's own entry wins
        if not claims:
            if cur is not None:
                self.ipcache.delete(txn, cur)
                return 1
            return 0
        win = claims[0]
        row = IPCacheEntry(net, win.identity, OWNER_PREFIX + win.key, tunnel_endpoint=win.node)
        if cur == row:
            return 0
        self.ipcache.insert(txn, row)
        return 1
