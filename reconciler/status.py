"""Reconciliation status stored in each row: Pending, Refreshing, Done or Error, with the time set.

Writers mark a row Pending when they change it; the reconciler writes Done or
Error back. Every Pending status carries a fresh ``id`` so the reconciler can
tell "the row changed only because another reconciler wrote its own status"
from "the row was rewritten by a writer".
"""

from __future__ import annotations

import dataclasses
import enum
import itertools
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TypeVar

from statedb.rows import slot_constructor

O = TypeVar("O")

_pending_ids = itertools.count(1)


class StatusKind(enum.Enum):
    """Where a row is in its reconciliation."""

    PENDING = "Pending"
    REFRESHING = "Refreshing"
    DONE = "Done"
    ERROR = "Error"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True, slots=True)
class Status:
    """One reconciler's verdict on one row; ``updated_at`` is wall-clock seconds (epoch)."""

    kind: StatusKind
    updated_at: float = 0.0
    error: str = ""
    id: int = 0

    @property
    def needs_work(self) -> bool:
        """True for Pending and Refreshing: the reconciler must (re)apply the row."""
        return self.kind is StatusKind.PENDING or self.kind is StatusKind.REFRESHING

    def __str__(self) -> str:
        if self.kind is StatusKind.ERROR:
            return f"Error: {self.error}"
        text: str = self.kind.value
        return text


#: ``Status(kind, updated_at, error, id)`` through its slots (no keyword handling and no
#: ``object.__setattr__`` per field): every row write of a writer makes a Pending status.
_new_status = slot_constructor(Status, "new_status")
_PENDING = StatusKind.PENDING
_time = time.time


def status_pending(now: float | None = None) -> Status:
    """Return a new Pending status with a fresh id; writers set it whenever they change a row."""
    return _new_status(_PENDING, _time() if now is None else now, "", next(_pending_ids))


def status_refreshing(now: float | None = None) -> Status:
    """Return a new Refreshing status (a Done row to be re-applied to repair drift)."""
    at = time.time() if now is None else now
    return Status(StatusKind.REFRESHING, at, "", next(_pending_ids))


def status_done(now: float | None = None) -> Status:
    """Return a Done status: the row is applied to the target."""
    return Status(StatusKind.DONE, time.time() if now is None else now)


def status_error(message: str, now: float | None = None) -> Status:
    """Return an Error status carrying the failure message; the reconciler retries the row."""
    return Status(StatusKind.ERROR, time.time() if now is None else now, message)


@dataclass(frozen=True, slots=True)
class StatusSet:
    """Independent statuses of several reconcilers on one row, keyed by reconciler name.

    A reconciler that has no entry yet sees a Pending status carrying the set's
    ``pending_id``, so a new row is pending for every reconciler without naming them.
    """

    statuses: tuple[tuple[str, Status], ...] = ()
    pending_id: int = 0
    updated_at: float = 0.0

    @classmethod
    def new(cls, now: float | None = None) -> StatusSet:
        """Return an empty set: every reconciler sees Pending."""
        return cls((), next(_pending_ids), time.time() if now is None else now)

    def get(self, name: str) -> Status:
        """Return the status of reconciler ``name`` (Pending when it has none yet)."""
        for n, s in self.statuses:
            if n == name:
                return s
        return Status(StatusKind.PENDING, self.updated_at, "", self.pending_id)

    def set(self, name: str, status: Status) -> StatusSet:
        """Return a copy with reconciler ``name``'s status replaced."""
        rest = tuple((n, s) for n, s in self.statuses if n != name)
        return StatusSet((*rest, (name, status)), self.pending_id, self.updated_at)

    def pending(self, now: float | None = None) -> StatusSet:
        """Return a set with every status Pending again (what writers store on a change)."""
        return StatusSet.new(now)

    def as_dict(self) -> Mapping[str, Status]:
        """Return the explicit statuses by reconciler name."""
        return dict(self.statuses)

    def __iter__(self) -> Iterator[tuple[str, Status]]:
        return iter(self.statuses)

    def __str__(self) -> str:
        return ", ".join(f"{n}: {s}" for n, s in self.statuses) or "Pending"


def status_field_accessors(
    field: str = "status",
) -> tuple[Callable[[O], Status], Callable[[O, Status], O]]:
    """Return (get_object_status, set_object_status) for a dataclass row whose ``field``
    is its one reconciler's `Status` (the usual shape: ``status: Status``).

    The accessors are generic in the row type: given to a `Config`, they take the row type
    of its table, so Operations for other rows are still a type error."""

    def get_status(obj: O) -> Status:
        status: Status = getattr(obj, field)
        return status

    def set_status(obj: O, status: Status) -> O:
        new: O = dataclasses.replace(obj, **{field: status})  # type: ignore[type-var]
        return new

    return get_status, set_status


def status_set_accessors(
    name: str, field: str = "statuses"
) -> tuple[Callable[[O], Status], Callable[[O, Status], O]]:
    """Return (get_object_status, set_object_status) for a dataclass row whose ``field`` is a
    `StatusSet`, so reconciler ``name`` owns its own entry on the row (generic in the row
    type, as `status_field_accessors`)."""

    def get_status(obj: O) -> Status:
        status: Status = getattr(obj, field).get(name)
        return status

    def set_status(obj: O, status: Status) -> O:
        statuses = getattr(obj, field).set(name, status)
        new: O = dataclasses.replace(obj, **{field: statuses})  # type: ignore[type-var]
        return new

    return get_status, set_status
