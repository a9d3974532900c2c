"""IPCacheOps: the reconciler Operations writing the ``ipcache`` table into the ipcache LPM
BPF map (layout: bpf/include/ipcache.h, codec: bpf/ipcache.py).

Each row is one prefix and its identity: key ``ipcache_key`` (prefixlen = 32 + the CIDR
length, family, address), value ``remote_endpoint_info`` (the identity; for an address
on another node also that node's address as tunnel endpoint, with Cilium's "has tunnel
endpoint" flag and, for an IPv6 one, its "IPv6 tunnel endpoint" flag). `KeyedMapOps`
writes only entries that differ and prunes what no row explains; ``stored`` says when an
LPM lookup finds the exact entry.
"""

from __future__ import annotations

from bpf.ipcache import (
    FLAG_HAS_TUNNEL_EP,
    FLAG_IPV6_TUNNEL_EP,
    PREFIX_HEADER_BITS,
    IPCacheKey,
    RemoteEndpointInfo,
)
from bpf.typed_map import TypedMap
from bpfops.keyed_map_ops import KeyedMapOps
from tables.endpoint_entries import IPCacheEntry
from tables.l3n4 import IPNetwork


def ipcache_key(prefix: IPNetwork) -> IPCacheKey:
    """The ipcache key of a prefix."""
    return IPCacheKey.for_cidr(prefix.network_address.packed, prefix.prefixlen)


def ipcache_value(row: IPCacheEntry) -> RemoteEndpointInfo:
    """The ipcache value of a row."""
    tunnel = row.tunnel_endpoint
    if tunnel is None:
        return RemoteEndpointInfo(sec_identity=row.identity)
    flags = FLAG_HAS_TUNNEL_EP | (FLAG_IPV6_TUNNEL_EP if tunnel.version == 6 else 0)
    return RemoteEndpointInfo(
        sec_identity=row.identity, tunnel_endpoint=tunnel.packed.ljust(16, b"\0"), flags=flags
    )


class IPCacheOps(KeyedMapOps[IPCacheEntry]):
    """Operations of the ``ipcache`` reconciler (see the module doc)."""

    def __init__(self, ipcache_map: TypedMap[IPCacheKey, RemoteEndpointInfo]) -> None:
        super().__init__(ipcache_map)

    def key_of(self, obj: IPCacheEntry) -> IPCacheKey:
        """The ipcache key of the row's prefix."""
        return ipcache_key(obj.prefix)

    def value_of(self, obj: IPCacheEntry) -> RemoteEndpointInfo:
        """The ipcache value of the row."""
        return ipcache_value(obj)

    def describe(self, obj: IPCacheEntry) -> str:
        """Prefix and owner."""
        return f"{obj.prefix} ({obj.owner})"

    def stored(self, key: IPCacheKey) -> RemoteEndpointInfo | None:
        """The entry stored under exactly ``key``, as far as one lookup can tell.

        An LPM lookup returns the longest stored prefix that covers the key, which may be
        a shorter one. For a full-length key (/32, /128) the only covering entries this
        agent writes are world's 0.0.0.0/0 and ::/0, whose identity (2, 9, 10) is never
        a host's or an endpoint's, so an equal value means this very entry is present.
        A /0 key (world's) can only match itself (nothing shorter is ever written).
        Other lengths are always written: telling a covering entry apart from an exact
        one would take a scan of the whole map."""
        if key.prefixlen in (PREFIX_HEADER_BITS, 32 + 32, 32 + 128):
            return self.map.lookup(key)
        return None
