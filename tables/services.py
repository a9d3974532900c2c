"""The services table: one row per load-balanced service, keyed by its name ``namespace/name``.

A service row holds what is common to all of its frontends: where it came from
(source), its port names, traffic policies, session affinity, source ranges,
forwarding mode, explicit algorithm, health-check node port and the
annotations that influence them. Frontends and backends refer to it by name;
`tables.lb_writer.LBWriter` keeps the three tables consistent.

``table_header``/``table_row`` render the columns the Cilium corpus compares:
``Name Source PortNames TrafficPolicy Flags``.
"""

from __future__ import annotations

import dataclasses
import enum
import ipaddress
import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from statedb import Index, Table
from statedb.rows import FrozenValue, slot_builder, slot_setters
from tables.l3n4 import IPNetwork

#: A service name, ``namespace/name`` (``cluster/namespace/name`` for remote clusters).
ServiceName = str

SERVICES_TABLE = "services"


class TrafficPolicy(enum.StrEnum):
    """Backend selection for a traffic direction: all backends, or node-local ones only."""

    CLUSTER = "Cluster"
    LOCAL = "Local"



class ForwardingMode(enum.StrEnum):
    """How traffic is dispatched to remote backends; UNDEF means the agent default."""

    UNDEF = ""
    SNAT = "snat"
    DSR = "dsr"



class LBAlgorithm(enum.StrEnum):
    """Backend selection algorithm; UNDEF means the agent default (--bpf-lb-algorithm)."""

    UNDEF = "undef"
    RANDOM = "random"
    MAGLEV = "maglev"



class SourceRangesPolicy(enum.StrEnum):
    """Whether the source ranges are an allow-list (default) or a deny-list."""

    ALLOW = "allow"
    DENY = "deny"



#: Source names and their priority (smaller wins when several sources give a backend).
SOURCE_PRIORITY: dict[str, int] = {
    "kube-apiserver": 0,
    "local": 1,
    "kvstore": 2,
    "custom-resource": 3,
    "k8s": 4,
    "api": 5,
    "directory": 6,
    "generated": 7,
    "unspec": 8,
}


def source_priority(source: str) -> int:
    """Return the priority of ``source``; raise ValueError for an unknown source name."""
    try:
        return SOURCE_PRIORITY[source]
    except KeyError:
        raise ValueError(
            f"unknown source {source!r} (known: {', '.join(SOURCE_PRIORITY)})"
        ) from None


def format_duration(seconds: float) -> str:
    """Format seconds like Go's time.Duration (``42s``, ``3h0m0s``, ``1m30s``, ``0s``)."""
    total = int(seconds)
    frac = seconds - total
    if total == 0 and frac == 0:
        return "0s"
    h, rem = divmod(total, 3600)
    m, s = divmod(rem, 60)
    sec = f"{s + frac:g}s" if frac else f"{s}s"
    if h:
        return f"{h}h{m}m{sec}"
    if m:
        return f"{m}m{sec}"
    return sec


#: trafficDistribution that prefers backends in the node's zone (Kubernetes 1.34's name).
PREFER_SAME_ZONE = "PreferSameZone"
#: trafficDistribution that prefers backends on the node itself.
PREFER_SAME_NODE = "PreferSameNode"
#: Deprecated trafficDistribution names -> the name they are stored and handled as.
TRAFFIC_DISTRIBUTION_ALIASES = {"PreferClose": PREFER_SAME_ZONE}
#: Every trafficDistribution value the load balancer acts on (aliases included).
TRAFFIC_DISTRIBUTIONS = frozenset(
    {PREFER_SAME_ZONE, PREFER_SAME_NODE, *TRAFFIC_DISTRIBUTION_ALIASES}
)


@dataclass(frozen=True, slots=True)
class ProxyRedirect:
    """Redirect a service's frontends (optionally only some ports) to a local proxy port."""

    proxy_port: int
    ports: tuple[int, ...] = ()

    def redirects(self, port: int) -> bool:
        """True when a frontend with service port ``port`` is redirected."""
        return not self.ports or port in self.ports

    def __str__(self) -> str:
        if self.ports:
            return f"{self.proxy_port} (ports: [{' '.join(map(str, self.ports))}])"
        return str(self.proxy_port)


