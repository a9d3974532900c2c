"""The load balancer as one unit: LB tables and writer, the LB maps, FrontendOps and its
reconciler, all built from one `LBConfig`. The agent (statewright/agent/components/lb.py)
and the conformance runner (tests/conformance) both use it; what feeds the tables
(manifests, Kubernetes, the corpus' fake store) is up to them.

Life cycle, in the order callers use it:

1. ``LoadBalancer(config)``: a statedb `DB` (or the caller's) with the services,
   frontends, backends and node-addresses tables, the `LBWriter` and the Kubernetes
   converter. With ``--lb-state-file`` the state file source is built here too (it is
   driven by an LB flag) and its initializer registered.
2. Sources register their initializers on the LB tables (`LBWriter.register_initializer`)
   before step 4, so the reconciler prunes nothing before every source has applied its
   initial state.
3. `open_maps`: the LB maps on the chosen backend, pinned or not, optionally wrapped
   (the conformance runner injects faults this way), each sized by its
   ``--bpf-lb-*-map-max`` flag (`map_sizes`); a size the kernel refuses fails here,
   naming the flag.
4. ``await tg.start(lb.run)``: FrontendOps restores service and backend ids from the maps,
   then the reconciler (and the state file source, and the health-check server of
   `statewright.lb_healthserver`) run until cancelled.
5. `close_maps` after the run was cancelled: pinned maps keep their entries.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.abc

from bpf.catalog import LBMapSizes, group_of
from bpf.errors import MapError
from bpf.factory import BackendConfig, MapFactory
from bpfops.lb_maps import LBMaps, LBMapsConfig
from reconciler import Reconciler
from sources.k8s_convert import K8sConverter
from sources.state_file import StateFileSource
from statedb import DB
from statedb.errors import StatewrightError
from statewright.lb_healthserver import HealthServer
from tables.lb_config import LBConfig
from tables.lb_writer import LBWriter

#: Periodic full reconciliation of the maps (the first prune runs once the frontends
#: table is initialized).
PRUNE_INTERVAL = 3600.0
#: Periodic rewrite of every frontend's entries (Cilium's default refresh interval).
REFRESH_INTERVAL = 1800.0

#: Wraps each map backend (fault injection in tests); None for the plain backends.
MapWrapper = Callable[[Any], Any]


class LoadBalancerError(StatewrightError, RuntimeError):
    """The load balancer cannot do what was asked (maps not open, already running...)."""


@dataclass(frozen=True, slots=True)
class MapsPlacement:
    """Where the LB maps live: backend (``auto``, ``kernel`` or ``memory``) and pin directory
    (empty: unpinned)."""

    backend: str = "auto"
    pin_dir: str = ""


def map_sizes(config: LBConfig) -> LBMapSizes:
    """The capacity of each LB map group from the ``--bpf-lb-*-map-max`` flags (a group's
    own flag, else ``--bpf-lb-map-max``)."""
    return LBMapSizes(
        services=config.service_map_max,
        backends=config.backend_map_max,
        rev_nat=config.rev_nat_map_max,
        affinity=config.affinity_map_max,
        source_range=config.source_range_map_max,
        maglev=config.maglev_map_max,
    )


class LoadBalancer:
    """One load balancer; see the module docstring."""

    def __init__(
        self,
        config: LBConfig,
        placement: MapsPlacement | None = None,
        *,
        db: DB | None = None,
        name: str = "bpf-lb",
        health_bind_address: str = "",
    ) -> None:
        self.config = config
        self.placement = placement or MapsPlacement()
        self.name = name
        self.db = db if db is not None else DB()
        self.writer = LBWriter.create(self.db, config)
        self.services, self.frontends, self.backends, self.node_addresses = self.writer.tables
        self.converter = K8sConverter(self.writer, config)
        self.state_file = StateFileSource.from_config(self.writer, config)
        #: The health-check server (--enable-health-check-nodeport, with kube-proxy
        #: replacement as in Cilium); its listeners bind ``health_bind_address`` (all
        #: addresses when empty).
        self.health_server: HealthServer | None = None
        if config.enable_health_check_nodeport and config.kube_proxy_replacement:
            self.health_server = HealthServer(
                self.db, self.writer, config.node_name, health_bind_address
            )
        self.maps_kind = "none"
        self.maps_reason = "not opened"
        #: The maps as the reconciler writes them (maybe wrapped) and without wrappers.
        self.maps: LBMaps | None = None
        self.plain_maps: LBMaps | None = None
        self.ops: Any = None
        self.reconciler: Reconciler[Any] | None = None
        self.running = False

    # ----- maps -------------------------------------------------------------------------
    def _open(self, wrap: MapWrapper | None = None) -> tuple[MapFactory, LBMaps]:
        placement = self.placement
        factory = MapFactory(
            BackendConfig(
                backend=placement.backend,  # type: ignore[arg-type]
                pin_dir=placement.pin_dir or "/sys/fs/bpf",
                pin=bool(placement.pin_dir),
            )
        )
        sizes = map_sizes(self.config)
        config = LBMapsConfig(
            backend="kernel" if factory.kind == "kernel" else "memory",
            pin_dir=placement.pin_dir,
            pin=bool(placement.pin_dir),
            max_entries=self.config.lb_map_max,
            maglev_table_size=self.config.maglev_table_size,
            scale_to_zero=self.config.enable_scale_to_zero,
            sizes=sizes,
        )
        try:
            return factory, LBMaps.open(config, wrap=wrap, factory=factory)
        except MapError as e:
            try:
                group = group_of(e.map_name)
            except KeyError:
                raise e from None
            if e.op != "create":
                raise
            # The kernel refused the size (E2BIG, ENOMEM): name the flag that asked for it.
            flag = self.config.map_size_flag(group)
            raise LoadBalancerError(
                f"{e}: cannot create it with {sizes.of(e.map_name)} entries "
                f"(--{flag}); choose a smaller size"
            ) from e

    def open_maps(self, wrap: MapWrapper | None = None) -> LBMaps:
        """Open (or adopt the pinned) LB maps; ``wrap`` wraps each backend."""
        if self.maps is not None:
            raise LoadBalancerError("the LB maps are already open")
        factory, maps = self._open(wrap)
        self.maps_kind, self.maps_reason = factory.kind, factory.reason
        self.maps = maps
        self.plain_maps = maps if wrap is None else maps.unwrapped()
        return maps

    def close_maps(self) -> None:
        """Close the maps' handles (pinned maps keep their entries)."""
        if self.maps is not None:
            self.maps.close()
        self.maps = self.plain_maps = None

    @contextlib.contextmanager
    def dump_view(self) -> Iterator[LBMaps]:
        """The maps without wrappers: the open ones, or (while closed) the pinned ones
        opened just for reading."""
        if self.plain_maps is not None:
            yield self.plain_maps
            return
        if not self.placement.pin_dir:
            raise LoadBalancerError("the LB maps are not open and not pinned")
        _, maps = self._open()
        try:
            yield maps
        finally:
            maps.close()

    # ----- reconciler -------------------------------------------------------------------
    def build_reconciler(self, prune_interval: float = PRUNE_INTERVAL) -> Reconciler[Any]:
        """FrontendOps on the open maps (restoring ids from them) and its reconciler."""
        from bpfops.adapter import frontend_ops_for, reconciler_config

        if self.maps is None:
            raise LoadBalancerError("open the LB maps before building the reconciler")
        cfg = self.config
        self.ops = frontend_ops_for(self.writer, self.maps, cfg)
        # The prune's look at every map entry (about 1.8 s of CPU at 10,000 services) runs
        # in steps beside the rounds: changes keep reaching the maps meanwhile.
        self.ops.audit_in_steps = True
        self.reconciler = Reconciler(
            self.db,
            reconciler_config(
                self.writer,
                self.ops,
                cfg,
                name=self.name,
                retry_min_backoff=max(cfg.retry_backoff_min, 0.001),
                retry_max_backoff=max(cfg.retry_backoff_max, cfg.retry_backoff_min, 0.001),
                prune_interval=prune_interval,
                prune_beside_rounds=True,
                refresh_interval=REFRESH_INTERVAL,
                # A round's frontends go into the maps with one batch call per map.
                batch_operations=self.ops,
            ),
        )
        return self.reconciler

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Run the reconciler (built by `build_reconciler` unless it was) and the state file
        source until cancelled; started once both are."""
        if self.running:
            raise LoadBalancerError("the load balancer is already running")
        reconciler = self.reconciler or self.build_reconciler()
        self.running = True
        try:
            async with anyio.create_task_group() as tg:
                await tg.start(reconciler.run)
                if self.state_file is not None:
                    await tg.start(self.state_file.run)
                if self.health_server is not None:
                    await tg.start(self.health_server.run)
                task_status.started()
        finally:
            self.running = False

    # ----- what callers ask -------------------------------------------------------------------
    def idle(self) -> bool:
        """True when every change of the frontends table was applied, nothing retries and
        the health server has seen every change."""
        rec = self.reconciler
        if not self.running or rec is None:
            return True
        if self.health_server is not None and not self.health_server.idle():
            return False
        rev = self.frontends.revision(self.db.read_txn())
        return bool(rec.reconciled_revision >= rev and len(rec.retries) == 0)

    def request_prune(self) -> None:
        """Ask the reconciler for a prune of the maps."""
        if self.reconciler is None or not self.running:
            raise LoadBalancerError("the load balancer is not running")
        self.reconciler.prune()

    def prune_count(self) -> int:
        """How many prunes have run."""
        return int(self.reconciler.metrics.prunes.count) if self.reconciler is not None else 0

    def metric_samples(self) -> list[tuple[str, dict[str, str], float]]:
        """The reconciler's metric samples under Cilium's names."""
        if self.reconciler is None:
            return []
        samples: list[tuple[str, dict[str, str], float]] = self.reconciler.metrics.samples()
        return samples

    def maps_dump(self) -> str:
        """The LB maps in the corpus line format (sorted, newline-terminated)."""
        from bpfops.maps_dump import dump_text

        with self.dump_view() as maps:
            return str(dump_text(maps))

    def scale_to_zero_dump(self) -> str:
        """The scale-to-zero map as ``SCALETOZERO: ID=<n>`` lines (empty when disabled)."""
        from bpfops.maps_dump import scale_to_zero_text

        with self.dump_view() as maps:
            return scale_to_zero_text(maps)

    def maps_leftovers(self) -> list[str]:
        """Map entries that remain (empty when the maps are empty)."""
        from bpfops.maps_dump import maps_empty

        with self.dump_view() as maps:
            return list(maps_empty(maps))
