"""The nodes table: every node of the cluster, from its Kubernetes Node object.

One row per Node (key: its name) with what the agent needs to reach the node and its
pods: the InternalIP and ExternalIP addresses of both families (``status.addresses``),
the pod CIDRs (``spec.podCIDRs``, else ``spec.podCIDR``) and the labels. Two sources
fill it: the Kubernetes source's Node reflector (sources/k8s_nodes.py, every Node of the
cluster) and the manifest directory (kind ``Node``, for a setup without an API server),
both through `NodeObjects`, the manifest source's `KindHandler` for Nodes.

`node_from_object` is the whole conversion, a pure function: an object it refuses
(`NodeError`, naming the Node and the field) is written nowhere, and the row of the
Node's previous valid version stays. Addresses of other types (``Hostname``,
``InternalDNS``...) are not addresses the agent routes to and are left out.

What follows the table: the native routes to the other nodes' pod CIDRs
(tables/node_routes.py) and the node entries of the ipcache
(tables/endpoint_entries.py, `EntryTables.set_nodes`).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from statedb import Index, InputError, Table, WriteTxn
from statedb import keys as keycodec
from tables.l3n4 import IPAddress, IPNetwork

NODES_TABLE = "nodes"
KIND_NODE = "Node"
INTERNAL_IP = "InternalIP"
EXTERNAL_IP = "ExternalIP"
#: The address types kept, in the order they are preferred.
ADDRESS_TYPES = (INTERNAL_IP, EXTERNAL_IP)

SOURCE_K8S = "k8s"
SOURCE_MANIFESTS = "manifests"


class NodeError(InputError):
    """A Node object the agent cannot use; the message names the Node and the field."""


@dataclass(frozen=True, slots=True)
class NodeIP:
    """One address of a node: its type (InternalIP or ExternalIP) and the address."""

    type: str
    ip: IPAddress

    def __str__(self) -> str:
        return f"{self.type}:{self.ip}"


@dataclass(frozen=True, slots=True)
class Node:
    """A node of the cluster as its Node object describes it."""

    name: str
    addresses: tuple[NodeIP, ...] = ()
    pod_cidrs: tuple[IPNetwork, ...] = ()
    labels: tuple[tuple[str, str], ...] = ()
    #: Where the row came from: "k8s" or "manifests".
    source: str = SOURCE_K8S

    def ips(self, kind: str | None = None, version: int | None = None) -> list[IPAddress]:
        """The node's addresses of type ``kind`` and family ``version`` (None: any)."""
        return [
            a.ip
            for a in self.addresses
            if (kind is None or a.type == kind) and (version is None or a.ip.version == version)
        ]

    def internal_ip(self, version: int) -> IPAddress | None:
        """The node's first InternalIP of family ``version`` (the next hop of its routes)."""
        found = self.ips(INTERNAL_IP, version)
        return found[0] if found else None

    def to_json(self) -> dict[str, Any]:
        """JSON form (``db show nodes -o json``)."""
        return {
            "name": self.name,
            "addresses": [{"type": a.type, "address": str(a.ip)} for a in self.addresses],
            "pod_cidrs": [str(c) for c in self.pod_cidrs],
            "labels": dict(self.labels),
            "source": self.source,
        }

    def to_yaml(self) -> dict[str, Any]:
        """YAML form (same as JSON)."""
        return self.to_json()

    @staticmethod
    def table_header() -> list[str]:
        """Columns of ``db show nodes``."""
        return ["Name", "Addresses", "PodCIDRs", "Labels", "Source"]

    def table_row(self) -> list[str]:
        """Cells of ``db show nodes``."""
        return [
            self.name,
            ", ".join(str(a) for a in self.addresses),
            ", ".join(str(c) for c in self.pod_cidrs),
            ", ".join(f"{k}={v}" for k, v in self.labels),
            self.source,
        ]


def _error(name: str, message: str, field: str) -> NodeError:
    return NodeError(message, obj=f"Node {name}", field=field)


def _addresses(name: str, status: Any) -> tuple[NodeIP, ...]:
    if status is None:
        return ()
    if not isinstance(status, Mapping):
        raise _error(name, f"expected a mapping, got {status!r}", "status")
    raw = status.get("addresses") or []
    if not isinstance(raw, list):
        raise _error(name, f"expected a list, got {raw!r}", "status.addresses")
    out: list[NodeIP] = []
    for i, entry in enumerate(raw):
        where = f"status.addresses[{i}]"
        if not isinstance(entry, Mapping):
            raise _error(name, f"expected a mapping, got {entry!r}", where)
        kind = entry.get("type")
        if kind not in ADDRESS_TYPES:
            continue
        text = entry.get("address")
        try:
            ip = ipaddress.ip_address(text) if isinstance(text, str) else None
        except ValueError:
            ip = None
        if ip is None:
            raise _error(name, f"{text!r} is not an IP address", f"{where}.address")
        node_ip = NodeIP(kind, ip)
        if node_ip not in out:
            out.append(node_ip)
    return tuple(out)


