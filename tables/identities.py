"""Security identities: numeric identities for label sets, allocated on this node.

Cilium gives every distinct set of security-relevant labels a numeric identity; the
datapath carries only the number (``endpoint_info.sec_id``, ``remote_endpoint_info.
sec_identity``). The reserved identities are fixed numbers with fixed labels (Cilium's
``pkg/identity``): unknown 0, host 1, world 2, unmanaged 3, health 4, init 5,
remote-node 6, kube-apiserver 7, ingress 8, world-ipv4 9, world-ipv6 10. Identities of
workloads are allocated from 256 (``MinimalAllocationIdentity``) up to 65535 (the largest
identity of cluster 0 with the default 16-bit cluster shift).

Statewright has no key-value store or CRDs, so allocation is local to the node: the
``identities`` table maps each label set in use to its number with a reference count (one
per endpoint using it); the last release frees the number. Restored endpoints ask for the
number they had (`IdentityAllocator.acquire` with ``want``) so the datapath keeps its
identities across restarts.

Labels are strings ``source:key=value`` (``k8s:app=web``, ``reserved:host``), sorted and
deduplicated; a label without a source gets ``unspec:`` (Cilium's convention).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from statedb import DB, Index, ReadTxn, Table, WriteTxn
from statedb import keys as keycodec
from statedb.errors import InputError, StatewrightError

IDENTITIES_TABLE = "identities"

IDENTITY_UNKNOWN = 0
IDENTITY_HOST = 1
IDENTITY_WORLD = 2
IDENTITY_UNMANAGED = 3
IDENTITY_HEALTH = 4
IDENTITY_INIT = 5
IDENTITY_REMOTE_NODE = 6
IDENTITY_KUBE_APISERVER = 7
IDENTITY_INGRESS = 8
IDENTITY_WORLD_IPV4 = 9
IDENTITY_WORLD_IPV6 = 10

#: The reserved identities and their names (label ``reserved:<name>``).
RESERVED: dict[int, str] = {
    IDENTITY_HOST: "host",
    IDENTITY_WORLD: "world",
    IDENTITY_UNMANAGED: "unmanaged",
    IDENTITY_HEALTH: "health",
    IDENTITY_INIT: "init",
    IDENTITY_REMOTE_NODE: "remote-node",
    IDENTITY_KUBE_APISERVER: "kube-apiserver",
    IDENTITY_INGRESS: "ingress",
    IDENTITY_WORLD_IPV4: "world-ipv4",
    IDENTITY_WORLD_IPV6: "world-ipv6",
}

MIN_ALLOCATED_IDENTITY = 256
MAX_ALLOCATED_IDENTITY = 65535


class IdentityError(StatewrightError):
    """An identity operation that failed (bad labels, exhausted range, unknown id)."""

    http_status = 500


class LabelError(InputError, IdentityError):
    """Malformed labels in a request (400)."""

    http_status = 400


class IdentitiesExhaustedError(IdentityError):
    """Every number from 256 to 65535 is in use."""

    http_status = 503


Labels = tuple[str, ...]


def normalize_labels(raw: Iterable[str] | Mapping[str, str] | None) -> Labels:
    """Labels as sorted, unique ``source:key=value`` strings; LabelError when malformed.

    A mapping is read as Kubernetes labels (``{"app": "web"}`` -> ``k8s:app=web``)."""
    if raw is None:
        return ()
    out: set[str] = set()
    if isinstance(raw, Mapping):
        for k, v in raw.items():
            if not isinstance(k, str) or not isinstance(v, str) or not k:
                raise LabelError(f"labels: {k!r}: {v!r}: keys and values must be strings")
            out.add(f"k8s:{k}={v}")
        return tuple(sorted(out))
    if isinstance(raw, str):
        raise LabelError(f"labels: expected a list of strings, got the string {raw!r}")
    for item in raw:
        if not isinstance(item, str) or not item or item.startswith((":", "=")):
            raise LabelError(f"labels: {item!r} is not a label (source:key=value)")
        source, sep, rest = item.partition(":")
        if not sep:
            source, rest = "unspec", item
        key = rest.partition("=")[0]
        if not source or not key:
            raise LabelError(f"labels: {item!r} is not a label (source:key=value)")
        out.add(f"{source}:{rest}")
    return tuple(sorted(out))


#: The label Cilium gives every pod's identity: the pod's namespace.
POD_NAMESPACE_LABEL = "io.kubernetes.pod.namespace"
#: Prefix of the namespace's own labels, copied into every pod identity of the namespace.
NAMESPACE_LABELS_PREFIX = "io.cilium.k8s.namespace.labels."
#: The label Kubernetes sets on every namespace: its name. Known from the name alone, so
#: every pod identity carries it, whether or not the namespace's other labels are known.
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"
#: The source of labels only the agent sets.
AGENT_LABEL_SOURCE = "statewright"
#: Carried by the identity of a pod whose namespace's labels the agent does not know (no
#: Namespace object read): selectors on namespace labels cannot be evaluated for it and
#: fail closed (policy/namespace_labels.py).
NAMESPACE_LABELS_UNKNOWN = f"{AGENT_LABEL_SOURCE}:namespace-labels=unknown"


def namespace_identity_labels(
    namespace: str, namespace_labels: Mapping[str, str] | None
) -> dict[str, str]:
    """The labels a pod's identity gets from its namespace (key -> value, source ``k8s``
    unless the key has one): the namespace, ``kubernetes.io/metadata.name`` and the
    namespace's labels as ``io.cilium.k8s.namespace.labels.<key>``; when its labels are
    unknown (None), the marker `NAMESPACE_LABELS_UNKNOWN` instead of them."""
    out = {
        f"k8s:{POD_NAMESPACE_LABEL}": namespace,
        f"k8s:{NAMESPACE_LABELS_PREFIX}{NAMESPACE_NAME_LABEL}": namespace,
    }
    if namespace_labels is None:
        key, _, value = NAMESPACE_LABELS_UNKNOWN.partition("=")
        out[key] = value
        return out
    for k, v in namespace_labels.items():
        if str(k) != NAMESPACE_NAME_LABEL:
            out[f"k8s:{NAMESPACE_LABELS_PREFIX}{k}"] = v
    return out


def pod_identity_labels(
    pod_labels: Mapping[str, str],
    namespace: str,
    namespace_labels: Mapping[str, str] | None = None,
) -> Labels:
    """The security labels of a pod, as Cilium builds them: the pod's labels
    (``k8s:<key>=<value>``), its namespace (``k8s:io.kubernetes.pod.namespace=<ns>``) and
    its namespace's labels (``k8s:io.cilium.k8s.namespace.labels.<key>=<value>``, with
    ``kubernetes.io/metadata.name`` always), so that namespace selectors select on
    identities alone. ``namespace_labels`` None: not known (`namespace_identity_labels`).
    LabelError when malformed."""
    if not isinstance(namespace, str) or not namespace:
        raise LabelError("namespace: must be a non-empty string", field="namespace")
    merged = {f"k8s:{k}": v for k, v in pod_labels.items()}
    merged.update(namespace_identity_labels(namespace, namespace_labels))
    return normalize_labels(f"{k}={v}" for k, v in merged.items())


def reserved_identity_of(labels: Labels) -> int | None:
    """The reserved identity of a label set made only of one ``reserved:`` label."""
    if len(labels) == 1 and labels[0].startswith("reserved:"):
        name = labels[0][len("reserved:") :]
        for num, n in RESERVED.items():
            if n == name:
                return num
    return None


@dataclass(frozen=True, slots=True)
class Identity:
    """A numeric identity, its labels and how many endpoints use it (reserved: always 0)."""

    id: int
    labels: Labels
    refcount: int = 0

    @property
    def reserved(self) -> bool:
        """Whether this is one of Cilium's fixed reserved identities."""
        return self.id in RESERVED

    def to_json(self) -> dict[str, Any]:
        """JSON form (API, CLI)."""
        return {
            "id": self.id,
            "labels": list(self.labels),
            "refcount": self.refcount,
            "reserved": self.reserved,
        }

    @staticmethod
    def table_header() -> list[str]:
        """Columns of ``db show identities``."""
        return ["ID", "Labels", "Refs"]

    def table_row(self) -> list[str]:
        """Cells of ``db show identities``."""
        return [str(self.id), ",".join(self.labels), str(self.refcount)]


