"""Kubernetes objects to LB table writes: v1 Service, discovery.k8s.io/v1 EndpointSlice, v1 Pod.

Objects are plain dicts as parsed from YAML/JSON. The pure functions
(`convert_service`, `convert_endpoint_slice`, `convert_pod_host_ports`) turn
one object into rows/parameters and raise `ConversionError` (an `InputError`)
naming the object (``Service test/echo``) and the field (``spec.ports[0].port``)
for bad input, including the API server's validation limits the conversion
depends on (`MAX_SLICE_ENDPOINTS` and the other ``MAX_*`` constants, unique
service port names and port/protocol pairs).
`K8sConverter` applies them through an `LBWriter`, remembering each
EndpointSlice's backends so that several slices of one service merge, and a
deleted slice releases exactly its own backends.

What is converted (following Cilium's semantics):

* Service: ClusterIP(s) (dual stack), NodePort (a ``0.0.0.0``/``::`` surrogate
  frontend per port and family; the BPF ops expand it over node addresses),
  LoadBalancer ingress IPs, ExternalIPs (unless ``--enable-external-ips=false``),
  port names, headless services (``clusterIP: None`` or the
  ``service.kubernetes.io/headless`` label: a service row without frontends),
  session affinity and its timeout, external/internal traffic policies and,
  when they differ, internal-scope (``/i``) frontends for the external types,
  source ranges and ``service.cilium.io/src-ranges-policy``, health-check node
  port, load-balancer class, topology mode / trafficDistribution, and the
  annotations ``service.cilium.io/type`` (which frontend types to expose),
  ``service.cilium.io/scope``, ``service.cilium.io/lb-algorithm`` (with
  ``--bpf-lb-algorithm-annotation``), ``service.cilium.io/forwarding-mode``
  (with ``--bpf-lb-mode-annotation``), ``service.cilium.io/proxy-delegation``
  and ``service.cilium.io/scale-to-zero``.
* EndpointSlice: every address x port becomes a backend instance of the
  service named by the ``kubernetes.io/service-name`` label; conditions map to
  states (ready -> active, whatever terminating and serving say, as in
  Kubernetes; not ready: terminating+serving -> terminating, terminating+not
  serving -> terminating-not-serving, not terminating -> maintenance: kept, but
  never load-balanced); node name, zone
  and ``hints.forZones``; the slice's ``service.cilium.io/weight`` annotation
  (0..65535, invalid values ignored) is the weight of every backend of the slice
  (Maglev honours it), 0 putting them in maintenance.
* Pod: every container port with a hostPort becomes a HostPort service named
  ``namespace/pod:host-port:<port>:<uid>`` with a ``0.0.0.0``/``::`` (or host IP)
  frontend and the pod IPs as backends.
"""

from __future__ import annotations

import ipaddress
import socket
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import repeat
from typing import Any, TypeAlias

from sources.k8s_converted import (
    ConvertedEndpoints,
    ConvertedService,
    ServicePort,
    new_converted_endpoints,
    new_converted_service,
    new_service_port,
)
from statedb import InputError, WriteTxn
from tables import backends
from tables.backends import (
    DEFAULT_WEIGHT,
    BackendParams,
    BackendState,
    backend_params_of,
    backend_shared_part,
    new_backend_params_from,
)
from tables.frontends import FrontendParams, SVCType, new_frontend_params
from tables.l3n4 import (
    PROTOCOLS,
    SCOPE_INTERNAL,
    V4_KEY_PREFIX,
    AddressError,
    IPAddress,
    IPNetwork,
    L3n4Addr,
    addr_key_suffix,
    addr_of_key,
    addrs_of_ipv4,
    new_addr,
    parse_protocol,
)
from tables.lb_config import LBConfig
from tables.lb_writer import CheckedBackends, LBWriter, OrderedBackends
from tables.services import (
    PREFER_SAME_ZONE,
    TRAFFIC_DISTRIBUTION_ALIASES,
    TRAFFIC_DISTRIBUTIONS,
    ForwardingMode,
    LBAlgorithm,
    Service,
    ServiceName,
    SourceRangesPolicy,
    TrafficPolicy,
    new_plain_service,
    new_service,
    parse_cidr,
)
from tables.slice_addresses import remember as remember_addresses

try:
    from mypy_extensions import mypyc_attr
except ImportError:  # the agent does not need mypy's extensions: a no-op decorator there

    def mypyc_attr(*_args: object, **_kwargs: object) -> Callable[[type], type]:  # type: ignore[misc]
        return lambda cls: cls

# The backend table's shared tuples (a backend's details, everything but its address) are
# held as plain objects here. Compiled (mypyc), the result of a call declared to return a
# fixed-length tuple is unpacked into C values and packed into a new tuple where it is
# stored or passed on: every slice would get its own copy of a shared tuple (memory), and
# the writer and the LB Ops, which compare them by identity, would find them all different.
_backend_details: Callable[..., Any] = backends.backend_details
_backend_rest: Callable[..., Any] = backends.backend_rest
_active_backend_rest: Callable[..., Any] = backends.active_backend_rest

SERVICE_NAME_LABEL = "kubernetes.io/service-name"
HEADLESS_LABEL = "service.kubernetes.io/headless"
SERVICE_PROXY_NAME_LABEL = "service.kubernetes.io/service-proxy-name"
TOPOLOGY_MODE_ANNOTATION = "service.kubernetes.io/topology-mode"
TOPOLOGY_HINTS_ANNOTATION = "service.kubernetes.io/topology-aware-hints"
ANN_TYPE = "service.cilium.io/type"
ANN_SCOPE = "service.cilium.io/scope"
ANN_LB_ALGORITHM = "service.cilium.io/lb-algorithm"
ANN_FORWARDING_MODE = "service.cilium.io/forwarding-mode"
ANN_SRC_RANGES_POLICY = "service.cilium.io/src-ranges-policy"
ANN_PROXY_DELEGATION = "service.cilium.io/proxy-delegation"
ANN_SCALE_TO_ZERO = "service.cilium.io/scale-to-zero"
ANN_NODE = "service.cilium.io/node"
#: EndpointSlice annotation: the weight of every backend of the slice (Cilium's).
ANN_WEIGHT = "service.cilium.io/weight"
MAX_WEIGHT = 65535

#: Default session-affinity timeout (Kubernetes: 3 hours).
DEFAULT_AFFINITY_TIMEOUT = 10800

KIND_SERVICE = "Service"
KIND_ENDPOINT_SLICE = "EndpointSlice"
KIND_POD = "Pod"

#: The API server's validation limits for a discovery.k8s.io/v1 EndpointSlice.
MAX_SLICE_ENDPOINTS = 1000
MAX_SLICE_PORTS = 100
MAX_ENDPOINT_ADDRESSES = 100
#: A Service has at most two cluster IPs (dual stack). The API server also wants them of
#: different families; Cilium's test corpus (pruning.txtar) has two IPv4 ones, both used.
MAX_CLUSTER_IPS = 2

#: What a conversion error names: the object's ``Kind namespace/name``, or the object
#: (a mapping), named by `object_ref` only when an error is raised.
ObjectRef: TypeAlias = str | Mapping[str, Any]


class ConversionError(InputError):
    """An object cannot be converted: ``obj`` names it (``Service default/echo``), ``field``
    the field path (``spec.ports[0].port``), ``message`` what is wrong.

    ``obj_ref`` is that name, or the object itself (`ObjectRef`): the converters pass the
    object, so the name is built only when one is refused (`object_ref`)."""

    def __init__(self, obj_ref: ObjectRef, field_path: str, reason: str) -> None:
        name = obj_ref if isinstance(obj_ref, str) else object_ref(obj_ref)
        super().__init__(reason, obj=name, field=field_path)


# ----- object helpers ---------------------------------------------------------------
def object_kind(obj: Mapping[str, Any]) -> str:
    """The ``kind`` of an object ("" when missing)."""
    kind = obj.get("kind", "")
    return kind if isinstance(kind, str) else ""


def object_ref(obj: Mapping[str, Any]) -> str:
    """``Kind namespace/name`` for messages (best effort on malformed objects)."""
    meta = obj.get("metadata")
    ns = name = "?"
    if type(meta) is dict or isinstance(meta, Mapping):
        ns = str(meta.get("namespace") or "default")
        name = str(meta.get("name") or "?")
    return f"{object_kind(obj) or 'object'} {ns}/{name}"


def namespaced_name(obj: Mapping[str, Any]) -> str:
    """``namespace/name`` of an object; raise ConversionError when the name is missing."""
    meta = obj.get("metadata")
    if type(meta) is not dict and not isinstance(meta, Mapping):
        raise ConversionError(object_ref(obj), "metadata", "missing or not a mapping")
    name = meta.get("name")
    if not isinstance(name, str) or not name:
        raise ConversionError(object_ref(obj), "metadata.name", "missing or not a string")
    ns = meta.get("namespace") or "default"
    if not isinstance(ns, str):
        raise ConversionError(object_ref(obj), "metadata.namespace", "not a string")
    return f"{ns}/{name}"


def _mapping(ref: ObjectRef, path: str, value: Any) -> Mapping[str, Any]:
    # A plain dict first: the usual case, without the Mapping ABC's isinstance check.
    if type(value) is dict:
        return value
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConversionError(ref, path, f"expected a mapping, got {type(value).__name__}")
    return value


