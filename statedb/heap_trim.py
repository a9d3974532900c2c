"""Giving the C heap's free pages back to the system after a bulk load (glibc's malloc).

Python's small objects live in its own arenas, but everything larger than 512 bytes
(the hash tables of large dicts, lists, decoded pages of a list response, buffers) comes
from malloc. During an agent's initial sync those grow and are freed over and over, and
glibc raises its mmap threshold as large blocks are freed, so later large blocks come
from the heap too; what is freed in the middle of the heap stays resident, because only
the heap's top is returned by itself. `trim_heap` asks glibc (``malloc_trim(0)``) to
release every free page of the heap, in the middle as well.

Measured with benchmarks/k8s.py (the resident set after the initial sync): -8.7 MB at
10,000 services (180.1 -> 171.4 MB) and -21 MB at 60,000 (595.2 -> 574.0 MB) on
2026-11-27. A fixed mmap threshold instead (``MALLOC_MMAP_THRESHOLD_=131072``) gave the
same at 60,000 (573.3 MB) but changes every later allocation; one trim after the load
changes nothing else.

Like `statedb.gc_tuning`, this is a process-wide choice, so statedb never makes it by
itself: the agent calls `trim_heap` once its initial state is in the maps (its
``maps`` component, beside `statedb.gc_tuning.freeze_loaded`), where the sync's
temporary blocks are all freed; it runs in a thread there (ctypes releases the GIL, and
glibc walks the whole heap: 42 ms at 2,000 services on a loaded machine). Where malloc is
not glibc's (musl, macOS), it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from collections.abc import Callable

_trim: Callable[[int], int] | None = None
_looked_up = False


def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``, or None where the C library has none."""
    global _trim, _looked_up
    if not _looked_up:
        _looked_up = True
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            fn = libc.malloc_trim
        except (OSError, AttributeError):
            return None
        fn.argtypes = [ctypes.c_size_t]
        fn.restype = ctypes.c_int
        _trim = fn
    return _trim


def trim_heap() -> bool:
    """Return the C heap's free pages to the system (glibc's ``malloc_trim(0)``).

    True when glibc released memory; False when there was nothing to release or the C
    library has no ``malloc_trim`` (then nothing is done)."""
    fn = _malloc_trim()
    if fn is None:
        return False
    return bool(fn(0))
