"""Objects that wait for a resource: failures the target cannot resolve by retrying on a
timer, only once something is freed.

A target that runs out of a bounded resource (ids, slots in a fixed table) raises a
`ResourceExhaustedError` naming the `Resource`; the reconciler then *parks* the object
in its retry queue instead of scheduling a retry with backoff. Parked objects cost
nothing per round: after each round the reconciler asks every exhausted resource how
many units are `available` and wakes that many parked objects (first parked, first
woken). Resources of this kind are freed by the target's own operations (a delete, a
prune), which run in the reconciler's rounds, so checking after each round sees every
release. A parked object is still an error of its row (its status says why) and counts
in health and metrics apart from the other failures (`Waiting`).
"""

from __future__ import annotations

from typing import Protocol

from statedb.errors import StatewrightError


class Resource(Protocol):
    """Something of which a target has a bounded number of units."""

    @property
    def unit(self) -> str:
        """What one unit is, for health ("service id")."""
        ...

    def available(self) -> int:
        """How many units are free now (an attempt needs at least one)."""
        ...


class ResourceExhaustedError(StatewrightError):
    """An operation failed because ``resource`` has no free unit left."""

    def __init__(self, message: str, resource: Resource) -> None:
        super().__init__(message)
        self.resource = resource


def exhausted_resource(exc: BaseException) -> Resource | None:
    """The resource ``exc`` says ran out: its own, or that of an exception it was raised
    from (a target wraps errors with context), else None."""
    seen = 0
    cur: BaseException | None = exc
    while cur is not None and seen < 16:
        if isinstance(cur, ResourceExhaustedError):
            return cur.resource
        cur = cur.__cause__ or cur.__context__
        seen += 1
    return None


def resource_name(resource: Resource) -> str:
    """What a unit of the resource is, for messages, robust to a broken ``unit``."""
    try:
        return str(resource.unit)
    except Exception:  # a broken property must not hide the report
        return type(resource).__name__
