"""The endpoints table: the local workloads (pods) this agent connects, one row per endpoint.

An endpoint is what Cilium's agent creates for a pod's network interface: a numeric
endpoint id (1..4095, ``lxc_id`` in the datapath), the container and its interface (the
host-side veth name and ifindex, the container-side name), MACs, IPv4/IPv6 addresses from
IPAM, the pod's name, namespace and labels, its security identity, its netns path and a
state:

* ``waiting-for-identity``: no identity yet. Identities are allocated on the node in the
  transaction that creates the endpoint, so a committed endpoint is never in this state
  (it is the default of an `Endpoint` built before that transaction);
* ``restoring``: read back from the state directory at start, until the agent's restore
  is complete (host entries derived, pruning allowed);
* ``regenerating``: identity known, its endpoint-map and ipcache entries are being
  written into the maps by the reconcilers (after create, after a change of its entries,
  after restoring);
* ``ready``: every entry of the endpoint is Done, i.e. in the maps;
* ``disconnecting``: being deleted: its entries are out of the entry tables and the
  reconcilers are removing them from the maps; then the row goes.

tables/endpoint_manager.py makes the transitions.

`EndpointChange` is the validated form of an endpoint change request (``PUT /endpoint``
body, Cilium's ``EndpointChangeRequest`` model: ``container-id``, ``interface-name``,
``interface-index``, ``container-interface-name``, ``mac``, ``host-mac``,
``addressing: {ipv4, ipv6}``, ``k8s-pod-name``, ``k8s-namespace``, ``labels``,
``netns-path``, ``datapath-configuration: {external-ipam}``); a bad request raises
`EndpointRequestError` naming the field.
"""

from __future__ import annotations

import enum
import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from statedb import Index, Table
from statedb import keys as keycodec
from statedb.errors import InputError, StatewrightError
from tables.identities import (
    AGENT_LABEL_SOURCE,
    NAMESPACE_LABELS_PREFIX,
    POD_NAMESPACE_LABEL,
    LabelError,
    Labels,
    namespace_identity_labels,
    normalize_labels,
)
from tables.l3n4 import IPAddress

ENDPOINTS_TABLE = "endpoints"
MIN_ENDPOINT_ID = 1
MAX_ENDPOINT_ID = 4095  # Cilium's endpoint id range (the datapath's lxc_id)

#: An IANA service name, what a container port's name is (Kubernetes' IsValidPortName).
_PORT_NAME = re.compile(r"^(?=.*[a-z])(?!.*--)[a-z0-9]([a-z0-9-]{0,13}[a-z0-9])?$")
#: The protocols a named port may have.
PORT_PROTOCOLS = {"TCP": 6, "UDP": 17, "SCTP": 132}
_PROTOCOL_NAMES = {v: k for k, v in PORT_PROTOCOLS.items()}
#: A named port: (name, IP protocol number, port).
NamedPort = tuple[str, int, int]


def port_name_ok(name: str) -> bool:
    """Whether ``name`` is a valid port name (an IANA service name)."""
    return bool(_PORT_NAME.match(name))


def parse_named_ports(value: Any, what: str) -> tuple[NamedPort, ...]:
    """Named ports as Kubernetes' container ports or Cilium's ``Port`` model list them
    (``[{"name": .., "port"|"containerPort": .., "protocol": ..}]``, protocol TCP when
    missing); entries without a name are skipped. ValueError naming ``what`` and the
    entry when malformed."""
    if not isinstance(value, list):
        raise ValueError(f"{what}: expected a list of ports")
    out: set[NamedPort] = set()
    for i, p in enumerate(value):
        if not isinstance(p, Mapping):
            raise ValueError(f"{what}[{i}]: expected an object")
        name = p.get("name")
        if name in (None, ""):
            continue
        port = p.get("port", p.get("containerPort"))
        proto = p.get("protocol") or "TCP"
        if not isinstance(name, str) or not port_name_ok(name):
            raise ValueError(f"{what}[{i}].name: {name!r} is not a port name")
        if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
            raise ValueError(f"{what}[{i}].port: {port!r} is not a port number")
        if not isinstance(proto, str) or proto.upper() not in PORT_PROTOCOLS:
            raise ValueError(f"{what}[{i}].protocol: {proto!r} is not TCP, UDP or SCTP")
        out.add((name, PORT_PROTOCOLS[proto.upper()], port))
    return tuple(sorted(out))


