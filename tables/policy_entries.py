"""The computed network policy of every local endpoint: the contract between the policy
control plane (which computes it) and the datapath (which writes it into the per-endpoint
policy maps, bpfops/policy_ops.py, and enforces it in bpf/sock_lb.c).

Two tables:

* ``policy-entries``: one row per desired policy-map entry of one endpoint (its key:
  endpoint, remote identity, direction, protocol, port or port prefix; its verdict: allow
  or deny, and the rules that produced it), with a reconciler status;
* ``policy-endpoints``: one row per endpoint a policy was computed for: whether its egress
  and ingress are enforced (an endpoint selected by an egress policy is default-deny
  egress; otherwise all its egress is allowed) and the policy revision it reflects.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from reconciler.status import Status, status_pending
from statedb import Index, Table
from statedb import keys as keycodec

POLICY_ENTRIES_TABLE = "policy-entries"
POLICY_ENDPOINTS_TABLE = "policy-endpoints"

IPPROTO_ANY = 0
IPPROTO_TCP = 6
IPPROTO_UDP = 17
IPPROTO_SCTP = 132


@dataclass(frozen=True, slots=True, order=True)
class PolicyKey:
    """What one policy entry matches.

    ``identity`` 0 is any identity; ``protocol`` 0 any protocol (then ``dport`` and
    ``port_prefix_len`` are 0); ``port_prefix_len`` 16 means exactly ``dport``, fewer bits
    a port range written as a prefix (Cilium's port ranges), 0 any port. The bits of
    ``dport`` beyond the prefix are zero: two keys differing only there would be one map
    entry.
    """

    endpoint_id: int
    identity: int
    egress: bool
    protocol: int
    dport: int
    port_prefix_len: int


@dataclass(frozen=True, slots=True)
class PolicyEntry:
    """One desired entry of an endpoint's policy map."""

    key: PolicyKey
    deny: bool = False
    rules: tuple[str, ...] = ()
    status: Status = field(default_factory=status_pending, compare=False)

    def to_json(self) -> dict[str, Any]:
        """JSON form (``db show``)."""
        k = self.key
        return {
            "endpoint": k.endpoint_id,
            "identity": k.identity,
            "direction": "egress" if k.egress else "ingress",
            "protocol": k.protocol,
            "dport": k.dport,
            "port_prefix_len": k.port_prefix_len,
            "deny": self.deny,
            "rules": list(self.rules),
            "status": str(self.status.kind),
        }

    @staticmethod
    def table_header() -> list[str]:
        """Columns of ``db show policy-entries``."""
        return ["Endpoint", "Identity", "Dir", "Proto", "Port", "Verdict", "Rules", "Status"]

    def table_row(self) -> list[str]:
        """Cells of ``db show policy-entries``."""
        k = self.key
        port = "any" if k.port_prefix_len == 0 else f"{k.dport}/{k.port_prefix_len}"
        return [
            str(k.endpoint_id),
            str(k.identity),
            "egress" if k.egress else "ingress",
            str(k.protocol),
            port,
            "deny" if self.deny else "allow",
            ",".join(self.rules),
            str(self.status.kind),
        ]


@dataclass(frozen=True, slots=True)
class PolicyEndpoint:
    """The enforcement mode of one endpoint's computed policy."""

    endpoint_id: int
    egress_enforced: bool = False
    ingress_enforced: bool = False
    revision: int = 0

    def to_json(self) -> dict[str, Any]:
        """JSON form (``db show``)."""
        return {
            "endpoint": self.endpoint_id,
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


def _key_tuple(k: PolicyKey) -> tuple[int, int, bool, int, int, int]:
    return (k.endpoint_id, k.identity, k.egress, k.protocol, k.dport, k.port_prefix_len)


_encode_key = keycodec.tuple_of(
    keycodec.uint16,
    keycodec.uint32,
    keycodec.boolean,
    keycodec.uint8,
    keycodec.uint16,
    keycodec.uint8,
)

#: Primary index: the whole key (endpoint first, so one endpoint's entries are adjacent).
policy_key_index: Index[PolicyEntry, tuple[int, int, bool, int, int, int]] = Index(
    "key", key=lambda e: _key_tuple(e.key), encode=_encode_key
)
#: The endpoint's entries.
policy_endpoint_index: Index[PolicyEntry, int] = Index(
    "endpoint", key=lambda e: e.key.endpoint_id, encode=keycodec.uint16, unique=False, parse=int
)
#: Primary index of ``policy-endpoints``.
policy_endpoint_id_index: Index[PolicyEndpoint, int] = Index(
    "endpoint", key=lambda e: e.endpoint_id, encode=keycodec.uint16, parse=int
)


def key_query(key: PolicyKey) -> Any:
    """The primary-index query of ``key``."""
    return policy_key_index.query(_key_tuple(key))


def new_policy_entries_table() -> Table[PolicyEntry]:
    """A new, unregistered ``policy-entries`` table."""
    table: Table[PolicyEntry] = Table(
        POLICY_ENTRIES_TABLE, policy_key_index, policy_endpoint_index
    )
    table.row_type = PolicyEntry  # type: ignore[attr-defined]
    return table


def new_policy_endpoints_table() -> Table[PolicyEndpoint]:
    """A new, unregistered ``policy-endpoints`` table."""
    table: Table[PolicyEndpoint] = Table(POLICY_ENDPOINTS_TABLE, policy_endpoint_id_index)
    table.row_type = PolicyEndpoint  # type: ignore[attr-defined]
    return table
