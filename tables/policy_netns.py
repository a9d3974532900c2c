"""The ``policy-netns`` table: which endpoint a network namespace belongs to and which
directions its policy enforces, derived from the ``endpoints`` table (each endpoint's
netns cookie) and the ``policy-endpoints`` table (its enforcement mode). The reconciler
writes it into the ``policy_netns`` BPF map (bpfops/policy_ops.PolicyNetnsOps), where the
socket program looks the connecting socket's namespace up.

A row's flags are what the endpoint's policy enforces; the reconciler switches a
direction on only once the endpoint's entries of it are written, so a row held back is in
Error saying so (bpfops/policy_ops.py, "Enforcement order"). `enforcement_may_be_on` and
`enforcement_written` read the rows of one endpoint for the entries' reconciler and the
realized revision.

An endpoint without a netns cookie (its namespace could not be read) has no row: its
sockets are not identified, so its policy is not enforced at the socket layer (the
policy component reports such endpoints in its health). Two endpoints in one namespace
(two interfaces of one pod) share the row of the lower endpoint id.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from reconciler.status import Status, StatusKind, status_pending
from statedb import Index, ReadTxn, Table, WriteTxn
from statedb import keys as keycodec
from tables.endpoints import Endpoint
from tables.policy_entries import DirectionBacklog, PolicyEndpoint, PolicyEntry, direction_backlog

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


def mode_flags(mode: PolicyEndpoint | None) -> int:
    """The ``policy_netns`` flags of an enforcement mode (None: nothing enforced)."""
    if mode is None:
        return 0
    return (F_EGRESS if mode.egress_enforced else 0) | (F_INGRESS if mode.ingress_enforced else 0)


def direction_flag(egress: bool) -> int:
    """The flag of one direction."""
    return F_EGRESS if egress else F_INGRESS


def enforcement_may_be_on(
    txn: ReadTxn, table: Table[PolicyNetnsEntry], endpoint_id: int, flag: int
) -> bool:
    """Whether ``policy_netns`` may still enforce ``flag`` for the endpoint: true unless
    every row of the endpoint in ``txn`` is Done without it (a Done row is exactly what
    the map holds: the netns reconciler never reports a partial write Done). An endpoint
    without a row has no namespace entry the socket program could find."""
    for row in table.list(txn, netns_endpoint_index.query(endpoint_id)):
        if row.flags & flag or row.status.kind is not StatusKind.DONE:
            return True
    return False


def enforcement_written(
    txn: ReadTxn, table: Table[PolicyNetnsEntry], mode: PolicyEndpoint
) -> bool:
    """Whether ``policy_netns`` enforces exactly what the endpoint's mode says: every row
    of the endpoint in ``txn`` is Done with the mode's flags (an endpoint without a row,
    no cookie or sharing a namespace with a lower id, has nothing to wait for)."""
    flags = mode_flags(mode)
    return all(
        row.flags == flags and row.status.kind is StatusKind.DONE
        for row in table.list(txn, netns_endpoint_index.query(mode.endpoint_id))
    )


def writable_flags(
    txn: ReadTxn, entries: Table[PolicyEntry], want: dict[int, int], on: dict[int, int]
) -> tuple[dict[int, int], list[DirectionBacklog]]:
    """For a writer of per-endpoint enforcement flags (endpoint id -> flags, such as the
    endpoint datapath's ``policy_endpoints``): ``want`` less every direction being
    switched on (not in ``on``, what the map may hold now) whose entries are not all Done
    in ``txn``, and those directions' backlogs. O(entries of the endpoints switching a
    direction on)."""
    out: dict[int, int] = {}
    held: list[DirectionBacklog] = []
    for ep, flags in want.items():
        turning_on = flags & ~on.get(ep, 0)
        for egress in (True, False):
            flag = direction_flag(egress)
            if turning_on & flag:
                backlog = direction_backlog(txn, entries, ep, egress)
                if not backlog.written:
                    flags &= ~flag
                    held.append(backlog)
        if flags:
            out[ep] = flags
    return out, held


def desired_rows(
    endpoints: Iterable[Endpoint], modes: Iterable[PolicyEndpoint]
) -> dict[int, PolicyNetnsEntry]:
    """The rows the endpoints and their enforcement modes call for, by cookie."""
    flags = {m.endpoint_id: mode_flags(m) for m in modes}
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
