"""The north-south NAT maps of bpf/nodeport.c (mirrors bpf/include/nat.h byte for byte).

``nodeport_nat4``/``nodeport_nat6`` (LRU hashes) are keyed by the CT tuple of the packet
as the node's device sees it, with ``flags`` saying what the entry rewrites: `F_SNAT`
(a client's packet to a backend on another node: the source becomes this node and a NAT
port), `F_REV_SNAT` (the backend's reply to that port: the destination becomes the
client) or `F_REV_DNAT` (a backend's reply to a client: the source becomes the service
frontend). ``lifetime`` is renewed by every packet using the entry; the agent removes the
expired ones as its CT GC does. ``nodeport_devices``: external device ifindex -> the
addresses SNAT uses for packets leaving through it.
"""

from __future__ import annotations

from dataclasses import dataclass

from bpf.codec import StructCodec, be16, ipv4, ipv6, u32

NAT4_MAP = "nodeport_nat4"
NAT6_MAP = "nodeport_nat6"
DEVICES_MAP = "nodeport_devices"
NAT_MAP_MAX_ENTRIES = 65536
DEVICES_MAX_ENTRIES = 256

# tuple flags: what an entry rewrites
F_SNAT = 0
F_REV_SNAT = 1
F_REV_DNAT = 2
KINDS = {F_SNAT: "snat", F_REV_SNAT: "rev-snat", F_REV_DNAT: "rev-dnat"}

#: entry flags: on a REV_DNAT entry, the backend is on another node (masqueraded).
E_NEEDS_SNAT = 1

#: nodeport_device.flags
DEV_IPV4 = 1
DEV_IPV6 = 2


@dataclass(frozen=True, slots=True)
class NatEntry4:
    """nat4_entry: the address and port written into the packet."""

    to_addr: bytes
    to_port: int
    rev_nat_index: int
    lifetime: int
    flags: int = 0


@dataclass(frozen=True, slots=True)
class NatEntry6:
    """nat6_entry."""

    to_addr: bytes
    to_port: int
    rev_nat_index: int
    lifetime: int
    flags: int = 0


@dataclass(frozen=True, slots=True)
class NodePortDevice:
    """nodeport_device: the SNAT addresses of one external device (raw bytes; zeros and
    the flag unset when the device has none of a family)."""

    ip4: bytes = bytes(4)
    ip6: bytes = bytes(16)
    flags: int = 0


NAT_ENTRY4 = StructCodec(
    NatEntry4,
    "nat4_entry",
    [ipv4("to_addr"), be16("to_port"), be16("rev_nat_index"), u32("lifetime"), u32("flags")],
)
NAT_ENTRY6 = StructCodec(
    NatEntry6,
    "nat6_entry",
    [ipv6("to_addr"), be16("to_port"), be16("rev_nat_index"), u32("lifetime"), u32("flags")],
)
NODEPORT_DEVICE = StructCodec(
    NodePortDevice, "nodeport_device", [ipv4("ip4"), ipv6("ip6"), u32("flags")]
)
#: Where ``lifetime`` sits in an encoded entry, in 32-bit words (the GC reads it alone).
LIFETIME_WORD4 = 2
LIFETIME_WORD6 = 5
