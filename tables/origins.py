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

import binascii
import dataclasses
import socket
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from itertools import repeat
from operator import attrgetter
from typing import Any, ClassVar, cast

from statedb import DB, Index, ReadTxn, Table, WriteTxn, rowbuild
from statedb import keys as keycodec
from statedb.errors import TableNotRegisteredError
from statedb.rows import FrozenValue, assignable_twin, slot_builder, slot_setters
from tables.slice_addresses import HELD
from tables.slice_addresses import packed as packed_addresses

ORIGINS_TABLE = "origins"

#: Kinds without a namespace.
CLUSTER_SCOPED_KINDS = frozenset({"Node", "Namespace", "CiliumClusterwideNetworkPolicy"})

#: Where an origin came from.
SOURCE_MANIFESTS = "manifests"
SOURCE_K8S = "k8s"


@dataclass(frozen=True)
class _OriginFields:
    """The fields of Origin, in order (the field list ``dataclasses.fields``, ``replace``
    and ``asdict`` read from Origin)."""

    kind: str
    namespace: str
    name: str
    source: str
    uid: str = ""
    resource_version: str = ""
    file: str = ""
    line: int = 0
    owner: str = ""
    addresses: str = ""


#: (kind, namespace, source) triples, shared by the origins that have the same ones.
_KINDS: dict[tuple[str, str, str], tuple[str, str, str]] = {}
_KINDS_MAX = 4096
_NO_WHERE: tuple[str, int] = ("", 0)


def _shared_kind(kind: str, namespace: str, source: str) -> tuple[str, str, str]:
    triple = (kind, namespace, source)
    shared = _KINDS.get(triple)
    if shared is None:
        if len(_KINDS) >= _KINDS_MAX:
            _KINDS.clear()  # only costs the sharing of the triples made before
        shared = _KINDS[triple] = (sys.intern(kind), sys.intern(namespace), sys.intern(source))
    return shared


def _pack_uid(uid: str) -> str | int:
    """A canonical (lower-case, hyphenated) UUID as its 128-bit int (48 bytes instead of
    88 for the string); any other uid as it is."""
    # The hyphens where a UUID has them (characters 8, 13, 18 and 23), and no other.
    if len(uid) == 36 and uid[8:24:5] == "----":
        h = uid.replace("-", "")
        if len(h) == 32:
            try:
                packed = _unhex(h)  # hex digits only (no sign, blank or underscore)
            except ValueError:
                return uid
            # Only lower-case digits give themselves back: then `_unpack_uid` gives the
            # uid back.
            if packed.hex() == h:
                return _from_bytes(packed)
    return uid


_unhex = binascii.unhexlify
_from_bytes = int.from_bytes


def _pack_rv(rv: str) -> str | int:
    """A resourceVersion in canonical decimal form (an etcd revision: ASCII digits, no
    leading zero) as its int (32 bytes instead of 56-64 for the string); any other as it
    is, so two different versions never compare equal."""
    if rv.isascii() and rv.isdigit() and rv[0] != "0":
        return int(rv)
    return rv


def _unpack_uid(packed: str | int) -> str:
    if isinstance(packed, str):
        return packed
    h = f"{packed:032x}"
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


