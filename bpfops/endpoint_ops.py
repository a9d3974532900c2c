"""EndpointMapOps: the reconciler Operations writing the ``endpoint-map`` table into the
endpoint map, Cilium's lxc map (layout: bpf/include/endpoints.h, codec: bpf/endpoints.py).

Each row is one address: key ``endpoint_key`` (IP, family), value ``endpoint_info``
(ifindex, lxc_id, flags, MACs, identity). `KeyedMapOps` writes only entries that differ and
prunes every key of the map that no row explains (leftovers of endpoints removed while the
agent was down).
Errors are ``bpfops.errors.KeyedMapError`` naming the map, the operation, the address,
the key and the errno.
"""

from __future__ import annotations

from bpf.endpoints import FAMILY_IPV4, FAMILY_IPV6, EndpointInfo, EndpointKey
from bpf.typed_map import TypedMap
from bpfops.keyed_map_ops import KeyedMapOps
from tables.endpoint_entries import EndpointMapEntry
from tables.l3n4 import IPAddress


def endpoint_key(ip: IPAddress) -> EndpointKey:
    """The endpoint map key of an address (IPv4 in the first four bytes)."""
    if ip.version == 4:
        return EndpointKey(ip.packed + bytes(12), FAMILY_IPV4)
    return EndpointKey(ip.packed, FAMILY_IPV6)


def endpoint_info(row: EndpointMapEntry) -> EndpointInfo:
    """The endpoint map value of a row."""
    return EndpointInfo(
        ifindex=row.ifindex,
        lxc_id=row.lxc_id,
        flags=row.flags,
        mac=row.mac,
        node_mac=row.node_mac,
        sec_id=row.sec_id,
    )


class EndpointMapOps(KeyedMapOps[EndpointMapEntry]):
    """Operations of the ``endpoint-map`` reconciler (see the module doc)."""

    def __init__(self, endpoint_map: TypedMap[EndpointKey, EndpointInfo]) -> None:
        super().__init__(endpoint_map)

    def key_of(self, obj: EndpointMapEntry) -> EndpointKey:
        """The endpoint map key of the row's address."""
        return endpoint_key(obj.ip)

    def value_of(self, obj: EndpointMapEntry) -> EndpointInfo:
        """The endpoint map value of the row."""
        return endpoint_info(obj)

    def describe(self, obj: EndpointMapEntry) -> str:
        """Address and owner."""
        return f"{obj.ip} ({obj.owner})"