@dataclass(frozen=True)
class _ServiceFields:
    """The fields of Service, in order (the field list ``dataclasses.fields``, ``replace``
    and ``asdict`` read from Service)."""

    name: ServiceName
    source: str = "k8s"
    labels: tuple[tuple[str, str], ...] = ()
    annotations: tuple[tuple[str, str], ...] = ()
    selector: tuple[tuple[str, str], ...] = ()
    nat_policy: str = ""
    ext_traffic_policy: TrafficPolicy = TrafficPolicy.CLUSTER
    int_traffic_policy: TrafficPolicy = TrafficPolicy.CLUSTER
    forwarding_mode: ForwardingMode = ForwardingMode.UNDEF
    session_affinity: bool = False
    #: Session-affinity timeout in seconds.
    session_affinity_timeout: int = 0
    load_balancer_class: str | None = None
    proxy_redirect: ProxyRedirect | None = None
    health_check_node_port: int = 0
    loopback_host_port: bool = False
    source_ranges: tuple[IPNetwork, ...] = ()
    source_ranges_policy: SourceRangesPolicy = SourceRangesPolicy.ALLOW
    #: Port name -> service port, sorted by name.
    port_names: tuple[tuple[str, int], ...] = ()
    traffic_distribution: str = ""
    #: Per-service algorithm (service.cilium.io/lb-algorithm), UNDEF when not set.
    lb_algorithm: LBAlgorithm = LBAlgorithm.UNDEF
    #: False when the service.cilium.io/scope annotation asks for external-only frontends.
    internal_scope_enabled: bool = True
    #: service.cilium.io/proxy-delegation: "" or "delegate-if-local".
    proxy_delegation: str = ""
    #: service.cilium.io/scale-to-zero opt-in.
    scale_to_zero: bool = False


#: The Service fields a row keeps in its own slots (set per service); every other field
#: is in the row's shared tuple (`_SHARED_FIELDS`).
_OWN_FIELDS = ("name", "labels", "annotations", "selector", "port_names")
_SHARED_FIELDS = tuple(f.name for f in dataclasses.fields(_ServiceFields)
                       if f.name not in _OWN_FIELDS)
#: Shared tuples by the identities of their items (so an equal tuple of other types, such
#: as a str for a TrafficPolicy, is never shared); cleared past `_RESTS_MAX`, which only
#: costs the sharing of the tuples made before.
_RESTS: dict[tuple[int, ...], tuple[Any, ...]] = {}
#: The same tuples by value, the first of each value: a new tuple finds its shared one
#: there when it holds the very same objects (the usual case: the same constants, enum
#: members and strings), without building its key of identities.
_RESTS_BY_VALUE: dict[tuple[Any, ...], tuple[Any, ...]] = {}
_RESTS_MAX = 4096
_is = operator.is_


def _shared_rest(rest: tuple[Any, ...]) -> tuple[Any, ...]:
    """``rest``, or the tuple of the very same objects made before."""
    try:
        shared = _RESTS_BY_VALUE.get(rest)
    except TypeError:  # an unhashable field (a caller's list): shared by identities only
        hashable = False
    else:
        if shared is not None and all(map(_is, shared, rest)):
            return shared
        hashable = True
    key = tuple(map(id, rest))
    shared = _RESTS.get(key)
    if shared is not None:
        return shared
    if len(_RESTS) >= _RESTS_MAX:
        _RESTS.clear()
        _RESTS_BY_VALUE.clear()
    _RESTS[key] = rest  # it holds its items: their ids are not reused while it is kept
    if hashable:
        _RESTS_BY_VALUE.setdefault(rest, rest)
    return rest


