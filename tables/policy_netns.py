"""The ``policy-netns`` table: which endpoint a network namespace belongs to and which
directions its policy enforces, derived from the ``endpoints`` table (each endpoint's
netns cookie) and the ``policy-endpoints`` table (its enforcement mode). The reconciler
writes it into the ``policy_netns`` BPF map (bpfops/policy_ops.PolicyNetnsOps), where the
socket program looks the connecting socket's namespace up.

An endpoint without a netns cookie (its namespace could not be read) has no row: its
sockets are not identified, so its policy is not enforced at the socket layer (the
policy component reports such endpoints in its health). Two endpoints in one namespace
(two interfaces of one pod) share the row of the lower endpoint id.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from reconciler.status import Status, status_pending
from statedb import Index, Table, WriteTxn
from statedb import keys as keycodec
from tables.endpoints import Endpoint
from tables.policy_entries import PolicyEndpoint

POLICY_NETNS_TABLE = "policy-netns"

F_EGRESS = 1  # policy_netns.flags: egress enforced
F_INGRESS = 2  # ingress enforced


@dataclass(frozen=True, slots=True)
class PolicyNetnsEntry:
    """One desired ``policy_netns`` entry."""

    netns_cookie: int
    endpoint_id: int
    flags: int = 0
    status: Status = field(default_factory=status_pending, compare=False)

    @property
    def egress_enforced(self) -> bool:
        """Whether the endpoint's egress policy is enforced."""
        return bool(self.flags & F_EGRESS)

    def to_json(self) -> dict[str, Any]:
        """JSON form (``db show``)."""
        return {
            "netns_cookie": self.netns_cookie,
            "endpoint": self.endpoint_id,
            "egress_enforced": bool(self.flags & F_EGRESS),
            "ingress_enforced": bool(self.flags & F_INGRESS),
            "status": str(self.status.kind),
        }

    @staticmethod
    def table_header() -> list[str]:
        """Columns of ``db show policy-netns``."""
        return ["NetnsCookie", "Endpoint", "Egress", "Ingress", "Status"]

    def table_row(self) -> list[str]:
        """Cells of ``db show policy-netns``."""
        return [
            str(self.netns_cookie),
            str(self.endpoint_id),
            "enforced" if self.flags & F_EGRESS else "-",
            "enforced" if self.flags & F_INGRESS else "-",
            str(self.status.kind),
        ]


netns_cookie_index: Index[PolicyNetnsEntry, int] = Index(
    "cookie", key=lambda e: e.netns_cookie, encode=keycodec.uint64, parse=int
)
netns_endpoint_index: Index[PolicyNetnsEntry, int] = Index(
    "endpoint", key=lambda e: e.endpoint_id, encode=keycodec.uint16, unique=False, parse=int
)


def new_policy_netns_table() -> Table[PolicyNetnsEntry]:
    """A new, unregistered ``policy-netns`` table."""
    return Table(
        POLICY_NETNS_TABLE, netns_cookie_index, netns_endpoint_index,
        row_type=PolicyNetnsEntry,
    )


def desired_rows(
    endpoints: Iterable[Endpoint], modes: Iterable[PolicyEndpoint]
) -> dict[int, PolicyNetnsEntry]:
    """The rows the endpoints and their enforcement modes call for, by cookie."""
    flags = {
        m.endpoint_id: (F_EGRESS if m.egress_enforced else 0)
        | (F_INGRESS if m.ingress_enforced else 0)
        for m in modes
    }
    out: dict[int, PolicyNetnsEntry] = {}
    for ep in sorted(endpoints, key=lambda e: e.id):
        cookie = ep.netns_cookie
        if cookie and cookie not in out:
            out[cookie] = PolicyNetnsEntry(cookie, ep.id, flags.get(ep.id, 0))
    return out


def sync_rows(
    txn: WriteTxn, table: Table[PolicyNetnsEntry], want: dict[int, PolicyNetnsEntry]
) -> int:
    """Make ``table`` hold exactly ``want`` (changed rows get a Pending status); returns
    how many rows were written or deleted."""
    changed = 0
    have = {row.netns_cookie: row for row in table.all(txn)}
    for cookie, row in want.items():
        if have.get(cookie) != row:
            table.insert(txn, replace(row, status=status_pending()))
            changed += 1
    for cookie, row in have.items():
        if cookie not in want:
            table.delete(txn, row)
            changed += 1
    return changed
