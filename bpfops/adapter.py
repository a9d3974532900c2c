"""Glue between the LB tables (tables/) and the LB Ops: rows -> FrontendSpec, node view, config.

``frontend_ops_for(writer, maps, lb_config)`` builds the FrontendOps a frontends
reconciler runs with; ``reconciler_config(...)`` the reconciler Config for it (its
``set_object_status`` also records the assigned service id in the row's ``id``).
"""

from __future__ import annotations

from collections.abc import Callable
from operator import attrgetter
from typing import Any

from bpfops.frontend_ops import FrontendOps
from bpfops.lb_maps import LBMaps
from bpfops.model import (
    LOCAL_REDIRECT,
    Addr,
    BackendSpec,
    FrontendSpec,
    IPAddress,
    LazyBackends,
    LBOpsConfig,
    ServiceSpec,
    fast_backend_spec,
)
from reconciler.config import Config
from reconciler.status import Status
from statedb import ReadTxn, Table
from tables.backends import Backend, BackendParams, BackendState, backend_shared_part
from tables.frontends import Frontend, SVCType, new_frontend
from tables.lb_config import LBConfig
from tables.lb_writer import LBWriter
from tables.node_addresses import NodeAddress
from tables.services import (
    ForwardingMode,
    LBAlgorithm,
    Service,
    SourceRangesPolicy,
    TrafficPolicy,
    service_shared_part,
)

_STATE = {
    BackendState.ACTIVE: 0,
    BackendState.TERMINATING: 1,
    BackendState.QUARANTINED: 2,
    BackendState.MAINTENANCE: 3,
    BackendState.TERMINATING_NOT_SERVING: 1,
}
_NOT_SERVING = BackendState.TERMINATING_NOT_SERVING


def ops_config(cfg: LBConfig) -> LBOpsConfig:
    """The LB Ops' view of the agent's LB options."""
    return LBOpsConfig(
        algorithm=cfg.algorithm,
        algorithm_annotation=cfg.algorithm_annotation,
        external_clusterip=cfg.external_clusterip,
        wildcard_entries=cfg.enable_wildcard_entries,
        lb_mode=cfg.mode,
        mode_annotation=cfg.mode_annotation,
        source_range_all_types=cfg.source_range_all_types,
        maglev_table_size=cfg.maglev_table_size,
        nodeport_min=cfg.node_port_min,
        nodeport_max=cfg.node_port_max,
        kube_proxy_replacement=cfg.kube_proxy_replacement,
        enable_ipv4=getattr(cfg, "enable_ipv4", True),
        enable_ipv6=getattr(cfg, "enable_ipv6", True),
        scale_to_zero=cfg.enable_scale_to_zero,
    )


def service_spec(svc: Service | None, name: str, service_port: int, cfg: LBConfig) -> ServiceSpec:
    """The service settings the map entries depend on."""
    if svc is None:
        return ServiceSpec(name)
    # `_SETTINGS.of`'s cache test inline (a hit is the usual case).
    last, affinity = _SETTINGS.last, cfg.enable_session_affinity
    if last[0] is service_shared_part(svc) and last[1] is affinity:
        v = last[2]
    else:
        v = _SETTINGS.of(svc, affinity)
    l7 = 0
    redirect = v[11]
    if redirect is not None and redirect.redirects(service_port):
        l7 = redirect.proxy_port
    # Every ServiceSpec field, positionally in declaration order: name,
    # session_affinity, affinity_timeout, ext_local, int_local, source_ranges,
    # source_ranges_deny, lb_algorithm, forwarding_mode, proxy_delegation,
    # loopback_hostport, load_balancer_class, l7_proxy_port, scale_to_zero.
    return _TUPLE_NEW(  # fast_service_spec, without its call
        ServiceSpec, (svc.name, *v[:11], l7, v[12])
    )