class Service(FrozenValue, fields=_ServiceFields):
    """A load-balanced service (row of the services table).

    Mappings are stored as sorted tuples of pairs so rows stay hashable and
    immutable; use the ``*_dict`` helpers to read them as dicts.

    Immutable, with the value semantics of a frozen dataclass of its fields (equality,
    hash, repr, ``dataclasses.fields``/``replace``/``asdict``). Held compactly, one row
    per service: the fields set per service (`_OWN_FIELDS`: name, labels, annotations,
    selector, port names) in slots of their own, the other eighteen (policies, flags,
    source...) in one tuple shared by the services that have the same ones: 80 bytes a
    row instead of 216.
    """

    __slots__ = ("_rest", "annotations", "labels", "name", "port_names", "selector")
    __dataclass_fields__: ClassVar[dict[str, dataclasses.Field[Any]]]

    name: ServiceName
    labels: tuple[tuple[str, str], ...]
    annotations: tuple[tuple[str, str], ...]
    selector: tuple[tuple[str, str], ...]
    #: Port name -> service port, sorted by name.
    port_names: tuple[tuple[str, int], ...]
    _rest: tuple[Any, ...]
    if TYPE_CHECKING:
        # Read from the shared tuple (properties made below the class).
        source: str
        nat_policy: str
        ext_traffic_policy: TrafficPolicy
        int_traffic_policy: TrafficPolicy
        forwarding_mode: ForwardingMode
        session_affinity: bool
        session_affinity_timeout: int
        load_balancer_class: str | None
        proxy_redirect: ProxyRedirect | None
        health_check_node_port: int
        loopback_host_port: bool
        source_ranges: tuple[IPNetwork, ...]
        source_ranges_policy: SourceRangesPolicy
        traffic_distribution: str
        lb_algorithm: LBAlgorithm
        internal_scope_enabled: bool
        proxy_delegation: str
        scale_to_zero: bool

    def __init__(
        self,
        name: ServiceName,
        source: str = "k8s",
        labels: tuple[tuple[str, str], ...] = (),
        annotations: tuple[tuple[str, str], ...] = (),
        selector: tuple[tuple[str, str], ...] = (),
        nat_policy: str = "",
        ext_traffic_policy: TrafficPolicy = TrafficPolicy.CLUSTER,
        int_traffic_policy: TrafficPolicy = TrafficPolicy.CLUSTER,
        forwarding_mode: ForwardingMode = ForwardingMode.UNDEF,
        session_affinity: bool = False,
        session_affinity_timeout: int = 0,
        load_balancer_class: str | None = None,
        proxy_redirect: ProxyRedirect | None = None,
        health_check_node_port: int = 0,
        loopback_host_port: bool = False,
        source_ranges: tuple[IPNetwork, ...] = (),
        source_ranges_policy: SourceRangesPolicy = SourceRangesPolicy.ALLOW,
        port_names: tuple[tuple[str, int], ...] = (),
        traffic_distribution: str = "",
        lb_algorithm: LBAlgorithm = LBAlgorithm.UNDEF,
        internal_scope_enabled: bool = True,
        proxy_delegation: str = "",
        scale_to_zero: bool = False,
    ) -> None:
        # Kubernetes 1.34 renamed PreferClose to PreferSameZone; the deprecated alias is
        # stored, shown and handled under the new name.
        traffic_distribution = TRAFFIC_DISTRIBUTION_ALIASES.get(
            traffic_distribution, traffic_distribution
        )
        _fill(
            self, name, source, labels, annotations, selector, nat_policy,
            ext_traffic_policy, int_traffic_policy, forwarding_mode, session_affinity,
            session_affinity_timeout, load_balancer_class, proxy_redirect,
            health_check_node_port, loopback_host_port, source_ranges, source_ranges_policy,
            port_names, traffic_distribution, lb_algorithm, internal_scope_enabled,
            proxy_delegation, scale_to_zero,
        )

    def _fields(self) -> tuple[Any, ...]:
        return tuple([getattr(self, n) for n in self.__match_args__])

    # ----- helpers ------------------------------------------------------------
    def annotations_dict(self) -> dict[str, str]:
        """The annotations as a dict."""
        return dict(self.annotations)

    def labels_dict(self) -> dict[str, str]:
        """The labels as a dict."""
        return dict(self.labels)

    def port_names_dict(self) -> dict[str, int]:
        """The port-name -> port mapping as a dict."""
        return dict(self.port_names)

    @property
    def namespace(self) -> str:
        """The namespace part of the name."""
        parts = self.name.split("/")
        return parts[-2] if len(parts) >= 2 else ""

    @property
    def short_name(self) -> str:
        """The name without namespace (and cluster)."""
        return self.name.rsplit("/", 1)[-1]

    @property
    def two_scopes(self) -> bool:
        """True when external and internal traffic policies differ (separate /i frontends)."""
        return self.ext_traffic_policy != self.int_traffic_policy and self.internal_scope_enabled

    def source_ranges_enabled(self, svc_type: str, all_types: bool) -> bool:
        """Whether source-range checks apply to a frontend of ``svc_type``."""
        if not self.source_ranges:
            return False
        return all_types or svc_type == "LoadBalancer"

    # ----- show ------------------------------------------------------------------
    @staticmethod
    def table_header() -> list[str]:
        """Columns of ``db/show services``."""
        return ["Name", "Source", "PortNames", "TrafficPolicy", "Flags"]

    def traffic_policy_text(self) -> str:
        """``Cluster``, ``Local`` or ``Ext=<p>, Int=<p>`` when they differ."""
        if self.ext_traffic_policy == self.int_traffic_policy:
            return self.ext_traffic_policy.value
        return f"Ext={self.ext_traffic_policy.value}, Int={self.int_traffic_policy.value}"

    def flags_text(self) -> str:
        """The rarely-set fields collapsed into one sorted, comma-separated column."""
        flags: list[str] = []
        if self.session_affinity:
            flags.append("SessionAffinity=" + format_duration(self.session_affinity_timeout))
        if self.source_ranges:
            flags.append("SourceRanges=" + ", ".join(str(c) for c in self.source_ranges))
        if self.source_ranges_policy is SourceRangesPolicy.DENY:
            flags.append("SourceRangesPolicy=deny")
        if self.proxy_redirect is not None:
            flags.append(f"ProxyRedirect={self.proxy_redirect}")
        if self.health_check_node_port:
            flags.append(f"HealthCheckNodePort={self.health_check_node_port}")
        if self.loopback_host_port:
            flags.append("LoopbackHostPort=true")
        if self.lb_algorithm is not LBAlgorithm.UNDEF:
            flags.append(f"ExplicitLBAlgorithm={self.lb_algorithm.value}")
        if self.forwarding_mode is not ForwardingMode.UNDEF:
            flags.append(f"ForwardingMode={self.forwarding_mode.value}")
        if self.traffic_distribution:
            flags.append(f"TrafficDistribution={self.traffic_distribution}")
        if self.load_balancer_class is not None:
            flags.append(f"LoadBalancerClass={self.load_balancer_class}")
        flags.sort()
        return ", ".join(flags)

    def table_row(self) -> list[str]:
        """Cells of ``db/show services`` (the corpus formats)."""
        ports = ", ".join(f"{n}={p}" for n, p in sorted(self.port_names))
        return [self.name, self.source, ports, self.traffic_policy_text(), self.flags_text()]

    def to_json(self) -> dict[str, Any]:
        """The JSON form (field names as in Cilium's marshalling)."""
        return {
            "Name": self.name,
            "Source": self.source,
            "Labels": dict(self.labels),
            "Annotations": dict(self.annotations) or None,
            "Selector": dict(self.selector) or None,
            "NatPolicy": self.nat_policy,
            "ExtTrafficPolicy": self.ext_traffic_policy.value,
            "IntTrafficPolicy": self.int_traffic_policy.value,
            "ForwardingMode": self.forwarding_mode.value,
            "SessionAffinity": self.session_affinity,
            "SessionAffinityTimeout": self.session_affinity_timeout * 1_000_000_000,
            "LoadBalancerClass": self.load_balancer_class,
            "ProxyRedirect": (
                None
                if self.proxy_redirect is None
                else {
                    "ProxyPort": self.proxy_redirect.proxy_port,
                    "Ports": list(self.proxy_redirect.ports) or None,
                }
            ),
            "HealthCheckNodePort": self.health_check_node_port,
            "LoopbackHostPort": self.loopback_host_port,
            "SourceRanges": [str(c) for c in self.source_ranges] or None,
            "PortNames": dict(self.port_names) or None,
            "TrafficDistribution": self.traffic_distribution,
        }

    def to_yaml(self) -> dict[str, Any]:
        """The YAML form (lower-cased field names as in Cilium's marshalling)."""
        j = self.to_json()
        out = {k.lower(): v for k, v in j.items()}
        out["annotations"] = dict(self.annotations)
        out["sessionaffinitytimeout"] = format_duration(self.session_affinity_timeout)
        out["sourceranges"] = [str(c) for c in self.source_ranges]
        return out


