"""The reconciler of a table whose rows carry one ``status`` field, written into a map.

The endpoint-map, ipcache, policy-entries and policy-netns reconcilers are all of this
shape: a table of dataclass rows with ``status: Status``, an Operations object writing
them into one BPF map (or map set), named after the table, pruned every
``prune_interval`` seconds (None: only when the table is initialized and on request).
"""

from __future__ import annotations

from typing import TypeVar

from reconciler import Config, Operations, Reconciler, status_field_accessors
from statedb import DB, Table

R = TypeVar("R")

_GET_STATUS, _SET_STATUS = status_field_accessors()


def status_field_config(
    table: Table[R], ops: Operations[R], prune_interval: float | None
) -> Config[R]:
    """The reconciler configuration of ``table`` through ``ops`` (see the module doc)."""
    return Config(
        table=table,
        operations=ops,
        get_object_status=_GET_STATUS,
        set_object_status=_SET_STATUS,
        name=table.name,
        prune_interval=prune_interval,
    )


def map_reconciler(
    db: DB, table: Table[R], ops: Operations[R], prune_interval: float | None
) -> Reconciler[R]:
    """A reconciler of ``table`` through ``ops`` (see the module doc), not yet started."""
    return Reconciler(db, status_field_config(table, ops, prune_interval))
