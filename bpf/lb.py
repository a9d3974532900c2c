"""Load-balancer map entries (mirrors bpf/include/lb.h byte for byte).

Addresses are network-order bytes (4 or 16), ports and rev-NAT ids are host ints
that the codecs store in network order where the C header says ``__be16``.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from bpf.addresses import check_length
from bpf.codec import StructCodec, U32ArrayCodec, be16, ipv4, ipv6, pad, u8, u16, u32, u64

LB_MAP_MAX_ENTRIES = 65536
MAGLEV_TABLE_SIZE = 16381

BACKEND_ACTIVE = 0
BACKEND_TERMINATING = 1
BACKEND_QUARANTINED = 2
BACKEND_MAINTENANCE = 3


@dataclass(frozen=True, slots=True)
class Service4Key:
    """lb4_key: a service frontend (slot 0) or one of its backend slots."""

    address: bytes
    dport: int
    backend_slot: int = 0
    proto: int = 0
    scope: int = 0

    def __post_init__(self) -> None:
        check_length(self, "address", self.address, 4)


@dataclass(frozen=True, slots=True)
class Service6Key:
    """lb6_key: the IPv6 twin of Service4Key."""

    address: bytes
    dport: int
    backend_slot: int = 0
    proto: int = 0
    scope: int = 0

    def __post_init__(self) -> None:
        check_length(self, "address", self.address, 16)


@dataclass(frozen=True, slots=True)
class ServiceValue:
    """lb4_service / lb6_service. ``backend_id`` doubles as affinity timeout or L7 port."""

    backend_id: int = 0
    count: int = 0
    rev_nat_index: int = 0
    flags: int = 0
    flags2: int = 0
    qcount: int = 0


@dataclass(frozen=True, slots=True)
class Backend4:
    """lb4_backend, keyed by a u32 backend id. ``flags`` is the BACKEND_* state."""

    address: bytes
    port: int
    proto: int = 0
    flags: int = BACKEND_ACTIVE
    cluster_id: int = 0
    zone: int = 0

    def __post_init__(self) -> None:
        check_length(self, "address", self.address, 4)


@dataclass(frozen=True, slots=True)
class Backend6:
    """lb6_backend, keyed by a u32 backend id."""

    address: bytes
    port: int
    proto: int = 0
    flags: int = BACKEND_ACTIVE
    cluster_id: int = 0
    zone: int = 0

    def __post_init__(self) -> None:
        check_length(self, "address", self.address, 16)


@dataclass(frozen=True, slots=True)
class RevNat4:
    """lb4_reverse_nat: the frontend a reply is translated back to."""

    address: bytes
    port: int

    def __post_init__(self) -> None:
        check_length(self, "address", self.address, 4)


@dataclass(frozen=True, slots=True)
class RevNat6:
    """lb6_reverse_nat."""

    address: bytes
    port: int

    def __post_init__(self) -> None:
        check_length(self, "address", self.address, 16)


@dataclass(frozen=True, slots=True)
class AffinityMatchKey:
    """lb_affinity_match: (backend, service) pairs eligible for session affinity."""

    backend_id: int
    rev_nat_id: int


@dataclass(frozen=True, slots=True)
class ScaleToZeroKey:
    """scale_to_zero_key: a services-map id (rev-NAT index) that opted into scale-to-zero."""

    svc_id: int


@dataclass(frozen=True, slots=True)
class ScaleToZeroValue:
    """scale_to_zero_value: when the datapath last signalled demand for the service (ns);
    the agent writes 0 and leaves an existing value alone."""

    last_emit_ns: int = 0


@dataclass(frozen=True, slots=True)
class Affinity4Key:
    """lb4_affinity_key: client IPv4 (as a u32 in memory order) or netns cookie, per service."""

    client_id: int
    rev_nat_id: int
    netns_cookie: int = 0


@dataclass(frozen=True, slots=True)
class Affinity6Key:
    """lb6_affinity_key: 16-byte client address (or cookie in the first 8), per service."""

    client_id: bytes
    rev_nat_id: int
    netns_cookie: int = 0

    def __post_init__(self) -> None:
        check_length(self, "client_id", self.client_id, 16)


@dataclass(frozen=True, slots=True)
class AffinityValue:
    """lb_affinity_val: the backend a client is pinned to and when it was last used."""

    last_used: int
    backend_id: int


@dataclass(frozen=True, slots=True)
class SourceRange4Key:
    """lb4_src_range_key. ``prefixlen`` is 32 + the CIDR length (it covers rev_nat_id+pad)."""

    prefixlen: int
    rev_nat_id: int
    address: bytes

    def __post_init__(self) -> None:
        check_length(self, "address", self.address, 4)

    @classmethod
    def for_cidr(cls, rev_nat_id: int, address: bytes, cidr_len: int) -> SourceRange4Key:
        """Key for ``address/cidr_len`` allowed for service ``rev_nat_id``."""
        return cls(32 + cidr_len, rev_nat_id, address)


@dataclass(frozen=True, slots=True)
class SourceRange6Key:
    """lb6_src_range_key. ``prefixlen`` is 32 + the CIDR length."""

    prefixlen: int
    rev_nat_id: int
    address: bytes

    def __post_init__(self) -> None:
        check_length(self, "address", self.address, 16)

    @classmethod
    def for_cidr(cls, rev_nat_id: int, address: bytes, cidr_len: int) -> SourceRange6Key:
        """Key for ``address/cidr_len`` allowed for service ``rev_nat_id``."""
        return cls(32 + cidr_len, rev_nat_id, address)


SERVICE4_KEY = StructCodec(
    Service4Key,
    "lb4_key",
    [ipv4("address"), be16("dport"), u16("backend_slot"), u8("proto"), u8("scope"), pad("pad", 2)],
)
SERVICE6_KEY = StructCodec(
    Service6Key,
    "lb6_key",
    [ipv6("address"), be16("dport"), u16("backend_slot"), u8("proto"), u8("scope"), pad("pad", 2)],
)
_SERVICE_VALUE_MEMBERS = [
    u32("backend_id"),
    u16("count"),
    be16("rev_nat_index"),
    u8("flags"),
    u8("flags2"),
    u16("qcount"),
]
SERVICE4_VALUE = StructCodec(ServiceValue, "lb4_service", _SERVICE_VALUE_MEMBERS)
SERVICE6_VALUE = StructCodec(ServiceValue, "lb6_service", _SERVICE_VALUE_MEMBERS)
BACKEND4 = StructCodec(
    Backend4,
    "lb4_backend",
    [
        ipv4("address"),
        be16("port"),
        u8("proto"),
        u8("flags"),
        u16("cluster_id"),
        u8("zone"),
        pad("pad", 1),
    ],
)
BACKEND6 = StructCodec(
    Backend6,
    "lb6_backend",
    [
        ipv6("address"),
        be16("port"),
        u8("proto"),
        u8("flags"),
        u16("cluster_id"),
        u8("zone"),
        pad("pad", 1),
    ],
)
REVNAT4 = StructCodec(RevNat4, "lb4_reverse_nat", [ipv4("address"), be16("port")])
REVNAT6 = StructCodec(RevNat6, "lb6_reverse_nat", [ipv6("address"), be16("port")])
AFFINITY_MATCH_KEY = StructCodec(
    AffinityMatchKey, "lb_affinity_match", [u32("backend_id"), be16("rev_nat_id"), pad("pad", 2)]
)
SCALE_TO_ZERO_KEY = StructCodec(
    ScaleToZeroKey, "scale_to_zero_key", [be16("svc_id"), pad("pad", 2)]
)
SCALE_TO_ZERO_VALUE = StructCodec(
    ScaleToZeroValue, "scale_to_zero_value", [u64("last_emit_ns")]
)
AFFINITY4_KEY = StructCodec(
    Affinity4Key,
    "lb4_affinity_key",
    [u64("client_id"), u16("rev_nat_id"), u8("netns_cookie"), pad("pad1", 1), pad("pad2", 4)],
)
AFFINITY6_KEY = StructCodec(
    Affinity6Key,
    "lb6_affinity_key",
    [
        ipv6("client_id"),
        u16("rev_nat_id"),
        u8("netns_cookie"),
        pad("pad1", 1),
        pad("pad2", 4),
    ],
)
AFFINITY_VALUE = StructCodec(
    AffinityValue, "lb_affinity_val", [u64("last_used"), u32("backend_id"), pad("pad", 4)]
)
SOURCE_RANGE4_KEY = StructCodec(
    SourceRange4Key,
    "lb4_src_range_key",
    [u32("prefixlen"), be16("rev_nat_id"), pad("pad", 2), ipv4("address", c_name="addr")],
)
SOURCE_RANGE6_KEY = StructCodec(
    SourceRange6Key,
    "lb6_src_range_key",
    [u32("prefixlen"), be16("rev_nat_id"), pad("pad", 2), ipv6("address", c_name="addr")],
)


def maglev_table_codec(table_size: int = MAGLEV_TABLE_SIZE) -> U32ArrayCodec:
    """Codec for the inner maglev value: ``table_size`` backend ids (``__u32[table_size]``)."""
    return U32ArrayCodec(table_size, f"__u32[{table_size}]")


# -- direct encoders -------------------------------------------------------------------
# Precompiled structs for the hot paths that write entries without building the dataclasses
# above (bpfops.frontend_ops). Byte for byte the codecs' output (tests/bpfops/test_fast_encode
# compares them); ``__be16`` members are passed already byte-swapped (``swap16``).

#: lb4_key: (address, swap16(dport), backend_slot, proto, scope).
SERVICE4_KEY_STRUCT = struct.Struct("<4sHHBB2x")
#: lb6_key: (address, swap16(dport), backend_slot, proto, scope).
SERVICE6_KEY_STRUCT = struct.Struct("<16sHHBB2x")
#: lb4_service/lb6_service: (backend_id, count, swap16(rev_nat_index), flags, flags2, qcount).
SERVICE_VALUE_STRUCT = struct.Struct("<IHHBBH")
#: lb4_backend: (address, swap16(port), proto, flags, cluster_id, zone).
BACKEND4_STRUCT = struct.Struct("<4sHBBHBx")
#: lb6_backend: (address, swap16(port), proto, flags, cluster_id, zone).
BACKEND6_STRUCT = struct.Struct("<16sHBBHBx")
#: lb4_reverse_nat: (address, swap16(port)).
REVNAT4_STRUCT = struct.Struct("<4sH")
#: lb6_reverse_nat: (address, swap16(port)).
REVNAT6_STRUCT = struct.Struct("<16sH")
#: lb_affinity_match: (backend_id, swap16(rev_nat_id)).
AFFINITY_MATCH_KEY_STRUCT = struct.Struct("<IH2x")
#: A host-order u32 key (backend ids, rev-NAT ids).
U32_STRUCT = struct.Struct("<I")


def swap16(value: int) -> int:
    """``value`` (a u16) with its two bytes swapped: a host int stored as ``__be16``."""
    return ((value & 0xFF) << 8) | (value >> 8)
#: A network-order u16 key (the rev-NAT maps' service id).
BE16_STRUCT = struct.Struct(">H")
