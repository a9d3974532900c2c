"""IPcache LPM map entries (mirrors bpf/include/ipcache.h byte for byte)."""

from __future__ import annotations

from dataclasses import dataclass

from bpf.addresses import check_length
from bpf.codec import StructCodec, ipv6, pad, u8, u16, u32

IPCACHE_MAP_MAX_ENTRIES = 512000

FAMILY_IPV4 = 1
FAMILY_IPV6 = 2

# remote_endpoint_info.flags bits
FLAG_SKIP_TUNNEL = 1
FLAG_HAS_TUNNEL_EP = 2
FLAG_IPV6_TUNNEL_EP = 4

# prefixlen counts cluster_id, pad1 and family before the address bits.
PREFIX_HEADER_BITS = 32


@dataclass(frozen=True, slots=True)
class IPCacheKey:
    """ipcache_key: ``prefixlen`` is 32 + the CIDR length; IPv4 fills the first 4 bytes of ip."""

    prefixlen: int
    cluster_id: int
    family: int
    ip: bytes

    def __post_init__(self) -> None:
        check_length(self, "ip", self.ip, 16)

    @classmethod
    def for_cidr(cls, address: bytes, cidr_len: int, cluster_id: int = 0) -> IPCacheKey:
        """Key for ``address/cidr_len``; 4-byte addresses are IPv4, 16-byte IPv6."""
        family = FAMILY_IPV4 if len(address) == 4 else FAMILY_IPV6
        return cls(PREFIX_HEADER_BITS + cidr_len, cluster_id, family, address.ljust(16, b"\0"))


@dataclass(frozen=True, slots=True)
class RemoteEndpointInfo:
    """remote_endpoint_info: security identity and tunnel endpoint of a prefix."""

    sec_identity: int
    tunnel_endpoint: bytes = bytes(16)
    key: int = 0
    flags: int = 0

    def __post_init__(self) -> None:
        check_length(self, "tunnel_endpoint", self.tunnel_endpoint, 16)


IPCACHE_KEY = StructCodec(
    IPCacheKey,
    "ipcache_key",
    [
        u32("prefixlen"),
        u16("cluster_id"),
        pad("pad1", 1),
        u8("family"),
        ipv6("ip", c_name="ip6", render="ip_by_family"),
    ],
)
REMOTE_ENDPOINT_INFO = StructCodec(
    RemoteEndpointInfo,
    "remote_endpoint_info",
    [
        u32("sec_identity"),
        ipv6("tunnel_endpoint", render="ip_auto"),
        pad("pad", 2),
        u8("key"),
        u8("flags"),
    ],
)
