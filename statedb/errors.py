"""The project's exception root and statedb's own errors.

`StatewrightError` is the root of every exception Statewright raises, so a caller
can tell "the agent refused or failed" from a bug (a TypeError, an AttributeError,
...). `InputError` is the part of it that means "bad input": a manifest, a
Kubernetes object, a flag, a config key. Sources catch `InputError` and report
it; anything else propagates. statedb is the lowest layer every package imports,
so both live here.

statedb's own errors (`StateDBError` and its subclasses) each name the table (and
key or index) they concern.
"""

from __future__ import annotations

from typing import Any


class StatewrightError(Exception):
    """The root of every error the project raises (statedb is the lowest layer, so it
    lives here): ``except StatewrightError`` catches the project's errors and nothing else."""


class InputError(StatewrightError, ValueError):
    """Bad input: ``message`` says what is wrong with ``field`` of ``obj``.

    ``obj`` names the object (``Service default/echo``, a file path, ``flag
    --foo``), ``field`` the field path inside it (``spec.ports[1].port``; may be
    empty). ``str()`` joins the non-empty parts: ``Service default/echo:
    spec.ports[1].port: port 0 is not allowed``. It subclasses ValueError, so
    callers that catch ValueError for bad values keep working.
    """

    def __init__(self, message: str, *, obj: str = "", field: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.obj = obj
        self.field = field

    def __str__(self) -> str:
        return ": ".join(part for part in (self.obj, self.field, self.message) if part)

    def __reduce__(self) -> tuple[Any, ...]:
        # Subclasses have their own __init__ signatures: rebuild through InputError's.
        return (_rebuild_input_error, (type(self), self.message, self.obj, self.field),
                self.__dict__)


def _rebuild_input_error(cls: type[InputError], message: str, obj: str, field: str) -> InputError:
    err = cls.__new__(cls)
    InputError.__init__(err, message, obj=obj, field=field)
    return err


class StateDBError(StatewrightError):
    """Base class of every statedb error."""


class TableNotLockedError(StateDBError):
    """A write went to a table the write transaction did not lock."""

    def __init__(self, table: str, locked: list[str]) -> None:
        super().__init__(
            f"table {table!r} is not locked by this write transaction "
            f"(locked: {', '.join(locked) or 'none'}); pass it to db.write_txn()"
        )
        self.table = table


class TableNotRegisteredError(StateDBError, ValueError):
    """A table was used with a DB it was not registered with (also a ValueError)."""

    def __init__(self, table: str) -> None:
        super().__init__(f"table {table!r} is not registered with this DB")
        self.table = table


class TableRegisteredElsewhereError(StateDBError, ValueError):
    """A table was registered with a second DB: a table belongs to exactly one DB (its
    lock, revisions, watches and snapshots are that DB's). Create a new Table object for
    the other DB."""

    def __init__(self, table: str) -> None:
        super().__init__(
            f"table {table!r} is already registered with another DB; a table belongs to "
            "one DB: create a new Table for this one"
        )
        self.table = table


class DuplicateTableError(StateDBError):
    """Two tables with the same name were registered."""

    def __init__(self, table: str) -> None:
        super().__init__(f"a table named {table!r} is already registered")
        self.table = table


class TransactionClosedError(StateDBError):
    """A write transaction was used after commit() or abort()."""

    def __init__(self, state: str) -> None:
        super().__init__(f"write transaction already {state}; start a new one")


class ObjectReusedError(StateDBError):
    """The very object already stored was inserted again (rows must be new, immutable objects)."""

    def __init__(self, table: str, key: bytes) -> None:
        super().__init__(
            f"table {table!r}: the object stored under key {key!r} was inserted again; "
            "rows are immutable, insert a new object (e.g. dataclasses.replace)"
        )
        self.table = table
        self.key = key


class ObjectNotFoundError(StateDBError):
    """A compare-and-swap or compare-and-delete found no object under the key."""

    def __init__(self, table: str, key: bytes) -> None:
        super().__init__(f"table {table!r}: no object with key {key!r}")
        self.table = table
        self.key = key


class RevisionMismatchError(StateDBError):
    """A compare-and-swap or compare-and-delete found a different revision than expected."""

    def __init__(self, table: str, key: bytes, expected: int, actual: int) -> None:
        super().__init__(
            f"table {table!r}: key {key!r} is at revision {actual}, expected {expected}"
        )
        self.table = table
        self.key = key
        self.expected = expected
        self.actual = actual


class UniqueIndexConflictError(StateDBError):
    """A unique secondary index key is already used by another object."""

    def __init__(self, table: str, index: str, key: bytes) -> None:
        super().__init__(
            f"table {table!r}: unique index {index!r} already has key {key!r} "
            "for a different object"
        )
        self.table = table
        self.index = index
        self.key = key


class UnknownIndexError(StateDBError):
    """A query named an index the table does not have."""

    def __init__(self, table: str, index: str, known: list[str]) -> None:
        super().__init__(
            f"table {table!r} has no index {index!r} (indexes: {', '.join(known)})"
        )
        self.table = table
        self.index = index


class NestedWriteTxnError(StateDBError):
    """A thread asked for a write transaction while its own write transaction of the same
    DB is still open. Refused whatever the tables: a thread holding table B that waits for
    table A deadlocks against a thread holding A that waits for B, and one write
    transaction over every table it needs is never at risk. Lock all the tables up front
    (``db.write_txn(a, b)``), or commit the open transaction first."""

    def __init__(self, held: list[str], requested: list[str]) -> None:
        super().__init__(
            f"write transaction on {_names(requested)} refused: this thread's write "
            f"transaction on {_names(held)} is still open, and nested write transactions "
            "can deadlock against other threads; lock every table in one "
            "db.write_txn(...) or commit the open one first"
        )
        self.held = held
        self.requested = requested


def _names(tables: list[str]) -> str:
    return ", ".join(repr(t) for t in tables) or "no table"
