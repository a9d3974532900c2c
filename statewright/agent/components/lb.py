"""The load balancer in the agent: two components around one `LoadBalancer`.

* `LoadBalancerComponent` (``lb``): the LB tables, writer and converter in the agent's
  database, with this node's identity (name and labels) in the LB configuration and the
  writer. Sources come after it in the component list and register their initializers on
  the LB tables while they start.
* `LBMapsComponent` (``maps``): opens (or adopts the pinned) LB maps and runs FrontendOps'
  reconciler. It comes after every source, so when it starts each source has registered
  its initializer and nothing is pruned before all of them applied their initial state.
  While the node-addresses table is still waiting for its source (netlink), it holds the
  frontends back too (at most `NODE_ADDRESSES_TIMEOUT`), so NodePort entries for the
  node's addresses are not pruned at a restart.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio

from bpfops.lb_maps import LB_MAP_NAMES, LBMaps
from statewright.agent.components.statedb import DATABASE
from statewright.agent.config import AgentConfig
from statewright.api_types import ApiError, Request, Route
from statewright.component import (
    DEGRADED,
    OK,
    STOPPED,
    Component,
    ComponentError,
    Health,
    Hive,
    MapView,
    Provided,
    typed_map_view,
)
from statewright.loadbalancer import LoadBalancer, MapsPlacement
from tables.lb_config import LBConfig

log = logging.getLogger("statewright.agent.lb")

#: LB flags the agent implements besides what tables.lb_config implements: the state file
#: runs as a source of the load balancer; metrics are sampled whenever they are read.
AGENT_LB_FLAGS = ("lb-state-file", "lb-state-file-interval", "metrics-sampling-interval")
#: How long the frontends wait for the node addresses' first dump before going on.
NODE_ADDRESSES_TIMEOUT = 10.0
#: How long the agent waits for the initial reconciliation before freezing the heap.
INITIAL_FREEZE_TIMEOUT = 60.0
#: The frontends-table initializer held while the node addresses are not known yet.
NODE_ADDRESSES_INITIALIZER = "node-addresses"


def lb_config_of(config: AgentConfig) -> LBConfig:
    """The LB configuration of the agent: this node's name, then the ``lb-flags``; refuses
    flags the agent does not implement (a `ComponentError` naming them)."""
    try:
        cfg = LBConfig.from_flags(list(config.lb_flags), LBConfig(node_name=config.node_name))
    except ValueError as e:
        raise ComponentError(f"lb-flags: {e}") from None
    unimplemented = LBConfig.unsupported_flags(config.lb_flags, also_supported=AGENT_LB_FLAGS)
    if unimplemented:
        raise ComponentError(f"lb-flags: not implemented by this agent: {' '.join(unimplemented)}")
    return cfg


@dataclass(frozen=True, slots=True)
class LBComponentConfig:
    """What the ``lb`` component needs from the agent's configuration: the LB
    configuration (`lb_config_of`), where the maps live, and this node's labels."""

    lb: LBConfig = field(default_factory=LBConfig)
    placement: MapsPlacement = field(default_factory=MapsPlacement)
    node_labels: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def from_agent_config(cls, cfg: AgentConfig) -> LBComponentConfig:
        """The agent's ``lb-flags`` and ``node-name`` (`lb_config_of`; a ComponentError
        for flags it refuses), ``backend``, ``pin-dir`` and ``node-labels``."""
        return cls(lb_config_of(cfg), maps_placement(cfg), cfg.node_labels)


def maps_placement(cfg: AgentConfig) -> MapsPlacement:
    """Where the agent's LB maps live (the ``maps`` component's configuration)."""
    return MapsPlacement(backend=cfg.backend, pin_dir=cfg.pin_dir)


SERVICES_SCHEMA = {
    "type": "array",
    "items": {
        "type": "object",
        "required": ["id", "address", "type", "flags", "algorithm", "backends"],
        "properties": {
            "id": {"type": "integer"},
            "address": {"type": "string"},
            "type": {"type": "string"},
            "flags": {"type": "array", "items": {"type": "string"}},
            "algorithm": {"type": "string"},
            "count": {"type": "integer"},
            "qcount": {"type": "integer"},
            "backends": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["slot", "id", "address", "state", "inactive"],
                    "properties": {"slot": {"type": "integer"}, "id": {"type": "integer"},
                                   "address": {"type": "string"}, "state": {"type": "string"},
                                   "inactive": {"type": "boolean"}},
                },
            },
        },
    },
}


