"""Atomic JSON state files: what IPAM and the endpoint manager persist across restarts.

A state file is written to a temporary file in the same directory, flushed and fsynced,
renamed over the old one (``os.replace`` is atomic on one filesystem) and the directory
is fsynced, so a crash at any point leaves either the old or the new content, never a
torn file. Readers therefore never need a repair path: a file that does not parse is an
error, reported with its path.
"""

from __future__ import annotations

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