def _list(ref: ObjectRef, path: str, value: Any) -> Sequence[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise ConversionError(ref, path, f"expected a list, got {type(value).__name__}")
    return value


def _str(ref: ObjectRef, path: str, value: Any, default: str = "") -> str:
    if value is None:
        return default
    if not isinstance(value, str):
        raise ConversionError(ref, path, f"expected a string, got {value!r}")
    return value


def _str_map(ref: ObjectRef, path: str, value: Any) -> dict[str, str]:
    m = _mapping(ref, path, value)
    out: dict[str, str] = {}
    for k, v in m.items():
        if type(k) is str and type(v) is str:  # the usual case
            out[k] = v
            continue
        if v is None:
            v = ""
        if not isinstance(v, str | int | float | bool):
            raise ConversionError(ref, f"{path}.{k}", f"expected a string, got {v!r}")
        out[str(k)] = v if isinstance(v, str) else str(v).lower() if isinstance(v, bool) else str(v)
    return out


def _port(ref: ObjectRef, path: str, value: Any, *, allow_zero: bool = False) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConversionError(ref, path, f"expected a port number, got {value!r}")
    if value == 0 and not allow_zero:
        raise ConversionError(ref, path, "port 0 is not allowed")
    if not 0 <= value <= 65535:
        raise ConversionError(ref, path, f"port {value} out of range 1..65535")
    return value


#: Small immutable values many objects carry alike (port names, a service's port list, a
#: slice's port-name tuple): one object each, shared by every row that holds an equal one.
#: Cleared when it grows past _SHARED_MAX, which only costs the sharing of those before.
_SHARED: dict[Any, Any] = {}
_SHARED_MAX = 4096


def _shared(value: Any) -> Any:
    """``value`` (a string or a tuple of them, of ints...), or an equal one made before."""
    kept = _SHARED.get(value)
    if kept is not None and type(kept) is type(value):
        return kept
    if len(_SHARED) >= _SHARED_MAX:
        _SHARED.clear()
    _SHARED[value] = value
    return value


_AF_INET = socket.AF_INET
# Enum members as module constants: reading one off its class goes through the enum
# metaclass's attribute hook (a Python-level lookup, ~20 times a global's cost).
_CLUSTER = TrafficPolicy.CLUSTER
_ALLOW = SourceRangesPolicy.ALLOW
_ALG_UNDEF = LBAlgorithm.UNDEF
_FWD_UNDEF = ForwardingMode.UNDEF
_CLUSTER_IP = SVCType.CLUSTER_IP
_NODE_PORT = SVCType.NODE_PORT
_LOAD_BALANCER = SVCType.LOAD_BALANCER
_EXTERNAL_IPS = SVCType.EXTERNAL_IPS
_inet_pton = socket.inet_pton
_IPv4Address = ipaddress.IPv4Address
_new = object.__new__
_set_ipv4_int = ipaddress.IPv4Address.__dict__["_ip"].__set__


def _parse_ip(text: str) -> IPAddress:
    """``ipaddress.ip_address(text)``, with a fast path for dotted-quad IPv4.

    inet_pton(AF_INET) accepts exactly what ipaddress accepts for IPv4 (four decimal
    octets of at most 255, no leading zeros); anything else (IPv6, errors) goes the
    ipaddress way (raising its ValueError).
    """
    try:
        packed = _inet_pton(_AF_INET, text)
    except (OSError, ValueError):
        return ipaddress.ip_address(text)
    # IPv4Address(packed) without its argument checks: the same object.
    ip = _new(_IPv4Address)
    _set_ipv4_int(ip, int.from_bytes(packed))
    return ip


def _plain_ipv4(text: str) -> IPAddress | None:
    """``_parse_ip(text)`` for a plain dotted-quad IPv4 address, None for anything else
    (which the caller then checks field by field)."""
    try:
        packed = _inet_pton(_AF_INET, text)
    except (OSError, ValueError):
        return None
    ip = _new(_IPv4Address)
    _set_ipv4_int(ip, int.from_bytes(packed))
    return ip


def _ip(ref: ObjectRef, path: str, value: Any) -> IPAddress:
    if not isinstance(value, str):
        raise ConversionError(ref, path, f"expected an IP address, got {value!r}")
    try:
        return _parse_ip(value.strip())
    except ValueError:
        raise ConversionError(ref, path, f"invalid IP address {value!r}") from None


#: The canonical protocol names (`parse_protocol` returns them as they are).
_CANONICAL_PROTOCOLS = frozenset(PROTOCOLS)


def _proto(ref: ObjectRef, path: str, value: Any) -> str:
    try:
        return parse_protocol(_str(ref, path, value, "TCP"))
    except AddressError as e:
        raise ConversionError(ref, path, str(e)) from None


def _family_enabled(addr: IPAddress, config: LBConfig) -> bool:
    return config.enable_ipv6 if addr.version == 6 else config.enable_ipv4


# ----- Service ----------------------------------------------------------------------------
def _policy(ref: ObjectRef, path: str, value: Any) -> TrafficPolicy:
    if value is None or value == "Cluster":  # the usual case first
        return _CLUSTER
    text = _str(ref, path, value, "Cluster")
    if text in ("", "Cluster"):
        return _CLUSTER
    if text == "Local":
        return TrafficPolicy.LOCAL
    raise ConversionError(ref, path, f"unknown traffic policy {text!r} (Cluster or Local)")


def convert_service(
    obj: Mapping[str, Any],
    config: LBConfig | None = None,
    node_labels: Mapping[str, str] | None = None,
    source: str = "k8s",
) -> ConvertedService:
    """Convert a v1 Service; raise ConversionError naming the object and field.

    ``node_labels`` are the local node's labels, for the ``service.cilium.io/node``
    exposure annotation (the service exists only on nodes whose label of the same
    name has the annotation's value)."""
    cfg = config if config is not None else LBConfig()
    plain = _plain_service(obj, cfg, source)
    if plain is not None:
        return new_converted_service(plain[0], plain[1], "")
    return _convert_service(obj, cfg, node_labels, source)


#: The spec fields `_plain_service` takes (any other sends a Service the general way).
_PLAIN_SPEC_FIELDS = frozenset({
    "type", "clusterIP", "clusterIPs", "ports", "selector", "ipFamilies", "ipFamilyPolicy",
    "sessionAffinity", "internalTrafficPolicy",
})
_IPV4_ONLY = ["IPv4"]


def _plain_service(
    obj: Mapping[str, Any], cfg: LBConfig, source: str
) -> tuple[Service, tuple[FrontendParams, ...]] | None:
    """`convert_service` of a plain ClusterIP Service (nearly every one), as its row and
    frontends (it is always exposed: it has no annotations): string labels
    (not the headless or service-proxy-name ones) and selector, no annotations, one IPv4
    cluster IP, one port without a node port, the other fields absent or at their
    defaults, and no load-balancer status. None for any other Service, which the general
    way then converts and checks from the start: this takes only what it would make of a
    plain one, and raises nothing."""
    meta, spec = obj.get("metadata"), obj.get("spec")
    if type(meta) is not dict or type(spec) is not dict or not spec.keys() <= _PLAIN_SPEC_FIELDS:
        return None
    name, ns = meta.get("name"), meta.get("namespace")
    labels = meta.get("labels")
    if (
        type(name) is not str
        or not name
        or type(ns) is not str
        or not ns
        or meta.get("annotations") not in _NO_ANNOTATIONS
        or obj.get("status") not in _NO_STATUS
        or (labels is not None and (
            type(labels) is not dict
            or HEADLESS_LABEL in labels
            or SERVICE_PROXY_NAME_LABEL in labels
        ))
    ):
        return None
    svc_type = spec.get("type")
    ips = spec.get("clusterIPs")
    if ips is None:
        ip_text = spec.get("clusterIP")
    elif type(ips) is list and len(ips) == 1:
        ip_text = ips[0]
    else:
        return None
    ports = spec.get("ports")
    affinity = spec.get("sessionAffinity")
    int_policy = spec.get("internalTrafficPolicy")
    families = spec.get("ipFamilies")
    if (
        (svc_type is not None and (type(svc_type) is not str or svc_type != "ClusterIP"))
        or type(ip_text) is not str
        or type(ports) is not list
        or len(ports) != 1
        or (affinity is not None and (type(affinity) is not str or affinity != "None"))
        or (int_policy is not None and (type(int_policy) is not str or int_policy != "Cluster"))
        or (families is not None and (type(families) is not list or families != _IPV4_ONLY))
    ):
        return None
    pm = ports[0]
    if type(pm) is not dict:
        return None
    port_name, port, proto = pm.get("name"), pm.get("port"), pm.get("protocol")
    if port_name is None:
        port_name = ""
    if proto is None:
        proto = "TCP"
    if (
        type(port_name) is not str
        or type(port) is not int
        or not 0 < port <= 65535
        or type(proto) is not str
        or proto not in _CANONICAL_PROTOCOLS
        or pm.get("nodePort") is not None
    ):
        return None
    try:
        packed = _inet_pton(_AF_INET, ip_text)  # what `_parse_ip` takes as IPv4
    except (OSError, ValueError):
        return None
    selector = spec.get("selector")
    labels_t = () if labels is None else _plain_str_items(labels)
    selector_t = () if selector is None else _plain_str_items(selector)
    if labels_t is None or selector_t is None:
        return None
    # As the general way: an interned name, shared port names and tuple of them (a tuple
    # found shared holds its shared name: both were made in one generation of _SHARED).
    svc_name = sys.intern(f"{ns}/{name}")
    port_names = _SHARED.get(((port_name, port),))
    if port_names is None:
        port_name = _shared(port_name)
        port_names = _shared(((port_name, port),))
    else:
        port_name = port_names[0][0]
    service = new_plain_service(
        svc_name, source, labels_t, (), selector_t, port_names, _CLUSTER, _CLUSTER
    )
    if not cfg.enable_ipv4:
        return service, ()
    # ``new_addr(_parse_ip(ip_text), port, proto)``, from its key (the port and protocol
    # were checked above).
    tail = _PLAIN_KEY_TAILS.get((port, proto))
    if tail is None:
        tail = _plain_key_tail(port, proto)
    fe = new_frontend_params(
        addr_of_key(V4_KEY_PREFIX + packed + tail), _CLUSTER_IP, svc_name, port_name, port
    )
    return service, (fe,)


#: The last bytes of the key of an external IPv4 frontend address, by (port, protocol).
_PLAIN_KEY_TAILS: dict[tuple[int, str], bytes] = {}


def _plain_key_tail(port: int, proto: str) -> bytes:
    """``addr_key_suffix(port, proto, False)``, kept in `_PLAIN_KEY_TAILS` (cleared when
    it grows past `_SHARED_MAX`)."""
    tail = addr_key_suffix(port, proto, False)
    if len(_PLAIN_KEY_TAILS) >= _SHARED_MAX:
        _PLAIN_KEY_TAILS.clear()
    _PLAIN_KEY_TAILS[(port, proto)] = tail
    return tail


#: The statuses `_plain_service` takes: none, or one without load-balancer ingress.
_NO_STATUS: tuple[Any, ...] = (None, {}, {"loadBalancer": {}})
_NO_ANNOTATIONS: tuple[Any, ...] = (None, {})


def _plain_str_items(value: Any) -> tuple[tuple[str, str], ...] | None:
    """``tuple(sorted(_str_map(value).items()))`` of None or a dict of strings, as the
    general way stores labels and a selector; None for anything else."""
    if value is None or (type(value) is dict and not value):
        return ()
    if type(value) is not dict:
        return None
    for k, v in value.items():
        if type(k) is not str or type(v) is not str:
            return None
    return tuple(sorted(value.items()))


def _convert_service(
    obj: Mapping[str, Any],
    cfg: LBConfig,
    node_labels: Mapping[str, str] | None,
    source: str,
) -> ConvertedService:
    """`convert_service` of any Service, field by field."""
    ref = obj  # what errors name: `object_ref` of it, built only for an error
    # Interned, as the EndpointSlices' service names are: one string per service, shared
    # by its rows (service, frontends, backend instance keys) and every lookup by name.
    name = sys.intern(namespaced_name(obj))
    # The usual values (plain dicts, absent fields) are taken as they are; any other goes
    # through the checking helper, which converts it or names the field in its error.
    meta, spec, status = obj.get("metadata"), obj.get("spec"), obj.get("status")
    if type(meta) is not dict:
        meta = _mapping(ref, "metadata", meta)
    if type(spec) is not dict:
        spec = _mapping(ref, "spec", spec)
    if type(status) is not dict and status is not None:
        status = _mapping(ref, "status", status)
    raw_labels = meta.get("labels")
    labels = {} if raw_labels is None else _str_map(ref, "metadata.labels", raw_labels)
    raw_annotations = meta.get("annotations")
    annotations = (
        {} if raw_annotations is None
        else _str_map(ref, "metadata.annotations", raw_annotations)
    )
    raw_selector = spec.get("selector")
    selector = {} if raw_selector is None else _str_map(ref, "spec.selector", raw_selector)
    svc_type = spec.get("type")
    if type(svc_type) is not str:
        svc_type = _str(ref, "spec.type", svc_type, "ClusterIP")
    if svc_type not in ("ClusterIP", "NodePort", "LoadBalancer", "ExternalName"):
        raise ConversionError(ref, "spec.type", f"unknown service type {svc_type!r}")

    ports, port_names = _service_ports(ref, spec)
    service = _service_row(ref, spec, cfg, name, source, labels, annotations, selector,
                           port_names)
    if svc_type == "ExternalName" or SERVICE_PROXY_NAME_LABEL in labels:
        return ConvertedService(service, ())
    exposure = annotations.get(ANN_NODE) if annotations else None
    if exposure is not None:
        node_value = (node_labels or {}).get(ANN_NODE)
        wanted = {v.strip() for v in exposure.split(",")}
        if node_value not in wanted:
            return ConvertedService(
                service, (), f"{ANN_NODE}={exposure} does not match node label {node_value!r}"
            )

    cluster_ips, lb_ips, ext_ips, headless = _frontend_ips(ref, spec, status, labels)
    if headless:
        return ConvertedService(service, ())
    fes = _frontends(ref, spec, annotations, cfg, service, svc_type, ports,
                     (cluster_ips, lb_ips, ext_ips))
    return new_converted_service(service, fes, "")


def _service_row(
    ref: ObjectRef,
    spec: Mapping[str, Any],
    cfg: LBConfig,
    name: ServiceName,
    source: str,
    labels: Mapping[str, str],
    annotations: Mapping[str, str],
    selector: Mapping[str, str],
    port_names: Mapping[str, int],
) -> Service:
    """The Service row of a v1 Service (its converted metadata and spec fields)."""
    ext_policy = spec.get("externalTrafficPolicy")
    if ext_policy is None or ext_policy == "Cluster":  # the usual case: no call
        ext_policy = _CLUSTER
    else:
        ext_policy = _policy(ref, "spec.externalTrafficPolicy", ext_policy)
    int_policy = spec.get("internalTrafficPolicy")
    if int_policy is None or int_policy == "Cluster":
        int_policy = _CLUSTER
    else:
        int_policy = _policy(ref, "spec.internalTrafficPolicy", int_policy)
    if not cfg.enable_internal_traffic_policy:
        int_policy = _CLUSTER
    # ``plain`` while every shared field but the policies keeps its default (most services).
    affinity_text = spec.get("sessionAffinity")
    if affinity_text is None or affinity_text == "None":
        affinity, timeout = False, 0
    else:
        affinity, timeout = _session_affinity(ref, spec, cfg)
    plain = not affinity
    if spec.get("loadBalancerSourceRanges") is None and ANN_SRC_RANGES_POLICY not in annotations:
        ranges: list[IPNetwork] = []
        ranges_policy = _ALLOW
    else:
        ranges, ranges_policy = _source_ranges(ref, spec, annotations)
        plain = False
    hc = spec.get("healthCheckNodePort")
    if hc is None:
        health_port = 0
    else:
        health_port = _port(ref, "spec.healthCheckNodePort", hc, allow_zero=True)
        plain = plain and not health_port
    lb_class = spec.get("loadBalancerClass")
    if lb_class is not None:
        lb_class = _str(ref, "spec.loadBalancerClass", lb_class)
        plain = False
    if annotations or spec.get("trafficDistribution") is not None:
        traffic_dist = _traffic_distribution(ref, spec, annotations)
        algorithm, fwd = _annotated_algorithm_and_mode(ref, annotations, cfg)
        scope_ann = annotations.get(ANN_SCOPE, "").strip().lower()
        delegation = annotations.get(ANN_PROXY_DELEGATION, "").strip().lower()
        scale_to_zero = annotations.get(ANN_SCALE_TO_ZERO, "").strip().lower() == "true"
        plain = plain and not (
            traffic_dist or algorithm is not _ALG_UNDEF or fwd is not _FWD_UNDEF
            or scope_ann == "external-only" or delegation == "delegate-if-local"
            or scale_to_zero
        )
    else:
        traffic_dist, algorithm, fwd = "", _ALG_UNDEF, _FWD_UNDEF
        scope_ann = delegation = ""
        scale_to_zero = False
    labels_t = tuple(sorted(labels.items())) if labels else ()
    annotations_t = tuple(sorted(annotations.items())) if annotations else ()
    selector_t = tuple(sorted(selector.items())) if selector else ()
    port_names_t = _shared(tuple(sorted(port_names.items())))
    if plain:
        service = new_plain_service(
            name, source, labels_t, annotations_t, selector_t, port_names_t, ext_policy,
            int_policy,
        )
    else:
        service = _new_full_service(
            name, source, labels_t, annotations_t, selector_t, port_names_t,
            # The ints as shared objects: the row's shared tuple is found by identity
            # (compiled, an int passed on is a new object each time it is above 256).
            (ext_policy, int_policy, fwd, affinity, _shared(timeout), lb_class,
             _shared(health_port), ranges, ranges_policy, traffic_dist, algorithm, scope_ann,
             delegation, scale_to_zero),
        )
    return service


def _new_full_service(
    name: ServiceName,
    source: str,
    labels: tuple[tuple[str, str], ...],
    annotations: tuple[tuple[str, str], ...],
    selector: tuple[tuple[str, str], ...],
    port_names: tuple[tuple[str, int], ...],
    fields: tuple[Any, ...],
) -> Service:
    """The Service row of ``convert_service`` when a shared field is not its default;
    ``fields``: the converted values (policies, mode, affinity and timeout, class, health
    port, ranges and their policy, distribution, algorithm, and the scope, delegation and
    scale-to-zero annotations' texts)."""
    (ext_policy, int_policy, fwd, affinity, timeout, lb_class, health_port, ranges,
     ranges_policy, traffic_dist, algorithm, scope_ann, delegation, scale_to_zero) = fields
    # Every Service field, positionally in declaration order.
    return new_service(
        name,  # name
        source,  # source
        labels,  # labels
        annotations,  # annotations
        selector,  # selector
        "",  # nat_policy
        ext_policy,  # ext_traffic_policy
        int_policy,  # int_traffic_policy
        fwd,  # forwarding_mode
        affinity,  # session_affinity
        timeout,  # session_affinity_timeout
        lb_class,  # load_balancer_class
        None,  # proxy_redirect
        health_port,  # health_check_node_port
        False,  # loopback_host_port
        tuple(ranges) if ranges else (),  # source_ranges
        ranges_policy,  # source_ranges_policy
        port_names,  # port_names
        traffic_dist,  # traffic_distribution
        algorithm,  # lb_algorithm
        scope_ann != "external-only",  # internal_scope_enabled
        "delegate-if-local" if delegation == "delegate-if-local" else "",  # proxy_delegation
        scale_to_zero,  # scale_to_zero
    )


def _frontend_ips(
    ref: ObjectRef,
    spec: Mapping[str, Any],
    status: Mapping[str, Any] | None,
    labels: Mapping[str, str],
) -> tuple[list[IPAddress], list[IPAddress], list[IPAddress], bool]:
    """(cluster IPs, load-balancer VIPs, external IPs, headless) of a Service (``status``:
    its status, None when it has none)."""
    cluster_ips: list[IPAddress] = []
    raw_ips = spec.get("clusterIPs")
    ip_list: Sequence[Any]
    if type(raw_ips) is list:
        ip_list = raw_ips
    else:
        ip_list = _list(ref, "spec.clusterIPs", raw_ips) if raw_ips is not None else []
    if len(ip_list) > MAX_CLUSTER_IPS:
        raise ConversionError(
            ref, "spec.clusterIPs", f"at most {MAX_CLUSTER_IPS} addresses, got {len(ip_list)}"
        )
    ip_path = "spec.clusterIPs"
    if not ip_list and spec.get("clusterIP") is not None:
        ip_list, ip_path = [spec.get("clusterIP")], "spec.clusterIP"
    headless = HEADLESS_LABEL in labels
    for i, ip in enumerate(ip_list):
        if type(ip) is str:
            parsed = _plain_ipv4(ip)  # the usual case: no path string, no ipaddress parse
            if parsed is not None:
                cluster_ips.append(parsed)
                continue
            if ip.strip().lower() in ("none", ""):
                headless = True
                continue
        elif isinstance(ip, str) and ip.strip().lower() in ("none", ""):
            headless = True
            continue
        cluster_ips.append(_ip(ref, f"{ip_path}[{i}]" if raw_ips else ip_path, ip))
    lb_ips: list[IPAddress] = []
    lb = status.get("loadBalancer") if status else None
    if type(lb) is not dict:
        lb = _mapping(ref, "status.loadBalancer", lb)
    ingress = lb.get("ingress")
    ingresses = _list(ref, "status.loadBalancer.ingress", ingress) if ingress is not None else ()
    for i, ing in enumerate(ingresses):
        im = _mapping(ref, f"status.loadBalancer.ingress[{i}]", ing)
        mode = _str(ref, f"status.loadBalancer.ingress[{i}].ipMode", im.get("ipMode"), "VIP")
        if im.get("ip") is not None and mode == "VIP":
            lb_ips.append(_ip(ref, f"status.loadBalancer.ingress[{i}].ip", im.get("ip")))
    raw_ext = spec.get("externalIPs")
    ext_ips = [
        _ip(ref, f"spec.externalIPs[{i}]", ip)
        for i, ip in enumerate(_list(ref, "spec.externalIPs", raw_ext))
    ] if raw_ext is not None else []
    return cluster_ips, lb_ips, ext_ips, headless


def _frontends(
    ref: ObjectRef,
    spec: Mapping[str, Any],
    annotations: Mapping[str, str],
    cfg: LBConfig,
    service: Service,
    svc_type: str,
    ports: list[ServicePort],
    ips: tuple[list[IPAddress], list[IPAddress], list[IPAddress]],
) -> tuple[FrontendParams, ...]:
    """The frontends of a (not headless) Service: each port on its cluster IPs, node
    ports, load-balancer VIPs and external IPs, of the enabled families and exposed
    types, with an internal-scope twin when the service has two scopes."""
    cluster_ips, lb_ips, ext_ips = ips
    allowed = _exposed_types(ref, annotations) if ANN_TYPE in annotations else _ALL_TYPES
    ip_families = spec.get("ipFamilies")
    if type(ip_families) is not list:
        ip_families = [] if ip_families is None else _list(ref, "spec.ipFamilies", ip_families)
    if len(ip_families) > 2:
        raise ConversionError(ref, "spec.ipFamilies", f"at most 2 families, got {len(ip_families)}")
    for i, fam in enumerate(ip_families):
        if fam not in ("IPv4", "IPv6"):
            raise ConversionError(ref, f"spec.ipFamilies[{i}]", f"unknown IP family {fam!r}")
        if fam in ip_families[:i]:
            raise ConversionError(ref, f"spec.ipFamilies[{i}]", f"duplicate IP family {fam}")
    # (address, port, service port, type) of every candidate frontend, in order.
    wanted: list[tuple[IPAddress, int, ServicePort, SVCType]] = []
    node_port_on = (
        svc_type in ("NodePort", "LoadBalancer") and cfg.enable_node_port
        and cfg.kube_proxy_replacement
    )
    for p in ports:
        for ip in cluster_ips:
            wanted.append((ip, p.port, p, _CLUSTER_IP))
        if node_port_on and p.node_port:
            families = {ip.version for ip in cluster_ips if _family_enabled(ip, cfg)}
            for fam in sorted(families) or [4]:
                unspec = ipaddress.ip_address("0.0.0.0" if fam == 4 else "::")
                wanted.append((unspec, p.node_port, p, _NODE_PORT))
        if svc_type == "LoadBalancer":
            for ip in lb_ips:
                wanted.append((ip, p.port, p, _LOAD_BALANCER))
        if cfg.enable_external_ips:
            for ip in ext_ips:
                wanted.append((ip, p.port, p, _EXTERNAL_IPS))
    return _frontend_params(wanted, cfg, service, allowed)


def _frontend_params(
    wanted: list[tuple[IPAddress, int, ServicePort, SVCType]],
    cfg: LBConfig,
    service: Service,
    allowed: frozenset[SVCType],
) -> tuple[FrontendParams, ...]:
    """The frontends of the ``wanted`` (address, port, service port, type) candidates of
    the enabled families and ``allowed`` types, first of each address kept, with an
    internal-scope twin for the external types of a two-scope service."""
    name = service.name
    v4_on = cfg.enable_ipv4
    every_type = allowed is _ALL_TYPES
    cluster_ip = _CLUSTER_IP
    fes: dict[L3n4Addr, FrontendParams] = {}
    for addr, port, p, t in wanted:
        if not (v4_on if type(addr) is _IPv4Address else _family_enabled(addr, cfg)):
            continue
        if not every_type and t not in allowed:
            continue
        a = new_addr(addr, port, p.protocol)
        if a not in fes:
            fes[a] = new_frontend_params(a, t, name, p.name, p.port)
        if t is not cluster_ip and service.two_scopes:
            ai = a.with_scope(SCOPE_INTERNAL)
            fes.setdefault(ai, FrontendParams(ai, t, name, p.name, p.port))
    return tuple(fes.values())


def _service_ports(
    ref: ObjectRef, spec: Mapping[str, Any]
) -> tuple[list[ServicePort], dict[str, int]]:
    """``spec.ports`` and the port numbers by name; names are required with several ports
    and unique, as is each port and protocol."""
    ports: list[ServicePort] = []
    port_names: dict[str, int] = {}
    port_protos: set[tuple[int, str]] = set()
    for i, p in enumerate(_list(ref, "spec.ports", spec.get("ports"))):
        # The usual values are taken as they are; any other goes through the checking
        # helper, which converts it or names the field in its error.
        pm = p if type(p) is dict else _mapping(ref, f"spec.ports[{i}]", p)
        name = pm.get("name")
        if type(name) is not str:
            name = _str(ref, f"spec.ports[{i}].name", name)
        # The port's name is carried by every frontend of the port: one string for all
        # the services that name a port alike ("http").
        pname = _shared(name)
        port = pm.get("port")
        if type(port) is not int or not 0 < port <= 65535:
            port = _port(ref, f"spec.ports[{i}].port", port)
        proto = pm.get("protocol")
        if proto is None:
            proto = "TCP"
        elif type(proto) is not str or proto not in _CANONICAL_PROTOCOLS:
            proto = _proto(ref, f"spec.ports[{i}].protocol", proto)
        np = pm.get("nodePort")
        if np is None:
            node_port = 0
        elif type(np) is int and 0 <= np <= 65535:
            node_port = np
        else:
            node_port = _port(ref, f"spec.ports[{i}].nodePort", np, allow_zero=True)
        if pname and pname in port_names:
            raise ConversionError(ref, f"spec.ports[{i}].name", f"duplicate port name {pname!r}")
        if (port, proto) in port_protos:
            raise ConversionError(ref, f"spec.ports[{i}]", f"duplicate port {port}/{proto}")
        ports.append(new_service_port(pname, port, proto, node_port))
        port_names[pname] = port
        port_protos.add((port, proto))
    if len(ports) > 1:
        for i, sp in enumerate(ports):
            if not sp.name:
                raise ConversionError(
                    ref, f"spec.ports[{i}].name", "required when a service has several ports"
                )
    return ports, port_names


def _session_affinity(ref: ObjectRef, spec: Mapping[str, Any], cfg: LBConfig) -> tuple[bool, int]:
    """(ClientIP affinity on, its timeout in seconds; 0 without affinity)."""
    affinity_text = _str(ref, "spec.sessionAffinity", spec.get("sessionAffinity"), "None")
    if affinity_text not in ("None", "ClientIP"):
        raise ConversionError(ref, "spec.sessionAffinity", f"unknown value {affinity_text!r}")
    affinity = affinity_text == "ClientIP" and cfg.enable_session_affinity
    if not affinity:
        return False, 0
    timeout = DEFAULT_AFFINITY_TIMEOUT
    cfgmap = _mapping(ref, "spec.sessionAffinityConfig", spec.get("sessionAffinityConfig"))
    client = _mapping(ref, "spec.sessionAffinityConfig.clientIP", cfgmap.get("clientIP"))
    t = client.get("timeoutSeconds")
    if t is not None:
        if isinstance(t, bool) or not isinstance(t, int) or not 0 < t <= 86400:
            raise ConversionError(
                ref,
                "spec.sessionAffinityConfig.clientIP.timeoutSeconds",
                f"expected 1..86400 seconds, got {t!r}",
            )
        timeout = t
    return True, timeout


def _source_ranges(
    ref: ObjectRef, spec: Mapping[str, Any], annotations: Mapping[str, str]
) -> tuple[list[IPNetwork], SourceRangesPolicy]:
    """``spec.loadBalancerSourceRanges`` and whether they allow or deny (the annotation)."""
    ranges = []
    for i, c in enumerate(
        _list(ref, "spec.loadBalancerSourceRanges", spec.get("loadBalancerSourceRanges"))
    ):
        try:
            ranges.append(parse_cidr(_str(ref, f"spec.loadBalancerSourceRanges[{i}]", c)))
        except ValueError as e:
            raise ConversionError(ref, f"spec.loadBalancerSourceRanges[{i}]", str(e)) from None
    ranges_policy = SourceRangesPolicy.ALLOW
    if annotations.get(ANN_SRC_RANGES_POLICY, "").strip().lower() == "deny":
        ranges_policy = SourceRangesPolicy.DENY
    return ranges, ranges_policy


def _traffic_distribution(
    ref: ObjectRef, spec: Mapping[str, Any], annotations: Mapping[str, str]
) -> str:
    """``spec.trafficDistribution`` (unknown values: none), PreferClose as PreferSameZone,
    and the topology annotations' ``auto`` as PreferSameZone."""
    traffic_dist = _str(ref, "spec.trafficDistribution", spec.get("trafficDistribution"))
    if traffic_dist not in TRAFFIC_DISTRIBUTIONS:
        traffic_dist = ""
    # The deprecated PreferClose becomes PreferSameZone in the Service row itself.
    traffic_dist = TRAFFIC_DISTRIBUTION_ALIASES.get(traffic_dist, traffic_dist)
    topo = annotations.get(TOPOLOGY_MODE_ANNOTATION, annotations.get(TOPOLOGY_HINTS_ANNOTATION))
    if not traffic_dist and topo is not None and topo.strip().lower() in ("auto", "true"):
        traffic_dist = PREFER_SAME_ZONE
    return traffic_dist


def _annotated_algorithm_and_mode(
    ref: ObjectRef, annotations: Mapping[str, str], cfg: LBConfig
) -> tuple[LBAlgorithm, ForwardingMode]:
    """The per-service algorithm and forwarding mode annotations, when enabled."""
    algorithm = LBAlgorithm.UNDEF
    if cfg.algorithm_annotation and ANN_LB_ALGORITHM in annotations:
        alg = annotations[ANN_LB_ALGORITHM].strip().lower()
        try:
            algorithm = LBAlgorithm(alg)
        except ValueError:
            raise ConversionError(
                ref, f"metadata.annotations[{ANN_LB_ALGORITHM}]", f"unknown algorithm {alg!r}"
            ) from None
    fwd = ForwardingMode.UNDEF
    if cfg.mode_annotation and ANN_FORWARDING_MODE in annotations:
        mode = annotations[ANN_FORWARDING_MODE].strip().lower()
        try:
            fwd = ForwardingMode(mode)
        except ValueError:
            raise ConversionError(
                ref, f"metadata.annotations[{ANN_FORWARDING_MODE}]", f"unknown mode {mode!r}"
            ) from None
    return algorithm, fwd


_ALL_TYPES = frozenset(SVCType)


def _exposed_types(ref: ObjectRef, annotations: Mapping[str, str]) -> frozenset[SVCType]:
    """Frontend types to expose: all, or those named by service.cilium.io/type."""
    text = annotations.get(ANN_TYPE)
    if text is None or not text.strip():
        return _ALL_TYPES
    out: set[SVCType] = set()
    for part in text.split(","):
        try:
            out.add(SVCType(part.strip()))
        except ValueError:
            raise ConversionError(
                ref, f"metadata.annotations[{ANN_TYPE}]", f"unknown service type {part!r}"
            ) from None
    return frozenset(out)


# ----- EndpointSlice ----------------------------------------------------------------------
def _cond(ref: ObjectRef, path: str, value: Any, default: bool) -> bool:
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ConversionError(ref, path, f"expected true/false, got {value!r}")
    return value


def endpoint_state(ref: ObjectRef, path: str, conditions: Any) -> BackendState:
    """Backend state for an endpoint's conditions (missing conditions: ready).

    As in Kubernetes, ready overrides terminating and serving: a ready endpoint is active
    even while terminating (a Service with ``publishNotReadyAddresses`` keeps its
    terminating endpoints ready). Not ready: terminating ones are ``terminating`` while
    serving and ``terminating-not-serving`` after; the others are in maintenance."""
    cond = _mapping(ref, path, conditions)
    ready = _cond(ref, f"{path}.ready", cond.get("ready"), True)
    serving = _cond(ref, f"{path}.serving", cond.get("serving"), ready)
    terminating = _cond(ref, f"{path}.terminating", cond.get("terminating"), False)
    return _state_of(ready, serving, terminating)


def _state_of(ready: bool, serving: bool, terminating: bool) -> BackendState:
    if ready:
        return BackendState.ACTIVE
    if terminating:
        return BackendState.TERMINATING if serving else BackendState.TERMINATING_NOT_SERVING
    return BackendState.MAINTENANCE


#: (state, node, zone, sorted zones, IPs in network byte order: 4 bytes IPv4, 16 IPv6).
_EndpointFields = tuple[BackendState, str, str, tuple[str, ...], Sequence[bytes]]


def _endpoint_fast(ep: Any, want_v6: bool) -> _EndpointFields | None:
    """(state, node, zone, sorted zones, ips) of a plainly well-formed endpoint, else None.

    The usual endpoint (ready, serving or not said, not terminating or not said; one
    IPv4 address; no hints) is taken in a few steps, any other values through the
    helpers below."""
    if type(ep) is not dict:
        return None
    cond = ep.get("conditions")
    if (
        type(cond) is dict
        and cond.get("ready") is True
        and cond.get("serving", True) is True
        and cond.get("terminating", False) is False
    ):
        state = BackendState.ACTIVE
    else:
        found = _conditions_state(cond)
        if found is None:
            return None
        state = found
    node = ep.get("nodeName", "")
    if type(node) is not str:
        if node is not None:
            return None
        node = ""
    zone = ep.get("zone", "")
    if type(zone) is not str:
        if zone is not None:
            return None
        zone = ""
    hints = ep.get("hints")
    zones = () if hints is None else _hinted_zones(hints)
    if zones is None:
        return None
    addrs = ep.get("addresses")
    if type(addrs) is list and len(addrs) == 1 and not want_v6 and type(addrs[0]) is str:
        # Dotted-quad IPv4 straight to bytes (inet_pton accepts what ipaddress accepts,
        # see _parse_ip); anything else through _endpoint_ips.
        try:
            return state, node, zone, zones, (_inet_pton(_AF_INET, addrs[0]),)
        except (OSError, ValueError):
            pass
    ips = _endpoint_ips(addrs, want_v6)
    return None if ips is None else (state, node, zone, zones, ips)


def _conditions_state(cond: Any) -> BackendState | None:
    """The state of well-formed conditions (missing ones: ready), else None."""
    if cond is None:
        return BackendState.ACTIVE
    if type(cond) is not dict:
        return None
    ready = cond.get("ready", True)
    if ready is None:
        ready = True
    serving = cond.get("serving", ready)
    if serving is None:
        serving = ready
    terminating = cond.get("terminating", False)
    if terminating is None:
        terminating = False
    if type(ready) is not bool or type(serving) is not bool or type(terminating) is not bool:
        return None
    return _state_of(ready, serving, terminating)


def _hinted_zones(hints: Any) -> tuple[str, ...] | None:
    """The sorted ``hints.forZones`` names of well-formed hints, else None."""
    if type(hints) is not dict:
        return None
    fz = hints.get("forZones")
    if fz is None:
        return ()
    if type(fz) is not list:
        return None
    names = []
    for z in fz:
        if z is None:
            names.append("")
            continue
        if type(z) is not dict:
            return None
        zname = z.get("name")
        if zname is None:
            zname = ""
        elif type(zname) is not str:
            return None
        names.append(zname)
    return tuple(sorted(names))


def _endpoint_ips(addrs: Any, want_v6: bool) -> list[bytes] | None:
    """The addresses of a well-formed address list (1..MAX_ENDPOINT_ADDRESSES addresses
    of the slice's family) in network byte order, else None."""
    if type(addrs) is not list or not 0 < len(addrs) <= MAX_ENDPOINT_ADDRESSES:
        return None
    ips: list[bytes] = []
    for a in addrs:
        if type(a) is not str:
            return None
        try:
            packed = _inet_pton(_AF_INET, a)
        except (OSError, ValueError):
            try:
                packed = ipaddress.ip_address(a.strip()).packed
            except ValueError:
                return None
        if (len(packed) == 16) != want_v6:
            return None
        ips.append(packed)
    return ips


def _endpoint_checked(ref: ObjectRef, i: int, ep: Any, addr_type: str) -> _EndpointFields:
    """Like `_endpoint_fast`, validating every field and raising ConversionError."""
    path = f"endpoints[{i}]"
    em = _mapping(ref, path, ep)
    state = endpoint_state(ref, f"{path}.conditions", em.get("conditions"))
    node = _str(ref, f"{path}.nodeName", em.get("nodeName"))
    zone = _str(ref, f"{path}.zone", em.get("zone"))
    hints = _mapping(ref, f"{path}.hints", em.get("hints"))
    for_zones: list[str] = []
    for j, z in enumerate(_list(ref, f"{path}.hints.forZones", hints.get("forZones"))):
        zm = _mapping(ref, f"{path}.hints.forZones[{j}]", z)
        for_zones.append(_str(ref, f"{path}.hints.forZones[{j}].name", zm.get("name")))
    addrs = _list(ref, f"{path}.addresses", em.get("addresses"))
    _address_count(ref, i, addrs)
    ips = [_ip(ref, f"{path}.addresses[{j}]", a) for j, a in enumerate(addrs)]
    for j, ip in enumerate(ips):
        if (ip.version == 6) != (addr_type == "IPv6"):
            raise ConversionError(
                ref, f"{path}.addresses[{j}]", f"{ip} does not match addressType {addr_type}"
            )
    return state, node, zone, tuple(sorted(for_zones)), [ip.packed for ip in ips]


def _address_count(ref: ObjectRef, i: int, addrs: Sequence[Any]) -> None:
    """Raise ConversionError unless endpoint ``i`` has 1..MAX_ENDPOINT_ADDRESSES addresses."""
    if not addrs:
        raise ConversionError(ref, f"endpoints[{i}].addresses", "at least one address is required")
    if len(addrs) > MAX_ENDPOINT_ADDRESSES:
        raise ConversionError(
            ref,
            f"endpoints[{i}].addresses",
            f"at most {MAX_ENDPOINT_ADDRESSES} addresses, got {len(addrs)}",
        )


def _slice_weight(annotations: Mapping[str, str]) -> int:
    """The backends' weight from the slice's ``service.cilium.io/weight`` annotation: an
    integer 0..65535; absent or invalid (ignored, as Cilium does) gives the default."""
    text = annotations.get(ANN_WEIGHT)
    if text is None:
        return DEFAULT_WEIGHT
    text = text.strip()
    if not (text.isascii() and text.isdigit()):
        return DEFAULT_WEIGHT
    value = int(text)
    return value if value <= MAX_WEIGHT else DEFAULT_WEIGHT


def convert_endpoint_slice(
    obj: Mapping[str, Any],
    config: LBConfig | None = None,
    source: str = "k8s",
    previous: Mapping[bytes, BackendParams] | None = None,
    *,
    mark_order: bool = False,
) -> ConvertedEndpoints:
    """Convert a discovery.k8s.io/v1 EndpointSlice; raise ConversionError naming the field.

    ``previous``: the backends an earlier version of the slice converted to, by address;
    a backend equal to one of them is that object (an update that changed one endpoint
    gives the others' objects back, which the writer recognizes at once).
    ``mark_order``: backends that the loop for plain slices found in address order are
    an `OrderedBackends` (for the LB writer), else a `CheckedBackends` as any."""
    cfg = config if config is not None else LBConfig()
    ref = obj  # what errors name: `object_ref` of it, built only for an error
    meta: Any = obj.get("metadata")
    names = _plain_slice_names(meta)
    if names is None:
        names = _slice_names(ref, obj)
        meta = obj["metadata"]  # a mapping: checked by _slice_names
    slice_name, service_name = names
    # The usual values are taken as they are; any other goes through the checking helper,
    # which converts it or names the field in its error.
    raw_annotations = meta.get("annotations")
    weight = (
        DEFAULT_WEIGHT
        if raw_annotations is None
        else _slice_weight(_str_map(ref, "metadata.annotations", raw_annotations))
    )
    addr_type = obj.get("addressType")
    if type(addr_type) is not str:
        addr_type = _str(ref, "addressType", addr_type, "IPv4")
    if addr_type not in ("IPv4", "IPv6", "FQDN"):
        raise ConversionError(ref, "addressType", f"unknown address type {addr_type!r}")
    endpoints = obj.get("endpoints")
    if type(endpoints) is not list:
        endpoints = _list(ref, "endpoints", endpoints)
    if len(endpoints) > MAX_SLICE_ENDPOINTS:
        raise ConversionError(
            ref, "endpoints", f"at most {MAX_SLICE_ENDPOINTS} endpoints, got {len(endpoints)}"
        )
    raw_ports = obj.get("ports")
    if type(raw_ports) is not list:
        raw_ports = _list(ref, "ports", raw_ports)
    if len(raw_ports) > MAX_SLICE_PORTS:
        raise ConversionError(
            ref, "ports", f"at most {MAX_SLICE_PORTS} ports, got {len(raw_ports)}"
        )
    if addr_type == "FQDN":
        for i, ep in enumerate(endpoints):
            em = _mapping(ref, f"endpoints[{i}]", ep)
            _address_count(ref, i, _list(ref, f"endpoints[{i}].addresses", em.get("addresses")))
        return ConvertedEndpoints(slice_name, service_name, _NO_BACKENDS)
    want_v6 = addr_type == "IPv6"
    port_keys = _port_keys(ref, raw_ports, want_v6)
    # Every address of a slice has its family (checked per endpoint below).
    family_on = cfg.enable_ipv6 if want_v6 else cfg.enable_ipv4
    checked = (
        _plain_endpoint_backends(endpoints, port_keys[0], (weight, source, mark_order), previous)
        if len(port_keys) == 1 and not want_v6 and family_on and weight
        else None
    )
    if checked is None:
        checked = CheckedBackends(
            _endpoint_backends(
                ref, endpoints, addr_type, port_keys, (weight, source, family_on), previous
            ).values()
        )
    # Checked as the writer would check them (one source, ports, weights, states; distinct
    # addresses): it takes them as they are.
    return new_converted_endpoints(slice_name, service_name, checked)


#: The backends of a slice that gives none (FQDN): checked, as every converted slice's.
_NO_BACKENDS = CheckedBackends()


def _plain_slice_names(meta: Any) -> tuple[str, str] | None:
    """(slice name, service name) of plain metadata (a namespace, a name, string labels
    naming the service), else None: `_slice_names` then checks it field by field.

    Both names interned: the reflector's key of the slice is the same string, and the
    Service's own conversion holds the same service name."""
    if type(meta) is not dict:
        return None
    name, ns, labels = meta.get("name"), meta.get("namespace"), meta.get("labels")
    if type(name) is not str or type(ns) is not str or not name or not ns:
        return None
    if type(labels) is not dict:
        return None
    svc = labels.get(SERVICE_NAME_LABEL)
    if type(svc) is not str or not svc:
        return None
    if len(labels) > 1:
        try:
            # Every label's value a string (`_str_map` would refuse some others): in C.
            "".join(labels.values())
        except TypeError:
            return None
    return sys.intern(f"{ns}/{name}"), sys.intern(f"{ns}/{svc}")


def _slice_names(ref: ObjectRef, obj: Mapping[str, Any]) -> tuple[str, str]:
    """(slice name, service name) of any slice, checking its metadata field by field
    (ConversionError naming the first bad one); interned as `_plain_slice_names`'."""
    slice_name = sys.intern(namespaced_name(obj))
    meta = obj.get("metadata")
    if type(meta) is not dict:
        meta = _mapping(ref, "metadata", meta)
    labels = _str_map(ref, "metadata.labels", meta.get("labels"))
    svc = labels.get(SERVICE_NAME_LABEL, "")
    if not svc:
        raise ConversionError(ref, f"metadata.labels[{SERVICE_NAME_LABEL}]", "missing")
    return slice_name, sys.intern(f"{slice_name.split('/', 1)[0]}/{svc}")


#: Per slice port: (name, the tuple of that one name, key prefix, key suffix).
_PortKey = tuple[str, tuple[str, ...], bytes, bytes]
#: The port keys of a slice's one port by its (name, port, protocol, IPv6?) as given:
#: most slices have one of a few ports. Cleared when it grows past _SHARED_MAX.
_ONE_PORT_KEYS: dict[tuple[str, int, str | None, bool], list[_PortKey]] = {}


def _port_keys(ref: ObjectRef, raw_ports: Sequence[Any], want_v6: bool) -> list[_PortKey]:
    """Per port of the slice (`_slice_ports`): its name, the tuple of that one name
    (shared by every backend of the slice) and its key's prefix and suffix (port,
    protocol, family: validated once here). The list is shared: not to be changed."""
    cache_key = None
    if len(raw_ports) == 1 and type(p := raw_ports[0]) is dict:
        name, port, proto = p.get("name"), p.get("port"), p.get("protocol")
        if type(name) is str and type(port) is int and (proto is None or type(proto) is str):
            cache_key = (name, port, proto, want_v6)
            found = _ONE_PORT_KEYS.get(cache_key)
            if found is not None:
                return found
    prefix = b"" if want_v6 else V4_KEY_PREFIX
    keys = [
        (pname, _shared((pname,)) if pname else (), prefix,
         addr_key_suffix(port, proto, want_v6))
        for pname, port, proto in _slice_ports(ref, raw_ports)
    ]
    if cache_key is not None:
        if len(_ONE_PORT_KEYS) >= _SHARED_MAX:
            _ONE_PORT_KEYS.clear()
        _ONE_PORT_KEYS[cache_key] = keys
    return keys


def _slice_ports(ref: ObjectRef, raw_ports: Sequence[Any]) -> list[tuple[str, int, str]]:
    """(name, port, protocol) of each of a slice's ``ports`` that has a port number."""
    ports: list[tuple[str, int, str]] = []
    for i, p in enumerate(raw_ports):
        # The usual values are taken as they are; any other goes through the checking
        # helper, which converts it or names the field in its error (in field order).
        pm = p if type(p) is dict else _mapping(ref, f"ports[{i}]", p)
        port = pm.get("port")
        if port is None:
            continue
        name = pm.get("name")
        if type(name) is not str:
            name = _str(ref, f"ports[{i}].name", name)
        if type(port) is not int or not 0 < port <= 65535:
            port = _port(ref, f"ports[{i}].port", port)
        proto = pm.get("protocol")
        if proto is None:
            proto = "TCP"
        elif type(proto) is not str or proto not in _CANONICAL_PROTOCOLS:
            proto = _proto(ref, f"ports[{i}].protocol", proto)
        ports.append((_shared(name), port, proto))
    return ports


def _plain_endpoint_backends(
    endpoints: Sequence[Any],
    port_key: _PortKey,
    common: tuple[int, str, bool],
    previous: Mapping[bytes, BackendParams] | None,
) -> CheckedBackends | None:
    """`_endpoint_backends` of an IPv4 slice with one port and a weight (not 0) whose
    endpoints are all plain (nearly every slice): each ready (serving and not terminating,
    or unsaid), with a string node and zone, no hints and one address, the addresses
    distinct. None for any other slice, which `_endpoint_backends` converts (and checks)
    from the start: this loop only takes what it would make of a plain one.

    The endpoints are checked and their addresses' texts taken in one loop; the
    addresses and the backends are then made in one call each. ``common``: the slice's
    weight, the source and whether backends in address order are to be an
    `OrderedBackends`."""
    weight, source, mark_order = common
    _, port_names, prefix, suffix = port_key
    texts: list[Any] = []
    add_text = texts.append
    d_node = d_zone = None
    rest: Any = None
    # Each endpoint's shared rest, once the endpoints are on more than one node or zone.
    rests: list[Any] | None = None
    try:
        for ep in endpoints:
            if type(ep) is not dict:
                return None
            # Ready; serving or not said; not terminating or not said: the keys
            # looked up are those the conditions have room for.
            cond = ep["conditions"]
            if type(cond) is not dict or cond["ready"] is not True:
                return None
            if len(cond) != 1:
                serving = cond.get("serving", _ABSENT)
                if serving is True:
                    if len(cond) != 2 and cond.get("terminating", False) is not False:
                        return None
                elif serving is not _ABSENT or cond.get("terminating", False) is not False:
                    return None
            addrs = ep["addresses"]
            if type(addrs) is not list:
                return None
            if len(ep) == 2:  # only its addresses and conditions
                node = zone = ""
            else:
                if ep.get("hints") is not None:
                    return None
                node, zone = ep.get("nodeName", ""), ep.get("zone", "")
            if rest is None or node != d_node or zone != d_zone:
                if type(node) is not str or type(zone) is not str:
                    return None
                if rests is None and texts:
                    rests = [rest] * len(texts)
                d_node, d_zone = node, zone
                rest = _active_backend_rest(node, zone, port_names, weight, source)
            if rests is not None:
                rests.append(rest)
            (ip,) = addrs  # one address (else ValueError)
            add_text(ip)
    except (KeyError, ValueError, TypeError):
        # No addresses or conditions (KeyError), or an address as above.
        return None
    # Each a dotted-quad IPv4 string straight to its key: inet_pton accepts what
    # ipaddress accepts (see _parse_ip). Anything else through the general loop.
    made = addrs_of_ipv4(prefix, texts, suffix)
    if made is None:
        return None
    addresses, ordered = made  # (addresses in increasing order are distinct)
    if type(endpoints) is list:
        # Each endpoint's one IPv4 address is in its key: for the slice's origin row.
        remember_addresses(endpoints, addresses, len(prefix))
    n = len(addresses)
    if not ordered and len(set(addresses)) != n:
        return None  # an address twice: merged by the general loop
    params = backend_params_of(addresses, repeat(rest, n) if rests is None else rests)
    if previous:
        # A backend equal to one the slice gave before is that object.
        shared = backend_shared_part
        for i, a in enumerate(addresses):
            old = previous.get(a)
            if old is not None and shared(old) == shared(params[i]):
                params[i] = old
    # All IPv4 and of the one port's names: in order, they are an OrderedBackends.
    return OrderedBackends(params) if ordered and mark_order else CheckedBackends(params)


#: A key's value when it is not there (no value of a parsed object is this one).
_ABSENT: Any = object()


def _endpoint_backends(
    ref: ObjectRef,
    endpoints: Sequence[Any],
    addr_type: str,
    port_keys: list[_PortKey],
    common: tuple[int, str, bool],
    previous: Mapping[bytes, BackendParams] | None,
) -> dict[L3n4Addr, BackendParams]:
    """The backends of a slice's endpoints, by address (`convert_endpoint_slice`);
    ``common``: the slice's weight, the source and whether its family is enabled."""
    weight, source, family_on = common
    want_v6 = addr_type == "IPv6"
    # Keyed by the addresses (each is its encoded key: hashed and compared in C).
    merged: dict[L3n4Addr, BackendParams] = {}
    # The shared details tuple of the endpoint before (most endpoints of a slice have
    # the same node, zone and hints, or a few distinct ones), and the shared tuples of
    # everything but the address made from it, by (port names, state).
    d_node = d_zone = None
    d_zones: tuple[str, ...] | None = None
    details = _backend_details("", "", (), 0, source, False, 0.0)
    rests: dict[tuple[tuple[str, ...], BackendState], Any] = {}
    # The last rest looked up, by its port names and state (most backends in a row share
    # them): no key tuple and lookup per backend.
    last_names: tuple[str, ...] | None = None
    last_state: BackendState | None = None
    last_rest: Any = None
    for i, ep in enumerate(endpoints):
        # Well-formed endpoints take the fast path; anything unusual is validated (and
        # reported) field by field by _endpoint_checked.
        fields = _endpoint_fast(ep, want_v6)
        if fields is None:
            fields = _endpoint_checked(ref, i, ep, addr_type)
        state, node, zone, zones, ips = fields
        if not family_on:
            continue
        if weight == 0:
            # Weight 0: in maintenance (existing connections live on, no new ones).
            state = BackendState.MAINTENANCE
        if node != d_node or zone != d_zone or zones != d_zones:
            d_node, d_zone, d_zones = node, zone, zones
            # BackendParams' details: node_name, zone, for_zones, cluster_id, source,
            # unhealthy, unhealthy_updated_at.
            details = _backend_details(node, zone, zones, 0, source, False, 0.0)
            rests = {}
            last_names = None
        for ip in ips:
            for pname, single, pre, suffix in port_keys:
                # The address's key: an L3n4Addr equals (and hashes like) its bytes.
                k = pre + ip + suffix
                prev = merged.get(k)  # type: ignore[call-overload]
                if prev is None:
                    port_names: tuple[str, ...] = single
                else:
                    names = set(prev.port_names)
                    if pname:
                        names.add(pname)
                    port_names = tuple(sorted(names))
                if port_names is last_names and state is last_state:
                    rest = last_rest
                else:
                    rest = rests.get((port_names, state))
                    if rest is None:
                        rest = rests[port_names, state] = _backend_rest(
                            details, port_names, weight, state
                        )
                    last_names, last_state, last_rest = port_names, state, rest
                old = previous.get(k) if previous else None
                if old is not None and (old._rest is rest or old._rest == rest):
                    merged[old.address] = old
                    continue
                a = prev.address if prev is not None else addr_of_key(k)
                merged[a] = new_backend_params_from(a, rest)
    return merged


# ----- Pod host ports ----------------------------------------------------------------------
def convert_pod_host_ports(
    obj: Mapping[str, Any], config: LBConfig | None = None
) -> list[tuple[ConvertedService, tuple[BackendParams, ...]]]:
    """Convert a Pod's host ports into HostPort services with their backends."""
    cfg = config if config is not None else LBConfig()
    ref = obj  # what errors name: `object_ref` of it, built only for an error
    pod_name = namespaced_name(obj)
    meta = _mapping(ref, "metadata", obj.get("metadata"))
    uid = _str(ref, "metadata.uid", meta.get("uid"))
    spec = _mapping(ref, "spec", obj.get("spec"))
    status = _mapping(ref, "status", obj.get("status"))
    phase = _str(ref, "status.phase", status.get("phase"))
    if not cfg.enable_host_port or phase in ("Succeeded", "Failed"):
        return []
    pod_ips: list[IPAddress] = []
    for i, pip in enumerate(_list(ref, "status.podIPs", status.get("podIPs"))):
        pm = _mapping(ref, f"status.podIPs[{i}]", pip)
        pod_ips.append(_ip(ref, f"status.podIPs[{i}].ip", pm.get("ip")))
    if not pod_ips and status.get("podIP"):
        pod_ips.append(_ip(ref, "status.podIP", status.get("podIP")))
    node = _str(ref, "spec.nodeName", spec.get("nodeName"))
    out: list[tuple[ConvertedService, tuple[BackendParams, ...]]] = []
    for ci, c in enumerate(_list(ref, "spec.containers", spec.get("containers"))):
        cm = _mapping(ref, f"spec.containers[{ci}]", c)
        for pi, p in enumerate(_list(ref, f"spec.containers[{ci}].ports", cm.get("ports"))):
            path = f"spec.containers[{ci}].ports[{pi}]"
            pm = _mapping(ref, path, p)
            if not pm.get("hostPort"):
                continue
            host_port = _port(ref, f"{path}.hostPort", pm.get("hostPort"))
            cport = _port(ref, f"{path}.containerPort", pm.get("containerPort"))
            proto = _proto(ref, f"{path}.protocol", pm.get("protocol"))
            host_ip = pm.get("hostIP")
            hip = None if not host_ip else _ip(ref, f"{path}.hostIP", host_ip)
            name = f"{pod_name}:host-port:{host_port}:{uid}"
            svc = Service(
                name=name,
                source="k8s",
                loopback_host_port=bool(hip is not None and hip.is_loopback),
            )
            fes: list[FrontendParams] = []
            bes: list[BackendParams] = []
            for fam in sorted({ip.version for ip in pod_ips if _family_enabled(ip, cfg)}):
                if hip is not None and not hip.is_unspecified and not hip.is_loopback:
                    if hip.version != fam:
                        continue
                    fa = hip
                else:
                    fa = ipaddress.ip_address("0.0.0.0" if fam == 4 else "::")
                a = L3n4Addr(fa, host_port, proto)
                fes.append(FrontendParams(a, SVCType.HOST_PORT, name, "", host_port))
            for ip in pod_ips:
                if _family_enabled(ip, cfg):
                    bes.append(
                        BackendParams(L3n4Addr(ip, cport, proto), node_name=node, source="k8s")
                    )
            out.append((ConvertedService(svc, tuple(fes)), tuple(bes)))
    return out


# ----- the stateful converter ------------------------------------------------------------
#: A service's slices: (slice name, its backends) for the one slice nearly every service
#: has (a pair, 56 bytes: a dict of one entry takes 200), else slice name -> backends.
_Slices = tuple[str, tuple[BackendParams, ...]] | dict[str, tuple[BackendParams, ...]]


@dataclass(slots=True)
class _State:
    """What the converter has applied, to merge slices and undo deletions."""

    services: set[ServiceName] = field(default_factory=set)  # names of applied services
    # service -> its slices (`_Slices`); a value is replaced, never changed in place
    slices: dict[ServiceName, _Slices] = field(default_factory=dict)
    slice_service: dict[str, ServiceName] = field(default_factory=dict)
    pods: dict[str, list[ServiceName]] = field(default_factory=dict)


# A Python class also when the module is compiled (its methods are compiled all the same):
# its methods can be wrapped (`benchmarks/k8s.py --phases` times them) and tests can patch
# them, as with its source.
@mypyc_attr(native_class=False)
class K8sConverter:
    """Applies Kubernetes objects to the LB tables through an `LBWriter`.

    Call its methods inside ``with writer.write_txn() as txn:``. A method that
    raises (ConversionError, FrontendConflictError, ...) has changed neither the
    converter's memory nor, when the caller aborts the transaction, the tables.
    """

    def __init__(
        self, writer: LBWriter, config: LBConfig | None = None, source: str = "k8s"
    ) -> None:
        self.writer = writer
        self.config = config if config is not None else writer.config
        #: Source name written on services and backend instances ("k8s", or "api" for the
        #: state file).
        self.source = source
        self._st = _State()

    def checkpoint(self) -> object:
        """Return a copy of the converter's memory, for `rollback` when a txn is aborted."""
        st = self._st
        return _State(
            set(st.services),
            dict(st.slices),  # its values are replaced, never changed in place
            dict(st.slice_service),
            {k: list(v) for k, v in st.pods.items()},
        )

    def rollback(self, checkpoint: object) -> None:
        """Restore the memory saved by `checkpoint` (after aborting the write txn)."""
        assert isinstance(checkpoint, _State)
        self._st = checkpoint

    # ----- dispatch -----------------------------------------------------------------------
    def upsert(self, txn: WriteTxn, obj: Mapping[str, Any]) -> None:
        """Add or update any supported object (by ``kind``)."""
        kind = object_kind(obj)
        if kind == KIND_SERVICE:
            self.upsert_service(txn, obj)
        elif kind == KIND_ENDPOINT_SLICE:
            self.upsert_endpoint_slice(txn, obj)
        elif kind == KIND_POD:
            self.upsert_pod(txn, obj)
        else:
            raise ConversionError(object_ref(obj), "kind", f"unsupported kind {kind!r}")

    def delete(self, txn: WriteTxn, obj: Mapping[str, Any]) -> None:
        """Delete any supported object (by ``kind``); only its name is needed."""
        kind = object_kind(obj)
        name = namespaced_name(obj)
        if kind == KIND_SERVICE:
            self.delete_service(txn, name)
        elif kind == KIND_ENDPOINT_SLICE:
            self.delete_endpoint_slice(txn, name)
        elif kind == KIND_POD:
            self.delete_pod(txn, name)
        else:
            raise ConversionError(object_ref(obj), "kind", f"unsupported kind {kind!r}")

    def check(self, obj: Mapping[str, Any]) -> None:
        """Convert ``obj`` as `upsert` would, writing nothing: raise ConversionError if it
        is invalid. (Conflicts with rows already in the tables show only in `upsert`.)"""
        kind = object_kind(obj)
        if kind == KIND_SERVICE:
            convert_service(obj, self.config, self.writer.node_labels, self.source)
        elif kind == KIND_ENDPOINT_SLICE:
            convert_endpoint_slice(obj, self.config, self.source)
        elif kind == KIND_POD:
            convert_pod_host_ports(obj, self.config)
        else:
            raise ConversionError(object_ref(obj), "kind", f"unsupported kind {kind!r}")

    @staticmethod
    def supports(obj: Mapping[str, Any]) -> bool:
        """True for the kinds this converter handles."""
        return object_kind(obj) in (KIND_SERVICE, KIND_ENDPOINT_SLICE, KIND_POD)

    # ----- services ------------------------------------------------------------------------
    def upsert_service(self, txn: WriteTxn, obj: Mapping[str, Any]) -> None:
        """Add or update a Service (its row and complete frontend set)."""
        plain = _plain_service(obj, self.config, self.source)
        if plain is not None:  # nearly every Service: always exposed
            service, frontends = plain
            if frontends:
                self.writer.upsert_service_and_frontend(txn, service, frontends[0])
            else:
                self.writer.upsert_service_and_frontends(txn, service, frontends)
            self._st.services.add(service.name)
            return
        conv = convert_service(obj, self.config, self.writer.node_labels, self.source)
        if conv.not_exposed:
            self.delete_service(txn, conv.service.name)
            return
        self.writer.upsert_service_and_frontends(txn, conv.service, conv.frontends)
        self._st.services.add(conv.service.name)

    def delete_service(self, txn: WriteTxn, name: ServiceName) -> None:
        """Delete a Service and its frontends (its backends stay until their slices go)."""
        self.writer.delete_service_and_frontends(txn, name)
        self._st.services.discard(name)

    # ----- endpoint slices ------------------------------------------------------------------
    def upsert_endpoint_slice(self, txn: WriteTxn, obj: Mapping[str, Any]) -> None:
        """Add or update an EndpointSlice; the service's backends become the union of its
        slices."""
        conv = convert_endpoint_slice(
            obj, self.config, self.source, self._slice_backends(obj), mark_order=True
        )
        st = self._st
        old_svc = st.slice_service.get(conv.slice_name)
        kept = st.slices.get(conv.service_name)
        if (old_svc is None or old_svc == conv.service_name) and (
            kept is None or (type(kept) is tuple and kept[0] == conv.slice_name)
        ):
            # The service's only slice (the usual case): its backends are the slice's.
            self.writer.set_backends(txn, conv.service_name, self.source, conv.backends)
            st.slices[conv.service_name] = (conv.slice_name, conv.backends)
            st.slice_service[conv.slice_name] = conv.service_name
            return
        moved = old_svc is not None and old_svc != conv.service_name
        if old_svc is not None and moved:
            self._apply_slices(txn, old_svc, drop=conv.slice_name)
        self._apply_slices(txn, conv.service_name, put=(conv.slice_name, conv.backends))
        if old_svc is not None and moved:
            left = self._slices_of(old_svc)
            left.pop(conv.slice_name, None)
            self._keep_slices(old_svc, left)
        slices = self._slices_of(conv.service_name)
        slices[conv.slice_name] = conv.backends
        self._keep_slices(conv.service_name, slices)
        self._st.slice_service[conv.slice_name] = conv.service_name

    def delete_endpoint_slice(self, txn: WriteTxn, slice_name: str) -> None:
        """Delete an EndpointSlice by ``namespace/name``, releasing its backends."""
        svc = self._st.slice_service.get(slice_name)
        if svc is None:
            return
        self._apply_slices(txn, svc, drop=slice_name)
        slices = self._slices_of(svc)
        slices.pop(slice_name, None)
        self._keep_slices(svc, slices)
        del self._st.slice_service[slice_name]

    def _slice_backends(self, obj: Mapping[str, Any]) -> dict[bytes, BackendParams] | None:
        """The backends the slice ``obj`` (by its name) gave when last applied, by
        address; None for a slice not applied before (or a malformed one)."""
        st = self._st
        if not st.slice_service:
            return None
        meta = obj.get("metadata")
        if type(meta) is not dict:
            return None
        name, ns = meta.get("name"), meta.get("namespace") or "default"
        if type(name) is not str or type(ns) is not str:
            return None
        slice_name = f"{ns}/{name}"
        svc = st.slice_service.get(slice_name)
        kept = st.slices.get(svc) if svc is not None else None
        if kept is None:
            return None
        if type(kept) is tuple:
            backends = kept[1] if kept[0] == slice_name else None
        else:
            assert isinstance(kept, dict)
            backends = kept.get(slice_name)
        return {b.address: b for b in backends} if backends else None

    def _slices_of(self, service: ServiceName) -> dict[str, tuple[BackendParams, ...]]:
        """The slices of ``service`` as a new dict (slice name -> backends)."""
        kept = self._st.slices.get(service)
        if kept is None:
            return {}
        if type(kept) is tuple:
            return {kept[0]: kept[1]}
        assert isinstance(kept, dict)
        return dict(kept)

    def _keep_slices(
        self, service: ServiceName, slices: dict[str, tuple[BackendParams, ...]]
    ) -> None:
        """Remember ``slices`` as the slices of ``service`` (one slice as a pair)."""
        if not slices:
            self._st.slices.pop(service, None)
        elif len(slices) == 1:
            ((name, backends),) = slices.items()
            self._st.slices[service] = (name, backends)
        else:
            self._st.slices[service] = slices

    def _apply_slices(
        self,
        txn: WriteTxn,
        service: ServiceName,
        put: tuple[str, tuple[BackendParams, ...]] | None = None,
        drop: str | None = None,
    ) -> None:
        slices = self._slices_of(service)
        if put is not None:
            slices[put[0]] = put[1]
        if drop is not None:
            slices.pop(drop, None)
        if len(slices) == 1:
            # One slice (the usual case): its backends have distinct addresses already.
            (only,) = slices.values()
            self.writer.set_backends(txn, service, self.source, only)
            return
        union: dict[L3n4Addr, BackendParams] = {}
        for name in sorted(slices):
            for be in slices[name]:
                prev = union.get(be.address)
                # An address in several slices (a transition): prefer an active instance.
                if prev is None or _state_rank(be) < _state_rank(prev):
                    union[be.address] = be
        self.writer.set_backends(txn, service, self.source, union.values())

    # ----- pods (host ports) -------------------------------------------------------------
    def upsert_pod(self, txn: WriteTxn, obj: Mapping[str, Any]) -> None:
        """Add or update a Pod's HostPort services."""
        pod = namespaced_name(obj)
        converted = convert_pod_host_ports(obj, self.config)
        new_names = [c.service.name for c, _ in converted]
        # Remove services of a previous incarnation (another uid) first: they hold the
        # same host-port frontends.
        for old in self._st.pods.get(pod, []):
            if old not in new_names:
                self.writer.delete_service_and_frontends(txn, old)
                self.writer.release_backends_of_service(txn, old)
        for c, bes in converted:
            self.writer.upsert_service_and_frontends(txn, c.service, c.frontends)
            self.writer.set_backends(txn, c.service.name, "k8s", bes)
        if new_names:
            self._st.pods[pod] = new_names
        else:
            self._st.pods.pop(pod, None)

    def delete_pod(self, txn: WriteTxn, pod: str) -> None:
        """Delete a Pod's HostPort services and backends."""
        for old in self._st.pods.pop(pod, []):
            self.writer.delete_service_and_frontends(txn, old)
            self.writer.release_backends_of_service(txn, old)

    # ----- resync ---------------------------------------------------------------------------
    def known_objects(self, kind: str) -> list[str]:
        """Names of the objects of ``kind`` currently applied (for resyncs)."""
        if kind == KIND_SERVICE:
            return sorted(self._st.services)
        if kind == KIND_ENDPOINT_SLICE:
            return sorted(self._st.slice_service)
        if kind == KIND_POD:
            return sorted(self._st.pods)
        return []

    def resync(self, txn: WriteTxn, kind: str, objs: Iterable[Mapping[str, Any]]) -> None:
        """Make ``objs`` the complete set of objects of ``kind``: upsert them, delete the rest."""
        keep: set[str] = set()
        items = list(objs)
        for obj in items:
            if object_kind(obj) != kind:
                raise ConversionError(object_ref(obj), "kind", f"expected {kind}")
            keep.add(namespaced_name(obj))
        for name in self.known_objects(kind):
            if name not in keep:
                if kind == KIND_SERVICE:
                    self.delete_service(txn, name)
                elif kind == KIND_ENDPOINT_SLICE:
                    self.delete_endpoint_slice(txn, name)
                else:
                    self.delete_pod(txn, name)
        for obj in items:
            self.upsert(txn, obj)


def _state_rank(be: BackendParams) -> int:
    return {
        BackendState.ACTIVE: 0,
        BackendState.TERMINATING: 1,
        BackendState.TERMINATING_NOT_SERVING: 2,
    }.get(be.state, 3)