def parse_cidr(text: str) -> IPNetwork:
    """Parse a CIDR (host bits are cleared); raise ValueError naming the text."""
    try:
        return ipaddress.ip_network(text.strip(), strict=False)
    except ValueError:
        raise ValueError(f"invalid CIDR {text!r}") from None


#: Primary index: the service name (prefix queries by namespace work: ``foo/``), read by
#: a C-level attribute getter (every write of a row reads its key).
service_name_index: Index[Service, str] = Index("name", key=operator.attrgetter("name"))


def new_services_table() -> Table[Service]:
    """Return a new, unregistered services table (register it with a DB)."""
    return Table(SERVICES_TABLE, service_name_index, row_type=Service)


def _field_property(i: int, name: str) -> property:
    def get(self: Service) -> Any:
        return self._rest[i]

    get.__name__ = name
    return property(get, doc=f"The service's ``{name}`` (from its shared tuple).")


for _i, _name in enumerate(_SHARED_FIELDS):
    setattr(Service, _name, _field_property(_i, _name))

#: The object a service row holds its shared fields in (every field but name, labels,
#: annotations, selector and port names): rows whose objects are the same one (``is``)
#: have the same shared fields. A reader deriving something from those fields alone (the
#: LB Ops' view of a service) derives it once per object. Equal fields do not imply the
#: same object.
service_shared_part: Callable[[Service], object] = operator.attrgetter("_rest")


