"""The endpoint-datapath component: the per-endpoint tc programs (bpf/lxc.c, bpf/lxc.py)
on the host side of every endpoint's veth, and the ``policy_endpoints`` map they read.

Needs ``db``, ``endpoints`` (the `EndpointManager`: each endpoint's host-side ifindex),
``policy-maps`` (``policy_maps`` pinned) and ``ct`` (the CT maps and drop counters
pinned). Runs with the ``datapath`` and ``endpoint-datapath`` settings on kernel maps;
otherwise its health says why it is off.

At start the programs are loaded once with every map reused from its pin. A follower
then keeps, on every change of the ``endpoints`` or ``policy-endpoints`` table:

* both programs attached to the veth of every endpoint that has one (tcx links pinned
  under ``<pin-dir>/lxc/links``; links pinned by an earlier agent are adopted, their
  program swapped, so a restart leaves no gap), and detached from endpoints that are
  gone; the first pass also removes the links of veths no endpoint has any longer;
* ``policy_endpoints``: endpoint id -> its enforced directions (the `PolicyEndpoint`
  rows), which tell the programs whether to check a new flow towards the pod. A
  direction is switched on only once the endpoint's entries of it are all written
  (tables/policy_netns.writable_flags; the follower then also wakes on every change of
  ``policy-entries``), and the policy-maps component keeps the entries of a direction
  no longer enforced until it is off here (`PolicyMapsComponent.add_enforcer`): the
  order of docs/policy.md, "Enforcement order".

An endpoint becomes ``ready`` only once its veth carries both programs
(`EndpointManager.ready_checks`). A failed attach (the veth is not there yet or has
gone) is retried and reported in the health until it succeeds; the endpoint stays
``regenerating`` meanwhile. So is a failed write of ``policy_endpoints`` (map full,
permission, a closed descriptor): its health line names the map, the endpoint and the
errno, the other endpoints' flags are still written, and the component records only what
the map really holds (a direction whose update failed is not in force, an entry whose
delete failed still is). Retries follow a failed pass after ``retry_min_backoff``
seconds, doubled per failed pass up to ``retry_max_backoff``; any change of the tables
wakes the follower earlier.
"""

from __future__ import annotations

import errno
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio

from bpf.catalog import policy_endpoints_spec
from bpf.errors import MapError, errno_name
from bpf.factory import BackendConfig, MapFactory
from bpf.policy import NETNS_F_EGRESS, NETNS_F_INGRESS, PolicyNetns
from bpf.typed_map import TypedMap
from statedb import DB, Table, WatchSet
from statewright.agent.components.conntrack import CT
from statewright.agent.components.endpoints import ENDPOINTS
from statewright.agent.components.policy_maps import POLICY_MAPS_COMPONENT, table_of
from statewright.agent.components.statedb import DATABASE
from statewright.agent.config import AgentConfig
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
from tables.endpoint_manager import EndpointManager
from tables.policy_entries import (
    POLICY_ENDPOINTS_TABLE,
    POLICY_ENTRIES_TABLE,
    DirectionBacklog,
    PolicyEndpoint,
    PolicyEntry,
    new_policy_endpoints_table,
    new_policy_entries_table,
)
from tables.policy_netns import writable_flags

log = logging.getLogger("statewright.agent.endpoint_datapath")

#: The first and the longest wait before a failed pass is tried again (seconds).
RETRY_MIN_BACKOFF = 0.1
RETRY_MAX_BACKOFF = 2.0


def enforcement_flags(rows: Sequence[PolicyEndpoint]) -> dict[int, int]:
    """Endpoint id -> ``policy_endpoints`` flags for the rows that enforce something."""
    out = {}
    for r in rows:
        flags = (NETNS_F_EGRESS if r.egress_enforced else 0) | (
            NETNS_F_INGRESS if r.ingress_enforced else 0)
        if flags:
            out[r.endpoint_id] = flags
    return out


@dataclass(frozen=True, slots=True)
class EndpointDatapathConfig:
    """What the endpoint datapath needs from the agent's configuration: whether it runs
    (``datapath`` and ``endpoint-datapath``) and where the maps live (kernel maps only)."""

    enabled: bool = True
    maps: BackendConfig = field(default_factory=BackendConfig)
    #: How the tc programs attach: auto, tcx or clsact (``tc-attach-mode``).
    tc_attach_mode: str = "auto"
    #: Backoff of the retries after a failed attach or map write (module doc).
    retry_min_backoff: float = RETRY_MIN_BACKOFF
    retry_max_backoff: float = RETRY_MAX_BACKOFF

    @classmethod
    def from_agent_config(cls, cfg: AgentConfig) -> EndpointDatapathConfig:
        """The agent's ``datapath``, ``endpoint-datapath``, ``backend``, ``pin-dir`` and
        ``tc-attach-mode``."""
        return cls(cfg.datapath and cfg.endpoint_datapath, cfg.map_backend(), cfg.tc_attach_mode)


