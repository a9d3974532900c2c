"""Atomic JSON state files: what IPAM and the endpoint manager persist across restarts.

A state file is written to a temporary file in the same directory, flushed and fsynced,
renamed over the old one (``os.replace`` is atomic on one filesystem) and the directory
is fsynced, so a crash at any point leaves either the old or the new content, never a
torn file. Readers therefore never need a repair path: a file that does not parse is an
error, reported with its path.
"""

from __future__ import annotations

import fcntl
import json
import os
import tempfile
from typing import Any

from statedb.errors import StatewrightError


class StateDirError(StatewrightError):
    """A state file that cannot be read or written; the message names the file."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"state file {path}: {reason}")
        self.path = path


#: The lock file an agent holds in its state directory while it runs (`lock_state_dir`).
LOCK_FILE = "agent.lock"


class StateDirLockedError(StateDirError):
    """Another process holds the state directory's lock (another agent on the same
    directory); the message names the lock file and the holder's pid."""


def lock_state_dir(directory: str) -> int:
    """Take the exclusive lock of ``directory`` (an flock on its ``agent.lock``, which
    records this process's pid) and return the descriptor: closing it, or the process
    ending however it ends, releases the lock. StateDirLockedError when another process
    holds it; StateDirError when the directory cannot be used."""
    path = os.path.join(directory, LOCK_FILE)
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError as e:
        raise StateDirError(path, f"cannot open the lock: {e}") from e
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "?"
        os.close(fd)
        raise StateDirLockedError(
            path, f"the state directory is in use by another agent (pid {holder})"
        ) from None
    except OSError as e:
        os.close(fd)
        raise StateDirError(path, f"cannot lock: {e}") from e
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def write_json_atomic(path: str, doc: Any) -> None:
    """Replace ``path`` with ``doc`` as JSON, atomically and durably (see the module doc)."""
    directory = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=directory)
    except OSError as e:
        raise StateDirError(path, f"cannot create a temporary file: {e}") from e
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(doc, f, sort_keys=True, separators=(",", ":"))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise StateDirError(path, f"cannot write: {e}") from e


def read_json(path: str) -> Any | None:
    """The JSON document in ``path``, or None when the file does not exist."""
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise StateDirError(path, f"cannot read: {e}") from e


def remove_file(path: str) -> bool:
    """Remove ``path`` durably; False when it did not exist."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    except OSError as e:
        raise StateDirError(path, f"cannot remove: {e}") from e
    dfd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
    return True
