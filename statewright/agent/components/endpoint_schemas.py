"""JSON Schemas of the endpoint and IPAM routes (statewright/agent/components/endpoints.py):
Cilium's ``EndpointChangeRequest`` as tables/endpoints.py's `EndpointChange.parse` takes it,
the endpoint model (`Endpoint.to_json`) and the IPAM answers. The API server checks
requests against them before a handler runs, and the OpenAPI document publishes them.
"""

from __future__ import annotations

from typing import Any

from statewright.api_types import QueryParam

_IFNAME = r"^[^/\s:]{1,15}$"  # as tables/endpoints.py: IFNAMSIZ - 1, no '/', ':', space
_MAC = r"^[0-9a-fA-F]{2}(:[0-9a-fA-F]{2}){5}$"
#: ``source:key=value`` or ``key=value``: a source and a key that are not empty.
_LABEL = r"^[^:=][^:]*(:[^=][\s\S]*)?$"


def _optional(pattern: str) -> str:
    """``pattern`` or the empty string (a field left unset)."""
    return f"^$|{pattern}"


_ADDRESS = {"type": "string", "nullable": True,
            "description": "the address (no prefix length), '' or null for none"}

#: Named container ports, Cilium's ``Port`` model (what NetworkPolicies' named ports
#: resolve to).
NAMED_PORTS: dict[str, Any] = {
    "type": "array",
    "description": "named container ports (NetworkPolicy named ports resolve to them)",
    "items": {
        "type": "object",
        "required": ["name", "port"],
        "properties": {
            "name": {"type": "string"},
            "port": {"type": "integer", "minimum": 1, "maximum": 65535},
            "protocol": {"type": "string", "enum": ["TCP", "UDP", "SCTP"]},
        },
    },
}

#: Cilium's field names (api/v1/openapi.yaml), the ones `EndpointChange.parse` takes; a
#: field of Cilium's that the agent does not implement (``container-name``, ``pid``,
#: ``policy-enabled``, ...) is refused as unknown rather than ignored.
ENDPOINT_CHANGE_REQUEST: dict[str, Any] = {
    "type": "object",
    "description": "Cilium's EndpointChangeRequest: the fields a request carries are set "
                   "(PATCH changes only those).",
    "additionalProperties": False,
    "properties": {
        "container-id": {"type": "string"},
        "interface-name": {"type": "string", "pattern": _optional(_IFNAME),
                           "description": "host-side interface (veth) name"},
        "interface-index": {"type": "integer", "minimum": 0, "maximum": 2**31 - 1,
                            "description": "host-side ifindex"},
        "container-interface-name": {"type": "string", "pattern": _optional(_IFNAME)},
        "mac": {"type": "string", "pattern": _optional(_MAC),
                "description": "container-side MAC"},
        "host-mac": {"type": "string", "pattern": _optional(_MAC)},
        "addressing": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "ipv4": _ADDRESS,
                "ipv6": _ADDRESS,
                "ipv4-expiration-uuid": {"type": "string"},
                "ipv6-expiration-uuid": {"type": "string"},
            },
        },
        "k8s-pod-name": {"type": "string"},
        "k8s-namespace": {"type": "string"},
        "labels": {
            "description": "source:key=value strings, or Kubernetes labels as an object",
            "oneOf": [
                {"type": "array", "items": {"type": "string", "pattern": _LABEL}},
                {"type": "object", "additionalProperties": {"type": "string"}},
            ],
        },
        "netns-path": {"type": "string"},
        "named-ports": NAMED_PORTS,
        "datapath-configuration": {
            "type": "object",
            "description": "Cilium's EndpointDatapathConfiguration; only external-ipam is "
                           "used (the addresses come from another IPAM), the others are "
                           "accepted and ignored",
            "properties": {name: {"type": "boolean"} for name in (
                "external-ipam", "require-arp-passthrough", "require-egress-prog",
                "require-routing", "install-endpoint-route", "disable-sip-verification")},
        },
        "id": {"type": "integer", "description": "ignored (the path names the endpoint)"},
        "identity": {"type": "integer", "description": "ignored (the agent allocates it)"},
        "state": {"type": "string", "description": "ignored"},
        "sync-build-endpoint": {"type": "boolean", "description": "ignored"},
    },
}

#: PUT (create) needs the container and its host-side interface, as Cilium's API does: an
#: endpoint without them would hold addresses no pod can use. PATCH takes any subset.
ENDPOINT_CREATE_REQUEST: dict[str, Any] = {
    **ENDPOINT_CHANGE_REQUEST,
    "description": "Cilium's EndpointChangeRequest for a new endpoint: container-id and "
                   "interface-name are required.",
    "required": ["container-id", "interface-name"],
}

