"""Per-endpoint policy map entries and the socket program's policy lookup maps (mirrors
bpf/include/policy.h byte for byte).

An endpoint's policy map is an LPM trie with Cilium's ``cilium_policy_v2`` layout: the key
is (prefix length, remote identity, direction, protocol, destination port in network
order); the value says allow or deny and how many of the protocol and port bits the entry
matched (``lpm_prefix_length``). A lookup is always made with the full prefix; the trie
returns the longest stored prefix covering it, so an entry for a protocol with any port,
or for a port range written as a prefix, covers every port it stands for. The identity is
part of the fixed prefix: "any identity" is identity 0, found by a second lookup.
"""

from __future__ import annotations

from dataclasses import dataclass

from bpf.codec import ScalarCodec, StructCodec, be16, pad, u8, u32

POLICY_MAP_MAX_ENTRIES = 16384
POLICY_ENDPOINTS_MAX_ENTRIES = 4096

#: The name of the per-endpoint maps' layout; each map is named by `policy_map_name`.
POLICY_MAP_PREFIX = "cilium_policy_v2"
POLICY_MAPS = "policy_maps"
POLICY_NETNS = "policy_netns"

FULL_PREFIX = 64
STATIC_PREFIX = 40  # sec_label and the direction byte
PROTO_PREFIX_BITS = 8
FULL_PREFIX_BITS = 24  # protocol and port

# policy_entry.flags
F_DENY = 1
LPM_SHIFT = 3

# policy_netns.flags
NETNS_F_EGRESS = 1
NETNS_F_INGRESS = 2

#: A bare u64 (the netns cookie key).
U64 = ScalarCodec("<Q", "__u64")


def policy_map_name(endpoint_id: int) -> str:
    """The pin name of endpoint ``endpoint_id``'s policy map (Cilium's: 5-digit id)."""
    return f"{POLICY_MAP_PREFIX}_{endpoint_id:05d}"


def endpoint_of_map(name: str) -> int | None:
    """The endpoint id of a per-endpoint policy map's pin name, None for other names."""
    head, _, digits = name.rpartition("_")
    if head != POLICY_MAP_PREFIX or len(digits) != 5 or not digits.isdigit():
        return None
    return int(digits)


@dataclass(frozen=True, slots=True, order=True)
class PolicyMapKey:
    """policy_key: ``prefixlen`` counts the bits after it that the entry matches
    (`STATIC_PREFIX` + protocol and port bits); bits beyond it are zero."""

    prefixlen: int
    sec_label: int
    egress: int  # bit 0 of the egress:1/pad:7 byte
    protocol: int
    dport: int  # host order here, network order in the map

    @classmethod
    def lookup(cls, identity: int, egress: bool, protocol: int, dport: int) -> PolicyMapKey:
        """The full-prefix key a datapath lookup uses."""
        return cls(FULL_PREFIX, identity, int(egress), protocol, dport)

    @classmethod
    def entry(
        cls, identity: int, egress: bool, protocol: int, dport: int, port_prefix_len: int
    ) -> PolicyMapKey:
        """The key of an entry: protocol 0 is any protocol (port ignored), a
        ``port_prefix_len`` of 0 any port, 16 exactly ``dport``, fewer bits a range."""
        if protocol == 0:
            return cls(STATIC_PREFIX, identity, int(egress), 0, 0)
        if port_prefix_len == 0:
            return cls(STATIC_PREFIX + PROTO_PREFIX_BITS, identity, int(egress), protocol, 0)
        mask = (0xFFFF << (16 - port_prefix_len)) & 0xFFFF
        return cls(
            STATIC_PREFIX + PROTO_PREFIX_BITS + port_prefix_len,
            identity,
            int(egress),
            protocol,
            dport & mask,
        )

    @property
    def lpm_prefix_length(self) -> int:
        """How many protocol and port bits the entry matches (0..24)."""
        return self.prefixlen - STATIC_PREFIX


@dataclass(frozen=True, slots=True)
class PolicyMapEntry:
    """policy_entry: ``flags`` holds deny (bit 0) and lpm_prefix_length (bits 3-7)."""

    proxy_port: int = 0
    flags: int = 0
    auth_type: int = 0
    proxy_port_priority: int = 0
    cookie: int = 0

    @classmethod
    def verdict(cls, deny: bool, lpm_prefix_length: int) -> PolicyMapEntry:
        """An allow or deny entry for a key matching ``lpm_prefix_length`` bits."""
        return cls(flags=(F_DENY if deny else 0) | (lpm_prefix_length << LPM_SHIFT))

    @property
    def deny(self) -> bool:
        """Whether the entry denies."""
        return bool(self.flags & F_DENY)

    @property
    def lpm_prefix_length(self) -> int:
        """The protocol and port bits of the key the entry was written for."""
        return self.flags >> LPM_SHIFT


@dataclass(frozen=True, slots=True)
class PolicyNetns:
    """policy_netns: the endpoint of a network namespace and its enforced directions."""

    endpoint_id: int
    flags: int = 0


POLICY_KEY = StructCodec(
    PolicyMapKey,
    "policy_key",
    [u32("prefixlen"), u32("sec_label"), u8("egress"), u8("protocol"), be16("dport")],
)
POLICY_ENTRY = StructCodec(
    PolicyMapEntry,
    "policy_entry",
    [
        be16("proxy_port"),
        u8("flags"),
        u8("auth_type"),
        u8("proxy_port_priority"),
        pad("pad1", 1),
        pad("pad2", 2),
        u32("cookie"),
    ],
)
POLICY_NETNS_VALUE = StructCodec(
    PolicyNetns, "policy_netns", [u32("endpoint_id"), u8("flags"), pad("pad", 3)]
)

