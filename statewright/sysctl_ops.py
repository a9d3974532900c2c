"""SysctlOps: the reconciler Operations writing the ``sysctls`` table (tables/sysctls.py)
into /proc/sys, and the record of the values it found there before.

* ``update`` reads the setting; for a row with ``restore`` it records the value found
  (and the value it is about to write) in `OriginalValues` *before* writing, persisted
  in the state directory, so neither a crash nor a restart loses the original; then it
  writes the wanted value when it differs and reads it back. A setting that cannot be
  read or written fails with `SysctlError`, naming the setting, the wanted value and the
  errno (a missing path, e.g. IPv6 disabled or an interface gone, is ENOENT): the
  reconciler retries it with backoff and the ``sysctl`` health names it.
* ``delete`` (no row wants the setting any more) and ``prune`` (every recorded setting
  no row wants) put the original back, but only where the setting still holds the value
  the agent wrote: a value someone else set since is theirs and is left alone. Either
  way the record goes. A setting that no longer exists is simply forgotten.
* `restore_recorded` does the same for every record: ``statewright agent --cleanup``.

The target is a `ProcSys`: `KernelProcSys` (the real /proc/sys of the agent's network
namespace, or of another one: the settings under ``net/`` are per network namespace,
and a thread that entered a namespace sees that namespace's) or, in tests,
`MemoryProcSys`. All kernel I/O happens in worker threads; nothing blocks the event loop.
"""

from __future__ import annotations

import ctypes
import errno as errno_mod
import json
import logging
import os
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Protocol, TypeVar

import anyio

from statedb import ReadTxn
from statedb.errors import StatewrightError
from tables.sysctls import Sysctl

log = logging.getLogger(__name__)

T = TypeVar("T")

#: The record of original values, in the agent's state directory.
ORIGINALS_FILE = "sysctl-originals.json"
CLONE_NEWNET = 0x40000000


class SysctlError(StatewrightError):
    """A setting that could not be read, set or restored: the setting, the wanted value
    and the errno name are in the message (and in ``path``, ``value``, ``errno``)."""

    def __init__(self, path: str, value: str, err: OSError | str, action: str = "set") -> None:
        self.path = path
        self.value = value
        if isinstance(err, OSError):
            self.errno: int | None = err.errno
            code = errno_mod.errorcode.get(err.errno or 0, "error")
            why = f"{code} ({err.strerror or err})"
            if err.errno == errno_mod.ENOENT:
                why += ": no such setting (IPv6 disabled, or the interface gone?)"
        else:
            self.errno = None
            why = err
        super().__init__(
            f"{path.replace('/', '.')} (/proc/sys/{path}): cannot {action} {value}: {why}")


class SysctlStateError(StatewrightError):
    """The record of original values cannot be read or written."""


def normalized(value: str) -> str:
    """A value as compared: /proc/sys ends values with a newline and separates the fields
    of a multi-value setting with tabs."""
    return " ".join(value.split())


# ----- targets ------------------------------------------------------------------------------
class ProcSys(Protocol):
    """Where settings are read and written; paths are relative to /proc/sys. Both raise
    OSError (FileNotFoundError for a setting that does not exist)."""

    def read(self, path: str) -> str: ...

    def write(self, path: str, value: str) -> None: ...

    def netns_id(self) -> str:
        """Which network namespace the settings are of (``net:[inode]``)."""
        ...


