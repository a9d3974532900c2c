"""Shared fixtures of the statedb tests: the object type and tables of the db.txtar port.

`Obj` mirrors the test object of cilium/statedb's script test: a uint64 id (the
primary key), a set of tags (a multi-key, non-unique index) and an IP network (a
non-unique index queried by network prefix).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from typing import Any

from statedb import DB, Index, Table, keys

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True, slots=True)
class Obj:
    """A row with an id, an optional network and tags."""

    id: int
    prefix: IPNetwork | None = None
    tags: frozenset[str] = field(default_factory=frozenset)

    @staticmethod
    def table_header() -> list[str]:
        """Columns of the text table (the Key column is always empty, as in db.txtar)."""
        return ["ID", "Key", "Prefix", "Tags"]

    def table_row(self) -> list[str]:
        """Cells of the text table."""
        prefix = str(self.prefix) if self.prefix is not None else ""
        return [str(self.id), "", prefix, ", ".join(sorted(self.tags))]

    def to_json(self) -> dict[str, Any]:
        """The JSON form: only ID and Tags, like the Go object's MarshalJSON."""
        return {"ID": self.id, "Tags": sorted(self.tags)}


def obj(id: int, prefix: str | None = None, *tags: str) -> Obj:
    """Build an Obj from text (prefix as a network string)."""
    net = ipaddress.ip_network(prefix) if prefix is not None else None
    return Obj(id, net, frozenset(tags))


ID_INDEX: Index[Obj, int] = Index("id", key=lambda o: o.id, encode=keys.uint64, parse=int)
TAGS_INDEX: Index[Obj, str] = Index("tags", keys=lambda o: o.tags, unique=False)
PREFIX_INDEX: Index[Obj, IPNetwork] = Index(
    "prefix",
    keys=lambda o: [o.prefix] if o.prefix is not None else [],
    encode=keys.ip_network,
    unique=False,
    parse=ipaddress.ip_network,
)


def new_table(name: str) -> Table[Obj]:
    """A fresh table of Obj rows with the id, tags and prefix indexes."""
    return Table[Obj](name, ID_INDEX, TAGS_INDEX, PREFIX_INDEX)


def new_db(*names: str) -> tuple[DB, list[Table[Obj]]]:
    """A DB with one fresh Obj table per name."""
    tables = [new_table(n) for n in names]
    return DB(*tables), tables


OBJ1 = obj(1, "10.0.0.0/8", "bar", "foo")
OBJ2 = obj(2, "10.1.2.3/32", "baz", "foo")
