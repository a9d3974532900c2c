"""The cookie of a network namespace, as the kernel reports it to BPF programs
(``bpf_get_netns_cookie``) and to sockets (``SO_NETNS_COOKIE``).

The kernel has no file that tells a namespace's cookie: a socket created inside the
namespace reports it. `netns_cookie` enters the namespace in a short-lived thread of its
own (``setns`` changes only the calling thread's namespace), opens a socket there, reads
the cookie and ends the thread, so no other thread of the process ever runs in another
namespace. It blocks for about a millisecond: call it from a worker thread.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import logging
import os
import socket
import sys
import threading

from statedb.errors import StatewrightError

log = logging.getLogger("statewright.netns_cookie")

SO_NETNS_COOKIE = 71  # <asm-generic/socket.h>; Linux 5.14 and later
CLONE_NEWNET = 0x40000000

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


class NetnsCookieError(StatewrightError, OSError):
    """The namespace cannot be entered or its cookie read; names the path and errno."""

    def __init__(self, err: int, path: str, what: str) -> None:
        name = errno.errorcode.get(err, str(err))
        super().__init__(err, f"netns {path}: {what}: {name} ({os.strerror(err)})")
        self.path = path


def _setns(fd: int, path: str, what: str) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        raise NetnsCookieError(ctypes.get_errno(), path, what)


def own_netns_cookie() -> int:
    """The cookie of the calling thread's network namespace."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        raw = s.getsockopt(socket.SOL_SOCKET, SO_NETNS_COOKIE, 8)
    return int.from_bytes(raw, sys.byteorder)


def _enter_and_read(path: str) -> int:
    """Enter the namespace at ``path`` with the calling thread and read its cookie; the
    thread returns to its own namespace afterwards (it ends right after in any case)."""
    try:
        home = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    except OSError as e:
        raise NetnsCookieError(e.errno or errno.EIO, path, "open own namespace") from None
    try:
        try:
            target = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as e:
            raise NetnsCookieError(e.errno or errno.EIO, path, "open") from None
        try:
            _setns(target, path, "enter")
        finally:
            os.close(target)
        try:
            return own_netns_cookie()
        except OSError as e:
            raise NetnsCookieError(e.errno or errno.EIO, path, "read SO_NETNS_COOKIE") from None
        finally:
            try:
                _setns(home, path, "return to the agent's namespace")
            except NetnsCookieError as e:
                log.warning("%s (the reader thread ends now)", e)
    finally:
        os.close(home)


def _read_in(path: str, out: list[int | BaseException]) -> None:
    try:
        out.append(_enter_and_read(path))
    except BaseException as e:  # handed to the caller's thread
        out.append(e)


def netns_cookie(path: str) -> int:
    """The cookie of the network namespace at ``path`` (``/var/run/netns/<name>``,
    ``/proc/<pid>/ns/net``); NetnsCookieError when it cannot be read."""
    out: list[int | BaseException] = []
    t = threading.Thread(target=_read_in, args=(path, out), name="netns-cookie", daemon=True)
    t.start()
    t.join()
    if not out:
        raise NetnsCookieError(errno.EIO, path, "reader thread failed")
    result = out[0]
    if isinstance(result, BaseException):
        raise result
    return result
