"""The ``origins`` table: where each source object the agent applied came from.

One row per object (``Kind/namespace/name``) a source applied: a manifest file and
the line its document starts on, or the Kubernetes object's uid and resourceVersion.
The agent's other rows name their objects already (a service row its ``namespace/name``,
a backend instance its service, a policy entry its rules, an endpoint its pod), so the
origin is kept once per object rather than copied into every row derived from it:
`statewright explain` follows a row to its object through that name, then to this table.

An EndpointSlice's row also names its service (``owner``) and the addresses it lists,
so a backend entry is followed to the slices that gave it, not to every slice of the
service.

The sources write the row in the same write transaction as the object's other rows
(`OriginRecorder`), so a row never exists without its origin once committed.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from statedb import DB, Index, ReadTxn, Table, WriteTxn
from statedb import keys as keycodec
from statedb.errors import TableNotRegisteredError

ORIGINS_TABLE = "origins"

#: Kinds without a namespace.
CLUSTER_SCOPED_KINDS = frozenset({"Node", "Namespace", "CiliumClusterwideNetworkPolicy"})

#: Where an origin came from.
SOURCE_MANIFESTS = "manifests"
SOURCE_K8S = "k8s"


@dataclass(frozen=True, slots=True)
class Origin:
    """One source object: kind, namespace, name; its manifest file and line, or its
    Kubernetes uid and resourceVersion; for an EndpointSlice its service and addresses."""

    kind: str
    namespace: str
    name: str
    source: str
    uid: str = ""
    resource_version: str = ""
    file: str = ""
    line: int = 0
    #: The service (``namespace/name``) an EndpointSlice belongs to; "" otherwise.
    owner: str = ""
    #: The endpoint addresses an EndpointSlice lists, comma-separated ("" otherwise): one
    #: string rather than a tuple of them, a few hundred bytes less per slice.
    addresses: str = ""

    def lists(self, address: str) -> bool:
        """Whether an EndpointSlice's endpoints list ``address``."""
        return address in self.addresses.split(",") if self.addresses else False

    @property
    def key(self) -> str:
        """``Kind/namespace/name`` (``Kind//name`` for cluster-scoped kinds)."""
        return f"{self.kind}/{self.namespace}/{self.name}"

    def where(self) -> str:
        """``file:line``, or ``uid U resourceVersion R``: for people."""
        if self.file:
            return f"{self.file}:{self.line}" if self.line else self.file
        return f"uid {self.uid or '?'} resourceVersion {self.resource_version or '?'}"

    def to_json(self) -> dict[str, Any]:
        """JSON form (API, CLI)."""
        out: dict[str, Any] = {
            "kind": self.kind,
            "namespace": self.namespace,
            "name": self.name,
            "source": self.source,
        }
        if self.file:
            out["file"], out["line"] = self.file, self.line
        if self.uid or self.resource_version:
            out["uid"], out["resourceVersion"] = self.uid, self.resource_version
        if self.owner:
            out["service"] = self.owner
        return out

    @staticmethod
    def table_header() -> list[str]:
        """Columns of ``db show origins``."""
        return ["Object", "Source", "Where"]

    def table_row(self) -> list[str]:
        """Cells of ``db show origins``."""
        return [self.key, self.source, self.where()]


origin_key_index: Index[Origin, str] = Index("key", key=lambda o: o.key, encode=keycodec.string)


def new_origins_table() -> Table[Origin]:
    """A new, unregistered ``origins`` table."""
    return Table(ORIGINS_TABLE, origin_key_index, row_type=Origin)


def object_origin_key(kind: str, namespace: str, name: str) -> str:
    """The ``origins`` key of an object."""
    return f"{kind}/{namespace}/{name}"


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def _namespace(kind: str, meta: Mapping[str, Any]) -> str:
    ns = meta.get("namespace")
    if kind in CLUSTER_SCOPED_KINDS:
        return ""
    return ns if isinstance(ns, str) and ns else "default"


def _slice_addresses(obj: Mapping[str, Any]) -> str:
    out: list[str] = []
    endpoints = obj.get("endpoints")
    if isinstance(endpoints, list):
        for ep in endpoints:
            addrs = ep.get("addresses") if isinstance(ep, Mapping) else None
            if isinstance(addrs, list):
                out.extend(str(a) for a in addrs)
    return ",".join(out)


def origin_of(
    obj: Mapping[str, Any], source: str, *, file: str = "", line: int = 0
) -> Origin | None:
    """The origin of an object as a source read it; None when it has no kind or name
    (the source refuses such an object anyway)."""
    kind = obj.get("kind")
    meta = _meta(obj)
    name = meta.get("name")
    if not isinstance(kind, str) or not kind or not isinstance(name, str) or not name:
        return None
    ns = sys.intern(_namespace(kind, meta))  # one string per namespace, not per object
    uid, rv = meta.get("uid"), meta.get("resourceVersion")
    owner = addresses = ""
    if kind == "EndpointSlice":
        labels = meta.get("labels")
        svc = labels.get("kubernetes.io/service-name") if isinstance(labels, Mapping) else None
        # Interned: the same string as the converter's (interned) name of the service.
        owner = sys.intern(f"{ns}/{svc}") if isinstance(svc, str) and svc else ""
        addresses = _slice_addresses(obj)
    return Origin(
        kind, ns, name, source,
        uid=str(uid) if uid else "",
        resource_version=str(rv) if rv else "",
        file=file, line=line, owner=owner, addresses=addresses,
    )


class OriginRecorder:
    """Writes and removes origins inside a source's write transaction (which must lock
    `table`)."""

    def __init__(self, table: Table[Origin]) -> None:
        self.table = table

    def record(
        self, txn: WriteTxn, obj: Mapping[str, Any], source: str, *, file: str = "",
        line: int = 0,
    ) -> None:
        """Record (or refresh) the origin of ``obj``; an unchanged origin is not written."""
        origin = origin_of(obj, source, file=file, line=line)
        if origin is None:
            return
        old = self.table.get(txn, origin_key_index.query(origin.key))
        if old != origin:
            self.table.insert(txn, origin)

    def forget(self, txn: WriteTxn, obj: Mapping[str, Any]) -> None:
        """Remove the origin of a deleted object (only its kind and name are read)."""
        origin = origin_of(obj, "")
        if origin is not None:
            self.forget_key(txn, origin.key)

    def forget_key(self, txn: WriteTxn, key: str) -> None:
        """Remove the origin of object ``Kind/namespace/name``, if recorded."""
        old = self.table.get(txn, origin_key_index.query(key))
        if old is not None:
            self.table.delete(txn, old)


def origin_recorder(db: DB) -> OriginRecorder | None:
    """A recorder on ``db``'s ``origins`` table, or None when no component registered it
    (an agent without the load balancer's tables)."""
    try:
        return OriginRecorder(db.table(ORIGINS_TABLE))
    except TableNotRegisteredError:
        return None


def origin(txn: ReadTxn, table: Table[Origin], kind: str, namespace: str, name: str
           ) -> Origin | None:
    """The origin of one object, or None."""
    return table.get(txn, origin_key_index.query(object_origin_key(kind, namespace, name)))


def slices_of(txn: ReadTxn, table: Table[Origin], service: str) -> Iterator[Origin]:
    """The EndpointSlice origins of ``service`` (``namespace/name``)."""
    ns = service.split("/", 1)[0]
    for o in table.prefix(txn, origin_key_index.query(f"EndpointSlice/{ns}/")):
        if o.owner == service:
            yield o
