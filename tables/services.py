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

import enum
import ipaddress
from dataclasses import dataclass
from typing import Any

from statedb import Index, Table
from statedb.rows import slot_constructor
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


@dataclass(frozen=True, slots=True)
class Service:
    """A load-balanced service (row of the services table).

    Mappings are stored as sorted tuples of pairs so rows stay hashable and
    immutable; use the ``*_dict`` helpers to read them as dicts.
    """

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

    def __post_init__(self) -> None:
        # Kubernetes 1.34 renamed PreferClose to PreferSameZone; the deprecated alias is
        # stored, shown and handled under the new name.
        alias = TRAFFIC_DISTRIBUTION_ALIASES.get(self.traffic_distribution)
        if alias is not None:
            object.__setattr__(self, "traffic_distribution", alias)

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


#: Primary index: the service name (prefix queries by namespace work: ``foo/``).
service_name_index: Index[Service, str] = Index("name", key=lambda s: s.name)


def new_services_table() -> Table[Service]:
    """Return a new, unregistered services table (register it with a DB)."""
    return Table(SERVICES_TABLE, service_name_index, row_type=Service)


#: ``Service(...)`` with every field positional, in declaration order, filling the slots
#: directly (no frozen-dataclass ``__setattr__`` per field; the converter builds one per
#: Service object).
new_service: Any = slot_constructor(Service, "new_service")
