"""The frontends table: one row per frontend address (address+port+protocol+scope) of a service.

A frontend row carries its static parameters (`FrontendParams`: address, type,
service name, port name, service port), the service row it belongs to, the
backends it currently selects (computed by `tables.lb_writer.LBWriter` from the
backends table and the service's policies: port name, traffic policy, zones),
the service id assigned by the BPF reconciler (0 until assigned) and the
reconciler `Status`.

NodePort and HostPort frontends are stored with the unspecified address
(``0.0.0.0`` / ``::``), as Cilium does: one *surrogate* frontend per port; the
BPF operations expand it over the node addresses marked for NodePort (see
`tables.node_addresses`). The writer marks these frontends Pending again when
node addresses change, so the expansion is refreshed.

Indexes: ``address`` (primary) and ``service`` (non-unique, by service name).
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any

from reconciler.status import Status, StatusKind, status_pending
from statedb import Index, Table
from statedb import keys as keycodec
from statedb.rows import slot_constructor
from tables.backends import BackendParams
from tables.l3n4 import L3n4Addr, addr_json, encode_addr_key, parse_addr_key
from tables.services import Service, ServiceName

FRONTENDS_TABLE = "frontends"

#: How many backends the Backends column lists before ``+ N more ...``.
MAX_BACKENDS_SHOWN = 5


class SVCType(enum.StrEnum):
    """The kind of a frontend."""

    CLUSTER_IP = "ClusterIP"
    NODE_PORT = "NodePort"
    EXTERNAL_IPS = "ExternalIPs"
    HOST_PORT = "HostPort"
    LOAD_BALANCER = "LoadBalancer"
    LOCAL_REDIRECT = "LocalRedirect"


    @property
    def is_external(self) -> bool:
        """True for types reachable from outside the cluster (ext traffic policy applies)."""
        return self in (
            SVCType.NODE_PORT,
            SVCType.EXTERNAL_IPS,
            SVCType.HOST_PORT,
            SVCType.LOAD_BALANCER,
        )


@dataclass(frozen=True, slots=True)
class FrontendParams:
    """The static parameters of a frontend, as sources give them to the writer."""

    address: L3n4Addr
    type: SVCType
    service_name: ServiceName
    port_name: str = ""
    #: The service (ClusterIP) port of this frontend; differs from address.port for
    #: NodePort/LoadBalancer-nodeport frontends. 0 means "same as address.port".
    service_port: int = 0

    def effective_service_port(self) -> int:
        """``service_port`` or, when 0, the frontend's own port."""
        return self.service_port or self.address.port


#: ``FrontendParams(address, type, service_name, port_name, service_port)`` through its
#: slots (the converter builds one per frontend).
new_frontend_params: Any = slot_constructor(FrontendParams, "new_frontend_params")


def _initial_status() -> Status:
    return status_pending()


class _Keep(enum.Enum):
    """The "unchanged" marker of `Frontend.copy_with`."""

    KEEP = 0


_KEEP = _Keep.KEEP


