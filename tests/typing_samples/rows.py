"""Rows, tables and targets the samples share: hosts (str primary key, int id index)
and zones, with typed Operations for each."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field, replace

from reconciler import Status, status_index, status_pending
from statedb import DB, Index, ReadTxn, Table, keys


@dataclass(frozen=True, slots=True)
class Host:
    name: str
    id: int
    zone: str
    status: Status = field(default_factory=status_pending)


@dataclass(frozen=True, slots=True)
class Zone:
    name: str
    status: Status = field(default_factory=status_pending)


def host_status(h: Host) -> Status:
    return h.status


def set_host_status(h: Host, s: Status) -> Host:
    return replace(h, status=s)


def zone_status(z: Zone) -> Status:
    return z.status


def set_zone_status(z: Zone, s: Status) -> Zone:
    return replace(z, status=s)


# Three ways to give an index its row type: an annotated variable, a subscripted
# constructor, a typed key function.
HOST_NAME: Index[Host, str] = Index("name", key=lambda h: h.name)
HOST_ID = Index[Host, int]("id", key=lambda h: h.id, encode=keys.uint64)


def zone_of(h: Host) -> str:
    return h.zone


HOST_ZONE = Index("zone", key=zone_of, unique=False)
HOST_STATUS = status_index(host_status)
ZONE_NAME: Index[Zone, str] = Index("name", key=lambda z: z.name)

hosts = Table("hosts", HOST_NAME, HOST_ID, HOST_ZONE, HOST_STATUS)
zones = Table("zones", ZONE_NAME)
db = DB(hosts, zones)


class HostOps:
    """A dict target for hosts."""

    def __init__(self) -> None:
        self.applied: dict[str, Host] = {}

    def update(self, txn: ReadTxn, revision: int, obj: Host) -> None:
        self.applied[obj.name] = obj

    def delete(self, txn: ReadTxn, revision: int, obj: Host) -> None:
        self.applied.pop(obj.name, None)

    def prune(self, txn: ReadTxn, objects: Iterator[Host]) -> None:
        keep = {h.name for h in objects}
        self.applied = {k: v for k, v in self.applied.items() if k in keep}


class ZoneOps:
    """An async target for zones."""

    async def update(self, txn: ReadTxn, revision: int, obj: Zone) -> None:
        pass

    async def delete(self, txn: ReadTxn, revision: int, obj: Zone) -> None:
        pass

    async def prune(self, txn: ReadTxn, objects: Iterator[Zone]) -> None:
        pass
