"""The ``sysctls`` table: the kernel settings the agent's datapath needs, one row per
setting, reconciled into /proc/sys (statewright/sysctl_ops.py), in the manner of
Cilium's sysctl table.

A row names the setting by its path under /proc/sys (``net/ipv4/ip_forward``; shown
dotted, ``net.ipv4.ip_forward``, as sysctl(8) spells it), the value the agent wants, why
it wants it, and two flags:

* ``restore``: the value found before the agent changed it is recorded (persisted in
  the state directory, so a restarted agent still knows it) and put back when no row
  wants the setting any more, and at ``statewright agent --cleanup``. Settings of the
  pods' own interfaces (which vanish with the pod) are not restored;
* ``required``: a required setting that cannot be set makes the ``sysctl`` health
  Degraded; an optional one is reported there but leaves it OK.

``original`` is the value found before the agent changed it (None: not known yet, or
not recorded); the reconciler copies it from the recorded values when it commits a
row's status. A name is validated on the way in (`sysctl_path`): no ``..``, no empty
part, nothing outside /proc/sys.

`desired_sysctls` is what the agent wants for its pod CIDR families and its
endpoints' host-side interfaces (statewright/agent/components/sysctl.py keeps the table
equal to it).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import anyio

from reconciler.status import Status, status_pending
from statedb import DB, Index, Table, WriteTxn
from statedb import keys as keycodec
from statedb.errors import InputError
from tables.endpoints import Endpoint, EndpointState

SYSCTLS_TABLE = "sysctls"
INITIALIZER = "sysctls"

#: One part of a sysctl path: kernel names, interface names (which may hold dots, so
#: rows keep the ``/`` form), nothing that could leave /proc/sys.
_PART = re.compile(r"^[A-Za-z0-9_.:@+-]+$")


class SysctlNameError(InputError):
    """A sysctl name or value that cannot be a setting under /proc/sys."""


def sysctl_path(name: str) -> str:
    """The path under /proc/sys of a setting named ``net.ipv4.ip_forward`` or
    ``net/ipv4/ip_forward`` (the ``/`` form is the one that allows dots in interface
    names); SysctlNameError when it is not one."""
    parts = name.split("/") if "/" in name else name.split(".")
    if not name or any(p in ("", ".", "..") or not _PART.match(p) for p in parts):
        raise SysctlNameError(f"sysctl {name!r} is not a setting name under /proc/sys")
    return "/".join(parts)


def iface_sysctl(family: int, iface: str, key: str) -> str:
    """The path of an interface's setting, e.g. ``net/ipv4/conf/lxc1/rp_filter``."""
    return sysctl_path(f"net/ipv{family}/conf/{iface}/{key}")


@dataclass(frozen=True, slots=True)
class Sysctl:
    """One kernel setting the agent wants (see the module doc)."""

    path: str
    value: str
    reason: str = ""
    restore: bool = True
    required: bool = True
    original: str | None = field(default=None, compare=False)
    status: Status = field(default_factory=status_pending, compare=False)

    def __post_init__(self) -> None:
        if sysctl_path(self.path) != self.path:
            raise SysctlNameError(f"sysctl {self.path!r}: rows keep the '/' form")
        if not self.value or "\n" in self.value or len(self.value) > 256:
            raise SysctlNameError(f"sysctl {self.name}: {self.value!r} is not a value")

    @property
    def name(self) -> str:
        """The dotted name sysctl(8) shows."""
        return self.path.replace("/", ".")

    def to_json(self) -> dict[str, Any]:
        """JSON form (``db show sysctls -o json``)."""
        return {"name": self.name, "path": f"/proc/sys/{self.path}", "value": self.value,
                "original": self.original, "restore": self.restore,
                "required": self.required, "reason": self.reason, "status": str(self.status)}

    @staticmethod
    def table_header() -> list[str]:
        """Columns of ``db show sysctls``."""
        return ["Name", "Value", "Original", "Reason", "Status"]

    def table_row(self) -> list[str]:
        """Cells of ``db show sysctls``."""
        if not self.restore:
            original = "(not restored)"
        else:
            original = "?" if self.original is None else self.original
        return [self.name, self.value, original, self.reason, str(self.status)]


sysctl_path_index: Index[Sysctl, str] = Index(
    "path", key=lambda r: r.path, encode=keycodec.string
)


def new_sysctls_table() -> Table[Sysctl]:
    """A new, unregistered ``sysctls`` table."""
    return Table(SYSCTLS_TABLE, sysctl_path_index, row_type=Sysctl)


def node_sysctls(families: Iterable[int]) -> list[Sysctl]:
    """The node-wide settings for pods of these IP families: forwarding (pods on one node
    reach each other, and the rest of the world, through the host's routing), and for
    IPv4 no strict reverse-path filter (the effective ``rp_filter`` of an interface is
    the larger of its own and ``all``'s, so ``all`` must not be 1 for the pods'
    interfaces' 0 to hold)."""
    out: list[Sysctl] = []
    fams = set(families)
    if 4 in fams:
        out.append(Sysctl("net/ipv4/ip_forward", "1", "IPv4 pods are routed by this node"))
        out.append(Sysctl("net/ipv4/conf/all/rp_filter", "0",
                          "strict reverse-path filtering would drop pod traffic"))
    if 6 in fams:
        out.append(Sysctl("net/ipv6/conf/all/forwarding", "1",
                          "IPv6 pods are routed by this node"))
    return out


