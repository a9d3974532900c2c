"""In-memory maps with the kernel's semantics, for unprivileged machines and property tests.

Sizes, flags, capacity errnos (E2BIG for hash/array, ENOSPC for LPM tries), LRU
eviction, longest-prefix lookups, array semantics and map-in-map all follow the kernel.
Pins live in a process-wide registry keyed by path.
"""

from __future__ import annotations

import errno
import itertools
import threading
import weakref
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from typing import Any

from bpf.backend import MapBackend, join_fixed, split_fixed
from bpf.errors import BatchError, MapError
from bpf.spec import MAP_OF_MAPS, MapInfo, MapSpec, MapType, UpdateFlag

_ids = itertools.count(1 << 20)
_stores: weakref.WeakValueDictionary[int, _Store] = weakref.WeakValueDictionary()
_pins: dict[str, _Store] = {}
_lock = threading.Lock()


class _Store:
    """The shared state of one memory map (handles and pins point at it)."""

    def __init__(self, spec: MapSpec[Any, Any]) -> None:
        self.spec = spec
        self.id = next(_ids)
        self.ksize = spec.key_size
        self.vsize = spec.value_size
        self.max_entries = spec.max_entries
        self.data: dict[bytes, bytes] = OrderedDict() if spec.type == MapType.LRU_HASH else {}
        self.inner: dict[bytes, _Store] = {}
        # LPM: (prefixlen, masked data) -> stored key; prefix lengths in use with counts
        self.lpm_index: dict[tuple[int, bytes], bytes] = {}
        self.lpm_lens: dict[int, int] = {}
        self.lock = threading.RLock()  # compound updates stay atomic across threads
        if spec.type in (MapType.ARRAY, MapType.ARRAY_OF_MAPS):
            zero = bytes(self.vsize)
            for i in range(spec.max_entries):
                self.data[i.to_bytes(4, "little")] = zero
        _stores[self.id] = self

    def info(self) -> MapInfo:
        s = self.spec
        return MapInfo(
            int(s.type), s.key_size, s.value_size, s.max_entries, s.flags, s.name[:15], self.id
        )


def _mask(data: bytes, bits: int) -> bytes:
    full, rem = divmod(bits, 8)
    out = bytearray(data[:full])
    if rem:
        out.append(data[full] & (0xFF << (8 - rem)) & 0xFF)
    return bytes(out)


