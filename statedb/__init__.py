"""statedb: a transactional in-memory database with snapshots, indexes, watch channels and
change tracking.

Quick tour::

    from dataclasses import dataclass
    from statedb import DB, Index, Table, keys

    @dataclass(frozen=True, slots=True)
    class Host:
        name: str
        zone: str

    by_name: Index[Host, str] = Index("name", key=lambda h: h.name)
    by_zone: Index[Host, str] = Index("zone", key=lambda h: h.zone, unique=False)
    hosts = Table("hosts", by_name, by_zone)    # Table[Host, str] for type checkers
    db = DB(hosts)

    with db.write_txn(hosts) as txn:
        hosts.insert(txn, Host("a", "eu"))
    rtxn = db.read_txn()
    hosts.get(rtxn, "a")                      # primary key lookup
    list(hosts.list(rtxn, by_zone.query("eu")))

The API is typed (``Index[O, K]``, ``Query[O]``, ``Table[O, PK]``): mypy rejects a key of
the wrong type or a query built by another table's index; see docs/statedb.md, "Types".
"""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from statedb import keys
    from statedb.changes import ChangeIterator
    from statedb.db import DB
    from statedb.errors import (
        DuplicateTableError,
        InputError,
        NestedWriteTxnError,
        ObjectNotFoundError,
        ObjectReusedError,
        RevisionMismatchError,
        StateDBError,
        StatewrightError,
        TableNotLockedError,
        TableNotRegisteredError,
        TableRegisteredElsewhereError,
        TransactionClosedError,
        UniqueIndexConflictError,
        UnknownIndexError,
    )
    from statedb.index import Index, Query
    from statedb.table import Table
    from statedb.table_state import Change
    from statedb.txn import ReadTxn, WriteTxn
    from statedb.watch import Watch, WatchSet, closed_watch

#: Where each public name lives; the submodule is imported on first use (PEP 562), so
#: importing one small module of the package (``statedb.errors`` in the CNI plugin, which
#: runs once per container start) does not load the whole database.
_LAZY = {
    "keys": "statedb.keys",
    "ChangeIterator": "statedb.changes",
    "DB": "statedb.db",
    "DuplicateTableError": "statedb.errors",
    "InputError": "statedb.errors",
    "NestedWriteTxnError": "statedb.errors",
    "ObjectNotFoundError": "statedb.errors",
    "ObjectReusedError": "statedb.errors",
    "RevisionMismatchError": "statedb.errors",
    "StateDBError": "statedb.errors",
    "StatewrightError": "statedb.errors",
    "TableNotLockedError": "statedb.errors",
    "TableNotRegisteredError": "statedb.errors",
    "TableRegisteredElsewhereError": "statedb.errors",
    "TransactionClosedError": "statedb.errors",
    "UniqueIndexConflictError": "statedb.errors",
    "UnknownIndexError": "statedb.errors",
    "Index": "statedb.index",
    "Query": "statedb.index",
    "Table": "statedb.table",
    "Change": "statedb.table_state",
    "ReadTxn": "statedb.txn",
    "WriteTxn": "statedb.txn",
    "Watch": "statedb.watch",
    "WatchSet": "statedb.watch",
    "closed_watch": "statedb.watch",
}

__all__ = [
    "DB",
    "Change",
    "ChangeIterator",
    "DuplicateTableError",
    "Index",
    "InputError",
    "NestedWriteTxnError",
    "ObjectNotFoundError",
    "ObjectReusedError",
    "Query",
    "ReadTxn",
    "RevisionMismatchError",
    "StateDBError",
    "StatewrightError",
    "Table",
    "TableNotLockedError",
    "TableNotRegisteredError",
    "TableRegisteredElsewhereError",
    "TransactionClosedError",
    "UniqueIndexConflictError",
    "UnknownIndexError",
    "Watch",
    "WatchSet",
    "WriteTxn",
    "closed_watch",
    "keys",
]


def __getattr__(name: str) -> Any:
    """Import the submodule that defines ``name`` on first use and keep the name."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'statedb' has no attribute {name!r}")
    import importlib

    imported = importlib.import_module(module)
    value = imported if name == "keys" else getattr(imported, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