def interface_sysctls(iface: str, families: Iterable[int], owner: str) -> list[Sysctl]:
    """The settings of a pod's host-side interface (Cilium's for its lxc devices):
    forwarding on, no reverse-path filter, and for IPv6 no duplicate address detection
    (its link-local address is the pods' gateway and must answer at once). Not restored:
    the interface is the agent's own and goes with the pod."""
    out: list[Sysctl] = []
    fams = set(families)
    if 4 in fams:
        out.append(Sysctl(iface_sysctl(4, iface, "forwarding"), "1", owner, restore=False))
        out.append(Sysctl(iface_sysctl(4, iface, "rp_filter"), "0", owner, restore=False))
    if 6 in fams:
        out.append(Sysctl(iface_sysctl(6, iface, "forwarding"), "1", owner, restore=False))
        out.append(Sysctl(iface_sysctl(6, iface, "accept_dad"), "0", owner, restore=False))
    return out


def endpoint_sysctls(ep: Endpoint) -> list[Sysctl]:
    """The settings of an endpoint's host-side interface (none while it has no interface
    name, or once it is being deleted)."""
    if not ep.interface_name or ep.state is EndpointState.DISCONNECTING:
        return []
    fams = [v for v, addr in ((4, ep.ipv4), (6, ep.ipv6)) if addr is not None]
    return interface_sysctls(ep.interface_name, fams, f"endpoint {ep.id}: pod interface")


def desired_sysctls(families: Iterable[int], endpoints: Iterable[Endpoint]) -> dict[str, Sysctl]:
    """Every setting the agent wants, by path: `node_sysctls` and each endpoint's
    `endpoint_sysctls` (the first row of a path wins)."""
    out: dict[str, Sysctl] = {}
    for row in node_sysctls(families):
        out.setdefault(row.path, row)
    for ep in endpoints:
        for row in endpoint_sysctls(ep):
            out.setdefault(row.path, row)
    return out


class SysctlWriter:
    """Keeps the ``sysctls`` table equal to `desired_sysctls` of the pod families and the
    endpoints table (when there is one): `sync` writes the difference, `run` syncs
    whenever the endpoints table changes. Its initializer on the table is done once the
    endpoints table is initialized (restored endpoints included) and synced: until then
    the reconciler restores no recorded setting that a later row would want again."""

    def __init__(
        self,
        db: DB,
        table: Table[Sysctl],
        families: Iterable[int],
        endpoints: Table[Endpoint] | None = None,
    ) -> None:
        self.db = db
        self.table = table
        self.families = tuple(sorted(set(families)))
        self.endpoints = endpoints
        self.initialized = False
        self._init_done: Callable[[WriteTxn], None] | None = None

    def register_initializer(self, txn: WriteTxn) -> None:
        """Keep the table uninitialized until the first sync after the endpoints' restore."""
        self._init_done = self.table.register_initializer(txn, INITIALIZER)

    def sync(self) -> int:
        """Write the rows that differ from the desired ones and delete the unwanted ones;
        returns how many were written or deleted."""
        rtxn = self.db.read_txn()
        eps = list(self.endpoints.all(rtxn)) if self.endpoints is not None else []
        want = desired_sysctls(self.families, eps)
        changed = 0
        with self.db.write_txn(self.table) as txn:
            for row in list(self.table.all(txn)):
                if row.path not in want:
                    self.table.delete(txn, row)
                    changed += 1
            for path, row in want.items():
                old = self.table.get(txn, sysctl_path_index.query(path))
                if old is None or old != row:
                    self.table.insert(txn, row)
                    changed += 1
            ready = self.endpoints is None or self.endpoints.initialized(rtxn)[0]
            if not self.initialized and ready:
                self.initialized = True
                if self._init_done is not None:
                    self._init_done(txn)
                    self._init_done = None
        return changed

    async def run(self, *, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
        """`sync` (in a worker thread) now and whenever the endpoints table or its
        initialization changes."""
        task_status.started()
        while True:
            watches = []
            if self.endpoints is not None:
                txn = self.db.read_txn()
                watches.append(self.endpoints.all_watch(txn)[1])
                done, init_watch = self.endpoints.initialized(txn)
                if not done:
                    watches.append(init_watch)
                del txn  # a held ReadTxn keeps old row versions (docs/statedb.md)
            await anyio.to_thread.run_sync(self.sync)
            if not watches:
                await anyio.sleep_forever()
            async with anyio.create_task_group() as tg:

                async def wait(w: Any) -> None:
                    await w.wait_async()
                    tg.cancel_scope.cancel()

                for w in watches:
                    tg.start_soon(wait, w)
