"""The nodeport component: north-south services for clients outside the node. The tc
programs of bpf/nodeport.c (bpf/nodeport.py) on every external device of the devices
table, and the NAT maps they share (bpf/include/nat.h, bpfops/nat.py).

Needs ``db``, ``lb-maps`` (the LB maps pinned), ``endpoints`` (``endpoints`` and
``ipcache`` pinned) and ``ct`` (the CT maps and drop counters pinned). Runs with the
``datapath`` and ``nodeport-datapath`` settings on kernel maps; otherwise its health
says why it is off.

At start it opens (or adopts, pinned under the pin directory) ``nodeport_nat4`` and
``nodeport_nat6`` (``bpf-nat-global-max`` entries each) and ``nodeport_devices``, and
loads the programs once with every map reused from its pin. A follower then keeps, on
every change of the devices table:

* both programs attached to every *selected* device (the devices whose addresses are
  node addresses; pods' veths are never selected), and detached from devices no longer
  selected; the first pass removes what an earlier agent left on devices that are gone.
  Links pinned by an earlier agent are adopted with their program swapped (tcx), or the
  clsact filter replaced in place: a restart leaves no gap;
* ``nodeport_devices``: each such device's SNAT addresses (its first global address of
  each family).

Every ``conntrack-gc-interval`` seconds the expired NAT entries are removed. Route:
``GET /nodeport`` (devices, attach mode, NAT entries).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import anyio

from bpf import nat
from bpf.catalog import nat_specs, nodeport_devices_spec
from bpf.factory import BackendConfig, MapFactory
from bpfops.nat import NATMaps, device_entry
from sources.node_address_selection import is_global_address
from statedb import DB, Table, WatchSet
from statewright.agent.components.conntrack import CT
from statewright.agent.components.endpoints import ENDPOINTS
from statewright.agent.components.lb import LB_MAPS
from statewright.agent.components.periodic_gc import gc_every
from statewright.agent.components.statedb import DATABASE
from statewright.agent.config import AgentConfig
from statewright.api_types import Request, Route
from statewright.component import (
    DEGRADED,
    DISABLED,
    OK,
    Component,
    Health,
    Hive,
    MapView,
    typed_map_view,
)
from tables.devices import DEVICES_TABLE, Device, new_devices_table

log = logging.getLogger("statewright.agent.nodeport")

RETRY_INTERVAL = 2.0
_SCHEMA = {"type": "object", "required": ["enabled", "reason", "devices", "nat"], "properties": {
    "enabled": {"type": "boolean"}, "reason": {"type": "string"},
    "adopted": {"type": "integer"},
    "devices": {"type": "array", "items": {"type": "object"}},
    "nat": {"type": "array", "items": {"type": "object"}},
    "gc": {"type": "object"}}}


@dataclass(frozen=True, slots=True)
class NodePortComponentConfig:
    """What the component needs from the agent's configuration."""

    enabled: bool = True
    reason: str = ""
    backend: str = "auto"
    pin_dir: str = "/sys/fs/bpf/statewright"
    attach_mode: str = "auto"
    nat_max_entries: int = nat.NAT_MAP_MAX_ENTRIES
    gc_interval: float = 60.0

    @classmethod
    def from_agent_config(cls, cfg: AgentConfig) -> NodePortComponentConfig:
        """``datapath`` and ``nodeport-datapath``, the maps' backend and pin directory,
        ``tc-attach-mode``, ``bpf-nat-global-max`` and ``conntrack-gc-interval``."""
        enabled = cfg.datapath and cfg.nodeport_datapath
        return cls(enabled, "" if enabled else "disabled by configuration", cfg.backend,
                   cfg.pin_dir, cfg.tc_attach_mode, cfg.bpf_nat_global_max,
                   cfg.conntrack_gc_interval)


def snat_addresses(dev: Device) -> tuple[str | None, str | None]:
    """The device's first global IPv4 and IPv6 addresses (primary before secondary)."""
    out: dict[int, str] = {}
    for a in sorted(dev.addresses, key=lambda a: (a.secondary, a.scope)):
        if is_global_address(a) and a.family not in out:
            out[a.family] = str(a.address)
    return out.get(4), out.get(6)


def _devices_table(db: DB) -> Table[Device]:
    for t in db.tables:
        if t.name == DEVICES_TABLE:
            return t
    table = new_devices_table()
    db.register(table)
    return table