class Origin(FrozenValue, fields=_OriginFields):
    """One source object: kind, namespace, name; its manifest file and line, or its
    Kubernetes uid and resourceVersion; for an EndpointSlice its service and addresses.

    Immutable, with the value semantics of a frozen dataclass of its ten fields
    (equality, hash, repr, ``dataclasses.fields``/``replace``/``asdict``). Held compactly,
    one row per Kubernetes object at 60,000 services: the encoded ``Kind/namespace/name``
    (`key_bytes`, which is also the row's primary key: no second bytes object in the
    table), the name read back from it; kind, namespace and source in one shared tuple;
    a canonical uid as its 128-bit int, a decimal resourceVersion as its int; file and
    line in one slot (shared when empty). 96 bytes and two small objects less per row
    than a dataclass (112 bytes, and a name and a uid string).
    """

    __slots__ = ("_addrs", "_kind", "_rv", "_uid", "_where", "key_bytes", "owner")
    __dataclass_fields__: ClassVar[dict[str, dataclasses.Field[Any]]]

    #: ``Kind/namespace/name`` encoded (UTF-8): the row's primary key.
    key_bytes: bytes
    #: The service (``namespace/name``) an EndpointSlice belongs to; "" otherwise.
    owner: str
    _kind: tuple[str, str, str]
    _uid: str | int
    _rv: str | int
    _addrs: str | bytes
    _where: tuple[str, int]

    def __init__(
        self,
        kind: str,
        namespace: str,
        name: str,
        source: str,
        uid: str = "",
        resource_version: str = "",
        file: str = "",
        line: int = 0,
        owner: str = "",
        addresses: str = "",
    ) -> None:
        _fill(self, f"{kind}/{namespace}/{name}".encode(), _shared_kind(kind, namespace, source),
              _pack_uid(uid), _pack_rv(resource_version),
              (file, line) if file or line else _NO_WHERE,
              owner, _pack_addresses(addresses.split(",")) if addresses else "")

    @property
    def kind(self) -> str:
        """The object's kind (``Service``, ``EndpointSlice``, ...)."""
        return self._kind[0]

    @property
    def namespace(self) -> str:
        """The object's namespace ("" for cluster-scoped kinds)."""
        return self._kind[1]

    @property
    def source(self) -> str:
        """Where the object came from (``k8s``, ``manifests``)."""
        return self._kind[2]

    @property
    def name(self) -> str:
        """The object's name (read from `key_bytes`, after its kind and namespace)."""
        kind, ns, _ = self._kind
        # Byte offsets: kind and namespace may hold non-ASCII characters.
        skip = len(kind.encode()) + len(ns.encode()) + 2
        return self.key_bytes[skip:].decode()

    @property
    def uid(self) -> str:
        """The Kubernetes uid ("" for a manifest)."""
        return _unpack_uid(self._uid)

    @property
    def resource_version(self) -> str:
        """The Kubernetes resourceVersion ("" for a manifest)."""
        rv = self._rv
        return rv if type(rv) is str else str(rv)

    @property
    def addresses(self) -> str:
        """The endpoint addresses an EndpointSlice lists, comma-separated ("" otherwise)."""
        a = self._addrs
        if isinstance(a, str):
            return a
        return ",".join([_ntop(_AF_INET, a[i:i + 4]) for i in range(0, len(a), 4)])

    @property
    def file(self) -> str:
        """The manifest file ("" for a Kubernetes object)."""
        return self._where[0]

    @property
    def line(self) -> int:
        """The line the object's document starts on in `file` (0: not known)."""
        return self._where[1]

    def _fields(self) -> tuple[Any, ...]:
        return (self.kind, self.namespace, self.name, self.source, self.uid,
                self.resource_version, self.file, self.line, self.owner, self.addresses)

    def lists(self, address: str) -> bool:
        """Whether an EndpointSlice's endpoints list ``address``."""
        a = self._addrs
        if isinstance(a, str):
            return address in a.split(",") if a else False
        try:
            packed = _pton(_AF_INET, address)
        except (OSError, ValueError):  # not an IPv4 address in canonical form
            return False
        i = a.find(packed)
        while i >= 0:
            if i % 4 == 0:  # one of the addresses, not bytes across two of them
                return True
            i = a.find(packed, i + 1)
        return False

    @property
    def key(self) -> str:
        """``Kind/namespace/name`` (``Kind//name`` for cluster-scoped kinds)."""
        return self.key_bytes.decode()

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


_set_key, _set_kind, _set_uid, _set_rv, _set_where, _set_owner, _set_addresses = slot_setters(
    Origin, "key_bytes", "_kind", "_uid", "_rv", "_where", "owner", "_addrs"
)


def _fill(
    o: Origin, key_bytes: bytes, kind: tuple[str, str, str], uid: str | int, rv: str | int,
    where: tuple[str, int], owner: str, addresses: str | bytes,
) -> Origin:
    """Set every slot of ``o`` (new) from its stored form; return it."""
    _set_key(o, key_bytes)
    _set_kind(o, kind)
    _set_uid(o, uid)
    _set_rv(o, rv)
    _set_where(o, where)
    _set_owner(o, owner)
    _set_addresses(o, addresses)
    return o


#: Origins built by plain slot stores (`statedb.rows.assignable_twin`): ``_OriginSlots()``
#: is an empty one.
_OriginSlots = cast(Callable[[], Any], assignable_twin(Origin))
#: ``_new_origin(key_bytes, kind, uid, rv, where, owner, addresses)``: an Origin from its
#: slots' stored forms (`statedb.rows.slot_builder`), used where it is statedb's compiled
#: row builder (`_BUILT_IN_C`: a fifth of the instructions of the slot stores).
_new_origin = slot_builder(
    Origin, "key_bytes", "_kind", "_uid", "_rv", "_where", "owner", "_addrs", name="new_origin"
)
_BUILT_IN_C = rowbuild.COMPILED
#: `origins_of`'s mark for an origin it makes itself.
_USUAL: Any = object()


def _encode_key(key: str | bytes) -> bytes:
    """The primary key of an origin: ``Kind/namespace/name`` encoded, or a row's own
    `Origin.key_bytes` as it is (the table stores no second bytes object per row)."""
    if type(key) is bytes:
        return key
    return keycodec.string(key)  # type: ignore[arg-type]


