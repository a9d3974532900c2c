"""Connection-tracking entries, drop counters and per-endpoint enforcement (mirrors
bpf/include/ct.h byte for byte).

A flow has one entry in ``ct4_global`` or ``ct6_global`` (LRU hashes), keyed by Cilium's
``ipv4_ct_tuple``/``ipv6_ct_tuple`` in the flow's original direction, with ``flags``
saying whether the endpoint opened it (`F_EGRESS`) or it was opened towards the endpoint
(`F_INGRESS`). The value is Cilium's ``ct_entry``: ``lifetime`` is the second of
CLOCK_MONOTONIC after which the entry is expired (the agent's GC removes it), ``flags``
Cilium's bit field (closing, seen-non-SYN, ...).
"""

from __future__ import annotations

from dataclasses import dataclass

from bpf.codec import StructCodec, be16, ipv4, ipv6, pad, u8, u16, u32, u64

CT_MAP_MAX_ENTRIES = 65536
METRICS_MAX_ENTRIES = 1024
POLICY_EP_MAX_ENTRIES = 4096

CT4_MAP = "ct4_global"
CT6_MAP = "ct6_global"
METRICS_MAP = "metrics"
POLICY_ENDPOINTS_MAP = "policy_endpoints"

# tuple flags
F_EGRESS = 0
F_INGRESS = 1
#: A client's flow to a service frontend on the node's device (bpf/nodeport.c): the entry
#: holds the chosen backend and the rev-NAT id.
F_SERVICE = 4
DIRECTIONS = {F_EGRESS: "egress", F_INGRESS: "ingress", F_SERVICE: "service"}

# ct_entry.flags bits
RX_CLOSING = 1 << 0
TX_CLOSING = 1 << 1
SEEN_NON_SYN = 1 << 4
NODE_PORT = 1 << 5

#: Lifetimes in seconds (Cilium's defaults), as the tc program applies them.
LIFETIME_TCP = 21600
LIFETIME_NONTCP = 60
SYN_TIMEOUT = 60
CLOSE_TIMEOUT = 10

#: Drop reasons (Cilium's codes) and what ``statewright ct``/metrics call them.
DROP_REASONS = {
    133: "Policy denied",
    134: "Invalid packet",
    135: "CT: Truncated or invalid header",
    141: "Error writing to packet",
    153: "Error while correcting L3 checksum",
    154: "Error while correcting L4 checksum",
    155: "CT: Map insertion failed",
    158: "Service backend not found",
    167: "No mapping for NAT masquerade",
    177: "Denied by LB src range check",
    181: "Policy denied by denylist",
}
METRIC_DIRECTIONS = {1: "ingress", 2: "egress"}

PROTOCOLS = {1: "ICMP", 6: "TCP", 17: "UDP", 58: "ICMPv6", 132: "SCTP"}


@dataclass(frozen=True, slots=True)
class CTTuple4:
    """ipv4_ct_tuple: addresses as 4 raw bytes, ports in host order here."""

    daddr: bytes
    saddr: bytes
    dport: int
    sport: int
    nexthdr: int
    flags: int


@dataclass(frozen=True, slots=True)
class CTTuple6:
    """ipv6_ct_tuple: addresses as 16 raw bytes."""

    daddr: bytes
    saddr: bytes
    dport: int
    sport: int
    nexthdr: int
    flags: int


@dataclass(frozen=True, slots=True)
class CTEntry:
    """ct_entry (Cilium 1.16+)."""

    backend_id: int = 0
    packets: int = 0
    bytes: int = 0
    lifetime: int = 0
    flags: int = 0
    rev_nat_index: int = 0
    ifindex: int = 0
    tx_flags_seen: int = 0
    rx_flags_seen: int = 0
    src_sec_id: int = 0
    last_tx_report: int = 0
    last_rx_report: int = 0


@dataclass(frozen=True, slots=True, order=True)
class MetricsKey:
    """metrics_key: drop reason and direction (1 ingress, 2 egress)."""

    reason: int
    dir: int
    line: int = 0
    file: int = 0


@dataclass(frozen=True, slots=True)
class MetricsValue:
    """metrics_value: packets and bytes."""

    count: int
    bytes: int


CT_TUPLE4 = StructCodec(
    CTTuple4,
    "ipv4_ct_tuple",
    [ipv4("daddr"), ipv4("saddr"), be16("dport"), be16("sport"), u8("nexthdr"), u8("flags")],
)
CT_TUPLE6 = StructCodec(
    CTTuple6,
    "ipv6_ct_tuple",
    [ipv6("daddr"), ipv6("saddr"), be16("dport"), be16("sport"), u8("nexthdr"), u8("flags")],
)
CT_ENTRY = StructCodec(
    CTEntry,
    "ct_entry",
    [
        pad("reserved0", 8),
        u64("backend_id"),
        u64("packets"),
        u64("bytes"),
        u32("lifetime"),
        u16("flags"),
        u16("rev_nat_index"),
        u16("ifindex"),
        u8("tx_flags_seen"),
        u8("rx_flags_seen"),
        u32("src_sec_id"),
        u32("last_tx_report"),
        u32("last_rx_report"),
    ],
)
#: Where ``lifetime`` sits in an encoded entry, in 32-bit words (the GC reads it alone).
LIFETIME_WORD = 8
METRICS_KEY = StructCodec(
    MetricsKey,
    "metrics_key",
    [u8("reason"), u8("dir"), u16("line"), u8("file"), pad("reserved", 3)],
)
METRICS_VALUE = StructCodec(MetricsValue, "metrics_value", [u64("count"), u64("bytes")])