class _SharedSettings:
    """The ServiceSpec fields a service row's shared part gives (`service_shared_part`),
    for the last shared part read: the services of a cluster mostly have the same
    settings, and so one shared part, and a frontend's spec then reads none of them."""

    __slots__ = ("last",)

    def __init__(self) -> None:
        #: (shared part, session affinity enabled, the fields): one tuple, replaced as a
        #: whole, so a reader in another thread sees the old entry or the new one.
        self.last: tuple[object, bool, tuple[Any, ...]] = (None, False, ())

    def of(self, svc: Service, affinity_enabled: bool) -> tuple[Any, ...]:
        """session_affinity, affinity_timeout, ext_local, int_local, source_ranges,
        source_ranges_deny, lb_algorithm, forwarding_mode, proxy_delegation,
        loopback_hostport, load_balancer_class, the proxy redirect and scale_to_zero."""
        part = service_shared_part(svc)
        last = self.last
        if last[0] is part and last[1] is affinity_enabled:
            return last[2]
        affinity = svc.session_affinity and affinity_enabled
        values = (
            affinity,
            svc.session_affinity_timeout if affinity else 0,
            svc.ext_traffic_policy is TrafficPolicy.LOCAL,
            svc.int_traffic_policy is TrafficPolicy.LOCAL,
            tuple(svc.source_ranges),
            svc.source_ranges_policy == SourceRangesPolicy.DENY,
            "" if svc.lb_algorithm is LBAlgorithm.UNDEF else svc.lb_algorithm.value,
            "" if svc.forwarding_mode is ForwardingMode.UNDEF else svc.forwarding_mode.value,
            svc.proxy_delegation == "delegate-if-local",
            svc.loopback_host_port,
            svc.load_balancer_class,
            svc.proxy_redirect,
            svc.scale_to_zero,
        )
        self.last = (part, affinity_enabled, values)
        return values


_SETTINGS = _SharedSettings()


def backend_spec(be: BackendParams) -> BackendSpec:
    """One backend instance as the ops see it."""
    a = be.address  # the table address is the ops' address (bpfops.model.Addr)
    state = be.state
    # fast_backend_spec's fields: addr, state, weight, unhealthy, cluster_id, zone,
    # revision, health_known, not_serving.
    return fast_backend_spec(
        a,
        _STATE.get(state, 0),
        be.weight,
        be.unhealthy,
        be.cluster_id,
        0,
        0,
        bool(be.unhealthy_updated_at),
        state is _NOT_SERVING,
    )


#: Each frontend type's plain string (an enum member's ``value`` is a descriptor call).
_TYPE_NAMES: dict[SVCType, str] = {t: t.value for t in SVCType}


def frontend_spec(fe: Frontend, cfg: LBConfig) -> FrontendSpec:
    """A frontend row as the ops see it."""
    svc_type = LOCAL_REDIRECT if fe.redirect_to else _TYPE_NAMES[fe.type]
    port = fe.service_port or fe.address.port
    service = service_spec(fe.service, fe.service_name, port, cfg)
    # FrontendSpec's fields: addr, type, service, backends, service_port, shared_backends
    # (the row's tuple of instances, each with its ``address``: the ops keep it).
    bes = fe.backends
    # RowBackends(bes) without its __init__ (a class call costs more than the object).
    lazy = _NEW(RowBackends)
    lazy.rows = bes
    # fast_frontend_spec, without its call.
    return _TUPLE_NEW(FrontendSpec, (fe.address, svc_type, service, lazy, port, bes))


class RowBackends(LazyBackends):
    """A frontend row's backends (its tuple of instances) as BackendSpecs, built on first
    use (`backend_specs`). Whether they are all the usual kind is read from the
    instances' shared part (`backend_shared_part`) when they have one, with no spec
    built: the bulk path for a new frontend needs nothing else."""

    __slots__ = ("rows",)

    def __init__(self, rows: tuple[BackendParams, ...]) -> None:
        self._specs = None
        self.rows = rows

    def _build(self) -> tuple[BackendSpec, ...]:
        return backend_specs(self.rows)

    def __len__(self) -> int:
        return len(self.rows)

    def usual_addresses(self) -> list[Addr] | None:
        """See `LazyBackends.usual_addresses`: when every instance has one shared part
        (equal ones: equal fields), that part's fields as `backend_spec` reads them."""
        rows = self.rows
        if not rows:
            return []
        shared_part = backend_shared_part
        part = shared_part(rows[0])
        if not _USUAL.of(part, rows[0]):
            return None
        # One loop for the parts and the addresses (an address is a slot read, cheaper
        # in the loop than through a map of a C getter).
        addrs: list[Addr] = []
        append = addrs.append
        for b in rows:
            if shared_part(b) is not part:
                return None
            append(b.address)
        return addrs

    def made_from(self, shared: tuple[Any, ...]) -> bool:
        """Whether ``shared`` is the row's tuple of instances (`usual_addresses` reads it)."""
        return shared is self.rows


