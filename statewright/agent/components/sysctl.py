"""The ``sysctl`` component: the kernel settings the datapath needs, owned by the agent.

The ``sysctls`` table (tables/sysctls.py) holds what the agent wants: forwarding for
its pods' IP families, no strict reverse-path filter, and the settings of each
endpoint's host-side interface; `SysctlWriter` keeps it so as the endpoints come and
go. A reconciler writes it into /proc/sys through `SysctlOps` (statewright/sysctl_ops.py),
re-reading every setting every `REFRESH_INTERVAL` seconds (someone may have changed
it) and restoring, on its first prune, what an earlier run set and no row wants now.

The values found before the agent changed them are recorded in the state directory
(``sysctl-originals.json``): a restarted agent still knows them, and ``statewright
agent --cleanup`` puts them back (where the setting still holds the agent's value).
Stopping the agent leaves the settings as they are, as it leaves the maps: pods keep
working while it restarts.

Configuration: ``sysctl: false`` sets nothing (health Disabled, saying what pods then
need); ``procfs`` (default /proc; a container's own /proc/sys is read-only, so the
DaemonSet mounts the host's and names it); ``sysctl-netns: NAME|PATH`` writes the
settings of that network namespace instead of the agent's own (the ``net.*`` settings
are per namespace; the test harnesses use it, or ``sysctl: false``, so that no test
changes the machine's own).

Health: ``sysctl`` OK with the count; Degraded naming each required setting that
could not be set (its name, the wanted value and the errno: a missing path, e.g. IPv6
disabled, is reported, never a crash); optional ones are listed but leave it OK.
``statewright db show sysctls`` shows the table (value, original, reason, status).
"""

from __future__ import annotations

import dataclasses
import ipaddress
import logging
import os
from dataclasses import dataclass

import anyio

from reconciler import Config, Reconciler, Status, StatusKind
from reconciler.health import Level
from statedb import DB, Table
from statewright.agent.components.endpoints import ENDPOINTS
from statewright.agent.components.statedb import DATABASE
from statewright.agent.config import AgentConfig
from statewright.component import DEGRADED, DISABLED, OK, Component, Health, Hive
from statewright.sysctl_ops import (
    ORIGINALS_FILE,
    KernelProcSys,
    OriginalValues,
    SysctlOps,
    SysctlStateError,
    restore_recorded,
)
from tables.sysctls import Sysctl, SysctlWriter, new_sysctls_table

log = logging.getLogger("statewright.agent.sysctl")

#: Seconds between two re-reads of every setting.
REFRESH_INTERVAL = 60.0
#: Settings named in one health line at most.
HEALTH_NAMES = 5


def running_as_root() -> bool:
    """Whether the agent may write /proc/sys (tests replace it)."""
    return os.geteuid() == 0


@dataclass(frozen=True, slots=True)
class SysctlConfig:
    """What the component needs from the agent's configuration."""

    enabled: bool
    netns: str
    state_dir: str
    #: The pods' IP families (both while the pod CIDRs come from the Node object).
    families: tuple[int, ...] = (4, 6)
    refresh_interval: float | None = REFRESH_INTERVAL
    procfs: str = "/proc"

    @classmethod
    def from_agent_config(cls, cfg: AgentConfig) -> SysctlConfig:
        cidrs = cfg.effective_pod_cidrs
        versions = {ipaddress.ip_network(c, strict=False).version for c in cidrs}
        fams = tuple(sorted(versions)) if cidrs else (4, 6)
        return cls(cfg.sysctl, cfg.sysctl_netns, cfg.state_dir, fams, procfs=cfg.procfs)

    def procsys(self) -> KernelProcSys:
        """The target: ``<procfs>/sys`` of the configured namespace (or the agent's)."""
        return KernelProcSys(self.netns, os.path.join(self.procfs, "sys"))

    @property
    def originals_file(self) -> str:
        return os.path.join(self.state_dir, ORIGINALS_FILE)