#: The load balancer (tables, writer, converter), for the sources that feed it.
LB: Provided[LoadBalancer] = Provided("lb", LoadBalancer)
#: The same load balancer once its maps are open and its reconciler runs, for the
#: components that need the maps (the datapath, metrics).
LB_MAPS: Provided[LoadBalancer] = Provided("lb-maps", LoadBalancer)


class LoadBalancerComponent(Component):
    """Provides ``lb``: the LB tables, writer and converter, with the node's identity."""

    name = "lb"
    needs = (DATABASE,)
    provides = (LB,)

    def __init__(self, config: LBComponentConfig) -> None:
        self.config = config
        self.lb_config = config.lb
        self.lb: LoadBalancer | None = None

    async def start(self, hive: Hive) -> None:
        """Create the LB tables in the agent's database and give the writer the node labels."""
        lb = LoadBalancer(self.lb_config, self.config.placement, db=hive.get(self, DATABASE))
        if self.config.node_labels:
            with lb.writer.write_txn() as txn:
                lb.writer.set_node_labels(txn, dict(self.config.node_labels))
        self.lb = lb
        hive.provide(self, LB, lb)
        log.info("agent: load balancer for node %s (labels %s)", self.lb_config.node_name,
                 dict(self.config.node_labels) or "none")

    def health(self) -> list[Health]:
        """No line of its own: the maps component reports the load balancer."""
        return []