class _UsualPart:
    """Whether the instances of a shared part (`backend_shared_part`) are the usual kind
    (`LazyBackends.usual_addresses`), for the last part asked: the parts are interned,
    and a cluster's backends mostly share a few, so this mostly reads no field."""

    __slots__ = ("last",)

    def __init__(self) -> None:
        #: (part, usual): one tuple, replaced as a whole (it holds the part, so an
        #: identical object is that part).
        self.last: tuple[object, bool] = (None, False)

    def of(self, part: object, b: BackendParams) -> bool:
        """Whether ``b`` (an instance of ``part``) is the usual kind: `backend_spec`'s
        state, unhealthy, cluster_id and not_serving all zero (its zone is 0)."""
        last = self.last
        if last[0] is part:
            return last[1]
        state = b.state
        usual = not (
            _STATE.get(state, 0) or b.unhealthy or b.cluster_id or state is _NOT_SERVING
        )
        self.last = (part, usual)
        return usual


_USUAL = _UsualPart()


def backend_specs(backends: tuple[BackendParams, ...]) -> tuple[BackendSpec, ...]:
    """`backend_spec` of each instance. Everything but the address is read once per run
    of instances sharing it (`backend_shared_part`: the backends of one node and port
    usually do), not once per backend; each spec is built in one call (a named tuple's
    ``tuple.__new__``)."""
    out: list[BackendSpec] = []
    append = out.append
    shared_part = backend_shared_part
    new, spec = _TUPLE_NEW, BackendSpec
    last: object = None
    # BackendSpec's fields after addr: state, weight, unhealthy, cluster_id, zone,
    # revision, health_known, not_serving.
    state, weight, unhealthy, cluster_id, health_known, not_serving = 0, 0, False, 0, False, False
    for b in backends:
        part = shared_part(b)
        if part is not last:
            last = part
            be_state = b.state
            state = _STATE.get(be_state, 0)
            weight = b.weight
            unhealthy = b.unhealthy
            cluster_id = b.cluster_id
            health_known = bool(b.unhealthy_updated_at)
            not_serving = be_state is _NOT_SERVING
        append(
            new(
                spec,
                (b.address, state, weight, unhealthy, cluster_id, 0, 0, health_known, not_serving),
            )
        )
    return tuple(out)


_TUPLE_NEW = tuple.__new__
_NEW = object.__new__
# A frontend row's address and status, read by C getters: the reconciler asks for a row's
# status several times per change (the refresh, the superseded check, the status commit),
# and a getter call costs a fraction of a Python function's.
_ROW_ADDRESS: Callable[[Frontend], Addr] = attrgetter("address")
_ROW_STATUS: Callable[[Frontend], Status] = attrgetter("status")


