"""What the LB Ops need to know about a frontend, independent of the tables' row classes.

``bpfops.frontend_ops`` works on these plain values; ``bpfops.adapter`` builds them from
the frontends/services/backends rows. Keeping the map-writing logic on its own small
model makes it testable without the tables and stable when the rows grow fields. The
one shared piece is the address: `Addr` is the tables' `tables.l3n4.L3n4Addr`, so an
address parsed from a Kubernetes object is the very object the Ops key their state by
(no second address per backend, no conversion per row).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, make_dataclass
from typing import Any, NamedTuple, TypeVar, overload

from bpf.lb import BACKEND_ACTIVE, BACKEND_MAINTENANCE, BACKEND_QUARANTINED, BACKEND_TERMINATING
from tables.l3n4 import L3n4Addr, new_addr

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

PROTO_NUMBERS: dict[str, int] = {"ANY": 0, "TCP": 6, "UDP": 17, "SCTP": 132}
PROTO_NAMES: dict[int, str] = {v: k for k, v in PROTO_NUMBERS.items()}

SCOPE_EXTERNAL = 0
SCOPE_INTERNAL = 1

STATE_NAMES: dict[int, str] = {
    BACKEND_ACTIVE: "active",
    BACKEND_TERMINATING: "terminating",
    BACKEND_QUARANTINED: "quarantined",
    BACKEND_MAINTENANCE: "maintenance",
}
STATE_NUMBERS: dict[str, int] = {v: k for k, v in STATE_NAMES.items()}

# Frontend types (Cilium's names).
CLUSTER_IP = "ClusterIP"
NODE_PORT = "NodePort"
EXTERNAL_IPS = "ExternalIPs"
HOST_PORT = "HostPort"
LOAD_BALANCER = "LoadBalancer"
LOCAL_REDIRECT = "LocalRedirect"
FRONTEND_TYPES = (CLUSTER_IP, NODE_PORT, EXTERNAL_IPS, HOST_PORT, LOAD_BALANCER, LOCAL_REDIRECT)


def proto_number(proto: str) -> int:
    """IANA number of ``proto`` (TCP/UDP/SCTP/ANY, any case); ValueError when unknown."""
    try:
        return PROTO_NUMBERS[proto.upper()]
    except KeyError:
        raise ValueError(f"unknown L4 protocol {proto!r}") from None


def proto_name(number: int) -> str:
    """TCP/UDP/SCTP, or ANY for any other number (as Cilium prints unknown ones)."""
    return PROTO_NAMES.get(number, "ANY")


#: An L3+L4 address with scope, a frontend's or a backend's: the tables' address class
#: itself (one model from the Kubernetes objects to the maps, no conversion per row).
#: The Ops use its names ``ip``, ``port``, ``proto`` and ``scope``.
Addr = L3n4Addr


T = TypeVar("T")


def _dataclass_fields(cls: type[T]) -> type[T]:
    """Give named tuple ``cls`` the field list of a frozen dataclass of its fields, so that
    ``dataclasses.fields``/``replace``/``asdict`` treat it as one (tests and tools use
    them; ``replace`` calls the class with every field by name)."""
    names: tuple[str, ...] = cls._fields  # type: ignore[attr-defined]
    defaults: dict[str, Any] = cls._field_defaults  # type: ignore[attr-defined]
    hints = cls.__annotations__
    spec = [(n, hints[n], field(default=defaults[n])) if n in defaults else (n, hints[n])
            for n in names]
    as_dataclass = make_dataclass(cls.__name__, spec, frozen=True)
    cls.__dataclass_fields__ = as_dataclass.__dataclass_fields__  # type: ignore[attr-defined]
    return cls


# The specs are named tuples: the adapter builds one per frontend and per backend each
# time a frontend is written, and a tuple is made in one C call (``tuple.__new__``),
# where a slotted dataclass takes a Python call and a setter call per field.


@_dataclass_fields
class ServiceSpec(NamedTuple):
    """The service-level settings that shape a frontend's map entries."""

    name: str
    session_affinity: bool = False
    affinity_timeout: int = 0  # seconds
    ext_local: bool = False  # externalTrafficPolicy=Local
    int_local: bool = False  # internalTrafficPolicy=Local
    source_ranges: tuple[IPNetwork, ...] = ()
    source_ranges_deny: bool = False
    lb_algorithm: str = ""  # annotation: "" (none), "random" or "maglev"
    forwarding_mode: str = ""  # annotation: "" (none), "snat" or "dsr"
    proxy_delegation: bool = False  # delegate-if-local
    loopback_hostport: bool = False
    load_balancer_class: str | None = None
    l7_proxy_port: int = 0
    #: The service opted into scale-to-zero (annotation service.cilium.io/scale-to-zero).
    scale_to_zero: bool = False


@_dataclass_fields
class BackendSpec(NamedTuple):
    """One backend of a frontend. ``revision`` lets the ops skip unchanged backend entries."""

    addr: Addr
    state: int = BACKEND_ACTIVE
    weight: int = 100
    unhealthy: bool = False
    cluster_id: int = 0
    zone: int = 0
    revision: int = 0
    #: True once a health check reported on this backend; until then a quarantine
    #: restored from the maps after a restart stands in for its health.
    health_known: bool = False
    #: Terminating and no longer serving: in the inactive tail (QCOUNT), never active.
    not_serving: bool = False


