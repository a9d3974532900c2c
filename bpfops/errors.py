"""The errors of the Ops (all under statedb.errors.StatewrightError).

``LBOpsError``: a frontend could not be written into the LB maps; the message names the
frontend and the step, the cause is the map or id error underneath.

``KeyedMapError``: a map with one entry per row (``bpfops.keyed_map_ops``: the endpoints
map, the ipcache) refused an update, a delete or a prune; it carries the map, the
operation, the row, the key and the errno, the cause is the ``bpf.errors.MapError``.
"""

from __future__ import annotations

from typing import Any

from bpf.errors import MapError
from bpfops.model import FrontendSpec
from statedb.errors import StatewrightError


class LBOpsError(StatewrightError, RuntimeError):
    """A frontend could not be written; the message names the frontend and the step."""


class KeyedMapError(StatewrightError):
    """A failed write, delete or prune of a map with one entry per row.

    ``str()`` reads like ``map endpoints: update 10.0.0.1 (endpoint:1): map endpoints:
    update: EPERM``; ``map_name``, ``op``, ``obj`` (the row as its Ops name it, "" when
    there is none), ``key`` (the map key, None when the failure concerns no single key)
    and ``errno`` (the map error's) say the same as data.
    """

    def __init__(self, map_name: str, op: str, obj: str, key: Any, err: MapError) -> None:
        what = f"{op} {obj}" if obj else op
        super().__init__(f"map {map_name}: {what}: {err}")
        self.map_name = map_name
        self.op = op
        self.obj = obj
        self.key = key
        self.errno = err.errno


def frontend_error(fe: FrontendSpec, exc: BaseException) -> LBOpsError:
    """The LBOpsError of a frontend whose write failed with ``exc`` (its cause)."""
    if isinstance(exc, LBOpsError):
        return exc
    err = LBOpsError(f"frontend {fe.addr} ({fe.service.name}): {exc}")
    err.__cause__ = exc
    return err
