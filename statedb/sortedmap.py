"""A persistent sorted map built from copy-on-write chunks.

`SortedMap` keeps its keys in a list of sorted chunks (each at most
``2 * LOAD`` long) with a parallel list of value chunks and a list of each
chunk's largest key, the layout sortedcontainers uses. What makes it
persistent is ownership: a *frozen* map is never mutated, and
`SortedMap.transient()` makes a writable map that shares every chunk with
the frozen one and copies a chunk only the first time it writes to it.

Complexity, for n keys and chunk size B = LOAD (256):

- ``get``, ``floor``: O(log n) (two C-level bisects).
- ``set``/``pop`` on a transient: O(log n + B), plus O(B) once per chunk
  per transaction for the copy, plus O(n / B) once per transaction to copy
  the outer chunk lists.
- ``freeze`` (a snapshot of a transient): O(n / B); ``transient``: O(n / B).
- iteration: O(1) per item, at C speed within a chunk.

Values are sequences whose first item is what most readers want (statedb stores
records ``(row, revision, key)``): `SortedMap.firsts_from` iterates those first items
from per-chunk lists (``_firsts``) that a frozen map computes the first time a chunk is
read that way and that later maps derived from it share until they change the chunk,
so iterating rows costs no per-item projection.

Keys of one map must be mutually comparable (all ``bytes`` or all ``int``).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator
from itertools import chain, islice
from operator import itemgetter
from typing import Any

LOAD = 256

_first = itemgetter(0)


class SortedMap:
    """An ordered key -> value map: frozen maps are immutable, a transient has one writer."""

    __slots__ = ("_firsts", "_keys", "_len", "_maxes", "_owned", "_vals")

    def __init__(self) -> None:
        self._keys: list[list[Any]] = []
        self._vals: list[list[Any]] = []
        self._maxes: list[Any] = []
        # Per chunk: the first item of each of its values, or None until a reader of the
        # frozen map needs it (the lists are never changed once built, so maps share them).
        self._firsts: list[list[Any] | None] = []
        self._len = 0
        # ids of chunks this map may mutate in place; None means frozen.
        self._owned: set[int] | None = None

    @classmethod
    def from_sorted(cls, keys: list[Any], values: list[Any]) -> SortedMap:
        """Return a frozen map of already sorted, distinct ``keys`` and their ``values`` (O(n))."""
        m = cls()
        for i in range(0, len(keys), LOAD):
            m._keys.append(keys[i : i + LOAD])
            m._vals.append(values[i : i + LOAD])
            m._maxes.append(m._keys[-1][-1])
            m._firsts.append(None)
        m._len = len(keys)
        m._owned = None
        return m

    # ----- snapshots -------------------------------------------------
    def transient(self) -> SortedMap:
        """Return a writable copy that shares all chunks with this map (O(n / B))."""
        m = SortedMap.__new__(SortedMap)
        m._keys = self._keys.copy()
        m._vals = self._vals.copy()
        m._maxes = self._maxes.copy()
        m._firsts = self._firsts.copy()
        m._len = self._len
        m._owned = set()
        return m

    def freeze(self) -> SortedMap:
        """Return an immutable snapshot of this map; later writes to self copy chunks again."""
        if self._owned is None:
            return self
        m = SortedMap.__new__(SortedMap)
        m._keys = self._keys.copy()
        m._vals = self._vals.copy()
        m._maxes = self._maxes.copy()
        m._firsts = self._firsts.copy()
        m._len = self._len
        m._owned = None
        self._owned = set()
        return m

    def seal(self) -> SortedMap:
        """Turn this transient into a frozen map in place (the writer gives it up)."""
        self._owned = None
        return self

    @property
    def frozen(self) -> bool:
        """True when this map can no longer change."""
        return self._owned is None

    # ----- reads -----------------------------------------------------
    def __len__(self) -> int:
        return self._len

    def get(self, key: Any) -> Any:
        """Return the value stored under ``key``, or None."""
        maxes = self._maxes
        i = bisect_left(maxes, key)
        if i == len(maxes):
            return None
        keys = self._keys[i]
        j = bisect_left(keys, key)
        if keys[j] == key:
            return self._vals[i][j]
        return None

    def _locate(self, key: Any) -> tuple[int, int]:
        """Return (chunk, position) of the first key >= ``key``; chunk == len when past the end."""
        maxes = self._maxes
        i = bisect_left(maxes, key)
        if i == len(maxes):
            return i, 0
        return i, bisect_left(self._keys[i], key)

    def _chunks_from(self, chunks: list[list[Any]], key: Any) -> Iterator[Any]:
        """Chain the chunks from the first key >= ``key`` on, iterated in C."""
        if key is None:
            return chain.from_iterable(chunks)
        i, j = self._locate(key)
        if i >= len(chunks):
            return iter(())
        return chain(islice(chunks[i], j, None), chain.from_iterable(chunks[i + 1 :]))

    def items_from(self, key: Any = None) -> Iterator[tuple[Any, Any]]:
        """Iterate (key, value) pairs with key >= ``key`` (all when None), in key order.

        Only for frozen maps (iteration runs over the chunk lists as they are).
        """
        return zip(self._chunks_from(self._keys, key), self._chunks_from(self._vals, key))

    def values_from(self, key: Any = None) -> Iterator[Any]:
        """Iterate values whose key >= ``key`` (all when None), in key order (frozen maps)."""
        return self._chunks_from(self._vals, key)

    def firsts_from(self, key: Any = None) -> Iterator[Any]:
        """Iterate the first item of each value whose key >= ``key`` (all when None), in key
        order (frozen maps): for statedb's records, the rows."""
        start = 0
        if key is not None:
            start, j = self._locate(key)
            if start >= len(self._keys):
                return iter(())
            if j:
                rest = map(self._firsts_of, range(start + 1, len(self._keys)))
                return chain(islice(self._firsts_of(start), j, None), chain.from_iterable(rest))
        return chain.from_iterable(map(self._firsts_of, range(start, len(self._keys))))

    def _firsts_of(self, i: int) -> list[Any]:
        """The first items of chunk ``i``'s values (kept when this map is frozen)."""
        firsts = self._firsts[i]
        if firsts is None:
            firsts = list(map(_first, self._vals[i]))
            if self._owned is None:
                # Readers in several threads may each build it: equal lists, either stays.
                self._firsts[i] = firsts
        return firsts

    def items_prefix(self, prefix: bytes) -> Iterator[tuple[bytes, Any]]:
        """Yield (key, value) pairs whose bytes key starts with ``prefix``, in key order."""
        for k, v in self.items_from(prefix):
            if not k.startswith(prefix):
                return
            yield k, v

    # ----- writes (transient only) ------------------------------------
    def _own(self, i: int) -> tuple[list[Any], list[Any]]:
        owned = self._owned
        if owned is None:
            raise RuntimeError("SortedMap is frozen; take a transient() to write")
        # The caller is about to change chunk i.
        self._firsts[i] = None
        keys = self._keys[i]
        if id(keys) in owned:
            return keys, self._vals[i]
        keys = keys.copy()
        vals = self._vals[i].copy()
        self._keys[i] = keys
        self._vals[i] = vals
        owned.add(id(keys))
        return keys, vals

    def set(self, key: Any, value: Any) -> Any:
        """Store ``value`` under ``key``; return the value it replaced, or None."""
        maxes = self._maxes
        if not maxes:
            if self._owned is None:
                raise RuntimeError("SortedMap is frozen; take a transient() to write")
            keys, vals = [key], [value]
            self._keys.append(keys)
            self._vals.append(vals)
            maxes.append(key)
            self._firsts.append(None)
            self._owned.add(id(keys))
            self._len = 1
            return None
        i = bisect_left(maxes, key)
        if i == len(maxes):
            # Past the largest key: append to the last chunk (the common case for
            # monotonically growing keys such as revisions).
            i -= 1
            keys, vals = self._own(i)
            keys.append(key)
            vals.append(value)
            maxes[i] = key
        else:
            keys, vals = self._own(i)
            j = bisect_left(keys, key)
            if keys[j] == key:
                old = vals[j]
                vals[j] = value
                return old
            keys.insert(j, key)
            vals.insert(j, value)
        self._len += 1
        if len(keys) > 2 * LOAD:
            self._split(i)
        return None

    def _split(self, i: int) -> None:
        keys, vals = self._keys[i], self._vals[i]
        half = len(keys) // 2
        right_k, right_v = keys[half:], vals[half:]
        del keys[half:]
        del vals[half:]
        self._keys.insert(i + 1, right_k)
        self._vals.insert(i + 1, right_v)
        self._maxes[i] = keys[-1]
        self._maxes.insert(i + 1, right_k[-1])
        self._firsts.insert(i + 1, None)
        assert self._owned is not None
        self._owned.add(id(right_k))

    def pop(self, key: Any) -> Any:
        """Remove ``key``; return its value, or None when it was absent."""
        maxes = self._maxes
        i = bisect_left(maxes, key)
        if i == len(maxes):
            return None
        j = bisect_left(self._keys[i], key)
        if self._keys[i][j] != key:
            return None
        keys, vals = self._own(i)
        old = vals[j]
        del keys[j]
        del vals[j]
        self._len -= 1
        if not keys:
            del self._keys[i]
            del self._vals[i]
            del maxes[i]
            del self._firsts[i]
        else:
            maxes[i] = keys[-1]
            if len(keys) < LOAD // 4 and len(maxes) > 1:
                self._merge(i)
        return old

    def _merge(self, i: int) -> None:
        """Merge small chunk i into a neighbour so chunks stay reasonably full."""
        j = i + 1 if i + 1 < len(self._maxes) else i - 1
        lo, hi = min(i, j), max(i, j)
        if len(self._keys[lo]) + len(self._keys[hi]) > 2 * LOAD:
            return
        keys, vals = self._own(lo)
        keys.extend(self._keys[hi])
        vals.extend(self._vals[hi])
        assert self._owned is not None
        self._owned.discard(id(self._keys[hi]))
        del self._keys[hi]
        del self._vals[hi]
        del self._maxes[hi]
        del self._firsts[hi]
        self._maxes[lo] = keys[-1]


EMPTY = SortedMap()
EMPTY._owned = None