ENDPOINT: dict[str, Any] = {
    "type": "object",
    "required": ["id", "container-id", "interface-name", "interface-index", "addressing",
                 "k8s-pod-name", "k8s-namespace", "labels", "identity", "state"],
    "properties": {
        "id": {"type": "integer", "minimum": 1, "maximum": 4095},
        "container-id": {"type": "string"},
        "interface-name": {"type": "string"},
        "interface-index": {"type": "integer", "minimum": 0},
        "container-interface-name": {"type": "string"},
        "mac": {"type": "string"},
        "host-mac": {"type": "string"},
        "addressing": {
            "type": "object",
            "required": ["ipv4", "ipv6"],
            "properties": {"ipv4": {"type": "string"}, "ipv6": {"type": "string"}},
        },
        "k8s-pod-name": {"type": "string"},
        "k8s-namespace": {"type": "string"},
        "labels": {"type": "array", "items": {"type": "string"}},
        "k8s-pod-labels": {"type": "array", "items": {"type": "string"}},
        "k8s-namespace-labels": {
            "type": "object", "nullable": True, "additionalProperties": {"type": "string"},
            "description": "the labels of the pod's Namespace; null while unknown",
        },
        "identity-labels": {"type": "array", "items": {"type": "string"}},
        "named-ports": NAMED_PORTS,
        "k8s-pod-named-ports": {**NAMED_PORTS, "nullable": True,
                                "description": "the Pod object's named container ports "
                                               "(they win); null while it is not known"},
        "identity": {"type": "integer", "minimum": 0},
        "netns-path": {"type": "string"},
        "datapath-configuration": {
            "type": "object",
            "properties": {"external-ipam": {"type": "boolean"}},
        },
        "state": {"type": "string", "enum": ["waiting-for-identity", "regenerating", "ready",
                                             "disconnecting", "restoring"]},
    },
}

ENDPOINT_LIST: dict[str, Any] = {"type": "array", "items": ENDPOINT}

ENDPOINT_DELETED: dict[str, Any] = {
    "type": "object",
    "required": ["deleted"],
    "properties": {"deleted": {"type": "integer"}},
}

_FAMILY_ADDRESS = {
    "type": "object",
    "required": ["ip", "gateway", "cidrs"],
    "properties": {
        "ip": {"type": "string"},
        "gateway": {"type": "string", "description": "the router address ('' when none)"},
        "cidrs": {"type": "array", "items": {"type": "string"}},
    },
}

#: Cilium's IPAMResponse shape.
IPAM_RESPONSE: dict[str, Any] = {
    "type": "object",
    "required": ["address"],
    "properties": {
        "address": {"type": "object",
                    "properties": {"ipv4": {"type": "string"}, "ipv6": {"type": "string"}}},
        "ipv4": _FAMILY_ADDRESS,
        "ipv6": _FAMILY_ADDRESS,
    },
}

ALLOCATION: dict[str, Any] = {
    "type": "object",
    "required": ["ip", "owner", "family"],
    "properties": {
        "ip": {"type": "string"},
        "owner": {"type": "string"},
        "family": {"type": "integer", "enum": [4, 6]},
    },
}

IPAM_STATUS: dict[str, Any] = {
    "type": "object",
    "required": ["pools", "router", "allocations"],
    "properties": {
        "pools": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["cidr", "size", "used"],
                "properties": {"cidr": {"type": "string"}, "size": {"type": "integer"},
                               "used": {"type": "integer"}},
            },
        },
        "router": {"type": "object", "additionalProperties": {"type": "string"}},
        "allocations": {"type": "array", "items": ALLOCATION},
    },
}

OWNER = QueryParam("owner", {"type": "string"},
                   "who holds the address (an endpoint's container id); default 'api'")
OWNER_CHECK = QueryParam("owner", {"type": "string"},
                         "release only when this owner holds the address")
FAMILY = QueryParam("family", {"type": "string", "enum": ["ipv4", "ipv6"]},
                    "one family; without it one address per configured family")

ENDPOINT_ID = ("an endpoint id (1..4095) or a prefixed id: cni-attachment-id:CONTAINER:IFNAME, "
               "container-id:ID, pod-name:NAMESPACE/NAME (the '/' encoded as %2F)")

_WRITES = {"type": "object", "properties": {"writes": {"type": "integer"},
                                            "skipped": {"type": "integer"}}}
IPCACHE = {
    "type": "object",
    "required": ["entries", "writes"],
    "properties": {
        "entries": {"type": "array", "items": {"type": "object", "required": ["prefix"]}},
        "writes": {"type": "object", "additionalProperties": _WRITES},
    },
}
