"""An EndpointSlice's IPv4 addresses parsed once, for its backends and for its origin.

The slice converter (`sources.k8s_convert`) parses every address of a plain slice to its
4 bytes (``socket.inet_pton``, about 1.6k instructions each) to make the backends' keys;
the slice's origin row (`tables.origins`) keeps the same 4 bytes per address, and
parsing them again was a third of what recording an origin cost. This module hands them
over without either module reading the other's insides:

* a writer that records origins after converting (the Kubernetes source, around a
  batch's transaction) opens `holding`;
* the converter calls `remember` with the slice's ``endpoints`` list and the keys it
  made, when each endpoint had exactly one IPv4 address, in order;
* the origins table asks `packed` for that same list and gets the addresses, 4 bytes
  each in order: what it would have made of them itself.

Outside `holding`, `remember` keeps nothing (a manifest's slices are never asked for),
and what was kept is dropped when the block ends: at most one batch's lists are held,
and they are alive anyway until the batch is written.
"""

from __future__ import annotations

import contextlib
import struct
from collections.abc import Iterator, Sequence
from typing import Any

#: What `remember` was given while `holding`: id of an ``endpoints`` list -> (the list,
#: its keys, the offset of the address in each key). Empty otherwise: a caller may test
#: it before calling `packed` (the same dict always; cleared, never replaced).
HELD: dict[int, tuple[list[Any], Sequence[bytes], int]] = {}
_holding = False


@contextlib.contextmanager
def holding() -> Iterator[None]:
    """Keep what `remember` is given until the block ends. Blocks do not nest: the end
    of an inner one drops what the outer one was given too (its origins then parse
    their addresses themselves)."""
    global _holding
    HELD.clear()
    _holding = True
    try:
        yield
    finally:
        _holding = False
        HELD.clear()


def remember(endpoints: list[Any], keys: Sequence[bytes], offset: int) -> None:
    """Say that each endpoint of ``endpoints`` (an EndpointSlice's list, not changed
    afterwards) has exactly one address, an IPv4 one whose 4 bytes (``inet_pton``) are
    ``keys[i][offset:offset + 4]`` for endpoint i; the keys are all of one length (the
    converter's: one prefix, the address, one suffix). Kept only while `holding`."""
    if _holding:
        HELD[id(endpoints)] = (endpoints, keys, offset)


def packed(endpoints: Any) -> bytes | None:
    """The IPv4 addresses `remember`ed for ``endpoints`` (that very list), 4 bytes each
    in order; None when none were (or the list is empty)."""
    entry = HELD.get(id(endpoints))
    if entry is None or entry[0] is not endpoints or not entry[1]:
        return None
    _, keys, start = entry
    # The keys joined, and every key's 4 bytes taken out of that in one unpack: a
    # fifth of the instructions of slicing each key.
    return b"".join(_picker(len(keys), start, len(keys[0])).unpack(b"".join(keys)))


#: (keys, offset, key length) -> the `struct.Struct` that unpacks the 4 bytes at the
#: offset of each of that many keys of that length, joined.
_PICKERS: dict[tuple[int, int, int], struct.Struct] = {}
_PICKERS_MAX = 256


def _picker(n: int, offset: int, length: int) -> struct.Struct:
    found = _PICKERS.get((n, offset, length))
    if found is None:
        if len(_PICKERS) >= _PICKERS_MAX:
            _PICKERS.clear()  # slices of many sizes: only costs making them again
        one = f"{offset}x4s{length - offset - 4}x"
        found = _PICKERS[(n, offset, length)] = struct.Struct(one * n)
    return found