class MemoryMap(MapBackend):
    """A handle on an in-memory map; see MapBackend for the semantics."""

    def __init__(self, store: _Store, pinned_path: str | None = None) -> None:
        self.spec = store.spec
        self._store: _Store | None = store
        self._pinned_path = pinned_path
        self._type = MapType(store.spec.type)
        self._plain = self._type in (MapType.HASH, MapType.LRU_HASH, MapType.ARRAY)

    # -- lifecycle -----------------------------------------------------------------

    @classmethod
    def create(cls, spec: MapSpec[Any, Any]) -> MemoryMap:
        """A new empty map (validated like the kernel validates map creation)."""
        if spec.key_size <= 0 or spec.value_size <= 0 or spec.max_entries <= 0:
            raise MapError(spec.name, "create", errno.EINVAL)
        if spec.type in (MapType.ARRAY, MapType.ARRAY_OF_MAPS) and spec.key_size != 4:
            raise MapError(spec.name, "create", errno.EINVAL, "array keys must be 4 bytes")
        if spec.type == MapType.LPM_TRIE and not spec.flags & 1:
            raise MapError(spec.name, "create", errno.EINVAL, "LPM tries need BPF_F_NO_PREALLOC")
        if spec.type == MapType.LRU_HASH and spec.flags & 1:
            raise MapError(spec.name, "create", errno.EINVAL, "LRU maps cannot be NO_PREALLOC")
        if spec.type in MAP_OF_MAPS and (spec.inner is None or spec.value_size != 4):
            raise MapError(spec.name, "create", errno.EINVAL, "map-of-maps needs an inner spec")
        return cls(_Store(spec))

    @classmethod
    def open_pinned(cls, path: str, spec: MapSpec[Any, Any]) -> MemoryMap:
        """A new handle on the map pinned at ``path`` (ENOENT if none)."""
        with _lock:
            store = _pins.get(path)
        if store is None:
            raise MapError(spec.name, f"open {path}", errno.ENOENT)
        handle = cls(store, pinned_path=path)
        handle.spec = spec
        return handle

    @staticmethod
    def is_pinned(path: str) -> bool:
        """Whether a memory map is pinned at ``path``."""
        with _lock:
            return path in _pins

    @staticmethod
    def remove_pin(path: str) -> None:
        """Drop the pin at ``path``."""
        with _lock:
            if _pins.pop(path, None) is None:
                raise FileNotFoundError(errno.ENOENT, "not pinned", path)

    @staticmethod
    def pinned_paths() -> list[str]:
        """Every pinned memory map path (for tools and tests)."""
        with _lock:
            return sorted(_pins)

    @property
    def store(self) -> _Store:
        if self._store is None:
            raise MapError(self.name, "use", errno.EBADF, "map is closed")
        return self._store

    @property
    def fd(self) -> int:
        """Memory maps are installed into map-of-maps by id."""
        return self.store.id

    @property
    def pinned_path(self) -> str | None:
        """Where this map is pinned, if it is."""
        return self._pinned_path

    def info(self) -> MapInfo:
        """The map's own description."""
        return self.store.info()

    def pin(self, path: str) -> None:
        """Register under ``path`` (EEXIST if taken)."""
        with _lock:
            if path in _pins:
                raise self._error(f"pin {path}", errno.EEXIST)
            _pins[path] = self.store
        self._pinned_path = path

    def unpin(self) -> None:
        """Drop this map's pin."""
        if self._pinned_path is None:
            raise MapError(self.name, "unpin", errno.ENOENT, "map is not pinned")
        with _lock:
            _pins.pop(self._pinned_path, None)
        self._pinned_path = None

    def close(self) -> None:
        """Release the handle (the store lives while pinned or referenced)."""
        self._store = None

    # -- elements --------------------------------------------------------------------

    def _check(self, op: str, key: bytes, value: bytes | None = None) -> _Store:
        st = self.store
        if len(key) != st.ksize:
            raise MapError(self.name, op, errno.EINVAL, f"key is {len(key)} bytes, want {st.ksize}")
        if value is not None and len(value) != st.vsize:
            raise MapError(
                self.name, op, errno.EINVAL, f"value is {len(value)} bytes, want {st.vsize}"
            )
        return st

    def _lpm_split(self, op: str, key: bytes) -> tuple[int, bytes]:
        plen = int.from_bytes(key[:4], "little")
        data = key[4:]
        if plen > 8 * len(data):
            raise MapError(self.name, op, errno.EINVAL, f"prefixlen {plen} too long")
        return plen, data

    def lookup(self, key: bytes) -> bytes | None:
        """Value for ``key``; LPM tries return the longest matching prefix."""
        st = self._store
        if self._plain and st is not None and len(key) == st.ksize:
            return st.data.get(key)  # fast path: hash, LRU, array
        st = self._check("lookup", key)
        with st.lock:
            return self._lookup_slow(st, key)

    def _lookup_slow(self, st: _Store, key: bytes) -> bytes | None:
        if self._type == MapType.LPM_TRIE:
            plen = min(int.from_bytes(key[:4], "little"), 8 * (len(key) - 4))
            data = key[4:]
            for length in sorted(st.lpm_lens, reverse=True):
                if length <= plen:
                    stored = st.lpm_index.get((length, _mask(data, length)))
                    if stored is not None:
                        return st.data[stored]
            return None
        if self._type in MAP_OF_MAPS:
            inner = st.inner.get(key)
            return None if inner is None else inner.id.to_bytes(4, "little")
        return st.data.get(key)

    def lookup_exact(self, key: bytes) -> bytes | None:
        """Value stored under exactly ``key``."""
        if self._type == MapType.LPM_TRIE:
            return self.store.data.get(key)
        return self.lookup(key)

    def update(self, key: bytes, value: bytes, flags: int = UpdateFlag.ANY) -> None:
        """Create/replace per ``flags`` with the kernel's errnos."""
        with self.store.lock:
            self._update(key, value, flags)

    def _update(self, key: bytes, value: bytes, flags: int) -> None:
        st = self._store
        if (
            self._type is MapType.HASH
            and not flags
            and st is not None
            and len(key) == st.ksize
            and len(value) == st.vsize
        ):
            table = st.data  # fast path: plain hash, BPF_ANY
            if key in table or len(table) < st.max_entries:
                table[key] = value
                return
            raise self._error("update", errno.E2BIG)
        st = self._check("update", key, value)
        if flags not in (0, 1, 2):
            raise self._error("update", errno.EINVAL)
        t = self._type
        if t in (MapType.ARRAY, MapType.ARRAY_OF_MAPS):
            if int.from_bytes(key, "little") >= st.max_entries:
                raise self._error("update", errno.E2BIG)
            if flags == UpdateFlag.NOEXIST:
                raise self._error("update", errno.EEXIST)
            if t == MapType.ARRAY_OF_MAPS:
                self._set_inner_store(st, key, value)
            else:
                st.data[key] = value
            return
        if t == MapType.LPM_TRIE:
            plen, data = self._lpm_split("update", key)
            ident = (plen, _mask(data, plen))
            old = st.lpm_index.get(ident)
            self._check_flags(flags, old is not None)
            if old is None:
                if len(st.data) >= st.max_entries:
                    raise self._error("update", errno.ENOSPC)
                st.lpm_lens[plen] = st.lpm_lens.get(plen, 0) + 1
            else:
                del st.data[old]
            st.lpm_index[ident] = key
            st.data[key] = value
            return
        exists = (key in st.inner) if t in MAP_OF_MAPS else (key in st.data)
        self._check_flags(flags, exists)
        if t == MapType.LRU_HASH:
            lru = st.data
            assert isinstance(lru, OrderedDict)
            if exists:
                lru.move_to_end(key)
            elif len(lru) >= st.max_entries:
                lru.popitem(last=False)
            lru[key] = value
            return
        if not exists and len(st.inner if t in MAP_OF_MAPS else st.data) >= st.max_entries:
            raise self._error("update", errno.E2BIG)
        if t in MAP_OF_MAPS:
            self._set_inner_store(st, key, value)
        else:
            st.data[key] = value

    def _check_flags(self, flags: int, exists: bool) -> None:
        if flags == UpdateFlag.NOEXIST and exists:
            raise self._error("update", errno.EEXIST)
        if flags == UpdateFlag.EXIST and not exists:
            raise self._error("update", errno.ENOENT)

    def _set_inner_store(self, st: _Store, key: bytes, value: bytes) -> None:
        inner = _stores.get(int.from_bytes(value, "little"))
        if inner is None:
            raise self._error("update", errno.EBADF)
        want, have = st.spec.inner, inner.spec
        if want is None or (want.type, want.key_size, want.value_size, want.max_entries) != (
            have.type,
            have.key_size,
            have.value_size,
            have.max_entries,
        ):
            raise MapError(self.name, "update", errno.EINVAL, "inner map does not match the spec")
        st.inner[key] = inner

    def delete(self, key: bytes) -> None:
        """Remove ``key`` (ENOENT when absent, EINVAL for arrays)."""
        with self.store.lock:
            self._delete(key)

    def _delete(self, key: bytes) -> None:
        st = self._check("delete", key)
        t = self._type
        if t in (MapType.ARRAY, MapType.ARRAY_OF_MAPS):
            if t == MapType.ARRAY_OF_MAPS and key in st.inner:
                del st.inner[key]
                return
            raise self._error("delete", errno.EINVAL)
        if t == MapType.LPM_TRIE:
            plen, data = self._lpm_split("delete", key)
            stored = st.lpm_index.pop((plen, _mask(data, plen)), None)
            if stored is None:
                raise self._error("delete", errno.ENOENT)
            del st.data[stored]
            st.lpm_lens[plen] -= 1
            if not st.lpm_lens[plen]:
                del st.lpm_lens[plen]
            return
        table: dict[bytes, Any] = st.inner if t in MAP_OF_MAPS else st.data
        if table.pop(key, None) is None:
            raise self._error("delete", errno.ENOENT)

    def keys(self) -> Iterator[bytes]:
        """A snapshot of the keys, skipping those deleted while iterating."""
        st = self.store
        table: dict[bytes, Any] = st.inner if self._type in MAP_OF_MAPS else st.data
        for key in list(table):
            if key in table:
                yield key

    def items(self) -> Iterator[tuple[bytes, bytes]]:
        """Entries as stored (exact keys)."""
        for key in self.keys():
            value = self.lookup_exact(key)
            if value is not None:
                yield key, value

    # -- batches ---------------------------------------------------------------------

    def lookup_batch(self, batch_size: int = 4096) -> Iterator[list[tuple[bytes, bytes]]]:
        """Entries in chunks of ``batch_size``."""
        chunk: list[tuple[bytes, bytes]] = []
        for item in self.items():
            chunk.append(item)
            if len(chunk) >= batch_size:
                yield chunk
                chunk = []
        if chunk:
            yield chunk

    def dump_chunks(self, batch_size: int = 4096) -> Iterator[tuple[bytes, bytes]]:
        """Snapshot of the entries as (keys, values) buffers, without per-key lookups."""
        st = self.store
        if self._type in MAP_OF_MAPS:
            rows = [(k, m.id.to_bytes(4, "little")) for k, m in st.inner.items()]
        else:
            rows = list(st.data.items())
        for i in range(0, len(rows), batch_size):
            chunk = rows[i : i + batch_size]
            yield b"".join(k for k, _ in chunk), b"".join(v for _, v in chunk)

    def update_batch(
        self, keys: Sequence[bytes] | bytes, values: Sequence[bytes] | bytes, flags: int = 0
    ) -> int:
        """Updates in order; stops at the first failure like the kernel's generic batch."""
        st = self.store
        kbuf, n = join_fixed(self.name, "update_batch", keys, st.ksize)
        vbuf, nv = join_fixed(self.name, "update_batch", values, st.vsize)
        if n != nv:
            raise MapError(self.name, "update_batch", errno.EINVAL, f"{n} keys but {nv} values")
        update = self._update
        done = 0
        with st.lock:
            try:
                for k, v in zip(split_fixed(kbuf, st.ksize), split_fixed(vbuf, st.vsize)):
                    update(k, v, flags)
                    done += 1
            except MapError as exc:
                raise BatchError(self.name, "update_batch", exc.errno or 0, done) from exc
        return n

    def delete_batch(self, keys: Sequence[bytes] | bytes) -> int:
        """Deletes in order; stops at the first failure."""
        st = self.store
        kbuf, n = join_fixed(self.name, "delete_batch", keys, st.ksize)
        done = 0
        with st.lock:
            try:
                for k in split_fixed(kbuf, st.ksize):
                    self._delete(k)
                    done += 1
            except MapError as exc:
                raise BatchError(self.name, "delete_batch", exc.errno or 0, done) from exc
        return n

    # -- map-in-map ------------------------------------------------------------------

    def set_inner(self, key: bytes, inner: MapBackend, flags: int = UpdateFlag.ANY) -> None:
        """Install ``inner`` (a MemoryMap) under ``key``."""
        if self._type not in MAP_OF_MAPS:
            raise MapError(self.name, "set_inner", errno.EINVAL, "not a map-of-maps")
        self.update(key, inner.fd.to_bytes(4, "little"), flags)

    def get_inner(self, key: bytes) -> MemoryMap | None:
        """A new handle on the inner map under ``key``."""
        if self._type not in MAP_OF_MAPS or self.spec.inner is None:
            raise MapError(self.name, "get_inner", errno.EINVAL, "not a map-of-maps")
        self._check("get_inner", key)
        inner = self.store.inner.get(key)
        if inner is None:
            return None
        handle = MemoryMap(inner)
        handle.spec = self.spec.inner
        return handle
