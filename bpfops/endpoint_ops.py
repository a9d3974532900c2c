"""LXCOps: the reconciler Operations writing the ``endpoint-map`` table into the endpoints
(lxc) BPF map (layout: bpf/include/eps.h, codec: bpf/endpoints.py).

Each row is one address: key ``endpoint_key`` (IP, family), value ``endpoint_info``
(ifindex, lxc_id, flags, MACs, identity). ``update`` first reads the entry and writes only
when it differs, so a restarted agent whose restored endpoints still match the pinned map
rewrites nothing (``writes``/``skipped`` count both). ``prune`` deletes every key of the
map that no row explains (leftovers of endpoints removed while the agent was down).
Errors are `EndpointMapError` naming the map, the operation, the address and the errno.
"""

from __future__ import annotations

from bpf.endpoints import FAMILY_IPV4, FAMILY_IPV6, EndpointInfo, EndpointKey
from bpf.errors import MapError
from bpf.typed_map import TypedMap
from bpfops.keyed_map_ops import EndpointMapError, KeyedMapOps
from statedb import ReadTxn
from tables.endpoint_entries import LXCEntry
from tables.l3n4 import IPAddress


def endpoint_key(ip: IPAddress) -> EndpointKey:
    """The lxc map key of an address (IPv4 in the first four bytes)."""
    if ip.version == 4:
        return EndpointKey(ip.packed + bytes(12), FAMILY_IPV4)
    return EndpointKey(ip.packed, FAMILY_IPV6)


def endpoint_info(row: LXCEntry) -> EndpointInfo:
    """The lxc map value of a row."""
    return EndpointInfo(
        ifindex=row.ifindex,
        lxc_id=row.lxc_id,
        flags=row.flags,
        mac=row.mac,
        node_mac=row.node_mac,
        sec_id=row.sec_id,
    )


class LXCOps(KeyedMapOps[LXCEntry]):
    """Operations of the ``endpoint-map`` reconciler (see the module doc)."""

    def __init__(self, lxc_map: TypedMap[EndpointKey, EndpointInfo]) -> None:
        super().__init__(lxc_map)

    def key_of(self, obj: LXCEntry) -> EndpointKey:
        """The lxc key of the row's address."""
        return endpoint_key(obj.ip)

    def describe(self, obj: LXCEntry) -> str:
        """Address and owner."""
        return f"{obj.ip} ({obj.owner})"

    def update(self, txn: ReadTxn, revision: int, obj: LXCEntry) -> None:
        """Write the entry of ``obj`` unless the map already holds exactly it."""
        key, value = endpoint_key(obj.ip), endpoint_info(obj)
        try:
            if self.map.lookup(key) == value:
                self.skipped += 1
                return
            self.map.update(key, value)
        except MapError as e:
            raise EndpointMapError(self.map.name, "update", self.describe(obj), e) from e
        self.writes += 1