class SysctlComponent(Component):
    """Registers the table, keeps it derived, runs the reconciler (module doc)."""

    name = "sysctl"
    needs = (DATABASE,)
    uses = (ENDPOINTS,)

    def __init__(self, config: SysctlConfig) -> None:
        self.config = config
        self.table: Table[Sysctl] | None = None
        self.ops: SysctlOps | None = None
        self.writer: SysctlWriter | None = None
        self.reconciler: Reconciler[Sysctl] | None = None
        self.db: DB | None = None
        #: Why the component could not start its work ("" when it did).
        self.problem = ""
        #: Not root: the kernel settings cannot be changed (nothing is tried).
        self.unprivileged = False

    async def start(self, hive: Hive) -> None:
        db = hive.get(self, DATABASE)
        self.db = db
        # registered also when nothing is set: `db show sysctls` answers (empty)
        self.table = new_sysctls_table()
        db.register(self.table)
        if not self.config.enabled:
            return
        if not running_as_root():
            self.unprivileged = True
            return
        procfs = self.config.procsys()
        try:
            originals = await anyio.to_thread.run_sync(
                OriginalValues.load, self.config.originals_file)
            await anyio.to_thread.run_sync(originals.check_netns, procfs)
            ops = await anyio.to_thread.run_sync(SysctlOps, procfs, originals)
        except (SysctlStateError, OSError) as e:
            # Nothing is changed without the record: an original would be lost for good.
            self.problem = f"{e}; no setting is changed until it is repaired or removed"
            log.error("sysctl: %s", self.problem)
            return
        self.ops = ops
        manager = hive.find(self, ENDPOINTS)
        self.writer = SysctlWriter(db, self.table, self.config.families,
                                   manager.endpoints if manager is not None else None)
        with db.write_txn(self.table) as txn:
            self.writer.register_initializer(txn)

        def set_status(row: Sysctl, status: Status) -> Sysctl:
            original = originals.original_of(row.path) if row.restore else None
            return dataclasses.replace(row, status=status, original=original)

        self.reconciler = Reconciler(db, Config(
            table=self.table, operations=self.ops, get_object_status=lambda r: r.status,
            set_object_status=set_status, name="sysctls", prune_interval=None,
            refresh_interval=self.config.refresh_interval,
        ))
        await hive.spawn(self, self.writer.run, label="sysctl/writer")
        await hive.spawn(self, self.reconciler.run)

    async def stop(self) -> None:
        """The writer and reconciler tasks are already cancelled: the settings stay as they
        are (pods keep working while the agent restarts); ``--cleanup`` restores them."""
        if self.ops is not None:
            log.info("sysctl: stopped; %d recorded settings left as they are (restored by "
                     "statewright agent --cleanup)", len(self.ops.originals.paths()))

    def health(self) -> list[Health]:
        need = ("(its pods need net.ipv4.ip_forward=1, net.ipv6.conf.all.forwarding=1 and "
                "no strict rp_filter: set them by hand)")
        if not self.config.enabled:
            return [Health(self.name, DISABLED,
                           f"sysctl: false: the agent sets no kernel settings {need}")]
        if self.unprivileged:
            return [Health(self.name, DISABLED,
                           f"not root: the agent cannot set kernel settings {need}")]
        if self.problem:
            return [Health(self.name, DEGRADED, self.problem)]
        if self.reconciler is None or self.table is None or self.db is None:
            return [Health(self.name, DEGRADED, "not started")]
        rows = list(self.table.all(self.db.read_txn()))
        failed = [r for r in rows if r.status.kind is StatusKind.ERROR]
        where = f" in netns {self.config.netns}" if self.config.netns else ""
        required = [r for r in failed if r.required]
        optional = [r for r in failed if not r.required]
        if required:
            return [Health(self.name, DEGRADED,
                           f"{len(required)} of {len(rows)} settings not set{where}: "
                           + _names(required))]
        if self.reconciler.health.level is not Level.OK and not optional:
            return [Health(self.name, DEGRADED, self.reconciler.health.message)]
        held = sum(1 for r in rows if r.status.kind is StatusKind.DONE)
        pending = len(rows) - held - len(failed)
        msg = f"{held} settings held{where}" + (f", {pending} pending" if pending else "")
        if optional:
            msg += f"; optional, not set: {_names(optional)}"
        return [Health(self.name, OK, msg)]

    def cleanup(self) -> list[str]:
        """Put back the recorded originals (where the agent's value is still set), then
        remove the record; OSError naming what could not be restored (the record keeps it)."""
        path = self.config.originals_file
        if not os.path.exists(path):
            return []
        try:
            originals = OriginalValues.load(path)
            done, errors = restore_recorded(self.config.procsys(), originals)
        except SysctlStateError as e:
            raise OSError(str(e)) from None
        if errors:
            raise OSError("; ".join(errors))
        os.unlink(path)
        return done


def _names(rows: list[Sysctl]) -> str:
    text = "; ".join(r.status.error or f"{r.name}: wanted {r.value}" for r in rows[:HEALTH_NAMES])
    more = len(rows) - HEALTH_NAMES
    return text + (f"; and {more} more" if more > 0 else "")