@dataclass(frozen=True, slots=True)
class Frontend:
    """A frontend row (managed by `LBWriter`; the reconciler writes ``status`` and ``id``)."""

    address: L3n4Addr
    type: SVCType
    service_name: ServiceName
    port_name: str = ""
    service_port: int = 0
    #: The service row this frontend belongs to (updated with the service).
    service: Service | None = field(default=None, compare=False)
    #: Backends selected for this frontend, sorted by address; includes terminating
    #: ones (the BPF ops use them only when no active backend remains).
    backends: tuple[BackendParams, ...] = ()
    #: Service id assigned by the BPF reconciler; 0 = not yet assigned.
    id: int = 0
    #: When set, backends are taken from this service instead (local redirect).
    redirect_to: ServiceName | None = None
    status: Status = field(default_factory=_initial_status)

    # ----- helpers ------------------------------------------------------------
    @property
    def params(self) -> FrontendParams:
        """The static parameters of this frontend."""
        return FrontendParams(
            self.address, self.type, self.service_name, self.port_name, self.service_port
        )

    def effective_service_port(self) -> int:
        """``service_port`` or, when 0, the frontend's own port."""
        return self.service_port or self.address.port

    @property
    def is_surrogate(self) -> bool:
        """True for the 0.0.0.0/:: NodePort/HostPort frontend expanded over node addresses."""
        return self.address.is_unspecified and self.type in (SVCType.NODE_PORT, SVCType.HOST_PORT)

    def with_status(self, status: Status) -> Frontend:
        """Return a copy with ``status`` replaced (the reconciler's set_object_status)."""
        return self.copy_with(status=status)

    def pending(self, **changes: Any) -> Frontend:
        """Return a copy with ``changes`` applied and a fresh Pending status."""
        return self.copy_with(status=status_pending(), **changes)

    def pending_with(
        self, service: Service | None, backends: tuple[BackendParams, ...]
    ) -> Frontend:
        """A copy with ``service``, ``backends`` and a fresh Pending status: what the
        writer stores whenever a frontend's input changed (``pending`` without its keyword
        dispatch, on the path every service's load takes twice)."""
        return _new_frontend(
            self.address,
            self.type,
            self.service_name,
            self.port_name,
            self.service_port,
            service,
            backends,
            self.id,
            self.redirect_to,
            status_pending(),
        )

    def copy_with(
        self,
        *,
        service: Service | _Keep | None = _KEEP,
        backends: tuple[BackendParams, ...] | _Keep = _KEEP,
        id: int | _Keep = _KEEP,
        status: Status | _Keep = _KEEP,
    ) -> Frontend:
        """``dataclasses.replace`` for the fields that change after creation, without
        its per-call field introspection (the writer and the reconciler copy every
        frontend at least twice)."""
        return _new_frontend(
            self.address,
            self.type,
            self.service_name,
            self.port_name,
            self.service_port,
            self.service if service is _KEEP else service,
            self.backends if backends is _KEEP else backends,
            self.id if id is _KEEP else id,
            self.redirect_to,
            self.status if status is _KEEP else status,
        )

    # ----- show --------------------------------------------------------------------
    @staticmethod
    def table_header() -> list[str]:
        """Columns of ``db/show frontends``: Cilium's, then the service id and the service's
        flags (an older corpus generation compares ``Address Flags``)."""
        return [
            "Address",
            "Type",
            "ServiceName",
            "PortName",
            "Backends",
            "RedirectTo",
            "Status",
            "Since",
            "Error",
            "ID",
            "Flags",
        ]

    def backends_text(self) -> str:
        """Backend addresses, cut to five plus ``+ N more ...``."""
        shown = ", ".join(str(b.address) for b in self.backends[:MAX_BACKENDS_SHOWN])
        extra = len(self.backends) - MAX_BACKENDS_SHOWN
        if extra > 0:
            shown += f" + {extra} more ..."
        return shown

    def table_row(self) -> list[str]:
        """Cells of ``db/show frontends``."""
        since = ""
        if self.status.updated_at:
            since = _human_duration(time.time() - self.status.updated_at)
        return [
            str(self.address),
            self.type.value,
            self.service_name,
            self.port_name,
            self.backends_text(),
            self.redirect_to or "",
            self.status.kind.value,
            since,
            self.status.error if self.status.kind is StatusKind.ERROR else "",
            str(self.id),
            self.service.flags_text() if self.service is not None else "",
        ]

    def _status_json(self) -> dict[str, Any]:
        st: dict[str, Any] = {
            "kind": self.status.kind.value,
            "updated-at": _iso(self.status.updated_at),
            "id": self.status.id,
        }
        if self.status.kind is StatusKind.ERROR:
            st["error"] = self.status.error
        return st

    def to_json(self) -> dict[str, Any]:
        """JSON form (Cilium's field names)."""

        return {
            "Address": addr_json(self.address),
            "Type": self.type.value,
            "ServiceName": self.service_name,
            "PortName": self.port_name,
            "ServicePort": self.effective_service_port(),
            "Status": self._status_json(),
            "Backends": [b.to_json() for b in self.backends],
            "ID": self.id,
            "RedirectTo": self.redirect_to,
        }

    def to_yaml(self) -> dict[str, Any]:
        """YAML form (lower-cased names)."""
        return {
            "frontendparams": {
                "address": str(self.address),
                "type": self.type.value,
                "servicename": self.service_name,
                "portname": self.port_name,
                "serviceport": self.effective_service_port(),
            },
            "status": self._status_json(),
            "backends": [b.to_yaml() for b in self.backends],
            "id": self.id,
            "redirectto": self.redirect_to,
        }


#: ``Frontend(...)`` with every field positional, in declaration order (address, type,
#: service_name, port_name, service_port, service, backends, id, redirect_to, status),
#: filling the slots directly (no frozen-dataclass ``__setattr__`` per field).
new_frontend: Any = slot_constructor(Frontend, "new_frontend")
_new_frontend = new_frontend


def _iso(ts: float) -> str:
    import datetime

    return datetime.datetime.fromtimestamp(ts, tz=datetime.UTC).isoformat()


def _human_duration(seconds: float) -> str:
    s = max(0, int(seconds))
    if s < 120:
        return f"{s}s"
    m = s // 60
    if m < 10:
        return f"{m}m{s % 60}s"
    if m < 180:
        return f"{m}m"
    h = m // 60
    if h < 48:
        return f"{h}h"
    return f"{h // 24}d"


#: Primary index: the frontend address (``ip:port/PROTO[/i]``). The keys are read by
#: C-level attribute getters: every write reads its row's key, and a status write (the
#: reconciler's compare-and-swap) two rows'.
frontend_address_index: Index[Frontend, Any] = Index(
    "address", key=attrgetter("address"), encode=encode_addr_key, parse=parse_addr_key
)

#: Secondary index: the service name.
frontend_service_index: Index[Frontend, str] = Index(
    "service", key=attrgetter("service_name"), encode=keycodec.string, unique=False
)


def new_frontends_table() -> Table[Frontend]:
    """Return a new, unregistered frontends table."""
    return Table(FRONTENDS_TABLE, frontend_address_index, frontend_service_index, row_type=Frontend)