def _setns(fd: int) -> None:
    setns = getattr(os, "setns", None)  # Python 3.12+
    if setns is not None:
        setns(fd, CLONE_NEWNET)
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def run_in_netns(netns: str, func: Callable[[], T]) -> T:
    """``func()`` in a new thread that entered the network namespace at ``netns`` (a path,
    or a name under /var/run/netns) and then ends, so no thread ever returns to a pool in
    another namespace. Exceptions are raised here; SysctlStateError when the namespace
    cannot be entered."""
    path = netns if "/" in netns else f"/var/run/netns/{netns}"
    result: list[T] = []
    failure: list[BaseException] = []

    def body() -> None:
        try:
            try:
                fd = os.open(path, os.O_RDONLY)
                try:
                    _setns(fd)
                finally:
                    os.close(fd)
            except OSError as e:
                # not an OSError: a namespace not there is no setting gone (a record of
                # it must not be forgotten)
                raise SysctlStateError(f"network namespace {path}: cannot enter: {e}") from e
            result.append(func())
        except BaseException as e:  # handed to the caller
            failure.append(e)

    t = threading.Thread(target=body, name=f"netns-{os.path.basename(path)}")
    t.start()
    t.join()
    if failure:
        raise failure[0]
    return result[0]


class KernelProcSys:
    """/proc/sys of the agent's own network namespace, or with ``netns`` of that one (for
    the settings under ``net/``; the others are the machine's whatever the namespace)."""

    def __init__(self, netns: str = "", root: str = "/proc/sys") -> None:
        self.netns = netns
        self.root = root

    def _in_place(self, func: Callable[[], T]) -> T:
        return run_in_netns(self.netns, func) if self.netns else func()

    def read(self, path: str) -> str:
        def go() -> str:
            with open(os.path.join(self.root, path)) as f:
                return f.read()

        return self._in_place(go)

    def write(self, path: str, value: str) -> None:
        def go() -> None:
            with open(os.path.join(self.root, path), "w") as f:
                f.write(value)

        self._in_place(go)

    def netns_id(self) -> str:
        def go() -> str:
            return f"net:[{os.stat('/proc/thread-self/ns/net').st_ino}]"

        return self._in_place(go)

    def __repr__(self) -> str:
        return f"KernelProcSys(netns={self.netns!r})" if self.netns else "KernelProcSys()"


class MemoryProcSys:
    """An in-memory /proc/sys twin: a dict of settings; missing ones raise ENOENT, those
    listed in ``read_only`` EACCES on write, and ``accepts`` (path -> predicate) decides
    which values the kernel takes (EINVAL otherwise). Values read back end with a
    newline, as the kernel's do."""

    def __init__(self, settings: dict[str, str] | None = None) -> None:
        self.settings: dict[str, str] = dict(settings or {})
        self.read_only: set[str] = set()
        self.accepts: dict[str, Callable[[str], bool]] = {}
        self.writes = 0

    def read(self, path: str) -> str:
        if path not in self.settings:
            raise FileNotFoundError(errno_mod.ENOENT, "No such file or directory")
        return self.settings[path] + "\n"

    def write(self, path: str, value: str) -> None:
        if path not in self.settings:
            raise FileNotFoundError(errno_mod.ENOENT, "No such file or directory")
        if path in self.read_only:
            raise PermissionError(errno_mod.EACCES, "Permission denied")
        if not self.accepts.get(path, lambda v: True)(value):
            raise OSError(errno_mod.EINVAL, "Invalid argument")
        self.writes += 1
        self.settings[path] = normalized(value)

    def netns_id(self) -> str:
        return "memory"


# ----- the record of original values --------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Recorded:
    """A setting the agent changed: the value it found, and the value it wrote."""

    original: str
    ours: str