class NodePortComponent(Component):
    """See the module doc."""

    name = "nodeport"
    needs = (DATABASE, LB_MAPS, ENDPOINTS, CT)

    def __init__(self, config: NodePortComponentConfig) -> None:
        self.config = config
        self.programs: Any = None
        self.maps: NATMaps | None = None
        self.state = DISABLED
        self.reason = config.reason or "not started"
        self.errors: dict[int, str] = {}
        self.adopted = 0
        self.devices: dict[int, str] = {}

    async def start(self, hive: Hive) -> None:
        """Open the NAT maps, load the programs and follow the devices (module doc)."""
        cfg = self.config
        if not cfg.enabled:
            return
        factory = MapFactory(BackendConfig(backend=cfg.backend, pin_dir=cfg.pin_dir))  # type: ignore[arg-type]
        if factory.kind != "kernel":
            self.reason = f"needs kernel maps; using {factory.kind} ({factory.reason})"
            log.warning("agent: nodeport datapath off: %s", self.reason)
            return
        from bpf.nodeport import NodePortConfig, NodePortPrograms

        maglev = hive.get(self, LB_MAPS).config.maglev_table_size
        opened: list[Any] = []
        try:
            for spec in (*nat_specs(cfg.nat_max_entries), nodeport_devices_spec()):
                opened.append(factory.open_typed(spec))
        except BaseException:
            for m in opened:
                m.close()
            raise
        self.maps = NATMaps(*opened)
        programs = NodePortPrograms(NodePortConfig(
            pin_dir=cfg.pin_dir, attach_mode=cfg.attach_mode, maglev_table_size=maglev))
        try:
            await anyio.to_thread.run_sync(programs.load)
        except OSError as e:
            self.state, self.reason = DEGRADED, f"load the tc programs: {e}"
            log.error("agent: nodeport datapath: %s", self.reason)
            programs.close()
            return
        self.programs = programs
        self.state, self.reason = OK, "programs loaded"
        db = hive.get(self, DATABASE)
        await hive.spawn(self, self._follow(db, _devices_table(db)), label="nodeport")
        await hive.spawn(self, self._gc_loop, label="nat-gc")

    def _follow(self, db: DB, devices: Table[Device]) -> Any:
        async def follow(*, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
            first = True
            while True:
                rows, watch = devices.all_watch(db.read_txn())
                want = {d.index: d for d in rows if d.selected and d.up}
                await anyio.to_thread.run_sync(self._sync, want, first)
                if first:
                    first = False
                    task_status.started()
                with anyio.move_on_after(RETRY_INTERVAL if self.errors else None):
                    await WatchSet((watch,)).wait_async()

        return follow

    def _sync(self, want: dict[int, Device], first: bool) -> None:
        """Attach to ``want``, detach from the rest, write ``nodeport_devices`` (a thread)."""
        progs, maps = self.programs, self.maps
        assert progs is not None and maps is not None
        if first:
            for ifindex in progs.prune(set(want)):
                log.info("agent: nodeport: removed the programs of gone ifindex %d", ifindex)
        maps.set_devices({i: device_entry(*snat_addresses(d)) for i, d in want.items()})
        held = set(progs.attached())
        for ifindex in sorted(set(want) - held):
            try:
                if progs.attach(ifindex):
                    self.adopted += 1
                self.errors.pop(ifindex, None)
            except OSError as e:
                self.errors[ifindex] = str(e)
                log.warning("agent: nodeport: %s: %s", want[ifindex].name, e)
        for ifindex in sorted(held - set(want)):
            try:
                progs.detach(ifindex)
            except OSError as e:
                log.warning("agent: nodeport: %s", e)
        for ifindex in list(self.errors):
            if ifindex not in want:
                del self.errors[ifindex]
        self.devices = {i: d.name for i, d in want.items() if i in progs.attached()}

    async def _gc_loop(self, *, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
        await gc_every(self.config.gc_interval, lambda: self.maps, "nodeport: NAT", log,
                       task_status=task_status)

    async def stop(self) -> None:
        """Release the handles; the pinned links (or clsact filters) keep serving."""
        if self.programs is not None:
            self.programs.close()
            self.programs = None
        if self.maps is not None:
            self.maps.close()
            self.maps = None

    def health(self) -> list[Health]:
        """Off and why, or which devices carry the programs and the failures."""
        if self.programs is None:
            return [Health(self.name, self.state, self.reason)]
        modes = sorted(set(self.programs.modes.values())) or ["-"]
        names = ", ".join(sorted(self.devices.values())) or "none"
        text = (f"north-south programs on {len(self.devices)} external device(s) ({names}; "
                f"{'/'.join(modes)}; {self.adopted} adopted)")
        if self.errors:
            failed = "; ".join(f"ifindex {i}: {e}" for i, e in sorted(self.errors.items())[:3])
            return [Health(self.name, DEGRADED, f"{text}; not attached: {failed}")]
        return [Health(self.name, OK, text)]

    def routes(self) -> Sequence[Route]:
        """``GET /nodeport``."""
        return [Route("/nodeport", self._get, response=_SCHEMA,
                      summary="north-south devices and NAT entries (or why it is off)")]

    async def _get(self, request: Request) -> Any:
        if self.maps is None or self.programs is None:
            return {"enabled": False, "reason": self.reason, "devices": [], "nat": []}
        modes = self.programs.modes
        m = self.maps.metrics
        entries = await anyio.to_thread.run_sync(lambda: list(self.maps.entries())
                                                 if self.maps else [])
        return {
            "enabled": True,
            "reason": self.reason,
            "adopted": self.adopted,
            "devices": [{"ifindex": i, "name": n, "mode": modes.get(i, "")}
                        for i, n in sorted(self.devices.items())],
            "nat": entries,
            "gc": {"runs": m.gc_runs, "removed_total": m.removed_total,
                   "entries": dict(m.entries), "last_error": m.last_error},
        }

    def bpf_maps(self) -> Sequence[MapView]:
        """The NAT maps and ``nodeport_devices``."""
        if self.maps is None:
            return []
        return [typed_map_view(m, "kernel")
                for m in (self.maps.nat4, self.maps.nat6, self.maps.devices)]

    def cleanup(self) -> list[str]:
        """Detach every program; unpin the NAT maps and ``nodeport_devices``."""
        from bpf.nodeport import NodePortPrograms

        removed = NodePortPrograms.cleanup(self.config.pin_dir)
        for name in (nat.NAT4_MAP, nat.NAT6_MAP, nat.DEVICES_MAP):
            path = os.path.join(self.config.pin_dir, name)
            if os.path.exists(path):
                os.unlink(path)
                removed.append(f"pin {path}")
        return removed