class LBMapsComponent(Component):
    """Opens the LB maps and runs the reconciler; provides ``lb-maps``."""

    name = "maps"
    needs = (LB,)
    provides = (LB_MAPS,)

    def __init__(self, config: MapsPlacement) -> None:
        self.config = config
        self.lb: LoadBalancer | None = None
        self.maps: LBMaps | None = None

    async def start(self, hive: Hive) -> None:
        """Open the maps (start-up fails without them), restore ids, run the reconciler."""
        lb = hive.get(self, LB)
        self.lb = lb
        try:
            self.maps = lb.open_maps()
        except Exception as e:
            raise ComponentError(
                f"LB maps ({self.config.backend}, pinned under {self.config.pin_dir}): {e}"
            ) from e
        log.info("agent: LB maps: %s (%s), pinned under %s; %d entries adopted",
                 lb.maps_kind, lb.maps_reason, self.config.pin_dir,
                 sum(self.maps.counts().values()))
        try:
            lb.build_reconciler()
        except Exception as e:
            lb.close_maps()
            raise ComponentError(f"FrontendOps: restoring ids from the maps: {e}") from e
        await self._hold_for_node_addresses(hive, lb)
        await hive.spawn(self, lb.run, label="reconciler")
        await hive.spawn(self, self._freeze_initial_state, wait_started=False, label="gc")
        if lb.state_file is not None:
            log.info("agent: LB state file source on %s", lb.config.state_file)
        hive.provide(self, LB_MAPS, lb)

    async def _hold_for_node_addresses(self, hive: Hive, lb: LoadBalancer) -> None:
        """While the node addresses wait for their source, hold the frontends too."""
        table = lb.node_addresses
        if not table.pending_initializers(lb.db.read_txn()):
            return
        with lb.db.write_txn(lb.frontends) as txn:
            done = lb.frontends.register_initializer(txn, NODE_ADDRESSES_INITIALIZER)

        async def wait(*, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
            task_status.started()
            with anyio.move_on_after(NODE_ADDRESSES_TIMEOUT):
                while True:
                    initialized, watch = table.initialized(lb.db.read_txn())
                    if initialized:
                        break
                    await watch.wait_async()
            if table.pending_initializers(lb.db.read_txn()):
                log.warning("agent: node addresses not known after %.0f s; frontends go on",
                            NODE_ADDRESSES_TIMEOUT)
            with lb.db.write_txn(lb.frontends) as txn:
                done(txn)

        await hive.spawn(self, wait, label="node-addresses-wait")

    async def _freeze_initial_state(self, *, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
        """Once the initial state is in the maps, move it out of the garbage collector's
        reach (statedb.gc_tuning.freeze_loaded): later collections skip the loaded rows.
        Then give the C heap's free pages back (statedb.heap_trim): the sync's temporary
        large blocks are freed by now (-21 MB resident at 60,000 services); and from then
        on map blocks of 1 MiB and more on their own, so that the large hash tables a
        churn rebuilds do not leave the heap larger each time."""
        from statedb.gc_tuning import freeze_loaded
        from statedb.heap_trim import fix_mmap_threshold, trim_heap

        task_status.started()
        lb = self.lb
        if lb is None or lb.reconciler is None:
            return
        with anyio.move_on_after(INITIAL_FREEZE_TIMEOUT):
            while True:
                initialized, watch = lb.frontends.initialized(lb.db.read_txn())
                if initialized:
                    break
                await watch.wait_async()
        revision = lb.frontends.revision(lb.db.read_txn())
        try:
            await lb.reconciler.wait_until_reconciled(revision, INITIAL_FREEZE_TIMEOUT)
        except Exception as e:  # not reconciled in time: freeze anyway, it is only tuning
            log.info("agent: initial reconciliation not done (%s); freezing the heap now", e)
        start = time.perf_counter()
        frozen = freeze_loaded()
        log.info("agent: %d objects moved out of the garbage collector's reach in %.0f ms",
                 frozen, (time.perf_counter() - start) * 1000)
        start = time.perf_counter()
        # In a thread: the event loop goes on while glibc walks the heap.
        released = await anyio.to_thread.run_sync(trim_heap)
        log.info("agent: free heap pages %s in %.0f ms",
                 "returned to the system" if released else "not trimmed (none, or not glibc)",
                 (time.perf_counter() - start) * 1000)
        if not fix_mmap_threshold():
            log.info("agent: malloc's mmap threshold left as it is (not glibc)")

    async def stop(self) -> None:
        """Close the maps' handles: pinned, their entries stay for the datapath and the next
        run."""
        if self.lb is not None:
            self.lb.close_maps()
        self.maps = None

    def health(self) -> list[Health]:
        """``maps`` (backend and why), ``reconciler`` and, with --lb-state-file, ``state-file``."""
        lb = self.lb
        where = f"under {self.config.pin_dir}"
        if lb is None:
            return [Health("maps", STOPPED, f"not opened ({where})")]
        out = [Health("maps", OK if self.maps is not None else STOPPED,
                      f"{lb.maps_kind} maps {where} ({lb.maps_reason})")]
        if lb.reconciler is not None:
            h = lb.reconciler.health
            state = {"OK": OK, "Degraded": DEGRADED}.get(str(h.level), STOPPED)
            out.append(Health("reconciler", state, h.message))
        if lb.state_file is not None:
            err = lb.state_file.error
            out.append(Health("state-file", DEGRADED if err else OK,
                              err or f"LB state from {lb.state_file.path}"))
        return out

    def routes(self) -> Sequence[Route]:
        """``/lb/services``: frontends with their backends as the maps hold them."""
        return (Route("/lb/services", self._services, response=SERVICES_SCHEMA,
                      summary="frontends with their backends, as the maps hold them",
                      errors={503: "the LB maps are not open"}),)

    async def _services(self, req: Request) -> Any:
        from bpfops.maps_dump import list_frontends

        maps = self.lb.plain_maps if self.lb is not None else None
        if maps is None:
            raise ApiError(503, "the LB maps are not open")
        return list_frontends(maps)

    def bpf_maps(self) -> Sequence[MapView]:
        """Every LB map; the maglev outer maps list each service's table (size, backends)."""
        maps = self.maps
        if maps is None or self.lb is None:
            return ()
        kind = self.lb.maps_kind
        views = []
        for name, m in sorted(maps.maps.items()):
            view = typed_map_view(m, kind)
            if m.spec.inner is not None:
                v6 = name.endswith("6")

                def maglev(v6: bool = v6) -> list[dict[str, Any]]:
                    assert maps is not None
                    return [{"key": rev_nat_id, "value": {"size": len(table),
                                                         "backends": sorted(set(table))}}
                            for rev_nat_id, table in maps.maglev_tables(v6)]

                view = MapView(view.name, kind, view.count, maglev, view.pinned, view.map_id)
            views.append(view)
        return views

    def cleanup(self) -> list[str]:
        """Unpin the LB maps; remove the pin directory when nothing else is pinned there."""
        removed: list[str] = []
        pin_dir = self.config.pin_dir
        for name in LB_MAP_NAMES:
            path = os.path.join(pin_dir, name)
            if os.path.exists(path):
                os.unlink(path)
                removed.append(path)
        if os.path.isdir(pin_dir):
            try:
                os.rmdir(pin_dir)
                removed.append(pin_dir)
            except OSError as e:
                raise OSError(f"remove {pin_dir}: {e.strerror} (other pins left in place)") from e
        return removed
