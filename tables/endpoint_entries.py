"""Desired entries of the endpoint map (Cilium's lxc map) and the ipcache: two statedb tables
that the generic reconciler writes into the BPF maps (bpfops/endpoint_ops.py,
bpfops/ipcache_ops.py).

Where the entries come from (what Cilium's agent writes):

* every local endpoint: one endpoint map entry per address (ifindex and MACs of its veth, its
  endpoint id as ``lxc_id``, its identity) and one ipcache ``/32`` or ``/128`` entry per
  address with its identity (owner ``endpoint:<id>``);
* every address of this node (the node-addresses table, and the IPAM router addresses,
  i.e. ``cilium_host``'s): an endpoint map entry with the host flag and an ipcache entry with
  the host identity (Cilium's ``syncHostIPs``; owner ``host``), following the addresses as
  they come and go;
* ``0.0.0.0/0`` and ``::/0`` in the ipcache with the world identity (owner ``world``):
  ``world-ipv4``/``world-ipv6`` when both families are enabled, ``world`` otherwise;
* every address of the other nodes of the cluster (the nodes table, tables/nodes.py): an
  ipcache entry with the remote-node identity and the node's InternalIP of the family as
  tunnel endpoint (owner ``remote-node:<node>``; `EntryTables.set_nodes`). This node's own Node
  addresses are host entries. An endpoint's or the host's entry for an address wins over
  a remote node's.

Writers only insert a row when its content changed (`_upsert`), so an unchanged endpoint
never sends its entries back through the reconciler.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from reconciler.status import Status, status_pending
from statedb import Index, Table, WriteTxn
from statedb import keys as keycodec
from tables.endpoints import Endpoint, mac_to_u64
from tables.identities import (
    IDENTITY_HOST,
    IDENTITY_REMOTE_NODE,
    IDENTITY_WORLD,
    IDENTITY_WORLD_IPV4,
    IDENTITY_WORLD_IPV6,
)
from tables.l3n4 import IPAddress, IPNetwork
from tables.nodes import Node

ENDPOINT_MAP_TABLE = "endpoint-map"
IPCACHE_TABLE = "ipcache"
ENDPOINT_F_HOST = 1  # endpoint_info.flags: the entry is one of the host's addresses

HOST_OWNER = "host"
WORLD_OWNER = "world"
REMOTE_NODE_OWNER = "remote-node"


def remote_node_owner(name: str) -> str:
    """The owner string of node ``name``'s remote-node entries."""
    return f"{REMOTE_NODE_OWNER}:{name}"


def _yields(owner: str) -> bool:
    """True for owners whose entries give way to another owner's entry for a prefix (the
    host's, and the remote nodes')."""
    return owner == HOST_OWNER or owner.startswith(REMOTE_NODE_OWNER + ":")


def endpoint_owner(ep_id: int) -> str:
    """The owner string of an endpoint's entries."""
    return f"endpoint:{ep_id}"


@dataclass(frozen=True, slots=True)
class EndpointMapEntry:
    """One desired entry of the endpoint map."""

    ip: IPAddress
    owner: str
    ifindex: int = 0
    lxc_id: int = 0
    flags: int = 0
    mac: int = 0
    node_mac: int = 0
    sec_id: int = 0
    status: Status = field(default_factory=status_pending, compare=False)

    def to_json(self) -> dict[str, Any]:
        """JSON form (``db show``)."""
        return {
            "ip": str(self.ip),
            "owner": self.owner,
            "ifindex": self.ifindex,
            "lxc_id": self.lxc_id,
            "flags": self.flags,
            "sec_id": self.sec_id,
            "status": str(self.status.kind),
        }

    @staticmethod
    def table_header() -> list[str]:
        """Columns of ``db show endpoint-map``."""
        return ["IP", "Owner", "IfIndex", "LxcID", "Flags", "Identity", "Status"]

    def table_row(self) -> list[str]:
        """Cells of ``db show endpoint-map``."""
        return [
            str(self.ip),
            self.owner,
            str(self.ifindex),
            str(self.lxc_id),
            str(self.flags),
            str(self.sec_id),
            str(self.status.kind),
        ]


@dataclass(frozen=True, slots=True)
class IPCacheEntry:
    """One desired ipcache entry: a prefix, its security identity and, for addresses on
    other nodes, the address of the node that hosts them (the map's tunnel endpoint)."""

    prefix: IPNetwork
    identity: int
    owner: str
    status: Status = field(default_factory=status_pending, compare=False)
    tunnel_endpoint: IPAddress | None = None

    def to_json(self) -> dict[str, Any]:
        """JSON form (``db show``)."""
        out: dict[str, Any] = {
            "prefix": str(self.prefix),
            "identity": self.identity,
            "owner": self.owner,
            "status": str(self.status.kind),
        }
        if self.tunnel_endpoint is not None:
            out["tunnel_endpoint"] = str(self.tunnel_endpoint)
        return out

    @staticmethod
    def table_header() -> list[str]:
        """Columns of ``db show ipcache``."""
        return ["Prefix", "Identity", "Owner", "TunnelEndpoint", "Status"]

    def table_row(self) -> list[str]:
        """Cells of ``db show ipcache``."""
        tunnel = str(self.tunnel_endpoint) if self.tunnel_endpoint is not None else ""
        return [str(self.prefix), str(self.identity), self.owner, tunnel,
                str(self.status.kind)]