def named_ports_json(ports: tuple[NamedPort, ...]) -> list[dict[str, Any]]:
    """Named ports as Cilium's ``Port`` model (``name``, ``port``, ``protocol``)."""
    return [{"name": n, "port": port, "protocol": _PROTOCOL_NAMES[proto]}
            for n, proto, port in ports]


_MAC = re.compile(r"^[0-9a-fA-F]{2}(:[0-9a-fA-F]{2}){5}$")
_IFNAME = re.compile(r"^[^/\s:]{1,15}$")  # IFNAMSIZ - 1, no '/', ':' or whitespace


class EndpointState(enum.Enum):
    """Lifecycle state of an endpoint (Cilium's names)."""

    WAITING_FOR_IDENTITY = "waiting-for-identity"
    REGENERATING = "regenerating"
    READY = "ready"
    DISCONNECTING = "disconnecting"
    RESTORING = "restoring"


class EndpointError(StatewrightError):
    """An endpoint operation that failed; ``http_status`` is what the API answers."""

    http_status = 500


class EndpointRequestError(InputError, EndpointError):
    """A bad endpoint change request (400); the message names the field. Changes nothing."""

    http_status = 400


class EndpointNotFoundError(EndpointError):
    """No endpoint matches the id (404)."""

    http_status = 404


class EndpointExistsError(EndpointError):
    """PUT of an endpoint that already exists, or an id in use (409)."""

    http_status = 409


