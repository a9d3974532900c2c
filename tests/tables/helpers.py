"""Small builders shared by the tables tests."""

from __future__ import annotations

from statedb import DB
from tables.backends import BackendParams, BackendState
from tables.frontends import Frontend, FrontendParams, SVCType
from tables.l3n4 import L3n4Addr
from tables.lb_config import LBConfig
from tables.lb_writer import LBWriter
from tables.services import Service


def new_writer(config: LBConfig | None = None) -> tuple[DB, LBWriter]:
    """A fresh DB with the LB tables registered and a writer on them."""
    db = DB()
    return db, LBWriter.create(db, config)


def addr(text: str) -> L3n4Addr:
    """Parse ``ip:port/PROTO``."""
    return L3n4Addr.parse(text)


def fe(address: str, service: str, type_: SVCType = SVCType.CLUSTER_IP, port_name: str = "",
       service_port: int = 0) -> FrontendParams:
    """Frontend parameters."""
    return FrontendParams(addr(address), type_, service, port_name, service_port)


def be(address: str, *port_names: str, node: str = "", state: BackendState = BackendState.ACTIVE,
       source: str = "k8s", zone: str = "", for_zones: tuple[str, ...] = ()) -> BackendParams:
    """Backend instance parameters."""
    return BackendParams(addr(address), tuple(port_names), node_name=node, state=state,
                         source=source, zone=zone, for_zones=for_zones)


def frontend_map(db: DB, writer: LBWriter) -> dict[str, Frontend]:
    """All frontends by address text."""
    return {str(f.address): f for f in writer.frontends.all(db.read_txn())}


def backend_addrs(f: Frontend) -> list[str]:
    """The frontend's backend addresses as text."""
    return [str(b.address) for b in f.backends]


def svc(name: str, **kw: object) -> Service:
    """A service row."""
    return Service(name, **kw)  # type: ignore[arg-type]