class LazyBackends(Sequence[BackendSpec]):
    """A frontend's backends, built on first use (`_build`), from a source that can tell
    without building them whether they are all the usual kind (`usual_addresses`): the
    bulk path for new frontends then builds none (a spec is about a microsecond per
    backend to make and free). Stands for the tuple of BackendSpec `specs` gives:
    length, items, iteration, equality (with that tuple too) and hash are the tuple's."""

    __slots__ = ("_specs",)

    def __init__(self) -> None:
        self._specs: tuple[BackendSpec, ...] | None = None

    def _build(self) -> tuple[BackendSpec, ...]:
        """The specs, in order (called once)."""
        raise NotImplementedError

    def specs(self) -> tuple[BackendSpec, ...]:
        """The backends as a tuple of BackendSpec (built on the first call). (``_specs``
        unset counts as None: a subclass may make its objects without ``__init__``.)"""
        try:
            s = self._specs
        except AttributeError:
            s = None
        if s is None:
            s = self._specs = self._build()
        return s

    def usual_addresses(self) -> list[Addr] | None:
        """The backends' addresses, in order, when every backend is the usual one: state
        active, healthy, serving, of cluster 0 and in no zone (as its spec would say);
        else None. Builds no spec. (This base class always says None.)"""
        return None

    def made_from(self, shared: tuple[Any, ...]) -> bool:
        """Whether ``shared`` (a spec's ``shared_backends``) is the source whose objects'
        addresses `usual_addresses` reads. (This base class always says False.)"""
        return False

    def __len__(self) -> int:
        return len(self.specs())

    @overload
    def __getitem__(self, i: int) -> BackendSpec: ...

    @overload
    def __getitem__(self, i: slice) -> tuple[BackendSpec, ...]: ...

    def __getitem__(self, i: int | slice) -> BackendSpec | tuple[BackendSpec, ...]:
        return self.specs()[i]

    def __iter__(self) -> Iterator[BackendSpec]:
        return iter(self.specs())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, LazyBackends):
            other = other.specs()
        if not isinstance(other, tuple):
            return NotImplemented
        return self.specs() == other

    def __hash__(self) -> int:
        return hash(self.specs())

    def __repr__(self) -> str:
        return repr(self.specs())


@_dataclass_fields
class FrontendSpec(NamedTuple):
    """A frontend to program: address, type, its service's settings and its backends."""

    addr: Addr
    type: str
    service: ServiceSpec
    #: A tuple, or backends built on first use (`LazyBackends`).
    backends: tuple[BackendSpec, ...] | LazyBackends = ()
    service_port: int = 0
    #: The tuple the backends were made from, when the caller keeps it anyway (the
    #: frontend row's): one object per backend, in order, each with the backend's
    #: address as ``address``. The ops then keep it as the frontend's list of backend
    #: addresses instead of a tuple of their own (``FrontendState``). None: no such tuple.
    shared_backends: tuple[Any, ...] | None = None


@dataclass(frozen=True, slots=True)
class LBOpsConfig:
    """The LB options the map writing depends on (a subset of tables.lb_config)."""

    algorithm: str = "random"  # default algorithm: random | maglev
    algorithm_annotation: bool = False  # honour the per-service algorithm annotation
    external_clusterip: bool = False
    wildcard_entries: bool = True
    lb_mode: str = "snat"  # snat | dsr | hybrid
    mode_annotation: bool = False  # honour the per-service forwarding-mode annotation
    source_range_all_types: bool = False
    maglev_table_size: int = 16381
    maglev_hash_seed: str = "JLfvgnHc2kaSUFaI"
    nodeport_min: int = 30000
    nodeport_max: int = 32767
    kube_proxy_replacement: bool = True
    enable_ipv4: bool = True
    enable_ipv6: bool = True
    default_lb_class_is_lbipam: bool = True
    #: --enable-scale-to-zero: track opted-in frontends' ids in the scale-to-zero map.
    scale_to_zero: bool = False
    #: The end (exclusive) of the service id range [1, limit): rev-NAT ids are 16 bits.
    #: Smaller only in tests, to run out of ids with a few frontends.
    service_id_limit: int = 0xFFFF
    managed_lb_classes: tuple[str, ...] = field(
        default=("io.cilium/bgp-control-plane", "io.cilium/l2-announcer")
    )


#: ``Addr(ip, port, proto, scope)`` without re-validating well-formed parts.
fast_addr = new_addr

_tuple_new = tuple.__new__


def fast_backend_spec(
    addr: Addr,
    state: int,
    weight: int,
    unhealthy: bool,
    cluster_id: int,
    zone: int,
    revision: int,
    health_known: bool,
    not_serving: bool,
) -> BackendSpec:
    """``BackendSpec(...)`` with every field given positionally, in declaration order
    (``tuple.__new__(BackendSpec, fields)`` builds one without this call)."""
    return _tuple_new(
        BackendSpec,
        (addr, state, weight, unhealthy, cluster_id, zone, revision, health_known, not_serving),
    )


def fast_service_spec(*fields: Any) -> ServiceSpec:
    """``ServiceSpec(...)`` with every field given positionally, in declaration order."""
    return _tuple_new(ServiceSpec, fields)


def fast_frontend_spec(
    addr: Addr, type_: str, service: ServiceSpec, backends: tuple[BackendSpec, ...] | LazyBackends,
    service_port: int, shared_backends: tuple[Any, ...] | None,
) -> FrontendSpec:
    """``FrontendSpec(...)`` with every field given positionally, in declaration order."""
    return _tuple_new(FrontendSpec, (addr, type_, service, backends, service_port,
                                     shared_backends))
