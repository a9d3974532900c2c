"""The one exception raised by the BPF map layer, carrying map name, operation and errno."""

from __future__ import annotations

import errno as _errno

from statedb.errors import StatewrightError

# Short explanations for the errnos map operations commonly return.
_ERRNO_HINTS: dict[int, str] = {
    _errno.E2BIG: "map full",
    _errno.ENOSPC: "map full",
    _errno.ENOENT: "no such entry",
    _errno.EEXIST: "entry exists",
    _errno.EINVAL: "invalid argument",
    _errno.ENOMEM: "out of memory",
    _errno.EBADF: "bad map file descriptor",
    _errno.EPERM: (
        "operation not permitted: run as root or grant CAP_BPF (and CAP_NET_ADMIN / "
        "CAP_SYS_ADMIN), and check that /sys/fs/bpf is a mounted bpffs"
    ),
    _errno.EACCES: "permission denied: check the pin path's permissions and CAP_BPF",
    _errno.EOPNOTSUPP: "operation not supported by this map type or kernel",
    524: "operation not supported by this map type or kernel",  # ENOTSUPP (kernel-internal)
}


def errno_name(err: int) -> str:
    """Symbolic name of an errno value ("E2BIG"), or "errno N" when unknown."""
    if err == 524:
        return "ENOTSUPP"
    return _errno.errorcode.get(err, f"errno {err}")


class MapError(StatewrightError, OSError):
    """A failed map operation: which map, which operation, which errno, and why.

    It subclasses OSError so callers can match on ``.errno``; ``str()`` reads like
    ``map lb4_services: update: E2BIG (map full)``.
    """

    def __init__(self, map_name: str, op: str, err: int, detail: str = "") -> None:
        hint = detail or _ERRNO_HINTS.get(err, "")
        message = f"map {map_name}: {op}: {errno_name(err)}"
        if hint:
            message += f" ({hint})"
        super().__init__(err, message)
        self.map_name = map_name
        self.op = op
        self.message = message

    def __str__(self) -> str:
        return self.message

    def __reduce__(self) -> tuple[type[MapError], tuple[str, str, int, str]]:
        return (MapError, (self.map_name, self.op, self.errno or 0, ""))


class BatchError(MapError):
    """A batch operation that stopped part-way: ``done`` elements were applied first."""

    def __init__(self, map_name: str, op: str, err: int, done: int) -> None:
        super().__init__(map_name, op, err)
        self.done = done
        self.message += f" after {done} elements"

    def __reduce__(self) -> tuple[type[BatchError], tuple[str, str, int, int]]:  # type: ignore[override]
        return (BatchError, (self.map_name, self.op, self.errno or 0, self.done))