def _labels_key(labels: Labels) -> bytes:
    return "\n".join(labels).encode()


identity_id_index: Index[Identity, int] = Index(
    "id", key=lambda i: i.id, encode=keycodec.uint32, parse=int
)
identity_labels_index: Index[Identity, Labels] = Index(
    "labels",
    key=lambda i: i.labels,
    encode=_labels_key,
    parse=lambda s: normalize_labels(s.split(",")),
)


def new_identities_table() -> Table[Identity]:
    """A new, unregistered ``identities`` table."""
    return Table(IDENTITIES_TABLE, identity_id_index, identity_labels_index, row_type=Identity)


class IdentityAllocator:
    """Allocates numeric identities for label sets in the ``identities`` table.

    The methods take the caller's write transaction (which must lock the table), so an
    endpoint and its identity change together or not at all."""

    def __init__(self, db: DB, table: Table[Identity] | None = None) -> None:
        self.db = db
        self.table = table or new_identities_table()
        if self.table not in db.tables:
            db.register(self.table)
        with db.write_txn(self.table) as txn:
            for num, name in RESERVED.items():
                if self.table.get(txn, identity_id_index.query(num)) is None:
                    self.table.insert(txn, Identity(num, (f"reserved:{name}",)))

    def lookup(self, txn: ReadTxn, num: int) -> Identity | None:
        """The identity ``num``."""
        return self.table.get(txn, identity_id_index.query(num))

    def acquire(self, txn: WriteTxn, labels: Labels, want: int | None = None) -> Identity:
        """The identity of ``labels`` with one more reference; a new number when the label
        set is new (``want`` when it is free and in the allocatable range: restore)."""
        reserved = reserved_identity_of(labels)
        if reserved is not None:
            got = self.lookup(txn, reserved)
            assert got is not None
            return got
        existing = self.table.get(txn, identity_labels_index.query(labels))
        if existing is not None:
            row = replace(existing, refcount=existing.refcount + 1)
            self.table.insert(txn, row)
            return row
        num = None
        if (
            want is not None
            and MIN_ALLOCATED_IDENTITY <= want <= MAX_ALLOCATED_IDENTITY
            and self.lookup(txn, want) is None
        ):
            num = want
        if num is None:
            num = self._free_number(txn)
        row = Identity(num, labels, 1)
        self.table.insert(txn, row)
        return row

    def release(self, txn: WriteTxn, num: int) -> None:
        """Drop one reference of ``num``; the last one frees the number (never reserved)."""
        row = self.lookup(txn, num)
        if row is None or row.reserved:
            return
        if row.refcount <= 1:
            self.table.delete(txn, row)
        else:
            self.table.insert(txn, replace(row, refcount=row.refcount - 1))

    def _free_number(self, txn: ReadTxn) -> int:
        used = {
            i.id
            for i in self.table.lower_bound(txn, identity_id_index.query(MIN_ALLOCATED_IDENTITY))
        }
        for num in range(MIN_ALLOCATED_IDENTITY, MAX_ALLOCATED_IDENTITY + 1):
            if num not in used:
                return num
        raise IdentitiesExhaustedError(
            f"identities: all numbers {MIN_ALLOCATED_IDENTITY}..{MAX_ALLOCATED_IDENTITY} are in use"
        )