def _own_and_rest(
    name: ServiceName, source: str, labels: tuple[tuple[str, str], ...],
    annotations: tuple[tuple[str, str], ...], selector: tuple[tuple[str, str], ...],
    nat_policy: str, ext_traffic_policy: TrafficPolicy, int_traffic_policy: TrafficPolicy,
    forwarding_mode: ForwardingMode, session_affinity: bool, session_affinity_timeout: int,
    load_balancer_class: str | None, proxy_redirect: ProxyRedirect | None,
    health_check_node_port: int, loopback_host_port: bool,
    source_ranges: tuple[IPNetwork, ...], source_ranges_policy: SourceRangesPolicy,
    port_names: tuple[tuple[str, int], ...], traffic_distribution: str,
    lb_algorithm: LBAlgorithm, internal_scope_enabled: bool, proxy_delegation: str,
    scale_to_zero: bool,
) -> tuple[Any, ...]:
    """A row's slots from every Service field (declaration order), in `_SLOTS` order: the
    own fields, then the shared tuple of the others."""
    # In `_SHARED_FIELDS` order: the fields in declaration order, less `_OWN_FIELDS`.
    return name, labels, annotations, selector, port_names, _shared_rest((
        source, nat_policy, ext_traffic_policy, int_traffic_policy, forwarding_mode,
        session_affinity, session_affinity_timeout, load_balancer_class, proxy_redirect,
        health_check_node_port, loopback_host_port, source_ranges, source_ranges_policy,
        traffic_distribution, lb_algorithm, internal_scope_enabled, proxy_delegation,
        scale_to_zero,
    ))


#: The slots of a Service row, in the order `_own_and_rest` returns them.
_SLOTS = ("name", "labels", "annotations", "selector", "port_names", "_rest")
#: Fill ``__init__``'s object (`_fill`); a new row is built by `_new_service_slots`.
_SETTERS = slot_setters(Service, *_SLOTS)
#: ``Service`` from its slots, positionally in `_SLOTS` order (no per-slot setter call).
_new_service_slots: Callable[..., Service] = slot_builder(
    Service, *_SLOTS, name="new_service_slots"
)


def _fill(o: Service, *fields: Any) -> None:
    """Set ``o``'s slots from every Service field, positionally in declaration order."""
    for set_slot, value in zip(_SETTERS, _own_and_rest(*fields), strict=True):
        set_slot(o, value)


def new_service(*fields: Any) -> Service:
    """``Service(...)`` with every field positional, in declaration order, and no alias
    applied to ``traffic_distribution`` (the converter builds one per Service object and
    gives the name already resolved)."""
    return _new_service_slots(*_own_and_rest(*fields))


_DEFAULT_MODE = ForwardingMode.UNDEF
_DEFAULT_RANGES_POLICY = SourceRangesPolicy.ALLOW
_DEFAULT_ALGORITHM = LBAlgorithm.UNDEF
#: The shared tuples of `new_plain_service`, by (source, external policy, internal policy).
_PLAIN_RESTS: dict[tuple[str, TrafficPolicy, TrafficPolicy], tuple[Any, ...]] = {}


def new_plain_service(
    name: ServiceName,
    source: str,
    labels: tuple[tuple[str, str], ...],
    annotations: tuple[tuple[str, str], ...],
    selector: tuple[tuple[str, str], ...],
    port_names: tuple[tuple[str, int], ...],
    ext_traffic_policy: TrafficPolicy,
    int_traffic_policy: TrafficPolicy,
) -> Service:
    """``new_service`` for a service whose other fields have their defaults (most
    services): its shared tuple is found by its source and policies, without building
    and looking up the tuple of all eighteen."""
    rest = _PLAIN_RESTS.get((source, ext_traffic_policy, int_traffic_policy))
    if (
        rest is None
        or rest[0] is not source
        or rest[2] is not ext_traffic_policy
        or rest[3] is not int_traffic_policy
    ):
        # In `_SHARED_FIELDS` order, as `_own_and_rest` builds it: the defaults of the others.
        rest = _shared_rest((
            source, "", ext_traffic_policy, int_traffic_policy, _DEFAULT_MODE, False, 0, None,
            None, 0, False, (), _DEFAULT_RANGES_POLICY, "", _DEFAULT_ALGORITHM, True, "", False,
        ))
        if len(_PLAIN_RESTS) >= 64:
            _PLAIN_RESTS.clear()
        _PLAIN_RESTS[(source, ext_traffic_policy, int_traffic_policy)] = rest
    return _new_service_slots(name, labels, annotations, selector, port_names, rest)