endpoint_map_ip_index: Index[EndpointMapEntry, IPAddress] = Index(
    "ip", key=lambda e: e.ip, encode=keycodec.ip_address, parse=ipaddress.ip_address
)
endpoint_map_owner_index: Index[EndpointMapEntry, str] = Index(
    "owner", key=lambda e: e.owner, encode=keycodec.string, unique=False
)
ipcache_prefix_index: Index[IPCacheEntry, IPNetwork] = Index(
    "prefix", key=lambda e: e.prefix, encode=keycodec.ip_network, parse=ipaddress.ip_network
)
ipcache_owner_index: Index[IPCacheEntry, str] = Index(
    "owner", key=lambda e: e.owner, encode=keycodec.string, unique=False
)


def new_endpoint_map_table() -> Table[EndpointMapEntry]:
    """A new, unregistered ``endpoint-map`` table."""
    return Table(
        ENDPOINT_MAP_TABLE,
        endpoint_map_ip_index,
        endpoint_map_owner_index,
        row_type=EndpointMapEntry,
    )


def new_ipcache_table() -> Table[IPCacheEntry]:
    """A new, unregistered ``ipcache`` table."""
    return Table(IPCACHE_TABLE, ipcache_prefix_index, ipcache_owner_index, row_type=IPCacheEntry)


R = TypeVar("R", EndpointMapEntry, IPCacheEntry)


def _host_net(ip: IPAddress) -> IPNetwork:
    """The /32 or /128 of an address (tuple form: no string parsing)."""
    if ip.version == 4:
        return ipaddress.IPv4Network((int(ip), 32))
    return ipaddress.IPv6Network((int(ip), 128))


