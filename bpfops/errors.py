"""The errors of the Ops (all under statedb.errors.StatewrightError).

``LBOpsError``: a frontend could not be written into the LB maps; the message names the
frontend and the step, the cause is the map or id error underneath.
"""

from __future__ import annotations

from bpfops.model import FrontendSpec
from statedb.errors import StatewrightError


class LBOpsError(StatewrightError, RuntimeError):
    """A frontend could not be written; the message names the frontend and the step."""


def frontend_error(fe: FrontendSpec, exc: BaseException) -> LBOpsError:
    """The LBOpsError of a frontend whose write failed with ``exc`` (its cause)."""
    if isinstance(exc, LBOpsError):
        return exc
    err = LBOpsError(f"frontend {fe.addr} ({fe.service.name}): {exc}")
    err.__cause__ = exc
    return err