def mac_to_u64(mac: str) -> int:
    """A MAC ``aa:bb:..`` as the datapath's ``mac_t``: the six bytes in memory order."""
    return int.from_bytes(bytes.fromhex(mac.replace(":", "")) + b"\0\0", "little") if mac else 0


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One local endpoint (see the module doc for the fields' meaning)."""

    id: int
    container_id: str = ""
    interface_name: str = ""  # host side (the veth in the host netns)
    ifindex: int = 0  # host-side ifindex
    container_interface_name: str = ""
    mac: str = ""  # container side
    host_mac: str = ""  # host side
    ipv4: ipaddress.IPv4Address | None = None
    ipv6: ipaddress.IPv6Address | None = None
    pod_name: str = ""
    pod_namespace: str = ""
    labels: Labels = ()
    identity: int = 0
    netns_path: str = ""
    #: Addresses come from another IPAM (a delegated CNI IPAM plugin): the agent neither
    #: allocates, checks nor releases them (Cilium's ``datapath-configuration.external-ipam``).
    external_ipam: bool = False
    state: EndpointState = EndpointState.WAITING_FOR_IDENTITY
    #: The cookie of the network namespace at ``netns_path`` (SO_NETNS_COOKIE), 0 when
    #: unknown; read by the agent when the endpoint is created or restored (not part of
    #: the API model: a cookie is only valid while the namespace lives).
    netns_cookie: int = 0
    #: The labels of the Kubernetes Pod object (``k8s:<key>=<value>``), set by the agent
    #: from the Kubernetes source (not by requests); they take precedence over request
    #: labels with the same key.
    pod_labels: Labels = ()
    #: The labels of the pod's Namespace (key, value), set by the agent from the
    #: namespaces table (a Namespace object of the API server or the manifests); None
    #: while they are not known: the identity then says so and namespace selectors fail
    #: closed for it (docs/policy.md).
    namespace_labels: tuple[tuple[str, str], ...] | None = None
    #: Named container ports from the request (``named-ports``; statewright-cni passes
    #: a runtime's ``args.cni.ports``).
    named_ports: tuple[NamedPort, ...] = ()
    #: Named container ports of the Kubernetes Pod object, set by the agent; None while
    #: the Pod is not known. When known they are the endpoint's, not the request's.
    pod_named_ports: tuple[NamedPort, ...] | None = None

    def port_names(self) -> dict[tuple[str, int], frozenset[int]]:
        """The endpoint's named ports: (name, protocol) -> port numbers (the Pod's when it
        is known, else the request's)."""
        ports = self.named_ports if self.pod_named_ports is None else self.pod_named_ports
        out: dict[tuple[str, int], frozenset[int]] = {}
        for name, proto, port in ports:
            out[(name, proto)] = out.get((name, proto), frozenset()) | {port}
        return out

    def identity_labels(self) -> Labels:
        """The labels the endpoint's security identity is allocated for, as Cilium builds
        a pod's: the request's ``labels``, the Pod object's labels (``pod_labels``, which
        replace request labels of the same source and key) and, for a pod (a
        ``pod_namespace``), what its namespace gives (`namespace_identity_labels`: the
        namespace, ``kubernetes.io/metadata.name``, the namespace's labels or the marker
        saying they are unknown). Those are the agent's to set: a request (or a Pod)
        cannot claim them for another namespace, so those keys are dropped for a pod."""
        merged: dict[str, str] = {}
        for label in (*self.labels, *self.pod_labels):
            merged[label.partition("=")[0]] = label
        if self.pod_namespace:
            ns_labels = "k8s:" + NAMESPACE_LABELS_PREFIX
            ns_key = f"k8s:{POD_NAMESPACE_LABEL}"
            agent = AGENT_LABEL_SOURCE + ":"
            for key in [
                k for k in merged
                if k == ns_key or k.startswith(ns_labels) or k.startswith(agent)
            ]:
                del merged[key]
            ns = None if self.namespace_labels is None else dict(self.namespace_labels)
            for key, value in namespace_identity_labels(self.pod_namespace, ns).items():
                merged[key] = f"{key}={value}"
        return tuple(sorted(merged.values()))

    def addresses(self) -> list[IPAddress]:
        """The endpoint's addresses (IPv4 first)."""
        return [a for a in (self.ipv4, self.ipv6) if a is not None]

    @property
    def ipam_owner(self) -> str:
        """The IPAM owner of the endpoint's addresses."""
        return f"endpoint:{self.id}"

    def to_json(self) -> dict[str, Any]:
        """The API's model of an endpoint (also the persisted form)."""
        return {
            "id": self.id,
            "container-id": self.container_id,
            "interface-name": self.interface_name,
            "interface-index": self.ifindex,
            "container-interface-name": self.container_interface_name,
            "mac": self.mac,
            "host-mac": self.host_mac,
            "addressing": {
                "ipv4": str(self.ipv4) if self.ipv4 else "",
                "ipv6": str(self.ipv6) if self.ipv6 else "",
            },
            "k8s-pod-name": self.pod_name,
            "k8s-namespace": self.pod_namespace,
            "labels": list(self.labels),
            "k8s-pod-labels": list(self.pod_labels),
            "k8s-namespace-labels": (
                None if self.namespace_labels is None else dict(self.namespace_labels)
            ),
            "identity-labels": list(self.identity_labels()),
            "named-ports": named_ports_json(self.named_ports),
            "k8s-pod-named-ports": (
                None if self.pod_named_ports is None else named_ports_json(self.pod_named_ports)
            ),
            "identity": self.identity,
            "netns-path": self.netns_path,
            "datapath-configuration": {"external-ipam": self.external_ipam},
            "state": self.state.value,
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Endpoint:
        """Read back `to_json` (a restored endpoint); EndpointRequestError when malformed."""
        if not isinstance(doc, Mapping):
            raise EndpointRequestError(f"endpoint state: expected an object, got "
                                       f"{type(doc).__name__}")
        change = EndpointChange.parse(doc)
        if "id" not in doc:
            raise EndpointRequestError("endpoint state: field 'id' is missing")
        field_name = "id"
        try:
            ep_id = int(doc["id"])
            field_name = "identity"
            identity = int(doc.get("identity", 0))
            field_name = "state"
            state = EndpointState(doc.get("state", EndpointState.READY.value))
            field_name = "k8s-pod-labels"
            pod_labels = normalize_labels(doc.get("k8s-pod-labels") or ())
            field_name = "k8s-namespace-labels"
            ns_labels = namespace_label_pairs(doc.get("k8s-namespace-labels"))
            field_name = "k8s-pod-named-ports"
            raw_ports = doc.get("k8s-pod-named-ports")
            pod_ports = None if raw_ports is None else parse_named_ports(raw_ports, field_name)
        except (TypeError, ValueError, LabelError) as e:
            raise EndpointRequestError(f"endpoint state: field {field_name!r}: {e}") from None
        return replace(
            change.apply(Endpoint(ep_id)),
            identity=identity,
            state=state,
            pod_labels=pod_labels,
            namespace_labels=ns_labels,
            pod_named_ports=pod_ports,
        )

    @staticmethod
    def table_header() -> list[str]:
        """Columns of ``db show endpoints`` and ``statewright endpoint list``."""
        return ["ID", "Pod", "Interface", "IPv4", "IPv6", "Identity", "State"]

    def table_row(self) -> list[str]:
        """Cells of ``db show endpoints``."""
        pod = f"{self.pod_namespace}/{self.pod_name}" if self.pod_name else ""
        return [
            str(self.id),
            pod,
            f"{self.interface_name}({self.ifindex})",
            str(self.ipv4 or ""),
            str(self.ipv6 or ""),
            str(self.identity),
            self.state.value,
        ]


def namespace_label_pairs(
    labels: Mapping[str, str] | None,
) -> tuple[tuple[str, str], ...] | None:
    """A namespace's labels as sorted (key, value) pairs (`Endpoint.namespace_labels`);
    None stays None (unknown). ValueError when a key or value is not a string."""
    if labels is None:
        return None
    if not isinstance(labels, Mapping):
        raise ValueError("expected an object of string labels")
    for k, v in labels.items():
        if not isinstance(k, str) or not k or not isinstance(v, str):
            raise ValueError(f"{k!r}: {v!r}: keys and values must be strings")
    return tuple(sorted(labels.items()))


_UNSET: Any = object()


@dataclass(frozen=True, slots=True)
class EndpointChange:
    """A validated endpoint change request: only the fields the request carried are set
    (others are ``_UNSET``), so PATCH changes just those."""

    fields: Mapping[str, Any] = field(default_factory=dict)

    _STR_FIELDS = {
        "container-id": "container_id",
        "interface-name": "interface_name",
        "container-interface-name": "container_interface_name",
        "k8s-pod-name": "pod_name",
        "k8s-namespace": "pod_namespace",
        "netns-path": "netns_path",
    }
    #: Read-only fields of the model (the agent sets them), accepted and ignored.
    _IGNORED = {
        "id",
        "identity",
        "state",
        "sync-build-endpoint",
        "k8s-pod-labels",
        "k8s-namespace-labels",
        "k8s-pod-named-ports",
        "identity-labels",
    }

    @classmethod
    def parse(cls, doc: Any) -> EndpointChange:
        """Validate a request body; EndpointRequestError naming the first bad field."""
        if not isinstance(doc, Mapping):
            raise EndpointRequestError(
                f"endpoint change request: expected a JSON object, got {type(doc).__name__}"
            )
        out: dict[str, Any] = {}
        for key, value in doc.items():
            if key in cls._STR_FIELDS:
                if not isinstance(value, str):
                    raise EndpointRequestError(f"field {key!r}: expected a string, got {value!r}")
                is_ifname = key in ("interface-name", "container-interface-name")
                if is_ifname and value and not _IFNAME.match(value):
                    raise EndpointRequestError(f"field {key!r}: {value!r} is not an interface name")
                out[cls._STR_FIELDS[key]] = value
            elif key == "interface-index":
                if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                    raise EndpointRequestError(
                        f"field 'interface-index': expected an ifindex >= 0, got {value!r}"
                    )
                out["ifindex"] = value
            elif key in ("mac", "host-mac"):
                if not isinstance(value, str) or (value and not _MAC.match(value)):
                    raise EndpointRequestError(f"field {key!r}: {value!r} is not a MAC address")
                out["mac" if key == "mac" else "host_mac"] = value.lower()
            elif key == "addressing":
                out.update(cls._addressing(value))
            elif key == "labels":
                try:
                    out["labels"] = normalize_labels(value)
                except LabelError as e:
                    raise EndpointRequestError(f"field 'labels': {e}") from None
            elif key == "named-ports":
                try:
                    out["named_ports"] = parse_named_ports(value, "field 'named-ports'")
                except ValueError as e:
                    raise EndpointRequestError(str(e)) from None
            elif key == "datapath-configuration":
                if not isinstance(value, Mapping) or not isinstance(
                    value.get("external-ipam", False), bool
                ):
                    raise EndpointRequestError(
                        "field 'datapath-configuration': expected {\"external-ipam\": bool}"
                    )
                out["external_ipam"] = value.get("external-ipam", False)
            elif key in cls._IGNORED:
                continue
            else:
                raise EndpointRequestError(f"unknown field {key!r}")
        return cls(out)

    @staticmethod
    def _addressing(value: Any) -> dict[str, Any]:
        if not isinstance(value, Mapping):
            raise EndpointRequestError(f"field 'addressing': expected an object, got {value!r}")
        out: dict[str, Any] = {}
        for fam, attr in (("ipv4", "ipv4"), ("ipv6", "ipv6")):
            if fam not in value:
                continue
            raw = value[fam]
            if raw in ("", None):
                out[attr] = None
                continue
            if not isinstance(raw, str):
                raise EndpointRequestError(f"field 'addressing.{fam}': expected a string")
            try:
                ip = ipaddress.ip_address(raw.split("/")[0])
            except ValueError:
                raise EndpointRequestError(
                    f"field 'addressing.{fam}': {raw!r} is not an IP address"
                ) from None
            if ip.version != int(fam[-1]):
                raise EndpointRequestError(f"field 'addressing.{fam}': {raw} is not IPv{fam[-1]}")
            out[attr] = ip
        for k in value:
            if k not in ("ipv4", "ipv6", "ipv4-expiration-uuid", "ipv6-expiration-uuid"):
                raise EndpointRequestError(f"field 'addressing': unknown key {k!r}")
        return out

    def get(self, attr: str, default: Any = _UNSET) -> Any:
        """The requested value of an Endpoint attribute, or ``default``."""
        return self.fields.get(attr, default)

    def apply(self, ep: Endpoint) -> Endpoint:
        """``ep`` with the request's fields applied."""
        return replace(ep, **self.fields)


def _ep_ips(ep: Endpoint) -> list[IPAddress]:
    return ep.addresses()


#: Primary index: the endpoint id.
endpoint_id_index: Index[Endpoint, int] = Index(
    "id", key=lambda e: e.id, encode=keycodec.uint16, parse=int
)
#: The container id (a container may have several endpoints, one per interface).
endpoint_container_index: Index[Endpoint, str] = Index(
    "container", key=lambda e: e.container_id, encode=keycodec.string, unique=False
)
#: The addresses (IPAM keeps them unique).
endpoint_ip_index: Index[Endpoint, IPAddress] = Index(
    "ip",
    keys=_ep_ips,
    encode=keycodec.ip_address,
    unique=False,
    parse=ipaddress.ip_address,
)
#: ``namespace/name`` of the pod.
endpoint_pod_index: Index[Endpoint, str] = Index(
    "pod",
    key=lambda e: f"{e.pod_namespace}/{e.pod_name}",
    encode=keycodec.string,
    unique=False,
)


def new_endpoints_table() -> Table[Endpoint]:
    """A new, unregistered ``endpoints`` table."""
    return Table(
        ENDPOINTS_TABLE,
        endpoint_id_index,
        endpoint_container_index,
        endpoint_ip_index,
        endpoint_pod_index,
        row_type=Endpoint,
    )
