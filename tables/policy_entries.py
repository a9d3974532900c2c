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

`direction_backlog` says which entries of one endpoint and direction are not Done yet
(through the ``endpoint`` index): enforcement of a direction waits for it
(bpfops/policy_ops.py, "Enforcement order").
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any

from reconciler.status import Status, StatusKind, status_pending
from statedb import Index, ReadTxn, Table
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


@dataclass(frozen=True, slots=True)
class DirectionBacklog:
    """The entries of one endpoint and direction that its policy map may not hold yet:
    how many rows it has, how many are not Done (Pending, Refreshing or Error) and the
    first few in Error (`direction_backlog`)."""

    endpoint_id: int
    egress: bool
    total: int = 0
    not_done: int = 0
    errors: int = 0
    failed: tuple[PolicyEntry, ...] = ()

    @property
    def direction(self) -> str:
        """``egress`` or ``ingress``."""
        return "egress" if self.egress else "ingress"

    @property
    def written(self) -> bool:
        """Whether every entry of the direction is Done (the map holds them all)."""
        return self.not_done == 0

    def describe(self) -> str:
        """What is missing, for errors and health: counts, and the first failure."""
        text = f"{self.not_done} of {self.total} policy entries not written"
        if self.failed:
            e = self.failed[0]
            text += f", {self.errors} failed ({_entry_text(e)}: {e.status.error})"
        return text


def _entry_text(e: PolicyEntry) -> str:
    k = e.key
    port = "any port" if k.port_prefix_len == 0 else f"port {k.dport}/{k.port_prefix_len}"
    ident = f"identity {k.identity}" if k.identity else "any identity"
    return f"{'deny' if e.deny else 'allow'} {ident} proto {k.protocol or 'any'} {port}"


def direction_backlog(
    txn: ReadTxn, table: Table[PolicyEntry], endpoint_id: int, egress: bool, keep: int = 3
) -> DirectionBacklog:
    """The endpoint's entries of one direction not Done in ``txn`` (O(entries of the
    endpoint), through the ``endpoint`` index), with up to ``keep`` failed ones."""
    total = not_done = errors = 0
    failed: list[PolicyEntry] = []
    for e in table.list(txn, policy_endpoint_index.query(endpoint_id)):
        if e.key.egress != egress:
            continue
        total += 1
        kind = e.status.kind
        if kind is not StatusKind.DONE:
            not_done += 1
            if kind is StatusKind.ERROR:
                errors += 1
                if len(failed) < keep:
                    failed.append(e)
    return DirectionBacklog(endpoint_id, egress, total, not_done, errors, tuple(failed))


def endpoint_mode(
    txn: ReadTxn, modes: Table[PolicyEndpoint], endpoint_id: int
) -> PolicyEndpoint | None:
    """The endpoint's ``policy-endpoints`` row in ``txn``, if any."""
    return modes.get(txn, policy_endpoint_id_index.query(endpoint_id))
