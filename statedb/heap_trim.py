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

`fix_mmap_threshold` keeps the heap from growing afterwards. Under a steady churn the
hash tables of the largest dicts (a table's rows by key: ~10 MB at 100,000 rows) are
rebuilt now and then at the same size; glibc's raised threshold puts each new table in
the heap while the old one is still held, and the hole the old one leaves is partly taken
by smaller blocks before the next rebuild, so the resident set climbed in steps of one
table (~10 MB) every several minutes (benchmarks/soak.py, 10,000 services). With the
threshold fixed at 1 MiB such tables are mapped and unmapped whole; smaller blocks are
unchanged.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from collections.abc import Callable
from typing import Any

_trim: Callable[[int], int] | None = None
_looked_up = False


#: glibc's mallopt parameter for the mmap threshold (malloc.h).
M_MMAP_THRESHOLD = -3
#: Blocks from this size up are mapped on their own once `fix_mmap_threshold` ran.
MMAP_THRESHOLD_BYTES = 1 << 20

_mallopt: Callable[[int, int], int] | None = None
_mallopt_looked_up = False


def _libc_function(name: str, argtypes: list[Any]) -> Any:
    """The C library's function ``name`` (returning int), or None where there is none."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        fn = getattr(libc, name)
    except (OSError, AttributeError):
        return None
    fn.argtypes = argtypes
    fn.restype = ctypes.c_int
    return fn


def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``, or None where the C library has none."""
    global _trim, _looked_up
    if not _looked_up:
        _looked_up = True
        _trim = _libc_function("malloc_trim", [ctypes.c_size_t])
    return _trim


def _mallopt_function() -> Callable[[int, int], int] | None:
    """glibc's ``mallopt``, or None where the C library has none."""
    global _mallopt, _mallopt_looked_up
    if not _mallopt_looked_up:
        _mallopt_looked_up = True
        _mallopt = _libc_function("mallopt", [ctypes.c_int, ctypes.c_int])
    return _mallopt


def trim_heap() -> bool:
    """Return the C heap's free pages to the system (glibc's ``malloc_trim(0)``).

    True when glibc released memory; False when there was nothing to release or the C
    library has no ``malloc_trim`` (then nothing is done)."""
    fn = _malloc_trim()
    if fn is None:
        return False
    return bool(fn(0))


def fix_mmap_threshold(nbytes: int = MMAP_THRESHOLD_BYTES) -> bool:
    """Map every block of ``nbytes`` or more on its own from now on (glibc's
    ``mallopt(M_MMAP_THRESHOLD)``, which also stops glibc from raising the threshold as
    large blocks are freed): freeing such a block gives its pages back at once.

    True when glibc took the setting; False where the C library has no ``mallopt`` or
    refused the value (then nothing changed)."""
    if nbytes <= 0:
        raise ValueError(f"mmap threshold must be > 0 bytes, got {nbytes}")
    fn = _mallopt_function()
    if fn is None:
        return False
    return fn(M_MMAP_THRESHOLD, nbytes) == 1
