"""The namespaces table: the labels of each Kubernetes Namespace, from every source.

Pod identities carry their namespace's labels (tables/identities.py), so that a
NetworkPolicy ``namespaceSelector`` selects on identities alone. The labels come from
`Namespace` objects: listed and watched from the API server (sources/k8s_namespaces.py,
source ``k8s``) and read from the manifest directory (`NamespaceObjects`, source
``manifests``). One row per (namespace, source); when both sources have a namespace, the
API server's row is the one in force (`namespace_labels`).

Every row carries ``kubernetes.io/metadata.name=<name>``, as the API server sets it on
every namespace. A namespace with no row has unknown labels: its pods' identities say so
and selectors on namespace labels fail closed for them (policy/namespace_labels.py).

Each source holds an initializer on the table until its initial state is in, so a
restarted agent does not take a namespace that simply has not been read yet for one whose
labels are unknown.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from statedb import Index, InputError, ReadTxn, Table, WriteTxn
from statedb import keys as keycodec
from tables.identities import NAMESPACE_NAME_LABEL

NAMESPACES_TABLE = "namespaces"
KIND_NAMESPACE = "Namespace"
SOURCE_K8S = "k8s"
SOURCE_MANIFESTS = "manifests"
#: Which source's row is in force when several have the namespace (first wins).
SOURCE_PRECEDENCE = (SOURCE_K8S, SOURCE_MANIFESTS)


class NamespaceError(InputError):
    """A malformed Namespace object (its name or labels); nothing of it is applied."""


@dataclass(frozen=True, slots=True)
class Namespace:
    """One namespace's labels as one source has them."""

    name: str
    source: str
    labels: tuple[tuple[str, str], ...] = ()

    @property
    def key(self) -> str:
        """``name/source``: unique (namespace names contain no ``/``)."""
        return f"{self.name}/{self.source}"

    def to_json(self) -> dict[str, Any]:
        """JSON form (``db show namespaces``)."""
        return {"name": self.name, "source": self.source, "labels": dict(self.labels)}

    @staticmethod
    def table_header() -> list[str]:
        """Columns of ``db show namespaces``."""
        return ["Name", "Source", "Labels"]

    def table_row(self) -> list[str]:
        """Cells of ``db show namespaces``."""
        return [self.name, self.source, ",".join(f"{k}={v}" for k, v in self.labels)]


namespace_key_index: Index[Namespace, str] = Index(
    "key", key=lambda n: n.key, encode=keycodec.string
)
namespace_name_index: Index[Namespace, str] = Index(
    "name", key=lambda n: n.name, encode=keycodec.string, unique=False
)


def new_namespaces_table() -> Table[Namespace]:
    """A new, unregistered ``namespaces`` table."""
    return Table(NAMESPACES_TABLE, namespace_key_index, namespace_name_index, row_type=Namespace)


def namespace_labels(txn: ReadTxn, table: Table[Namespace], name: str) -> dict[str, str] | None:
    """The labels of namespace ``name`` from the source in force; None when unknown."""
    rows = {r.source: r for r in table.list(txn, namespace_name_index.query(name))}
    for source in (*SOURCE_PRECEDENCE, *sorted(rows)):
        if source in rows:
            return dict(rows[source].labels)
    return None


def namespace_name(obj: Mapping[str, Any]) -> str:
    """The name of a Namespace object; NamespaceError when it has none."""
    meta = obj.get("metadata")
    name = meta.get("name") if isinstance(meta, Mapping) else None
    if not isinstance(name, str) or not name or "/" in name:
        raise NamespaceError("missing or not a namespace name", obj=KIND_NAMESPACE,
                             field="metadata.name")
    return name


def namespace_from_object(obj: Mapping[str, Any], source: str) -> Namespace:
    """The row of a Namespace object (``metadata.name``, ``metadata.labels``), with
    ``kubernetes.io/metadata.name``; NamespaceError naming the field when malformed."""
    name = namespace_name(obj)
    raw = obj["metadata"].get("labels") or {}
    if not isinstance(raw, Mapping):
        raise NamespaceError("expected a mapping", obj=f"Namespace {name}",
                             field="metadata.labels")
    labels: dict[str, str] = {}
    for k, v in raw.items():
        if not isinstance(k, str) or not k or "=" in k or ":" in k or not isinstance(v, str):
            raise NamespaceError(
                f"{v!r} is not a string label", obj=f"Namespace {name}",
                field=f"metadata.labels.{k}",
            )
        labels[k] = v
    labels[NAMESPACE_NAME_LABEL] = name
    return Namespace(name, source, tuple(sorted(labels.items())))


class NamespaceObjects:
    """Namespace objects of one source -> rows of the ``namespaces`` table (the manifest
    source's kind handler: ``check``, ``upsert``, ``delete`` in the caller's write
    transaction)."""

    kinds: tuple[str, ...] = (KIND_NAMESPACE,)

    def __init__(self, table: Table[Namespace], source: str = SOURCE_MANIFESTS) -> None:
        self.table = table
        self.source = source

    @property
    def tables(self) -> tuple[Table[Any], ...]:
        """The tables a caller's write transaction must lock."""
        return (self.table,)

    def check(self, obj: Mapping[str, Any]) -> None:
        """Validate ``obj`` as `upsert` would, writing nothing."""
        namespace_from_object(obj, self.source)

    def upsert(self, txn: WriteTxn, obj: Mapping[str, Any]) -> None:
        """Write the namespace's row (unchanged: nothing written)."""
        row = namespace_from_object(obj, self.source)
        if self.table.get(txn, namespace_key_index.query(row.key)) != row:
            self.table.insert(txn, row)

    def delete(self, txn: WriteTxn, obj: Mapping[str, Any]) -> None:
        """Remove the namespace's row of this source."""
        key = f"{namespace_name(obj)}/{self.source}"
        old = self.table.get(txn, namespace_key_index.query(key))
        if old is not None:
            self.table.delete(txn, old)

    def resync(self, txn: WriteTxn, objs: list[Mapping[str, Any]]) -> None:
        """Make ``objs`` this source's complete set of namespaces (a relist)."""
        keep = {f"{namespace_name(o)}/{self.source}" for o in objs}
        for row in list(self.table.all(txn)):
            if row.source == self.source and row.key not in keep:
                self.table.delete(txn, row)
        for o in objs:
            self.upsert(txn, o)