class OriginalValues:
    """Setting path -> `Recorded`, kept in ``file`` (JSON, replaced atomically on every
    change) when one is given. Thread-safe: the Ops write it from worker threads, the
    reconciler's status commit reads it."""

    def __init__(self, file: str | None = None, records: dict[str, Recorded] | None = None,
                 netns: str = "") -> None:
        self.file = file
        #: The network namespace the records are of (`ProcSys.netns_id`; "" while none).
        self.netns = netns
        self._records: dict[str, Recorded] = dict(records or {})
        self._lock = threading.Lock()

    @classmethod
    def load(cls, file: str) -> OriginalValues:
        """The record in ``file`` (empty when there is none); SysctlStateError naming the
        file when it cannot be read or is not a record (nothing is overwritten then)."""
        try:
            with open(file, encoding="utf-8") as f:
                doc = json.load(f)
        except FileNotFoundError:
            return cls(file)
        except (OSError, ValueError) as e:
            raise SysctlStateError(f"{file}: cannot read the recorded sysctl values: {e}") from e
        try:
            settings = doc["settings"]
            records = {str(p): Recorded(str(r["original"]), str(r["ours"]))
                       for p, r in settings.items()}
            netns = str(doc.get("netns", ""))
        except (KeyError, TypeError, AttributeError) as e:
            raise SysctlStateError(
                f"{file}: not a record of sysctl values (expected {{'netns', 'settings': "
                f"{{path: {{'original', 'ours'}}}}}}): {type(e).__name__}: {e}") from e
        return cls(file, records, netns)

    def check_netns(self, procfs: ProcSys) -> None:
        """SysctlStateError when the records are of another network namespace than
        ``procfs``'s (an agent run in a namespace, cleaned up from outside it): restoring
        them here would change settings the agent never touched."""
        if not self.netns or not self.paths():
            return
        here = procfs.netns_id()
        if here != self.netns:
            where = self.file or "the record"
            raise SysctlStateError(
                f"{where}: the recorded sysctl values are of network namespace {self.netns}, "
                f"not of {here}: run this inside that namespace (nsenter --net=...) or name "
                "it with --sysctl-netns")

    def get(self, path: str) -> Recorded | None:
        with self._lock:
            return self._records.get(path)

    def original_of(self, path: str) -> str | None:
        """The recorded original value of ``path``, or None."""
        rec = self.get(path)
        return rec.original if rec is not None else None

    def paths(self) -> list[str]:
        with self._lock:
            return sorted(self._records)

    def items(self) -> list[tuple[str, Recorded]]:
        with self._lock:
            return sorted(self._records.items())

    def record(self, path: str, rec: Recorded, netns: str) -> None:
        """Add or replace a record of a setting of namespace ``netns``, persisted before
        this returns."""
        with self._lock:
            if not self._records:
                self.netns = netns
            elif netns != self.netns:
                raise SysctlStateError(
                    f"{self.file or 'the record'}: {path.replace('/', '.')} is of network "
                    f"namespace {netns}, the recorded values of {self.netns}")
            self._records[path] = rec
            self._save()

    def forget(self, path: str) -> None:
        """Drop a record, persisted before this returns."""
        with self._lock:
            if self._records.pop(path, None) is not None:
                self._save()

    def _save(self) -> None:
        if self.file is None:
            return
        doc = {"netns": self.netns,
               "settings": {p: {"original": r.original, "ours": r.ours}
                            for p, r in sorted(self._records.items())}}
        tmp = f"{self.file}.tmp"
        try:
            os.makedirs(os.path.dirname(self.file) or ".", exist_ok=True)
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump(doc, f, indent=1)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.file)
        except OSError as e:
            raise SysctlStateError(f"{self.file}: cannot record sysctl values: {e}") from e


