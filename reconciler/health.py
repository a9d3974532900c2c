"""Health of a reconciler: OK with the number of objects, or Degraded with the number of errors
and the first few messages (what the agent's health report shows)."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

from reconciler.waiting import Resource, resource_name


class Level(enum.Enum):
    """Health level."""

    OK = "OK"
    DEGRADED = "Degraded"
    STOPPED = "Stopped"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True, slots=True)
class Health:
    """A health report of one reconciler."""

    name: str
    level: Level
    message: str
    error_count: int = 0
    errors: tuple[str, ...] = ()  # the first few error messages
    #: Objects parked until a resource they need has a unit free (not in error_count).
    waiting_count: int = 0
    #: Per exhausted resource: how many wait for it and a few of them (`waiting_text`).
    waiting: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        """True when the level is OK."""
        return self.level is Level.OK

    def __str__(self) -> str:
        return f"reconciler-{self.name} level={self.level} message={self.message}"


def health_ok(name: str, objects: int) -> Health:
    """OK, with the number of rows in the table."""
    return Health(name, Level.OK, f"OK, {objects} object(s)")


def health_degraded(
    name: str,
    count: int,
    first: Sequence[str],
    waiting: Sequence[str] = (),
    waiting_count: int = 0,
) -> Health:
    """Degraded, with the number of errors and the first few messages (``first``), and
    per exhausted resource what waits for it (``waiting``, `waiting_text`)."""
    parts = list(waiting)
    if count:
        more = count - len(first)
        text = "; ".join(first) + (f"; and {more} more" if more > 0 else "")
        parts.append(f"{count} error(s): {text}")
    return Health(
        name,
        Level.DEGRADED,
        "; ".join(parts),
        count,
        tuple(first),
        waiting_count,
        tuple(waiting),
    )


def waiting_text(resource: Resource, count: int, examples: Sequence[str]) -> str:
    """"<count> object(s) wait for a free <unit> (none left): <examples>, ..."."""
    more = count - len(examples)
    shown = ", ".join(examples) + (f" and {more} more" if more > 0 else "")
    return f"{count} object(s) wait for a free {resource_name(resource)} (none left): {shown}"


def health_stopped(name: str) -> Health:
    """The reconciler is not running."""
    return Health(name, Level.STOPPED, "stopped")