@dataclass
class EntryTables:
    """The two desired-entry tables and the writers that keep them derived."""

    endpoint_map: Table[EndpointMapEntry] = field(default_factory=new_endpoint_map_table)
    ipcache: Table[IPCacheEntry] = field(default_factory=new_ipcache_table)

    def _put_endpoint_map(self, txn: WriteTxn, row: EndpointMapEntry) -> bool:
        old = self.endpoint_map.get(txn, endpoint_map_ip_index.query(row.ip))
        if old == row:
            return False
        self.endpoint_map.insert(txn, row)
        return True

    def _put_ipcache(self, txn: WriteTxn, row: IPCacheEntry) -> bool:
        old = self.ipcache.get(txn, ipcache_prefix_index.query(row.prefix))
        if old == row:
            return False
        self.ipcache.insert(txn, row)
        return True

    def set_endpoint(
        self, txn: WriteTxn, ep: Endpoint, previous: Iterable[IPAddress] | None = None
    ) -> int:
        """Make ``ep``'s entries match it (insert changed ones, delete stale ones); returns
        how many rows were written or deleted. Needs an identity (no entries before).

        ``previous``: the addresses the endpoint's entries had (``[]`` for a new endpoint),
        so stale entries are found by key; None looks them up by owner (slower: the
        owner index is ordered and kept current in the transaction)."""
        owner = endpoint_owner(ep.id)
        want_endpoint_map: dict[IPAddress, EndpointMapEntry] = {}
        want_ipc: dict[IPNetwork, IPCacheEntry] = {}
        if ep.identity:
            for ip in ep.addresses():
                want_endpoint_map[ip] = EndpointMapEntry(
                    ip,
                    owner,
                    ifindex=ep.ifindex,
                    lxc_id=ep.id,
                    mac=mac_to_u64(ep.mac),
                    node_mac=mac_to_u64(ep.host_mac),
                    sec_id=ep.identity,
                )
                net = _host_net(ip)
                want_ipc[net] = IPCacheEntry(net, ep.identity, owner)
        return self._replace_owned(txn, owner, want_endpoint_map, want_ipc, previous=previous)

    def delete_endpoint(
        self, txn: WriteTxn, ep_id: int, previous: Iterable[IPAddress] | None = None
    ) -> int:
        """Delete the entries of endpoint ``ep_id`` (at ``previous`` addresses when given,
        see `set_endpoint`); returns how many."""
        return self._replace_owned(txn, endpoint_owner(ep_id), {}, {}, previous=previous)

    def set_host(
        self, txn: WriteTxn, host_ips: Iterable[IPAddress], families: Iterable[int]
    ) -> int:
        """Host entries for ``host_ips`` (host identity, host flag) and world entries for
        ``families``; entries of addresses no longer listed are deleted. Returns changes."""
        want_endpoint_map = {
            ip: EndpointMapEntry(ip, HOST_OWNER, flags=ENDPOINT_F_HOST, sec_id=IDENTITY_HOST)
            for ip in host_ips
        }
        want_ipc = {
            _host_net(ip): IPCacheEntry(_host_net(ip), IDENTITY_HOST, HOST_OWNER)
            for ip in want_endpoint_map
        }
        changed = self._replace_owned(txn, HOST_OWNER, want_endpoint_map, want_ipc)
        fams = sorted(set(families))
        world: dict[IPNetwork, IPCacheEntry] = {}
        for fam in fams:
            net = ipaddress.ip_network("0.0.0.0/0" if fam == 4 else "::/0")
            ident = IDENTITY_WORLD
            if len(fams) == 2:
                ident = IDENTITY_WORLD_IPV4 if fam == 4 else IDENTITY_WORLD_IPV6
            world[net] = IPCacheEntry(net, ident, WORLD_OWNER)
        return changed + self._replace_owned(txn, WORLD_OWNER, {}, world, endpoint_map_too=False)

    def set_nodes(
        self, txn: WriteTxn, nodes: Iterable[Node], local: str, last: dict[str, Node]
    ) -> int:
        """Remote-node entries for every address of every node but ``local`` (owner
        ``remote-node:<name>``; tunnel endpoint: the node's InternalIP of the family, else
        the address itself); entries of nodes or addresses gone are deleted. ``last``: the
        nodes as of the previous call (name -> row), brought up to date here: only nodes
        whose row is a new object, and nodes that left, are looked at, so one Node's
        change among thousands costs one node's entries. Returns changes."""
        changed = 0
        seen = set()
        for node in nodes:
            if node.name == local:
                continue
            seen.add(node.name)
            if last.get(node.name) is not node:
                changed += self._set_node(txn, node.name, node)
                last[node.name] = node
        for name in [n for n in last if n not in seen]:
            changed += self._set_node(txn, name, None)
            del last[name]
        return changed

    def _set_node(self, txn: WriteTxn, name: str, node: Node | None) -> int:
        """The entries of node ``name`` (None: it left)."""
        owner = remote_node_owner(name)
        want: dict[IPNetwork, IPCacheEntry] = {}
        for ip in node.ips() if node is not None else ():
            net = _host_net(ip)
            tunnel = node.internal_ip(ip.version) if node is not None else None
            want.setdefault(net, IPCacheEntry(net, IDENTITY_REMOTE_NODE, owner,
                                              tunnel_endpoint=tunnel or ip))
        return self._replace_owned(txn, owner, {}, want, endpoint_map_too=False)

    def _replace_owned(
        self,
        txn: WriteTxn,
        owner: str,
        want_endpoint_map: dict[IPAddress, EndpointMapEntry],
        want_ipc: dict[IPNetwork, IPCacheEntry],
        endpoint_map_too: bool = True,
        previous: Iterable[IPAddress] | None = None,
    ) -> int:
        changed = 0
        old_endpoint_map: list[EndpointMapEntry]
        old_ipc_rows: list[IPCacheEntry]
        if previous is None:
            old_endpoint_map = (
                list(self.endpoint_map.list(txn, endpoint_map_owner_index.query(owner)))
                if endpoint_map_too
                else []
            )
            old_ipc_rows = list(self.ipcache.list(txn, ipcache_owner_index.query(owner)))
        else:
            prev = list(previous)
            lxc_rows = [self.endpoint_map.get(txn, endpoint_map_ip_index.query(ip)) for ip in prev]
            ipc_rows = [
                self.ipcache.get(txn, ipcache_prefix_index.query(_host_net(ip))) for ip in prev
            ]
            old_endpoint_map = [r for r in lxc_rows if r is not None and r.owner == owner]
            old_ipc_rows = [r for r in ipc_rows if r is not None and r.owner == owner]
        if endpoint_map_too:
            for old in old_endpoint_map:
                if old.ip not in want_endpoint_map:
                    self.endpoint_map.delete(txn, old)
                    changed += 1
            for ip, row in want_endpoint_map.items():
                cur = self.endpoint_map.get(txn, endpoint_map_ip_index.query(ip))
                if cur is not None and cur.owner != owner and owner == HOST_OWNER:
                    continue  # an endpoint's entry wins over a host entry for one address
                changed += self._put_endpoint_map(txn, row)
        for old_ipc in old_ipc_rows:
            if old_ipc.prefix not in want_ipc:
                self.ipcache.delete(txn, old_ipc)
                changed += 1
        for net, ipc_row in want_ipc.items():
            cur_ipc = self.ipcache.get(txn, ipcache_prefix_index.query(net))
            if cur_ipc is not None and cur_ipc.owner != owner and _yields(owner):
                continue
            changed += self._put_ipcache(txn, ipc_row)
        return changed


def reset_status(row: R) -> R:
    """``row`` with a fresh Pending status (used to force a rewrite)."""
    return replace(row, status=status_pending())