class EndpointDatapathComponent(Component):
    """See the module doc."""

    name = "endpoint-datapath"
    needs = (DATABASE, ENDPOINTS, POLICY_MAPS_COMPONENT, CT)

    def __init__(self, config: EndpointDatapathConfig) -> None:
        self.config = config
        self.programs: Any = None
        self.flags_map: TypedMap[int, PolicyNetns] | None = None
        self.state = DISABLED
        self.reason = "not started"
        #: Failed attaches: ifindex -> error.
        self.errors: dict[int, str] = {}
        #: Failed ``policy_endpoints`` operations of the last pass: endpoint id (0: the
        #: whole map) -> error naming the map, the endpoint and the errno.
        self.map_errors: dict[int, str] = {}
        self.adopted = 0
        #: The ifindexes carrying both programs (replaced whole after each sync).
        self.attached: frozenset[int] = frozenset()
        #: Endpoint id -> the flags ``policy_endpoints`` may hold (a superset while a
        #: write is under way; the policy-maps component reads it: module doc).
        self.written: dict[int, int] = {}
        #: Endpoint id -> the flags ``policy_endpoints`` holds (after each write).
        self.in_force: dict[int, int] = {}
        #: Directions not switched on yet: their entries are not all written.
        self.held: list[DirectionBacklog] = []
        self.policy_maps: Any = None

    async def start(self, hive: Hive) -> None:
        """Load the programs and start following the endpoints (module doc)."""
        cfg = self.config
        if not cfg.enabled:
            self.reason = "disabled by configuration"
            return
        factory = MapFactory(cfg.maps)
        if factory.kind != "kernel":
            self.reason = f"needs kernel maps; using {factory.kind} ({factory.reason})"
            log.warning("agent: endpoint datapath off: %s", self.reason)
            return
        from bpf.lxc import EndpointPrograms, LxcConfig

        db = hive.get(self, DATABASE)
        manager = hive.get(self, ENDPOINTS)
        modes = table_of(db, POLICY_ENDPOINTS_TABLE, new_policy_endpoints_table)
        entries = table_of(db, POLICY_ENTRIES_TABLE, new_policy_entries_table)
        self.flags_map = factory.open_typed(policy_endpoints_spec())
        self.written = {ep: v.flags for ep, v in self.flags_map.items()}
        self.in_force = dict(self.written)
        programs = EndpointPrograms(
            LxcConfig(pin_dir=cfg.maps.pin_dir, attach_mode=cfg.tc_attach_mode)
        )
        try:
            await anyio.to_thread.run_sync(programs.load)
        except OSError as e:
            self.state, self.reason = DEGRADED, f"load the tc programs: {e}"
            log.error("agent: endpoint datapath: %s", self.reason)
            programs.close()
            return
        self.programs = programs
        self.state, self.reason = OK, "programs loaded"
        self.policy_maps = hive.get(self, POLICY_MAPS_COMPONENT)
        self.policy_maps.add_enforcer(
            lambda ep: self.written.get(ep, 0), lambda ep: self.in_force.get(ep, 0))
        manager.ready_checks.append(self._carries_programs)
        await hive.spawn(self, self._follow(db, manager, modes, entries),
                         label="endpoint-datapath")

    def _carries_programs(self, ep: Any) -> bool:
        """An endpoint is ready only once its veth carries the programs (or it has none)."""
        return ep.ifindex <= 0 or ep.ifindex in self.attached

    def _follow(
        self,
        db: DB,
        manager: EndpointManager,
        modes: Table[PolicyEndpoint],
        entries: Table[PolicyEntry],
    ) -> Any:
        async def follow(*, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
            first = True
            backoff = self.config.retry_min_backoff
            while True:
                txn = db.read_txn()
                eps, w1 = manager.endpoints.all_watch(txn)
                rows, w2 = modes.all_watch(txn)
                want = {ep.ifindex for ep in eps if ep.ifindex > 0}
                flags, self.held = writable_flags(
                    txn, entries, enforcement_flags(list(rows)), self.in_force)
                watches = [w1, w2]
                if self.held:  # switched on once the entries are written
                    watches.append(entries.all_watch(txn)[1])
                del txn, eps, rows  # a held ReadTxn keeps old row versions (docs/statedb.md)
                await anyio.to_thread.run_sync(self._sync, want, flags, first)
                self.policy_maps.enforcement_changed()
                await anyio.to_thread.run_sync(manager.mark_ready)  # writes state files
                if first:
                    first = False
                    task_status.started()
                if self.errors or self.map_errors:
                    with anyio.move_on_after(backoff):
                        await WatchSet(watches).wait_async()
                    backoff = min(backoff * 2, self.config.retry_max_backoff)
                else:
                    backoff = self.config.retry_min_backoff
                    await WatchSet(watches).wait_async()

        return follow

    def _sync(self, want: set[int], flags: dict[int, int], first: bool) -> None:
        """Attach to ``want``, detach from the rest, write ``policy_endpoints`` (a thread)."""
        progs = self.programs
        assert progs is not None and self.flags_map is not None
        if first:
            for ifindex in progs.prune(want):
                log.info("agent: endpoint datapath: removed the links of gone ifindex %d",
                         ifindex)
        self._write_flags(flags)
        held = set(progs.attached())
        for ifindex in sorted(want - held):
            try:
                if progs.attach(ifindex):
                    self.adopted += 1
                self.errors.pop(ifindex, None)
            except OSError as e:
                self.errors[ifindex] = str(e)
                log.warning("agent: endpoint datapath: %s", e)
        for ifindex in sorted(held - want):
            try:
                progs.detach(ifindex)
            except OSError as e:
                log.warning("agent: endpoint datapath: %s", e)
        for ifindex in list(self.errors):
            if ifindex not in want:
                del self.errors[ifindex]
        self.attached = frozenset(progs.attached())

    def _write_flags(self, flags: dict[int, int]) -> None:
        """Make ``policy_endpoints`` hold ``flags``. A failed operation is recorded in
        `map_errors` (and logged when new) and the others go on; `written` and `in_force`
        then say what the map holds (module doc)."""
        m = self.flags_map
        assert m is not None
        errors: dict[int, str] = {}
        try:
            have = dict(m.items())
        except OSError as e:
            errors[0] = _map_failure(m.spec.name, "read", None, e)
            self._note_map_errors(errors)
            return
        written = self.written
        for ep in have:  # deletes first: they make room for new endpoints
            if ep in flags:
                continue
            try:
                m.delete(ep)
            except OSError as e:
                if e.errno != errno.ENOENT:
                    errors[ep] = _map_failure(m.spec.name, "delete", ep, e)
                    continue
            self.in_force.pop(ep, None)
            written.pop(ep, None)
        for ep, f in flags.items():
            value = PolicyNetns(ep, f)
            old = have.get(ep)
            if old != value:
                written[ep] = written.get(ep, 0) | f  # before: what the map may hold
                try:
                    m.update(ep, value)
                except OSError as e:
                    errors[ep] = _map_failure(m.spec.name, "update", ep, e)
                    if old is None:  # the map holds what it held before
                        written.pop(ep, None)
                    else:
                        written[ep] = old.flags
                    continue
            written[ep] = self.in_force[ep] = f
        self._note_map_errors(errors)

    def _note_map_errors(self, errors: dict[int, str]) -> None:
        """Keep the pass's map errors; log the new ones, and the recovery."""
        for ep, msg in errors.items():
            if self.map_errors.get(ep) != msg:
                log.error("agent: endpoint datapath: %s; retrying", msg)
        if self.map_errors and not errors:
            log.info("agent: endpoint datapath: policy_endpoints written again")
        self.map_errors = errors

    async def stop(self) -> None:
        """Release the handles; the pinned links keep the programs attached."""
        if self.programs is not None:
            self.programs.close()
            self.programs = None
        if self.flags_map is not None:
            self.flags_map.close()
            self.flags_map = None

    def health(self) -> list[Health]:
        """Off and why, or how many veths carry the programs and the failures."""
        if self.programs is None:
            return [Health(self.name, self.state, self.reason)]
        n = len(self.programs.attached())
        text = f"tc programs on {n} endpoint veth(s) ({self.adopted} adopted)"
        problems = []
        held = [b for b in self.held if b.errors]
        if held:
            problems.append("policy not enforced yet, entries failed: " + "; ".join(
                f"endpoint {b.endpoint_id} {b.direction}: {b.describe()}" for b in held[:3]))
        if self.errors:
            failed = "; ".join(f"ifindex {i}: {e}" for i, e in sorted(self.errors.items())[:3])
            problems.append(f"not attached: {failed}")
        if self.map_errors:
            failed = "; ".join(e for _, e in sorted(self.map_errors.items())[:3])
            more = len(self.map_errors) - 3
            problems.append(f"policy_endpoints not written ({failed}"
                            + (f"; {more} more" if more > 0 else "") + "), retrying")
        if problems:
            return [Health(self.name, DEGRADED, "; ".join([text, *problems]))]
        return [Health(self.name, OK, text)]

    def bpf_maps(self) -> Sequence[MapView]:
        """``policy_endpoints``."""
        return [typed_map_view(self.flags_map, "kernel")] if self.flags_map else []

    def cleanup(self) -> list[str]:
        """Detach and unpin every link; unpin ``policy_endpoints``."""
        from bpf.lxc import EndpointPrograms

        removed = EndpointPrograms.cleanup(self.config.maps.pin_dir)
        path = os.path.join(self.config.maps.pin_dir, "policy_endpoints")
        if os.path.exists(path):
            os.unlink(path)
            removed.append(f"pin {path}")
        return removed


def _map_failure(map_name: str, op: str, endpoint: int | None, e: OSError) -> str:
    """A failed map operation, naming the endpoint (when one), the map and the errno."""
    if isinstance(e, MapError):
        what = str(e)
    else:
        what = f"map {map_name}: {op}: {errno_name(e.errno or 0)} ({e.strerror or e})"
    return what if endpoint is None else f"endpoint {endpoint}: {what}"
