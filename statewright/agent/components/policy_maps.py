"""The policy-maps component: writes every endpoint's computed network policy into its
Cilium-layout policy map and tells the socket program which namespace is which endpoint.

Needs ``db`` and ``endpoints`` (the `EndpointManager`: its ``endpoints`` table carries each
endpoint's netns cookie). Provides ``policy-maps`` (this component).

* The ``policy-entries`` and ``policy-endpoints`` tables (tables/policy_entries.py) are
  the policy control plane's; when no earlier component registered them, this one does
  (they then stay empty until something fills them).
* The ``policy-entries`` reconciler (bpfops/policy_ops.PolicyOps) writes the entries into
  ``cilium_policy_v2_<id>`` maps pinned under the pin directory and installs each in the
  hash of maps ``policy_maps``.
* A follower keeps the ``policy-netns`` table (tables/policy_netns.py) derived from the
  endpoints and their enforcement modes; its reconciler (PolicyNetnsOps) writes it into
  ``policy_netns``. Its initializer is completed after the first derivation, so a
  restarted agent never prunes a namespace's entry before it has read the endpoints.

* The two reconcilers wait for each other (bpfops/policy_ops.py, "Enforcement order"):
  a direction is switched on in ``policy_netns`` only once the endpoint's entries of it
  are written, and entries of a direction no longer enforced are deleted only once it is
  switched off. A ``policy-netns`` row held back for entries that have all been written
  since is marked Pending again by the realized-revision follower, so it goes on at once
  rather than at its next retry; health names each endpoint whose enforcement is held
  back and why (a failed entry first, with its error).
* Each endpoint's **realized** policy revision (`realized`): the policy revision of its
  ``policy-endpoints`` row once every change of ``policy-entries`` up to the write of
  that row has been attempted by the reconciler, every entry of the endpoint is Done, no
  retry is pending and ``policy_netns`` enforces exactly the row's directions: the maps
  hold that revision's policy and enforce it (Cilium's realized policy revision;
  ``statewright policy wait`` waits on it through ``GET /policy/endpoints``).

List it after ``endpoints`` and before ``datapath``: the socket program reuses the pinned
``policy_maps``, ``policy_netns`` and ``ipcache`` when it is loaded (bpf/datapath.py).
"""

from __future__ import annotations

import errno
import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import anyio

from bpf.catalog import policy_maps_spec, policy_netns_spec
from bpf.factory import BackendConfig, BackendKind, MapFactory
from bpf.memory_map import MemoryMap
from bpf.policy import POLICY_MAPS, POLICY_NETNS, endpoint_of_map
from bpf.typed_map import TypedMap
from bpfops.policy_ops import PolicyMapSet, PolicyNetnsOps, PolicyOps
from reconciler import Reconciler
from reconciler.health import Level
from reconciler.status import StatusKind, status_pending
from statedb import DB, Table, Watch, WatchSet
from statewright.agent.components.endpoints import ENDPOINTS
from statewright.agent.components.map_reconciler import map_reconciler
from statewright.agent.components.policy import POLICY
from statewright.agent.components.statedb import DATABASE
from statewright.agent.config import AgentConfig
from statewright.component import (
    DEGRADED,
    OK,
    Component,
    Health,
    Hive,
    MapView,
    Provided,
    typed_map_view,
)
from tables.endpoint_manager import EndpointManager
from tables.policy_entries import (
    POLICY_ENDPOINTS_TABLE,
    POLICY_ENTRIES_TABLE,
    PolicyEndpoint,
    PolicyEntry,
    direction_backlog,
    new_policy_endpoints_table,
    new_policy_entries_table,
    policy_endpoint_index,
)
from tables.policy_netns import (
    PolicyNetnsEntry,
    desired_rows,
    enforcement_written,
    mode_flags,
    netns_cookie_index,
    new_policy_netns_table,
    sync_rows,
)

log = logging.getLogger("statewright.agent.policy_maps")

NETNS_INITIALIZER = "policy-netns-derived"
#: Pause between two realized-revision passes (status writes come in bursts).
REALIZED_INTERVAL = 0.02
#: How long start waits for the reconcilers' first rounds (then health tells).
STARTUP_ROUND_TIMEOUT = 10.0


@dataclass(frozen=True, slots=True)
class PolicyMapsConfig:
    """What the component needs from the agent's configuration."""

    backend: BackendKind = "auto"
    pin_dir: str = "/sys/fs/bpf/statewright"
    prune_interval: float | None = 300.0

    @classmethod
    def from_agent_config(cls, cfg: AgentConfig) -> PolicyMapsConfig:
        """The agent's ``backend`` and ``pin-dir``."""
        maps = cfg.map_backend()
        return cls(backend=maps.backend, pin_dir=maps.pin_dir)


