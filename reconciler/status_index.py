"""A status index: a table's rows by the kind of their reconciliation status.

A non-unique secondary index whose key is the `StatusKind` of a row's status (what
cilium/statedb's ``reconciler.NewStatusIndex`` gives a Go table). With it a controller
queries the rows still Pending or in Error, and watches that set, without scanning the
table::

    by_status = status_index(get_status)            # Index[Record, StatusKind]
    records = Table("records", by_name, by_status)
    failing, watch = records.list_watch(db.read_txn(), by_status.query(StatusKind.ERROR))

`wait_for_status` waits until no row has one of some kinds, from the table alone (no
`Reconciler` object needed, e.g. in another component). The index costs what any
non-unique index costs per write: each status the reconciler writes back moves the row
from one key to another.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from reconciler.status import Status, StatusKind
from statedb import DB, Index, InputError, Table, WatchSet
from statedb.keys import KeyTypeError

O = TypeVar("O")

#: The kinds a row waits in before it is reconciled: what `wait_for_status` waits out.
NOT_DONE: tuple[StatusKind, ...] = (StatusKind.PENDING, StatusKind.REFRESHING, StatusKind.ERROR)

_KIND_KEYS: dict[StatusKind, bytes] = {kind: kind.value.encode() for kind in StatusKind}
_KINDS_BY_TEXT: dict[str, StatusKind] = {
    text: kind
    for kind in StatusKind
    for text in (kind.value.lower(), kind.name.lower())
}


class UnknownStatusKindError(InputError):
    """A status kind given as text (a command line's query) names no `StatusKind`."""

    def __init__(self, text: str) -> None:
        kinds = ", ".join(kind.value for kind in StatusKind)
        super().__init__(f"unknown status kind {text!r}; use one of: {kinds}", obj="status")
        self.text = text


def encode_status_kind(kind: StatusKind) -> bytes:
    """Encode a status kind as its name's bytes (``b"Pending"``); other values raise
    `statedb.keys.KeyTypeError`."""
    try:
        return _KIND_KEYS[kind]
    except (KeyError, TypeError):
        raise KeyTypeError("status_kind", "StatusKind", kind) from None


def parse_status_kind(text: str) -> StatusKind:
    """The status kind named by ``text``, in any case (``error``, ``Error``, ``ERROR``);
    raises `UnknownStatusKindError` for anything else."""
    kind = _KINDS_BY_TEXT.get(text.strip().lower())
    if kind is None:
        raise UnknownStatusKindError(text)
    return kind


def status_index(
    get_object_status: Callable[[O], Status], name: str = "status"
) -> Index[O, StatusKind]:
    """A non-unique index of rows by the kind of the status ``get_object_status`` reads.

    Give it the reconciler's own accessor (`Config.get_object_status`). A table with
    several reconcilers (statuses in a `StatusSet`) takes one such index per reconciler,
    each with its own ``name``: ``status_index(get_a, name="status-a")``. Query it with
    ``index.query(StatusKind.ERROR)``; on the command line (``db show``) the kind is
    parsed from text (``error``).
    """

    def kind_of(obj: O) -> StatusKind:
        return get_object_status(obj).kind

    return Index(
        name,
        key=kind_of,
        encode=encode_status_kind,
        unique=False,
        parse=parse_status_kind,
    )


def rows_with_status(
    db: DB, table: Table[O, Any], index: Index[O, StatusKind], kinds: Iterable[StatusKind]
) -> tuple[list[O], WatchSet]:
    """The rows whose status is one of ``kinds`` in a fresh snapshot, in kind order then
    primary key order, and a watch set that fires once that set of rows may have changed."""
    txn = db.read_txn()
    rows: list[O] = []
    watches = WatchSet()
    for kind in kinds:
        found, watch = table.list_watch(txn, index.query(kind))
        rows.extend(found)
        watches.add(watch)
    return rows, watches


async def wait_for_status(
    db: DB,
    table: Table[O, Any],
    index: Index[O, StatusKind],
    kinds: Iterable[StatusKind] = NOT_DONE,
    timeout: float | None = None,
) -> None:
    """Wait in an anyio task until no row of ``table`` has a status of one of ``kinds``
    (by default: until every row is Done). Woken by the index's watches, never by polling.
    Raises TimeoutError, naming how many rows are left, after ``timeout`` seconds.

    Rows only: a delete that failed and waits for a retry has no row; for that, and for
    health, use `Reconciler.wait_until_done`.
    """
    import anyio

    wanted = tuple(kinds)
    left: list[O] = []
    try:
        with anyio.fail_after(timeout) if timeout is not None else contextlib.nullcontext():
            while True:
                left, watches = rows_with_status(db, table, index, wanted)
                if not left:
                    return
                await watches.wait_async()
    except TimeoutError:
        names = ", ".join(str(k) for k in wanted)
        raise TimeoutError(
            f"table {table.name!r}: {len(left)} row(s) still {names} after {timeout} s"
        ) from None