# A row's own key bytes are their encoding: the table neither calls `_encode_key` for
# them per row written nor per lookup by `Origin.key_bytes` (OriginRecorder.record).
keycodec.self_encoding(_encode_key, bytes)

#: Primary index: ``Kind/namespace/name``; queries take the str.
origin_key_index: Index[Origin, Any] = Index(
    "key", key=attrgetter("key_bytes"), encode=_encode_key, parse=str
)


def new_origins_table() -> Table[Origin]:
    """A new, unregistered ``origins`` table."""
    return Table(ORIGINS_TABLE, origin_key_index, row_type=Origin)


def object_origin_key(kind: str, namespace: str, name: str) -> str:
    """The ``origins`` key of an object."""
    return f"{kind}/{namespace}/{name}"


_AF_INET = socket.AF_INET
_pton = socket.inet_pton
_ntop = socket.inet_ntop


def _pack_addresses(addrs: list[Any]) -> str | bytes:
    """An EndpointSlice's addresses as the row keeps them: IPv4 addresses (the usual
    slice) as their 4 bytes each (80 bytes instead of some 176 for the text of ten);
    any other list as its comma-separated text. inet_pton takes the dotted quad only
    in its canonical form (no leading zeros), so the bytes read back as the same text."""
    if not addrs:
        return ""
    try:
        return b"".join(map(_pton, _AFS, addrs))
    except (OSError, ValueError):  # IPv6, a name, an address in another form
        return ",".join(addrs)
    except TypeError:  # an address that is no string: as its text
        return _pack_addresses([a if type(a) is str else str(a) for a in addrs])


#: AF_INET again and again: `inet_pton`'s first argument, by `map` with no Python step.
_AFS = repeat(_AF_INET)


def _slice_packed(obj: Mapping[str, Any]) -> str | bytes:
    """An EndpointSlice's addresses as its row keeps them: handed over by the converter
    that parsed them (`tables.slice_addresses`), else parsed here."""
    handed = packed_addresses(obj.get("endpoints")) if HELD else None
    return handed if handed is not None else _pack_addresses(_slice_addresses(obj))


def _slice_addresses(obj: Mapping[str, Any]) -> list[Any]:
    """The addresses an EndpointSlice's endpoints list, in order."""
    endpoints = obj.get("endpoints")
    if not isinstance(endpoints, list):
        return []
    out: list[str] = []
    try:
        # The usual slice: every endpoint a dict with a list of address strings (half
        # the instructions of a loop that checks each endpoint and address as it goes).
        for ep in endpoints:
            addrs = ep["addresses"]
            if type(addrs) is not list:
                raise TypeError  # a string's characters are no addresses
            out += addrs
        return out  # what is no string, `_pack_addresses` reads as its str()
    except (KeyError, TypeError):  # ep no dict, no list of addresses
        return _odd_slice_addresses(endpoints)


def _odd_slice_addresses(endpoints: list[Any]) -> list[str]:
    """`_slice_addresses` of a slice with an endpoint that is no dict, lists no
    addresses, or lists an address that is no string."""
    out: list[str] = []
    for ep in endpoints:
        if isinstance(ep, Mapping):
            addrs = ep.get("addresses")
            if isinstance(addrs, list):
                out.extend(a if type(a) is str else str(a) for a in addrs)
    return out


def origin_of(
    obj: Mapping[str, Any], source: str, *, file: str = "", line: int = 0
) -> Origin | None:
    """The origin of an object as a source read it; None when it has no kind or name
    (the source refuses such an object anyway)."""
    kind = obj.get("kind")
    meta = obj.get("metadata")
    # A plain dict first: the usual case, without the Mapping ABC's isinstance check.
    if type(meta) is not dict and not isinstance(meta, Mapping):
        meta = {}
    name = meta.get("name")
    if not isinstance(kind, str) or not kind or not isinstance(name, str) or not name:
        return None
    if kind in CLUSTER_SCOPED_KINDS:
        ns = ""
    else:
        given = meta.get("namespace")
        # One string per namespace, not per object.
        ns = sys.intern(given) if isinstance(given, str) and given else "default"
    uid, rv = meta.get("uid"), meta.get("resourceVersion")
    owner = ""
    addresses: str | bytes = ""
    if kind == "EndpointSlice":
        labels = meta.get("labels")
        svc = (
            labels.get("kubernetes.io/service-name")
            if type(labels) is dict or isinstance(labels, Mapping)
            else None
        )
        # Interned: the same string as the converter's (interned) name of the service.
        owner = sys.intern(f"{ns}/{svc}") if isinstance(svc, str) and svc else ""
        addresses = _slice_packed(obj)
    if type(rv) is not str:
        rv = str(rv) if rv else ""
    # The slots set as `_fill` sets them, by plain stores (`assignable_twin`).
    triple = _KINDS.get((kind, ns, source))
    o = _OriginSlots()
    o.key_bytes = f"{kind}/{ns}/{name}".encode()
    o._kind = triple if triple is not None else _shared_kind(kind, ns, source)
    o._uid = _pack_uid(uid if type(uid) is str else str(uid) if uid else "")
    o._rv = _pack_rv(rv)
    o._where = (file, line) if file or line else _NO_WHERE
    o.owner = owner
    o._addrs = addresses
    o.__class__ = Origin
    return o