def table_of(db: DB, name: str, new: Callable[[], Table[Any]]) -> Table[Any]:
    """The table ``name`` registered in ``db``, registering a new one when there is none."""
    for t in db.tables:
        if t.name == name:
            return t
    table = new()
    db.register(table)
    return table


#: The policy-maps component itself (its per-endpoint realized revisions), for the
#: components that must start after the policy maps exist.
POLICY_MAPS_COMPONENT: Provided[PolicyMapsComponent] = Provided("policy-maps")


class PolicyMapsComponent(Component):
    """See the module doc."""

    name = "policy-maps"
    needs = (DATABASE, ENDPOINTS)
    provides = (POLICY_MAPS_COMPONENT,)
    uses = (POLICY,)

    def __init__(self, config: PolicyMapsConfig) -> None:
        self.config = config
        self.maps_kind = ""
        self.outer: TypedMap[Any, Any] | None = None
        self.netns_map: TypedMap[Any, Any] | None = None
        self.policy_maps: PolicyMapSet | None = None
        self.ops: PolicyOps | None = None
        self.netns_ops: PolicyNetnsOps | None = None
        self.reconcilers: dict[str, Reconciler[Any]] = {}
        self.entries: Table[PolicyEntry] | None = None
        self.modes: Table[PolicyEndpoint] | None = None
        self.netns: Table[PolicyNetnsEntry] | None = None
        self.manager: EndpointManager | None = None
        #: Endpoint id -> the policy revision its maps hold (see the module doc).
        self.realized: dict[int, int] = {}
        #: What the other writers of enforcement flags hold (`add_enforcer`).
        self.in_force: list[Callable[[int], int]] = []
        self._enforcement_watch = Watch()

    async def start(self, hive: Hive) -> None:
        """Tables, maps, the two reconcilers and the netns follower (module doc)."""
        db = hive.get(self, DATABASE)
        manager = hive.get(self, ENDPOINTS)
        cfg = self.config
        entries = table_of(db, POLICY_ENTRIES_TABLE, new_policy_entries_table)
        modes = table_of(db, POLICY_ENDPOINTS_TABLE, new_policy_endpoints_table)
        netns = new_policy_netns_table()
        db.register(netns)
        with db.write_txn(netns) as txn:
            netns_done = netns.register_initializer(txn, NETNS_INITIALIZER)
        self.entries, self.modes, self.netns, self.manager = entries, modes, netns, manager

        factory = MapFactory(BackendConfig(backend=cfg.backend, pin_dir=cfg.pin_dir))
        self.maps_kind = factory.kind
        self.outer = factory.open_typed(policy_maps_spec())
        try:
            self.netns_map = factory.open_typed(policy_netns_spec())
        except BaseException:
            await self.stop()
            raise
        pin_dir = cfg.pin_dir if factory.config.pin else None
        self.policy_maps = PolicyMapSet(self.outer, factory.opener, pin_dir)
        self.ops = PolicyOps(entries, self.policy_maps, modes, netns)
        self.netns_ops = PolicyNetnsOps(self.netns_map, entries, modes)
        self.reconcilers = {
            POLICY_ENTRIES_TABLE: map_reconciler(db, entries, self.ops, cfg.prune_interval),
            netns.name: map_reconciler(db, netns, self.netns_ops, cfg.prune_interval),
        }
        for name, rec in self.reconcilers.items():
            await hive.spawn(self, rec.run, label=f"{self.name}-{name}")
        await hive.spawn(self, self._follow(db, manager, modes, netns, netns_done),
                         label="policy-netns")
        writer = hive.find(self, POLICY)
        await hive.spawn(self, self._follow_realized(db, entries, modes, netns, writer),
                         label="policy-realized")
        # A reconciler reports Stopped until its first round: wait for those rounds (they
        # do not wait for initializers, only the prune does) so the agent starts healthy.
        with anyio.move_on_after(STARTUP_ROUND_TIMEOUT):
            while any(r.health.level is Level.STOPPED for r in self.reconcilers.values()):
                await anyio.sleep(0.005)
        hive.provide(self, POLICY_MAPS_COMPONENT, self)

    def add_enforcer(
        self, may_enforce: Callable[[int], int], in_force: Callable[[int], int]
    ) -> None:
        """Another writer of enforcement flags (the endpoint datapath's
        ``policy_endpoints``): the entries of a direction no longer enforced also wait
        until ``may_enforce(endpoint_id)`` (the flags its map may hold) lacks it, and an
        endpoint's revision is realized only once ``in_force(endpoint_id)`` (the flags its
        map holds) are its ``policy-endpoints`` row's. Both are called on the event loop
        and must not block; the writer calls `enforcement_changed` after each write."""
        if self.ops is not None:
            self.ops.enforcers.append(may_enforce)
        self.in_force.append(in_force)

    def enforcement_changed(self) -> None:
        """Another writer of enforcement flags wrote some (see `add_enforcer`): the
        realized revisions are computed again now (thread-safe)."""
        old, self._enforcement_watch = self._enforcement_watch, Watch()
        old.close()

    def _follow(
        self,
        db: DB,
        manager: EndpointManager,
        modes: Table[PolicyEndpoint],
        netns: Table[PolicyNetnsEntry],
        done: Callable[[Any], None],
    ) -> Callable[..., Any]:
        async def follow(*, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
            first = True
            while True:
                txn = db.read_txn()
                eps, w1 = manager.endpoints.all_watch(txn)
                rows, w2 = modes.all_watch(txn)
                want = desired_rows(eps, rows)
                with db.write_txn(netns) as wtxn:
                    sync_rows(wtxn, netns, want)
                    if first:
                        done(wtxn)
                del txn, eps, rows, wtxn  # a held ReadTxn keeps old row versions (docs/statedb.md)
                if first:
                    first = False
                    task_status.started()
                await WatchSet((w1, w2)).wait_async()

        return follow

    def _follow_realized(
        self,
        db: DB,
        entries: Table[PolicyEntry],
        modes: Table[PolicyEndpoint],
        netns: Table[PolicyNetnsEntry],
        writer: Any,
    ) -> Callable[..., Any]:
        rec = self.reconcilers[POLICY_ENTRIES_TABLE]

        async def follow(*, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
            task_status.started()
            while True:
                synced = getattr(writer, "synced_revision", 0)  # before the snapshot
                txn = db.read_txn()
                before = {m.endpoint_id: m for m in modes.all(txn)}
                _, w1 = modes.all_watch(txn)
                _, w2 = entries.all_watch(txn)
                _, w3 = netns.all_watch(txn)
                w4 = self._enforcement_watch
                revision = entries.revision(txn)
                del txn  # a held ReadTxn keeps old row versions (docs/statedb.md)
                await rec.wait_until_reconciled(revision)
                self.realized = realized_revisions(
                    db.read_txn(), entries, modes, before, self.realized, bool(rec.retries),
                    synced, netns, self.in_force,
                )
                self._release_held(db, entries, netns)
                await anyio.sleep(REALIZED_INTERVAL)  # status writes come in bursts
                # at least every second: a policy change that changed no row moves the
                # writer's synced revision only
                with anyio.move_on_after(1.0):
                    await WatchSet([w1, w2, w3, w4]).wait_async()

        return follow

    def _release_held(
        self, db: DB, entries: Table[PolicyEntry], netns: Table[PolicyNetnsEntry]
    ) -> None:
        """Mark Pending again the ``policy-netns`` rows whose enforcement was held back
        for entries that are all written now, so the reconciler switches it on at once
        rather than at its next retry (which backs off to 30 s while a write fails)."""
        ops = self.netns_ops
        if ops is None or not ops.held:
            return
        txn = db.read_txn()
        ready = []
        for cookie, err in list(ops.held.items()):
            row = netns.get(txn, netns_cookie_index.query(cookie))
            if row is None or row.status.kind is not StatusKind.ERROR:
                continue
            # a row held for an older mode waits for the follower's rewrite instead
            if all(
                h.backlog is not None
                and direction_backlog(txn, entries, err.endpoint_id, h.egress).written
                for h in err.held
            ):
                ready.append(row)
        del txn
        if not ready:
            return
        with db.write_txn(netns) as wtxn:
            for row in ready:
                cur = netns.get(wtxn, netns_cookie_index.query(row.netns_cookie))
                if cur is not None and cur.status == row.status:
                    netns.insert(wtxn, replace(cur, status=status_pending()))

    async def stop(self) -> None:
        """Close the maps (their pins stay: the next start adopts them)."""
        if self.policy_maps is not None:
            self.policy_maps.close()
        for m in (self.outer, self.netns_map):
            if m is not None:
                m.close()
        self.outer = self.netns_map = None

    # ----- reporting ----------------------------------------------------------------------------
    def unidentified(self) -> list[int]:
        """Endpoints whose policy enforces egress but whose namespace has no cookie (their
        sockets cannot be told apart, so the policy is not enforced on them)."""
        if self.manager is None or self.modes is None:
            return []
        txn = self.manager.db.read_txn()
        enforced = {m.endpoint_id for m in self.modes.all(txn) if m.egress_enforced}
        return sorted(
            ep.id for ep in self.manager.endpoints.all(txn)
            if ep.id in enforced and not ep.netns_cookie
        )

    def health(self) -> list[Health]:
        """One line: maps kind, policy maps, entries written; reconciler problems."""
        if self.ops is None or self.policy_maps is None:
            return [Health(self.name, DEGRADED, "not started")]
        held = list(self.netns_ops.held.values()) if self.netns_ops is not None else []
        bad = [
            f"{n}: {r.health.message}"
            for n, r in self.reconcilers.items()
            if r.health.level is not Level.OK
            # the netns reconciler's errors when all are enforcement held back: below
            and not (r.config.table is self.netns and r.health.error_count == len(held))
        ]
        # a failed entry first: the policy stays unenforced until it is written
        for err in sorted(held, key=lambda e: (not e.failed, e.endpoint_id))[:3]:
            bad.append(str(err))
        if len(held) > 3:
            bad.append(f"and {len(held) - 3} more endpoint(s) whose enforcement waits")
        missing = self.unidentified()
        if missing:
            bad.append(
                f"egress policy not enforced on endpoint(s) {missing[:5]}: netns cookie unknown"
            )
        if bad:
            return [Health(self.name, DEGRADED, "; ".join(bad))]
        n = len(self.policy_maps.open_maps())
        return [Health(self.name, OK, f"{n} endpoint policy map(s), {self.maps_kind} maps, "
                                      f"{self.ops.writes} entries written")]

    def bpf_maps(self) -> Sequence[MapView]:
        """``policy_maps``, ``policy_netns`` and every open per-endpoint policy map."""
        out = [typed_map_view(m, self.maps_kind) for m in (self.outer, self.netns_map) if m]
        if self.policy_maps is not None:
            out += [
                typed_map_view(m, self.maps_kind)
                for _, m in sorted(self.policy_maps.open_maps().items())
            ]
        return out

    def cleanup(self) -> list[str]:
        """Unpin ``policy_maps``, ``policy_netns`` and every ``cilium_policy_v2_<id>``."""
        removed = []
        pin_dir = self.config.pin_dir
        names = [POLICY_MAPS, POLICY_NETNS]
        if os.path.isdir(pin_dir):
            names += sorted(n for n in os.listdir(pin_dir) if endpoint_of_map(n) is not None)
        for name in names:
            path = os.path.join(pin_dir, name)
            try:
                os.unlink(path)
                removed.append(f"pin {path}")
            except FileNotFoundError:
                continue
            except OSError as e:
                if e.errno != errno.ENOENT:
                    raise
        for path in MemoryMap.pinned_paths():
            if os.path.dirname(path) == pin_dir and (
                os.path.basename(path) in (POLICY_MAPS, POLICY_NETNS)
                or endpoint_of_map(os.path.basename(path)) is not None
            ):
                MemoryMap.remove_pin(path)
        return removed


def realized_revisions(
    txn: Any,
    entries: Table[PolicyEntry],
    modes: Table[PolicyEndpoint],
    before: dict[int, PolicyEndpoint],
    realized: dict[int, int],
    retrying: bool,
    synced: int = 0,
    netns: Table[PolicyNetnsEntry] | None = None,
    in_force: Sequence[Callable[[int], int]] = (),
) -> dict[int, int]:
    """The realized revision of every endpoint, given ``before`` (the policy-endpoints
    rows when the entries' revision the reconciler has now attempted was read) and
    ``synced`` (the writer's `synced_revision` read before that): an endpoint whose row is
    unchanged since, whose entries are all Done and (given ``netns``, ``in_force``) whose
    ``policy_netns`` entry and other enforcement flags hold exactly its row's directions,
    realizes its row's
    revision, or ``synced`` when later (the changes up to it did not touch the endpoint);
    none while a retry is pending (a failed delete is not in the table). Otherwise it
    keeps what it had realized."""
    out: dict[int, int] = {}
    for m in modes.all(txn):
        old = realized.get(m.endpoint_id)
        if (
            not retrying
            and before.get(m.endpoint_id) == m
            and (netns is None or enforcement_written(txn, netns, m))
            and all(flags(m.endpoint_id) == mode_flags(m) for flags in in_force)
            and all(
                e.status.kind is StatusKind.DONE
                for e in entries.list(txn, policy_endpoint_index.query(m.endpoint_id))
            )
        ):
            out[m.endpoint_id] = max(m.revision, synced)
        elif old is not None:
            out[m.endpoint_id] = old
    return out
