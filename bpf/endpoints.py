"""Endpoints (lxc) map entries (mirrors bpf/include/endpoints.h byte for byte)."""

from __future__ import annotations

from dataclasses import dataclass

from bpf.addresses import check_length
from bpf.codec import StructCodec, ipv6, pad, u8, u16, u32, u64

ENDPOINTS_MAP_MAX_ENTRIES = 65535

FAMILY_IPV4 = 1
FAMILY_IPV6 = 2

ENDPOINT_F_HOST = 1
ENDPOINT_F_ATHOSTNS = 2


@dataclass(frozen=True, slots=True)
class EndpointKey:
    """endpoint_key: 16-byte IP (IPv4 in the first four bytes, rest zero) and family."""

    ip: bytes
    family: int
    key: int = 0
    cluster_id: int = 0

    def __post_init__(self) -> None:
        check_length(self, "ip", self.ip, 16)

    @classmethod
    def ipv4(cls, address: bytes, cluster_id: int = 0) -> EndpointKey:
        """Key for a 4-byte IPv4 address."""
        check_length(cls, "ip", address, 4)
        return cls(address + bytes(12), FAMILY_IPV4, 0, cluster_id)


@dataclass(frozen=True, slots=True)
class EndpointInfo:
    """endpoint_info: how to deliver to a local endpoint. MACs are u64 in memory order."""

    ifindex: int
    unused: int = 0
    lxc_id: int = 0
    flags: int = 0
    mac: int = 0
    node_mac: int = 0
    sec_id: int = 0
    parent_ifindex: int = 0


ENDPOINT_KEY = StructCodec(
    EndpointKey,
    "endpoint_key",
    [
        ipv6("ip", c_name="ip6", render="ip_by_family"),
        u8("family"),
        u8("key"),
        u16("cluster_id"),
    ],
)
ENDPOINT_INFO = StructCodec(
    EndpointInfo,
    "endpoint_info",
    [
        u32("ifindex"),
        u16("unused"),
        u16("lxc_id"),
        u32("flags"),
        pad("pad0", 4),
        u64("mac", render="mac"),
        u64("node_mac", render="mac"),
        u32("sec_id"),
        u32("parent_ifindex"),
        pad("pad", 8),
    ],
)
