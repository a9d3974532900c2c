"""Open-or-create of pinned maps, with detection of layout changes against the pinned map."""

from __future__ import annotations

import errno
import fcntl
import logging
import os
from typing import Any, Protocol

from bpf.backend import MapBackend
from bpf.errors import MapError
from bpf.spec import MAP_OF_MAPS, MapSpec
from statedb.errors import StatewrightError

log = logging.getLogger("statewright.bpf")


class MapOpener(Protocol):
    """What pinning needs from a backend class (KernelMap, MemoryMap)."""

    def create(self, spec: MapSpec[Any, Any]) -> MapBackend: ...

    def open_pinned(self, path: str, spec: MapSpec[Any, Any]) -> MapBackend: ...

    def is_pinned(self, path: str) -> bool: ...

    def remove_pin(self, path: str) -> None: ...


def pin_path(pin_dir: str, name: str) -> str:
    """Where map ``name`` is pinned under ``pin_dir``."""
    return os.path.join(pin_dir, name)


def _inner_mismatch(m: MapBackend, spec: MapSpec[Any, Any]) -> str | None:
    """For map-of-maps, compare one existing inner map with the inner spec."""
    if spec.type not in MAP_OF_MAPS or spec.inner is None:
        return None
    for key in m:
        inner = m.get_inner(key)
        if inner is None:
            continue
        try:
            why = spec.inner.mismatch(inner.info())
        finally:
            inner.close()
        return None if why is None else f"inner map: {why}"
    return None


def open_or_create(opener: MapOpener, spec: MapSpec[Any, Any], pin_dir: str) -> MapBackend:
    """Open ``spec``'s map pinned under ``pin_dir``, or create and pin it.

    A pinned map whose type, key/value size, capacity, flags or inner layout differ
    from ``spec`` is unpinned and recreated (its entries are lost), with a warning;
    keeping it would make every later write misinterpret its bytes.
    """
    path = pin_path(pin_dir, spec.name)
    if opener.is_pinned(path):
        m = opener.open_pinned(path, spec)
        try:
            why = spec.mismatch(m.info()) or _inner_mismatch(m, spec)
        except BaseException:
            m.close()
            raise
        if why is None:
            log.debug("bpf: reusing pinned map %s at %s", spec.name, path)
            return m
        m.close()
        log.warning(
            "bpf: pinned map %s at %s has a different layout (%s); unpinning and recreating it "
            "empty",
            spec.name,
            path,
            why,
        )
        try:
            opener.remove_pin(path)
        except OSError as exc:
            raise MapError(spec.name, f"unpin {path}", exc.errno or errno.EIO) from exc
    m = opener.create(spec)
    try:
        m.pin(path)
    except BaseException:
        m.close()
        raise
    log.info("bpf: created map %s pinned at %s", spec.name, path)
    return m


class PinDirLockError(StatewrightError):
    """The pin directory cannot be locked; the message names the directory."""

    def __init__(self, pin_dir: str, reason: str) -> None:
        super().__init__(f"pin directory {pin_dir}: {reason}")
        self.pin_dir = pin_dir


class PinDirLockedError(PinDirLockError):
    """Another process holds the pin directory's lock (another agent pinning its maps
    there); the message names the directory and the holder's pid when it is known."""


def _flock_holders(st: os.stat_result) -> list[int]:
    """The pids /proc/locks lists as holding an flock on the inode ``st``."""
    inode = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    pids: list[int] = []
    try:
        with open("/proc/locks") as f:
            for line in f:
                parts = line.split()
                # "1: FLOCK  ADVISORY  WRITE 1234 fe:00:5678 0 EOF"; blocked waiters are
                # listed as "1: -> FLOCK ..." and are not holders
                if len(parts) >= 6 and parts[1] == "FLOCK" and parts[5] == inode:
                    pids.append(int(parts[4]))
    except (OSError, ValueError):
        pass
    return pids


def lock_pin_dir(pin_dir: str) -> int:
    """Take the exclusive lock of ``pin_dir`` and return its descriptor: closing it, or the
    process ending however it ends (a SIGKILL too), releases the lock.

    Two agents pinning under one directory would overwrite each other's maps, whatever
    their state directories. bpffs holds no regular files, so the lock is an flock on the
    directory itself (created when missing), and the holder's pid is read back from
    /proc/locks for the error. PinDirLockedError when another process holds it;
    PinDirLockError when the directory cannot be created or opened.
    """
    try:
        os.makedirs(pin_dir, mode=0o700, exist_ok=True)
        fd = os.open(pin_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as e:
        raise PinDirLockError(pin_dir, f"cannot open it to lock it: {e}") from e
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holders = _flock_holders(os.fstat(fd))
        os.close(fd)
        who = f"pid {', '.join(map(str, holders))}" if holders else "pid unknown"
        raise PinDirLockedError(
            pin_dir, f"its maps are in use by another agent ({who})"
        ) from None
    except OSError as e:
        os.close(fd)
        raise PinDirLockError(pin_dir, f"cannot lock: {e}") from e
    return fd