def _pod_cidrs(name: str, spec: Any) -> tuple[IPNetwork, ...]:
    if spec is None:
        return ()
    if not isinstance(spec, Mapping):
        raise _error(name, f"expected a mapping, got {spec!r}", "spec")
    raw = spec.get("podCIDRs")
    field = "spec.podCIDRs"
    if not raw and spec.get("podCIDR"):
        raw, field = [spec["podCIDR"]], "spec.podCIDR"
    if not raw:
        return ()
    if not isinstance(raw, list):
        raise _error(name, f"expected a list, got {raw!r}", field)
    out: list[IPNetwork] = []
    for i, text in enumerate(raw):
        where = f"{field}[{i}]" if field == "spec.podCIDRs" else field
        try:
            net = ipaddress.ip_network(text, strict=True) if isinstance(text, str) else None
        except ValueError as e:
            raise _error(name, f"{text!r} is not a CIDR ({e})", where) from None
        if net is None:
            raise _error(name, f"{text!r} is not a CIDR", where)
        if any(c.version == net.version for c in out):
            raise _error(name, f"a second IPv{net.version} pod CIDR ({text})", where)
        out.append(net)
    return tuple(out)


def _labels(name: str, meta: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    raw = meta.get("labels") or {}
    if not isinstance(raw, Mapping):
        raise _error(name, f"expected a mapping, got {raw!r}", "metadata.labels")
    out = []
    for key, value in raw.items():
        if not isinstance(key, str) or not isinstance(value, str | None):
            raise _error(name, f"{key!r}: {value!r} is not a string label",
                         "metadata.labels")
        out.append((key, value or ""))
    return tuple(sorted(out))


def node_name_of(obj: Mapping[str, Any]) -> str:
    """The Node's name; NodeError when it has none."""
    meta = obj.get("metadata") if isinstance(obj, Mapping) else None
    name = meta.get("name") if isinstance(meta, Mapping) else None
    if not isinstance(name, str) or not name:
        raise NodeError("a Node needs a name", obj="Node", field="metadata.name")
    return name


def node_from_object(obj: Mapping[str, Any], source: str = SOURCE_K8S) -> Node:
    """The row of a Node object; NodeError (naming the Node and field) when it is invalid."""
    name = node_name_of(obj)
    meta = obj["metadata"]
    return Node(
        name=name,
        addresses=_addresses(name, obj.get("status")),
        pod_cidrs=_pod_cidrs(name, obj.get("spec")),
        labels=_labels(name, meta),
        source=source,
    )


node_name_index: Index[Node, str] = Index(
    "name", key=lambda n: n.name, encode=keycodec.string, parse=str
)


def new_nodes_table() -> Table[Node]:
    """A new, unregistered ``nodes`` table."""
    return Table(NODES_TABLE, node_name_index, row_type=Node)


class NodeObjects:
    """Node objects into the nodes table: the manifest source's `KindHandler` for kind
    ``Node`` and the Kubernetes Node reflector's writer. A row belongs to the source that
    wrote it: a deletion from the other source leaves it."""

    kinds: tuple[str, ...] = (KIND_NODE,)

    def __init__(self, table: Table[Node], source: str = SOURCE_MANIFESTS) -> None:
        self.table = table
        self.source = source

    @property
    def tables(self) -> tuple[Table[Any], ...]:
        """The nodes table (locked with the LB tables by the manifest source)."""
        return (self.table,)

    def check(self, obj: Mapping[str, Any]) -> None:
        """NodeError when ``obj`` is not a valid Node; writes nothing."""
        node_from_object(obj, self.source)

    def upsert(self, txn: WriteTxn, obj: Mapping[str, Any]) -> None:
        """Insert or replace the Node's row (NodeError before writing when invalid)."""
        row = node_from_object(obj, self.source)
        if self.table.get(txn, node_name_index.query(row.name)) != row:
            self.table.insert(txn, row)

    def delete(self, txn: WriteTxn, obj: Mapping[str, Any]) -> None:
        """Remove the Node's row when this source wrote it."""
        try:
            name = node_name_of(obj)
        except NodeError:
            return
        old = self.table.get(txn, node_name_index.query(name))
        if old is not None and old.source == self.source:
            self.table.delete(txn, old)
