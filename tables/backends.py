"""The backends table: one row per backend address, holding one instance per (service, source).

Following Cilium's model, a backend row is keyed by its L3n4 address alone and
carries the per-service *instances* of that address: each service that uses the
address has an instance (port names, weight, node, zone, state, source). When
several sources give the same service an instance, the one with the highest
priority (smallest number, see `tables.services.SOURCE_PRIORITY`) is the
*preferred* instance; the others are *shadows*. The same address used by two
services is one row with two instances, so the BPF backends map can share the
entry, and the corpus tables (``Address Instances Shadows NodeName``) compare
directly.

Indexes: ``address`` (primary; accepts ``ip:port/PROTO``, a CIDR prefix or a
bare IP in queries) and ``service`` (non-unique, one key per service of a
preferred instance).
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
import operator
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import repeat
from typing import Any, ClassVar, cast

from statedb import Index, Table, rowbuild
from statedb import keys as keycodec
from statedb.rows import FrozenValue, assignable_twin, slot_setters
from tables.l3n4 import L3n4Addr, addr_json, encode_addr_key, parse_addr_key
from tables.services import ServiceName

BACKENDS_TABLE = "backends"

#: Default backend weight (Kubernetes has none; Cilium uses 100).
DEFAULT_WEIGHT = 100


class BackendState(enum.IntEnum):
    """The lifecycle state of a backend instance (numbers as in Cilium's marshalling)."""

    ACTIVE = 0
    TERMINATING = 1
    QUARANTINED = 2
    MAINTENANCE = 3
    TERMINATING_NOT_SERVING = 4

    @property
    def text(self) -> str:
        """Lower-case name as the tables and maps dump show it (``terminating``)."""
        return self.name.lower().replace("_", "-")

    @classmethod
    def parse(cls, text: str) -> BackendState:
        """Parse ``active``, ``terminating``, ... ; raise ValueError."""
        try:
            return cls[text.strip().upper().replace("-", "_")]
        except KeyError:
            raise ValueError(f"unknown backend state {text!r}") from None


@dataclass(frozen=True)
class _BackendParamsFields:
    """The fields of BackendParams, in order (their names, defaults and the field list
    that ``dataclasses.fields``/``replace``/``asdict`` read from BackendParams)."""

    address: L3n4Addr
    port_names: tuple[str, ...] = ()
    weight: int = DEFAULT_WEIGHT
    node_name: str = ""
    zone: str = ""
    for_zones: tuple[str, ...] = ()
    cluster_id: int = 0
    source: str = "k8s"
    state: BackendState = BackendState.ACTIVE
    unhealthy: bool = False
    unhealthy_updated_at: float = 0.0


#: The seven details of a backend instance that the backends of one node share:
#: (node_name, zone, for_zones, cluster_id, source, unhealthy, unhealthy_updated_at).
_Details = tuple[str, str, tuple[str, ...], int, str, bool, float]
#: Everything of a backend instance but its address, as one tuple: the seven details, then
#: (port_names, weight, state). The details come first, at the same positions as in
#: `_Details`, so a reader indexing the details reads either tuple alike.
_Rest = tuple[str, str, tuple[str, ...], int, str, bool, float, tuple[str, ...], int,
              BackendState]
#: Shared tuples (the backends of a node with the same port names, weight and state share
#: one); cleared when it grows past _RESTS_MAX, which only costs the sharing of the
#: tuples made before.
_RESTS: dict[tuple[Any, ...], tuple[Any, ...]] = {}
_RESTS_MAX = 16384


def _shared_rest(rest: tuple[Any, ...]) -> Any:
    """``rest`` (a `_Details` or a `_Rest`), or an equal tuple made before (one object
    for many backends)."""
    # Only values of the exact field types are shared: an equal tuple of other types
    # (0 for False, 1 for 1.0, 0 for BackendState.ACTIVE) would change the type a field
    # reads back as.
    if type(rest[3]) is not int or type(rest[5]) is not bool or type(rest[6]) is not float:
        return rest
    if len(rest) > 7 and (
        type(rest[7]) is not tuple or type(rest[8]) is not int or type(rest[9]) is not BackendState
    ):
        return rest
    shared = _RESTS.get(rest)
    if shared is not None:
        return shared
    if len(_RESTS) >= _RESTS_MAX:
        _RESTS.clear()
    _RESTS[rest] = rest
    return rest


class BackendParams(FrozenValue, fields=_BackendParamsFields):
    """One service's view of a backend address (a backend instance).

    Immutable, with the value semantics of a frozen dataclass of its eleven fields
    (equality, hash, repr, ``dataclasses.fields``/``replace``/``asdict``). Two slots hold
    them: the address, and one tuple of the other ten (`_Rest`: node, zones, cluster,
    source, health, then port names, weight and state), shared by every backend with
    the same ones: the backends of one node and port share one tuple, so a backend costs
    its address and a 48-byte object (five slots took 80 bytes, eleven 128).
    """

    __slots__ = ("_rest", "address")
    __dataclass_fields__: ClassVar[dict[str, dataclasses.Field[Any]]]

    address: L3n4Addr
    _rest: _Rest

    def __init__(
        self,
        address: L3n4Addr,
        port_names: tuple[str, ...] = (),
        weight: int = DEFAULT_WEIGHT,
        node_name: str = "",
        zone: str = "",
        for_zones: tuple[str, ...] = (),
        cluster_id: int = 0,
        source: str = "k8s",
        state: BackendState = BackendState.ACTIVE,
        unhealthy: bool = False,
        unhealthy_updated_at: float = 0.0,
    ) -> None:
        _set_bp_address(self, address)
        _set_bp_rest(
            self,
            _shared_rest(
                (node_name, zone, for_zones, cluster_id, source, unhealthy, unhealthy_updated_at,
                 port_names, weight, state)
            ),
        )

    @property
    def port_names(self) -> tuple[str, ...]:
        """The names of the ports this backend serves (() when the port has no name)."""
        return self._rest[7]

    @property
    def weight(self) -> int:
        """The backend's weight (Maglev honours it)."""
        return self._rest[8]

    @property
    def state(self) -> BackendState:
        """The instance's lifecycle state."""
        return self._rest[9]

    @property
    def node_name(self) -> str:
        """The node the backend runs on ("" when unknown)."""
        return self._rest[0]

    @property
    def zone(self) -> str:
        """The backend's topology zone ("" when unknown)."""
        return self._rest[1]

    @property
    def for_zones(self) -> tuple[str, ...]:
        """Topology hints: zones this backend should serve; () when there are no hints."""
        return self._rest[2]

    @property
    def cluster_id(self) -> int:
        """The cluster the backend is in (0: this one)."""
        return self._rest[3]

    @property
    def source(self) -> str:
        """Where the instance came from (``k8s``, ``local``, ...)."""
        return self._rest[4]

    @property
    def unhealthy(self) -> bool:
        """Whether a health check found the backend unhealthy."""
        return self._rest[5]

    @property
    def unhealthy_updated_at(self) -> float:
        """When ``unhealthy`` was last reported (epoch seconds; 0.0: never)."""
        return self._rest[6]

    def _fields(self) -> tuple[Any, ...]:
        r = self._rest
        return (self.address, r[7], r[8], *r[:5], r[9], r[5], r[6])

    @property
    def effective_state(self) -> BackendState:
        """The state after health checks: an unhealthy backend counts as quarantined."""
        return BackendState.QUARANTINED if self.unhealthy else self.state

    def to_json(self) -> dict[str, Any]:
        """JSON form (Cilium's field names)."""
        return {
            "Address": addr_json(self.address),
            "PortNames": list(self.port_names) or None,
            "Weight": self.weight,
            "NodeName": self.node_name,
            "Zone": self.zone,
            "ForZones": list(self.for_zones) or None,
            "Source": self.source,
            "State": int(self.state),
            "Unhealthy": self.unhealthy,
            "UnhealthyUpdatedAt": _time_text(self.unhealthy_updated_at),
        }

    def to_yaml(self) -> dict[str, Any]:
        """YAML form (lower-cased names, addresses as text)."""
        return {
            "address": str(self.address),
            "portnames": list(self.port_names) or None,
            "weight": self.weight,
            "nodename": self.node_name,
            "zone": self.zone,
            "forzones": list(self.for_zones),
            "source": self.source,
            "state": int(self.state),
            "unhealthy": self.unhealthy,
            "unhealthyupdatedat": _time_text(self.unhealthy_updated_at),
        }


_set_bp_address, _set_bp_rest = slot_setters(BackendParams, "address", "_rest")

#: The object a backend instance holds everything but its address in: instances whose
#: objects are the same one (``is``) have the same fields but the address. A reader
#: deriving something per instance from those fields (the LB Ops' view of a backend)
#: derives it once per run of instances sharing the object: the backends of one node
#: and port usually share it. Equal fields do not imply the same object.
backend_shared_part: Callable[[BackendParams], object] = operator.attrgetter("_rest")


def _time_text(ts: float) -> str:
    if not ts:
        return "0001-01-01T00:00:00Z"
    dt = datetime.datetime.fromtimestamp(ts, tz=datetime.UTC)
    return dt.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


#: Key of an instance: (service name, source priority).
InstanceKey = tuple[ServiceName, int]


class Backend(FrozenValue):
    """A backend address with its instances, sorted by (service name, source priority).

    Immutable, with the value semantics of a frozen dataclass of ``address`` and
    ``instances`` (equality, hash, repr). Two slots, 48 bytes a row: a backend with one
    instance whose parameters carry the backend's address (nearly all of them) keeps that
    instance's key and parameters, and reads its address from the parameters; any other
    keeps its address and the tuple of (key, params) pairs. ``_key`` tells the two apart:
    a key is a tuple, an address is not.
    """

    __slots__ = ("_key", "_val")
    __match_args__ = ("address", "instances")

    _key: InstanceKey | L3n4Addr  # the lone instance's key, or the address
    _val: Any  # the lone instance's parameters, or the tuple of (key, params) pairs

    def __init__(
        self,
        address: L3n4Addr,
        instances: tuple[tuple[InstanceKey, BackendParams], ...] = (),
    ) -> None:
        if len(instances) == 1:
            ((key, params),) = instances
            if params.address is address or params.address == address:
                _set_key(self, key)
                _set_val(self, params)
                return
        _set_key(self, address)
        _set_val(self, tuple(instances))

    @classmethod
    def single(cls, address: L3n4Addr, key: InstanceKey, params: BackendParams) -> Backend:
        """``Backend(address, ((key, params),))`` without building the pair."""
        if params.address is not address and params.address != address:
            return cls(address, ((key, params),))
        b = _new(cls)
        _set_key(b, key)
        _set_val(b, params)
        return b

    @property
    def address(self) -> L3n4Addr:
        """The backend's address (the primary key)."""
        key = self._key
        if type(key) is tuple:
            address: L3n4Addr = self._val.address
            return address
        return key  # type: ignore[return-value]

    @property
    def instances(self) -> tuple[tuple[InstanceKey, BackendParams], ...]:
        """The (key, params) pairs, sorted by key."""
        key = self._key
        if type(key) is tuple:
            return ((key, self._val),)
        pairs: tuple[tuple[InstanceKey, BackendParams], ...] = self._val
        return pairs

    def has_instance(self, key: InstanceKey) -> bool:
        """True when the row holds an instance under ``key``."""
        k = self._key
        if type(k) is tuple:
            return k == key
        return any(ik == key for ik, _ in self._val)

    def is_only_instance(self, key: InstanceKey, params: BackendParams) -> bool:
        """True when the row's one instance is ``key`` with ``params`` (the same or equal
        parameters): what writing that instance again would leave unchanged."""
        k = self._key
        return type(k) is tuple and k == key and (self._val is params or self._val == params)

    def instance_keys(self) -> tuple[InstanceKey, ...]:
        """The keys of the instances, in order."""
        key = self._key
        if type(key) is tuple:
            return (key,)
        return tuple([k for k, _ in self._val])

    def _fields(self) -> tuple[Any, ...]:
        return (self.address, self.instances)

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        assert isinstance(other, Backend)
        # The stored form is canonical: equal backends, equal slots.
        return self._key == other._key and self._val == other._val

    def __hash__(self) -> int:
        # The hash of the frozen dataclass of (address, instances) the row was.
        return hash((self.address, self.instances))

    # ----- instance access -------------------------------------------------
    def preferred_instances(self) -> Iterator[tuple[InstanceKey, BackendParams]]:
        """Yield the highest-priority instance of each service, in service order."""
        last: str | None = None
        for key, inst in self.instances:
            if key[0] != last:
                last = key[0]
                yield key, inst

    def instance(self, service: ServiceName) -> BackendParams | None:
        """The preferred instance for ``service``, or None."""
        key = self._key
        if type(key) is tuple:
            inst: BackendParams | None = self._val if key[0] == service else None
            return inst
        for key, inst in self._val:
            if key[0] == service:
                return inst
        return None

    def instances_of(self, service: ServiceName) -> list[tuple[InstanceKey, BackendParams]]:
        """Every instance (all sources) for ``service``, best first."""
        return [(k, i) for k, i in self.instances if k[0] == service]

    def service_names(self) -> list[ServiceName]:
        """The services that have an instance of this backend, sorted."""
        key = self._key
        if type(key) is tuple:
            return [key[0]]
        return [k[0] for k, _ in self.preferred_instances()]

    def with_instance(self, key: InstanceKey, params: BackendParams) -> Backend:
        """Return a copy with the instance under ``key`` set to ``params``."""
        rest = [(k, i) for k, i in self.instances if k != key]
        rest.append((key, params))
        rest.sort(key=lambda ki: ki[0])
        return Backend(self.address, tuple(rest))

    def without_instance(self, key: InstanceKey) -> Backend:
        """Return a copy without the instance under ``key`` (may leave no instance)."""
        return Backend(self.address, tuple((k, i) for k, i in self.instances if k != key))

    def is_alive(self) -> bool:
        """True if an instance is healthy and active or terminating (connections worth keeping)."""
        return any(
            not i.unhealthy and i.state in (BackendState.ACTIVE, BackendState.TERMINATING)
            for _, i in self.instances
        )

    # ----- show ------------------------------------------------------------------
    @staticmethod
    def table_header() -> list[str]:
        """Columns of ``db/show backends``: Cilium's four, then per-instance details of the
        first instance (older corpus files compare ``Service``/``State``/... columns)."""
        return [
            "Address",
            "Instances",
            "Shadows",
            "NodeName",
            "Service",
            "Source",
            "Priority",
            "State",
            "PortNames",
            "Weight",
            "Zone",
        ]

    def instances_text(self) -> str:
        """``svc [state] (port names)`` per preferred instance, comma separated."""
        parts: list[str] = []
        for (svc, _), inst in self.preferred_instances():
            s = svc
            if inst.unhealthy:
                s += " [unhealthy]"
            elif inst.state is not BackendState.ACTIVE:
                s += f" [{inst.state.text}]"
            if inst.port_names:
                s += " (" + " ".join(inst.port_names) + ")"
            parts.append(s)
        return ", ".join(parts)

    def shadows_text(self) -> str:
        """The non-preferred instances: ``svc [source (ports), ...]`` per service."""
        out: list[str] = []
        svc: str | None = None
        shadows: list[str] = []
        for (name, _), inst in self.instances:
            if name != svc:
                if shadows:
                    out.append(f"{svc} [{', '.join(shadows)}]")
                svc, shadows = name, []
                continue
            text = inst.source
            if inst.port_names:
                text += " (" + " ".join(inst.port_names) + ")"
            shadows.append(text)
        if shadows:
            out.append(f"{svc} [{', '.join(shadows)}]")
        return ", ".join(out)

    def table_row(self) -> list[str]:
        """Cells of ``db/show backends``."""
        node = next((i.node_name for _, i in self.instances if i.node_name), "")
        first = next(iter(self.preferred_instances()), None)
        if first is None:
            extra = ["", "", "", "", "", "", ""]
        else:
            (_svc, prio), inst = first
            extra = [
                ", ".join(self.service_names()),
                inst.source,
                str(prio),
                inst.effective_state.text,
                ", ".join(inst.port_names),
                str(inst.weight),
                inst.zone,
            ]
        return [str(self.address), self.instances_text(), self.shadows_text(), node, *extra]

    def to_json(self) -> dict[str, Any]:
        """JSON form (Cilium's field names)."""
        insts = []
        for (svc, prio), inst in self.instances:
            v = inst.to_json()
            v["Address"] = {**addr_json(inst.address), "AddrCluster": {}}
            insts.append({"k": {"ServiceName": svc, "SourcePriority": prio}, "v": v})
        return {"Address": addr_json(self.address), "Instances": insts}

    def to_yaml(self) -> dict[str, Any]:
        """YAML form (lower-cased names)."""
        return {
            "address": str(self.address),
            "instances": [
                {"k": {"servicename": svc, "sourcepriority": prio}, "v": inst.to_yaml()}
                for (svc, prio), inst in self.instances
            ],
        }


_new = object.__new__
_set_key, _set_val = slot_setters(Backend, "_key", "_val")
#: Backend rows and BackendParams built by plain slot stores, then given their class
#: (`statedb.rows.assignable_twin`): about half the cost of a slot setter call per slot.
#: Their ``twin()`` makes an empty one (the twin has object's own __init__).
_BackendSlots = cast(Callable[[], Backend], assignable_twin(Backend))
_BackendParamsSlots = cast(Callable[[], BackendParams], assignable_twin(BackendParams))
#: Whole lists of them built by `statedb.rowbuild`'s compiled helper when it is built
#: (about a tenth of the cost per object); else by the plain slot stores above.
_COMPILED = rowbuild.COMPILED
_new_rows = rowbuild.new_rows
_BACKEND_KEY, _BACKEND_VAL = Backend.__dict__["_key"], Backend.__dict__["_val"]
_PARAMS_ADDRESS, _PARAMS_REST = BackendParams.__dict__["address"], BackendParams.__dict__["_rest"]


def single_backends(key: InstanceKey, params: Iterable[BackendParams]) -> list[Backend]:
    """``[Backend.single(p.address, key, p) for p in params]``: new rows of one instance
    each (a service's new backends), in one call."""
    if _COMPILED:
        return _new_rows(Backend, _BACKEND_KEY, _BACKEND_VAL, repeat(key), params)
    out: list[Backend] = []
    append = out.append
    # Built by plain slot stores (`statedb.rows.assignable_twin`).
    twin, cls = _BackendSlots, Backend
    for p in params:
        b = twin()  # an empty one: object's C-level __new__ and __init__
        b._key = key
        b._val = p
        b.__class__ = cls
        append(b)
    return out


def rows_of_service(
    addresses: Iterable[L3n4Addr], rows: Iterable[Backend | None], service: ServiceName
) -> dict[L3n4Addr, Backend]:
    """The ``rows`` (the rows at ``addresses``, None where there is none) that have an
    instance for ``service``, by address."""
    out: dict[L3n4Addr, Backend] = {}
    for a, b in zip(addresses, rows, strict=True):
        if b is None:
            continue
        key = b._key
        if type(key) is tuple:  # one instance (nearly every row)
            if key[0] == service:
                out[a] = b
        elif b.instance(service) is not None:
            out[a] = b
    return out


def preferred_instances_of(
    rows: Mapping[L3n4Addr, Backend], service: ServiceName, family: int, port_name: str
) -> list[BackendParams]:
    """The preferred instances for ``service`` of the backends ``rows`` (by address), in
    address order: of those whose address is of ``family`` (4 or 6, an address key's
    last byte) and, when ``port_name`` is given, whose instance serves that port. A
    frontend's candidate backends (`tables.lb_writer.LBWriter.select_backends`)."""
    out: list[BackendParams] = []
    append = out.append
    for a in sorted(rows) if len(rows) > 1 else rows:
        if a[20] != family:
            continue
        b = rows[a]
        key = b._key
        if type(key) is tuple:  # one instance (nearly every row)
            if key[0] != service:
                continue
            inst: BackendParams = b._val
        else:
            found = b.instance(service)
            if found is None:
                continue
            inst = found
        if port_name and port_name not in inst._rest[7]:
            continue
        append(inst)
    return out


def selects_all_of(
    rows: Sequence[Backend | None],
    given: tuple[BackendParams, ...],
    addresses: list[L3n4Addr],
    service: ServiceName,
    family: int,
    port_name: str,
) -> bool:
    """True when ``rows`` (the rows at ``addresses``, ``given``'s addresses, None where
    there is none) are each a row of one instance, for ``service``, that is ``given``'s
    item at its position (the very object, as the LB writer stores a given tuple's
    items), and ``given`` is in address order (without repeats), of ``family`` and,
    when ``port_name`` is given, serves that port: `preferred_instances_of` those rows
    is then ``given``'s items, in their order. False does not tell it is not so (the
    LB writer then selects the usual way)."""
    prev = b""
    key: Any = None  # the last row's instance key, checked
    names: tuple[str, ...] | None = None  # the last port names checked
    for b, p, a in zip(rows, given, addresses):
        if b is None or b._val is not p or a <= prev or a[20] != family:
            return False
        prev = a
        # A slice's rows share one key tuple and its backends one port-name tuple (the
        # backends of a node and port share their `_Rest`): most are checked once.
        if b._key is not key:
            key = b._key
            if type(key) is not tuple or key[0] != service:
                return False
        if port_name and p._rest[7] is not names:
            names = p._rest[7]
            if port_name not in names:
                return False
    return True


def given_in_order(given: tuple[BackendParams, ...], family: int, port_name: str) -> bool:
    """True when ``given`` (backends at distinct addresses) is in address order, of
    ``family`` and, when ``port_name`` is given, each serves that port: the part of
    `selects_all_of` about the tuple itself, for rows known to be ``given``'s
    one-instance rows of the service."""
    prev = b""
    rest: Any = None  # the last `_Rest` checked
    for p in given:
        a = p.address
        if a <= prev or a[20] != family:
            return False
        prev = a
        # The backends of a node and port share their `_Rest`: most are checked once.
        if p._rest is not rest:
            rest = p._rest
            if port_name and port_name not in rest[7]:
                return False
    return True


def _backend_address(b: Backend) -> L3n4Addr:
    """``b.address`` (the primary index's key: one call per row written, not two)."""
    key = b._key
    if type(key) is tuple:
        address: L3n4Addr = b._val.address
        return address
    return key  # type: ignore[return-value]


#: Primary index: the backend address.
backend_address_index: Index[Backend, Any] = Index(
    "address", key=_backend_address, encode=encode_addr_key, parse=parse_addr_key
)

#: Secondary index: every service with a preferred instance of the backend.
backend_service_index: Index[Backend, str] = Index(
    "service", keys=lambda b: b.service_names(), encode=keycodec.string, unique=False
)


def new_backends_table() -> Table[Backend]:
    """Return a new, unregistered backends table."""
    return Table(BACKENDS_TABLE, backend_address_index, backend_service_index, row_type=Backend)


def new_backend_params(
    address: L3n4Addr,
    port_names: tuple[str, ...],
    weight: int,
    node_name: str,
    zone: str,
    for_zones: tuple[str, ...],
    cluster_id: int,
    source: str,
    state: BackendState,
    unhealthy: bool,
    unhealthy_updated_at: float,
) -> BackendParams:
    """``BackendParams(...)`` with every field given positionally in declaration order:
    the same object, built without the keyword handling (the converters build one per
    endpoint)."""
    o = _new(BackendParams)
    _set_bp_address(o, address)
    _set_bp_rest(
        o,
        _shared_rest((node_name, zone, for_zones, cluster_id, source, unhealthy,
                      unhealthy_updated_at, port_names, weight, state)),
    )
    return o


def backend_details(
    node_name: str,
    zone: str,
    for_zones: tuple[str, ...],
    cluster_id: int,
    source: str,
    unhealthy: bool,
    unhealthy_updated_at: float,
) -> _Details:
    """The shared tuple of a backend instance's seven details (node, zones, cluster,
    source, health), for `backend_rest`: one per distinct set of details."""
    details: _Details = _shared_rest(
        (node_name, zone, for_zones, cluster_id, source, unhealthy, unhealthy_updated_at)
    )
    return details


def backend_rest(
    details: _Details, port_names: tuple[str, ...], weight: int, state: BackendState
) -> _Rest:
    """The shared tuple of everything of an instance but its address (`_Rest`), from a
    `backend_details` tuple: for `new_backend_params_from`, made once for the instances
    that have the same ones."""
    rest: _Rest = _shared_rest((*details, port_names, weight, state))
    return rest


#: `active_backend_rest`'s tuples by (node_name, zone, port_names, weight, source).
_ACTIVE_RESTS: dict[tuple[str, str, tuple[str, ...], int, str], _Rest] = {}


def active_backend_rest(
    node_name: str, zone: str, port_names: tuple[str, ...], weight: int, source: str
) -> _Rest:
    """``backend_rest(backend_details(node_name, zone, (), 0, source, False, 0.0),
    port_names, weight, BackendState.ACTIVE)``: the rest of an active, healthy instance
    without zone hints in this cluster (nearly every endpoint's), found in one lookup.
    ``node_name``, ``zone`` and ``source`` are strings, ``weight`` an int."""
    key = (node_name, zone, port_names, weight, source)
    rest = _ACTIVE_RESTS.get(key)
    if rest is None:
        details = backend_details(node_name, zone, (), 0, source, False, 0.0)
        rest = backend_rest(details, port_names, weight, BackendState.ACTIVE)
        if type(weight) is int:  # not a bool, whose key would be an equal int's
            if len(_ACTIVE_RESTS) >= _RESTS_MAX:
                _ACTIVE_RESTS.clear()
            _ACTIVE_RESTS[key] = rest
    return rest


def new_backend_params_from(address: L3n4Addr, rest: _Rest) -> BackendParams:
    """``BackendParams`` from its address and a `backend_rest` tuple (two slots set)."""
    o = _BackendParamsSlots()
    o.address = address
    o._rest = rest
    o.__class__ = BackendParams
    return o


def backend_params_of(
    addresses: Iterable[L3n4Addr], rests: Iterable[_Rest]
) -> list[BackendParams]:
    """``[new_backend_params_from(a, r) for a, r in zip(addresses, rests)]`` in one call
    (a converter's backends of one slice)."""
    if _COMPILED:
        return _new_rows(BackendParams, _PARAMS_ADDRESS, _PARAMS_REST, addresses, rests)
    out: list[BackendParams] = []
    append = out.append
    twin, cls = _BackendParamsSlots, BackendParams
    for a, r in zip(addresses, rests):
        o = twin()  # an empty one: object's C-level __new__ and __init__
        o.address = a
        o._rest = r
        o.__class__ = cls
        append(o)
    return out


def new_backend_params_with(
    address: L3n4Addr,
    port_names: tuple[str, ...],
    weight: int,
    state: BackendState,
    details: _Details,
) -> BackendParams:
    """``BackendParams`` from its four own fields and a `backend_details` tuple: what
    `new_backend_params` builds."""
    return new_backend_params_from(address, backend_rest(details, port_names, weight, state))
