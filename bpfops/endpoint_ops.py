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

import errno as errno_mod
from collections.abc import Iterator

from bpf.endpoints import FAMILY_IPV4, FAMILY_IPV6, EndpointInfo, EndpointKey
from bpf.errors import MapError
from bpf.typed_map import TypedMap
from statedb import ReadTxn
from statedb.errors import StatewrightError
from tables.endpoint_entries import LXCEntry
from tables.l3n4 import IPAddress


class EndpointMapError(StatewrightError):
    """A failed write of the endpoints or ipcache map: map, operation, object, errno."""

    def __init__(self, map_name: str, op: str, obj: str, err: MapError) -> None:
        what = f"{op} {obj}" if obj else op
        super().__init__(f"map {map_name}: {what}: {err}")
        self.map_name = map_name
        self.errno = err.errno


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


class LXCOps:
    """Operations of the ``endpoint-map`` reconciler (see the module doc)."""

    def __init__(self, lxc_map: TypedMap[EndpointKey, EndpointInfo]) -> None:
        self.map = lxc_map
        self.writes = 0
        self.skipped = 0
        self.deletes = 0

    def update(self, txn: ReadTxn, revision: int, obj: LXCEntry) -> None:
        """Write the entry of ``obj`` unless the map already holds exactly it."""
        key, value = endpoint_key(obj.ip), endpoint_info(obj)
        try:
            if self.map.lookup(key) == value:
                self.skipped += 1
                return
            self.map.update(key, value)
        except MapError as e:
            raise EndpointMapError(self.map.name, "update", f"{obj.ip} ({obj.owner})", e) from e
        self.writes += 1

    def delete(self, txn: ReadTxn, revision: int, obj: LXCEntry) -> None:
        """Delete the entry of ``obj``; an absent entry is fine."""
        try:
            self.map.delete(endpoint_key(obj.ip))
        except MapError as e:
            if e.errno == errno_mod.ENOENT:
                return
            raise EndpointMapError(self.map.name, "delete", f"{obj.ip} ({obj.owner})", e) from e
        self.deletes += 1

    def prune(self, txn: ReadTxn, objects: Iterator[LXCEntry]) -> None:
        """Delete every map entry that no row explains."""
        want = {endpoint_key(o.ip) for o in objects}
        try:
            stray = [k for k in self.map if k not in want]
        except MapError as e:
            raise EndpointMapError(self.map.name, "prune (iterate)", "", e) from e
        for key in stray:
            try:
                self.map.delete(key)
                self.deletes += 1
            except MapError as e:
                if e.errno != errno_mod.ENOENT:
                    raise EndpointMapError(self.map.name, "prune", repr(key), e) from e