class TablesNodeView:
    """NodeView over the node-addresses and frontends tables."""

    def __init__(
        self,
        node_addresses: Table[NodeAddress],
        frontends: Table[Frontend],
        cfg: LBConfig,
        backends: Table[Backend] | None = None,
    ) -> None:
        self.node_addresses = node_addresses
        self.frontends = frontends
        self.cfg = cfg
        self.backends = backends

    def nodeport_addresses(self, txn: ReadTxn, v6: bool) -> list[IPAddress]:
        """NodePort-flagged node addresses of the family, sorted, without duplicates."""
        ips = {
            na.address
            for na in self.node_addresses.all(txn)
            if na.nodeport and (na.address.version == 6) == v6
        }
        return sorted(ips)

    def is_local_address(self, txn: ReadTxn, ip: IPAddress) -> bool:
        """Whether ``ip`` is an address of this node."""
        if self.node_addresses.count(txn) == 0:  # no ordered view needed for an empty table
            return False
        return any(na.address == ip for na in self.node_addresses.all(txn))

    def local_keys(self, txn: ReadTxn) -> frozenset[bytes]:
        """The node's addresses as the 16 bytes an `Addr` key starts with (IPv4 mapped):
        what `FrontendOps.local_check` compares a VIP with."""
        if self.node_addresses.count(txn) == 0:
            return frozenset()
        return frozenset(Addr.of(na.address, 0)[:16] for na in self.node_addresses.all(txn))

    def is_primary_frontend(self, txn: ReadTxn, addr: Addr) -> bool:
        """Whether a non-expansion frontend (LoadBalancer, ExternalIP, ...) owns ``addr``."""
        if self.cfg.node_port_min <= addr.port <= self.cfg.node_port_max:
            return False
        existing = self.frontends.get(txn, addr)
        if existing is None:
            return False
        return not (
            existing.type is SVCType.NODE_PORT
            or (existing.type is SVCType.HOST_PORT and existing.address.is_unspecified)
        )

    def frontend_type(self, txn: ReadTxn, addr: Addr) -> str | None:
        """The type of the frontend the snapshot holds at ``addr`` (as `frontend_spec`
        gives it), or None."""
        row = self.frontends.get(txn, addr)
        if row is None:
            return None
        return LOCAL_REDIRECT if row.redirect_to else row.type.value

    def backend_referenced(self, txn: ReadTxn, be_addr: Addr, other_than: Addr) -> bool:
        """Whether a frontend other than ``other_than`` selects the backend at ``be_addr``
        (looked up through the services the backend belongs to)."""
        if self.backends is None:
            return False
        row = self.backends.get(txn, be_addr)
        if row is None:
            return False
        by_service = self.frontends.index("service")
        for name in row.service_names():
            for fe in self.frontends.list(txn, by_service.query(name)):
                if fe.address == other_than:
                    continue
                if any(b.address == be_addr for b in fe.backends):
                    return True
        return False


def frontend_ops_for(
    writer: LBWriter, maps: LBMaps, cfg: LBConfig, restore: bool = True
) -> FrontendOps[Frontend]:
    """FrontendOps for the writer's frontends table, writing ``maps``."""
    return FrontendOps(
        maps,
        ops_config(cfg),
        node=TablesNodeView(writer.node_addresses, writer.frontends, cfg, writer.backends),
        to_spec=lambda _txn, fe: frontend_spec(fe, cfg),
        key_of=_ROW_ADDRESS,
        restore=restore,
    )


def reconciler_config(
    writer: LBWriter, ops: FrontendOps[Frontend], cfg: LBConfig, **overrides: Any
) -> Config[Frontend]:
    """The reconciler Config of the frontends table for ``ops`` (overrides: Config fields).

    While the LB tables are not initialized (a source has not applied its initial state
    yet), a frontend with no backends that this run has not written is held
    (``Config.hold_until_initialized``): after a restart the pinned maps still hold its
    previous entries, whose backends keep serving until the sources' state is in, instead
    of a frontend whose EndpointSlices are not loaded yet emptying them. Once the tables
    are initialized it is written at once, with no backends if it still has none; a
    frontend already written in this run is always written at once.
    """

    written = ops.frontends
    written_state = written.get

    def set_status(fe: Frontend, status: Status) -> Frontend:
        # `FrontendOps.service_id` without its call: the id the maps hold for the
        # frontend (0 when they hold none). Runs once per row of every status commit.
        state = written_state(fe.address)
        fe_id = state.id if state is not None else 0
        # Frontend's fields, positionally: the row with its id and status replaced.
        return new_frontend(
            fe.address, fe.type, fe.service_name, fe.port_name, fe.service_port, fe.service,
            fe.backends, fe_id, fe.redirect_to, status,
        )

    def hold(fe: Frontend) -> bool:
        # See the docstring: held while the tables are not initialized.
        return not fe.backends and fe.address not in written

    settings: dict[str, Any] = {
        "name": "bpf-lb",
        "hold_until_initialized": hold,
        "retry_min_backoff": cfg.retry_backoff_min,
        "retry_max_backoff": max(cfg.retry_backoff_max, cfg.retry_backoff_min),
        "prune_interval": 1800.0,
        # A new frontend of the initial sync costs a fraction of a churned one: its chunks
        # grow (fewer calls, each with its fixed cost per map) within the same time budget.
        "target_chunk_max": 256,
    }
    settings.update(overrides)
    return Config(
        table=writer.frontends,
        operations=ops,
        get_object_status=_ROW_STATUS,
        set_object_status=set_status,
        **settings,
    )
