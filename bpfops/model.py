"""What the LB Ops need to know about a frontend, independent of the tables' row classes.

``bpfops.frontend_ops`` works on these plain values; ``bpfops.adapter`` builds them from
the frontends/services/backends rows. Keeping the map-writing logic on its own small
model makes it testable without the tables and stable when the rows grow fields.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from bpf.lb import BACKEND_ACTIVE, BACKEND_MAINTENANCE, BACKEND_QUARANTINED, BACKEND_TERMINATING
from statedb.rows import slot_constructor

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


@dataclass(frozen=True, slots=True, order=True)
class Addr:
    """An L3+L4 address with scope: a frontend or backend address."""

    ip: IPAddress
    port: int
    proto: str = "TCP"
    scope: int = SCOPE_EXTERNAL
    _hash: int = field(default=0, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # ipaddress hashes through hex(); the ops hash addresses in every state lookup,
        # so the hash of the integer form is computed once.
        object.__setattr__(self, "_hash", hash((int(self.ip), self.port, self.proto, self.scope)))

    @classmethod
    def of(cls, ip: str | IPAddress, port: int, proto: str = "TCP", scope: int = 0) -> Addr:
        """Build from a textual or parsed IP, validating port and protocol."""
        parsed = ipaddress.ip_address(ip) if isinstance(ip, str) else ip
        if not 0 <= port <= 0xFFFF:
            raise ValueError(f"port {port} out of range for {parsed}")
        proto_number(proto)
        return cls(parsed, port, proto.upper(), scope)

    def __hash__(self) -> int:
        return self._hash

    @property
    def is_v6(self) -> bool:
        """Whether this is an IPv6 address."""
        return self.ip.version == 6

    @property
    def is_unspecified(self) -> bool:
        """0.0.0.0 or :: (NodePort/HostPort surrogate frontends)."""
        return self.ip.is_unspecified

    def with_ip(self, ip: IPAddress) -> Addr:
        """The same port/protocol/scope on another IP."""
        return Addr(ip, self.port, self.proto, self.scope)

    def host_port(self) -> str:
        """``ip:port`` with IPv6 in brackets (no protocol)."""
        return f"[{self.ip}]:{self.port}" if self.is_v6 else f"{self.ip}:{self.port}"

    def __str__(self) -> str:
        suffix = "/i" if self.scope == SCOPE_INTERNAL else ""
        return f"{self.host_port()}/{self.proto}{suffix}"

    def sort_key(self) -> tuple[int, bytes, int]:
        """Cilium's backend order: IPv4 before IPv6, then the address bytes, then the port."""
        return (self.ip.version, self.ip.packed, self.port)


@dataclass(frozen=True, slots=True)
class ServiceSpec:
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


@dataclass(frozen=True, slots=True)
class BackendSpec:
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


@dataclass(frozen=True, slots=True)
class FrontendSpec:
    """A frontend to program: address, type, its service's settings and its backends."""

    addr: Addr
    type: str
    service: ServiceSpec
    backends: tuple[BackendSpec, ...] = ()
    service_port: int = 0


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
    managed_lb_classes: tuple[str, ...] = field(
        default=("io.cilium/bgp-control-plane", "io.cilium/l2-announcer")
    )


def _slot_setters(cls: type, names: list[str]) -> dict[str, Any]:
    return {f"_s{i}": cls.__dict__[n].__set__ for i, n in enumerate(names)}


def _fast_addr_factory() -> Callable[[IPAddress, int, str, int], Addr]:
    ns: dict[str, Any] = {"_new": object.__new__, "_cls": Addr, "_int": int, "_hash": hash}
    ns.update(_slot_setters(Addr, ["ip", "port", "proto", "scope", "_hash"]))
    src = (
        "def fast_addr(ip, port, proto, scope, _new=_new, _cls=_cls, _int=_int, _hash=_hash,"
        " _s0=_s0, _s1=_s1, _s2=_s2, _s3=_s3, _s4=_s4):\n"
        "    o = _new(_cls)\n"
        "    _s0(o, ip)\n    _s1(o, port)\n    _s2(o, proto)\n    _s3(o, scope)\n"
        "    _s4(o, _hash((_int(ip), port, proto, scope)))\n"
        "    return o\n"
    )
    exec(compile(src, "<fast_addr>", "exec"), ns)
    fn: Callable[[IPAddress, int, str, int], Addr] = ns["fast_addr"]
    return fn


fast_addr = _fast_addr_factory()

#: ``BackendSpec(...)`` with every field given positionally, in declaration order, built
#: the same way as ``fast_addr``.
fast_backend_spec = slot_constructor(BackendSpec, "fast_backend_spec")