def origins_of(objs: Iterable[Mapping[str, Any]], source: str) -> list[Origin]:
    """`origin_of` of each of ``objs`` (Kubernetes objects: no file or line) in order,
    those without an origin left out.

    A source's batch in one loop: the usual object (a dict with a namespaced kind and
    string name, namespace, uid and resourceVersion; an EndpointSlice's service label a
    string too) is made inline, the same origin with a third of the Python calls (none
    for a Service); any other goes through `origin_of`."""
    out: list[Origin] = []
    append = out.append
    kinds = _KINDS
    new = _OriginSlots
    build, in_c = _new_origin, _BUILT_IN_C
    scoped = CLUSTER_SCOPED_KINDS
    name: Any
    ns: Any
    uid: Any
    rv: Any
    owner: str
    addrs: str | bytes
    o: Any  # an Origin, None, or `_USUAL` (one to make here)
    for obj in objs:
        kind = obj.get("kind")
        meta = obj.get("metadata")
        if type(meta) is not dict or type(kind) is not str or not kind or kind in scoped:
            o = origin_of(obj, source)
        else:
            name = meta.get("name")
            ns = meta.get("namespace")
            uid = meta.get("uid")
            rv = meta.get("resourceVersion")
            if not (type(name) is str and name and type(ns) is str and ns
                    and type(uid) is str and type(rv) is str):
                o = origin_of(obj, source)
            elif kind != "EndpointSlice":
                o = _USUAL
                owner = addrs = ""
            else:
                labels = meta.get("labels")
                svc = labels.get(_SERVICE_LABEL) if type(labels) is dict else None
                if type(svc) is not str:
                    o = origin_of(obj, source)
                else:
                    o = _USUAL
                    # Interned: the converter's (interned) name of the service.
                    owner = sys.intern(f"{ns}/{svc}") if svc else ""
                    # Packed by the converter already, or here.
                    handed = packed_addresses(obj.get("endpoints")) if HELD else None
                    addrs = (handed if handed is not None
                             else _pack_addresses(_slice_addresses(obj)))
            if o is _USUAL:
                # The slots `origin_of` sets, as it sets them.
                triple = kinds.get((kind, ns, source))
                key_bytes = f"{kind}/{ns}/{name}".encode()
                shared = triple if triple is not None else _shared_kind(kind, ns, source)
                packed_uid = _pack_uid(uid)
                packed_rv = int(rv) if rv.isascii() and rv.isdigit() and rv[0] != "0" else rv
                if in_c:
                    # One call of the compiled row builder.
                    o = build(key_bytes, shared, packed_uid, packed_rv, _NO_WHERE, owner, addrs)
                else:
                    # By plain slot stores (without the call the Python builder would add).
                    o = new()
                    o.key_bytes = key_bytes
                    o._kind = shared
                    o._uid = packed_uid
                    o._rv = packed_rv
                    o._where = _NO_WHERE
                    o.owner = owner
                    o._addrs = addrs
                    o.__class__ = Origin
        if o is not None:
            append(o)
    return out


#: The label naming an EndpointSlice's service.
_SERVICE_LABEL = "kubernetes.io/service-name"


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
        # Looked up by the row's own encoded key (the primary key as it is stored).
        old = self.table.get(txn, origin.key_bytes)
        if old is None or old != origin:
            self.table.insert(txn, origin)

    def record_many(self, txn: WriteTxn, objs: Iterable[Mapping[str, Any]], source: str) -> None:
        """`record` each of ``objs`` in turn (Kubernetes objects: no file or line).

        A source's batch in one call: the origins that are new (every one of an initial
        list) go in with one lookup each (`Table.insert_new`), not a `get` and an
        `insert` per object; one already recorded is rewritten only when it changed."""
        made = origins_of(objs, source)
        table = self.table
        n = len(made)
        i = table.insert_new(txn, made)
        while i < n:
            # A row has this key: keep it when equal (as `record` does), then go on.
            origin = made[i]
            old = table.get(txn, origin.key_bytes)
            if old is None or old != origin:
                table.insert(txn, origin)
            i = table.insert_new(txn, made, i + 1)

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
