"""Desired policy entries: the computed network policy of every local endpoint.

The policy computation (``policy/``) turns the policy rules and the identities into one
row per (endpoint, remote identity, direction, protocol, port prefix), the shape of an
entry of Cilium's per-endpoint policy map (``cilium_policy_<id>``: identity, destination
port, protocol, direction and the port's prefix length for port ranges). A reconciler
writes the rows into those maps; the rows carry its status.

Wildcards, as in Cilium's policy map: identity 0 is any identity, protocol 0 any
protocol, and ``dport`` 0 with ``port_prefix_len`` 0 any port. A port range is split into
prefixes (``dport`` with its top ``port_prefix_len`` bits significant).

Verdict (policy/verdict.py): traffic matching a deny entry is denied, else traffic
matching an allow entry is allowed, else denied. For a longest-prefix-match lookup (one
with the remote identity, one with identity 0, deny first when combining the two), the
computation writes an allow key that a deny key of the same endpoint, direction and
identity contains as a deny row, so that lookup gives the same verdict (docs/policy.md).

The ``policy-endpoints`` table says, per endpoint, whether a direction is enforced: an
endpoint selected by at least one egress (ingress) rule is default-deny in that direction
and its entries are an allow-list with explicit denies; an endpoint selected by no rule of
a direction allows all traffic in it (and has no entries for it). ``revision`` is the
policy repository's revision the endpoint's entries were computed from.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any

from reconciler.status import Status, status_pending
from statedb import Index, Table
from statedb import keys as keycodec

POLICY_ENTRIES_TABLE = "policy-entries"
POLICY_ENDPOINTS_TABLE = "policy-endpoints"


@dataclass(frozen=True, slots=True, order=True)
class PolicyKey:
    """The key of one policy entry (see the module doc for the wildcards)."""

    endpoint_id: int  # local endpoint id (the lxc id, 1..4095)
    identity: int  # remote security identity; 0 = any identity (wildcard)
    egress: bool  # True: egress, False: ingress
    protocol: int  # IP protocol number (6 TCP, 17 UDP, 132 SCTP); 0 = any
    dport: int  # destination port, host order; 0 with port_prefix_len 0 = any port
    port_prefix_len: int  # 16 = exactly dport; fewer bits = a port range as a prefix

    def to_json(self) -> dict[str, Any]:
        """JSON form (API, CLI)."""
        return {
            "endpoint_id": self.endpoint_id,
            "identity": self.identity,
            "direction": "egress" if self.egress else "ingress",
            "protocol": self.protocol,
            "dport": self.dport,
            "port_prefix_len": self.port_prefix_len,
        }


_KEY = struct.Struct(">HI?BHB")


def encode_policy_key(key: PolicyKey) -> bytes:
    """The ordered bytes of a key: endpoint, identity, direction, protocol, port, prefix
    (big-endian, fixed width: byte order is key order; the first two bytes are the
    ``endpoint`` index's key)."""
    return _KEY.pack(
        key.endpoint_id, key.identity, key.egress, key.protocol, key.dport, key.port_prefix_len
    )


def parse_policy_key(text: str) -> PolicyKey:
    """A key from ``endpoint/identity/egress|ingress/protocol/dport/prefix`` (CLI)."""
    ep, ident, direction, proto, port, plen = text.split("/")
    return PolicyKey(int(ep), int(ident), direction == "egress", int(proto), int(port), int(plen))


@dataclass(frozen=True, slots=True)
class PolicyEntry:
    """One desired policy-map entry: allow or deny traffic matching ``key``."""

    key: PolicyKey
    deny: bool = False  # an explicit deny entry; allow otherwise
    rules: tuple[str, ...] = ()  # names of the rules that produced it ("namespace/name")
    status: Status = field(default_factory=status_pending, compare=False)

    def to_json(self) -> dict[str, Any]:
        """JSON form (``db show``, API)."""
        return {
            **self.key.to_json(),
            "deny": self.deny,
            "rules": list(self.rules),
            "status": str(self.status.kind),
        }

    @staticmethod
    def table_header() -> list[str]:
        """Columns of ``db show policy-entries``."""
        return ["Endpoint", "Identity", "Dir", "Proto", "Port", "Action", "Rules", "Status"]

    def table_row(self) -> list[str]:
        """Cells of ``db show policy-entries``."""
        k = self.key
        return [
            str(k.endpoint_id),
            str(k.identity) if k.identity else "any",
            "egress" if k.egress else "ingress",
            str(k.protocol) if k.protocol else "any",
            f"{k.dport}/{k.port_prefix_len}" if k.port_prefix_len else "any",
            "deny" if self.deny else "allow",
            ",".join(self.rules),
            str(self.status.kind),
        ]


@dataclass(frozen=True, slots=True)
class PolicyEndpoint:
    """Whether an endpoint's egress and ingress are enforced, and the policy revision its
    entries were computed from. No reconciler writes these rows (the policy-netns table
    and the endpoint datapath derive from them); whether the maps hold a revision is the
    endpoint's *realized* revision, which the policy-maps component reports."""

    endpoint_id: int
    egress_enforced: bool = False
    ingress_enforced: bool = False
    revision: int = 0

    def to_json(self) -> dict[str, Any]:
        """JSON form (``db show``, API)."""
        return {
            "endpoint_id": self.endpoint_id,
            "egress_enforced": self.egress_enforced,
            "ingress_enforced": self.ingress_enforced,
            "revision": self.revision,
        }

    @staticmethod
    def table_header() -> list[str]:
        """Columns of ``db show policy-endpoints``."""
        return ["Endpoint", "Egress", "Ingress", "Revision"]

    def table_row(self) -> list[str]:
        """Cells of ``db show policy-endpoints``."""
        return [
            str(self.endpoint_id),
            "enforced" if self.egress_enforced else "allow-all",
            "enforced" if self.ingress_enforced else "allow-all",
            str(self.revision),
        ]


policy_key_index: Index[PolicyEntry, PolicyKey] = Index(
    "key", key=lambda e: e.key, encode=encode_policy_key, parse=parse_policy_key
)
policy_endpoint_index: Index[PolicyEntry, int] = Index(
    "endpoint", key=lambda e: e.key.endpoint_id, encode=keycodec.uint16, unique=False, parse=int
)
policy_endpoint_id_index: Index[PolicyEndpoint, int] = Index(
    "endpoint", key=lambda e: e.endpoint_id, encode=keycodec.uint16, parse=int
)


def new_policy_entries_table() -> Table[PolicyEntry]:
    """A new, unregistered ``policy-entries`` table."""
    return Table(
        POLICY_ENTRIES_TABLE, policy_key_index, policy_endpoint_index, row_type=PolicyEntry
    )


def new_policy_endpoints_table() -> Table[PolicyEndpoint]:
    """A new, unregistered ``policy-endpoints`` table."""
    return Table(POLICY_ENDPOINTS_TABLE, policy_endpoint_id_index, row_type=PolicyEndpoint)