# ----- the Operations -----------------------------------------------------------------------
class SysctlOps:
    """Operations of the ``sysctls`` reconciler (see the module doc). The synchronous
    `apply`, `release` and `release_unwanted` do the work; the reconciler's async
    methods run them in a worker thread."""

    def __init__(self, procfs: ProcSys, originals: OriginalValues) -> None:
        self.procfs = procfs
        self.originals = originals
        #: The target's namespace (`ProcSys.netns_id`), what records are made for.
        self.netns_id = procfs.netns_id()
        #: Settings written, and left alone at a restore because someone changed them.
        self.writes = 0
        self.left_alone: list[str] = []

    # ----- work -------------------------------------------------------------------------------
    def apply(self, row: Sysctl) -> None:
        """Make the setting hold ``row.value``, recording the original first."""
        try:
            current = self.procfs.read(row.path)
        except OSError as e:
            raise SysctlError(row.path, row.value, e) from None
        rec = self.originals.get(row.path)
        if row.restore and (rec is None or rec.ours != row.value):
            original = rec.original if rec is not None else normalized(current)
            self.originals.record(row.path, Recorded(original, row.value), self.netns_id)
        if normalized(current) == normalized(row.value):
            return
        try:
            self.procfs.write(row.path, row.value)
            after = self.procfs.read(row.path)
        except OSError as e:
            raise SysctlError(row.path, row.value, e) from None
        self.writes += 1
        if normalized(after) != normalized(row.value):
            raise SysctlError(row.path, row.value, f"the kernel kept {normalized(after)!r}")

    def release(self, path: str) -> None:
        """Put the original of ``path`` back where the setting still holds the agent's
        value, and forget the record; SysctlError (record kept) when that fails."""
        rec = self.originals.get(path)
        if rec is None:
            return
        try:
            current = normalized(self.procfs.read(path))
        except FileNotFoundError:
            self.originals.forget(path)
            return
        except OSError as e:
            raise SysctlError(path, rec.original, e, "restore") from None
        if current == normalized(rec.ours) and current != normalized(rec.original):
            try:
                self.procfs.write(path, rec.original)
            except OSError as e:
                raise SysctlError(path, rec.original, e, "restore") from None
            self.writes += 1
        elif current != normalized(rec.original):
            log.warning("sysctl: %s is %s, neither the original %s nor the agent's %s: "
                        "left alone", path.replace("/", "."), current, rec.original, rec.ours)
            self.left_alone.append(path)
        self.originals.forget(path)

    def release_unwanted(self, wanted: Iterable[str]) -> None:
        """`release` every recorded setting not in ``wanted``; the first failure is raised
        after all were tried."""
        keep = set(wanted)
        errors: list[SysctlError] = []
        for path in self.originals.paths():
            if path not in keep:
                try:
                    self.release(path)
                except SysctlError as e:
                    errors.append(e)
        if errors:
            raise errors[0]

    # ----- the reconciler's calls -------------------------------------------------------------
    async def update(self, txn: ReadTxn, revision: int, obj: Sysctl) -> None:
        """`apply` in a worker thread."""
        await anyio.to_thread.run_sync(self.apply, obj)

    async def delete(self, txn: ReadTxn, revision: int, obj: Sysctl) -> None:
        """`release` in a worker thread."""
        await anyio.to_thread.run_sync(self.release, obj.path)

    async def prune(self, txn: ReadTxn, objects: Iterator[Sysctl]) -> None:
        """`release_unwanted` of the wanted rows' paths, in a worker thread."""
        wanted = [o.path for o in objects]
        await anyio.to_thread.run_sync(self.release_unwanted, wanted)


def restore_recorded(procfs: ProcSys, originals: OriginalValues) -> tuple[list[str], list[str]]:
    """Put back every recorded original (``agent --cleanup``); (what was restored or
    forgotten, one line each; errors). SysctlStateError when the records are of another
    network namespace than ``procfs``'s (nothing is changed then)."""
    originals.check_netns(procfs)
    ops = SysctlOps(procfs, originals)
    done: list[str] = []
    errors: list[str] = []
    for path, rec in originals.items():
        try:
            ops.release(path)
        except SysctlError as e:
            errors.append(str(e))
            continue
        name = path.replace("/", ".")
        if path in ops.left_alone:
            done.append(f"sysctl {name} left alone (changed since the agent set {rec.ours})")
        elif normalized(rec.original) == normalized(rec.ours):
            done.append(f"sysctl {name} = {rec.original} (as found: the agent changed nothing)")
        else:
            done.append(f"sysctl {name} = {rec.original} (restored)")
    return done, errors
