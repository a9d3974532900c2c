"""Kernel BPF maps through libbpf: create or open pinned, element and batch operations, pinning."""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Iterator, Sequence
from typing import Any

from bpf import btf, libbpf
from bpf.backend import MapBackend, join_fixed, split_fixed
from bpf.errors import BatchError, MapError, errno_name
from bpf.spec import MAP_OF_MAPS, MapInfo, MapSpec, MapType, UpdateFlag

_ENOTSUPP = 524
_UNSUPPORTED = frozenset({_ENOTSUPP, errno.EOPNOTSUPP})
_flag_arg = libbpf.update_flags


#: `UpdateFlag.ANY` as a global (an enum class attribute read is slow on Python 3.11).
_ANY = UpdateFlag.ANY


class KernelMap(MapBackend):
    """A kernel map fd with preallocated buffers; see MapBackend for the semantics."""

    def __init__(self, spec: MapSpec[Any, Any], fd: int, pinned_path: str | None = None) -> None:
        self.spec = spec
        self._fd = fd
        self._pinned_path = pinned_path
        lib = libbpf.lib()
        self._update = lib.update_elem
        self._lookup = lib.lookup_elem
        self._delete = lib.delete_elem
        self._next_key = lib.get_next_key
        self._ksize = spec.key_size
        self._vsize = spec.value_size
        self._vbuf = libbpf.new_buffer(self._vsize)
        self._kbuf = libbpf.new_buffer(self._ksize)
        self._batch = libbpf.BatchCall()
        self._batch_lock = threading.Lock()
        self._buf_lock = threading.Lock()
        self._batch_supported = True

    # -- lifecycle -----------------------------------------------------------------

    @classmethod
    def create(cls, spec: MapSpec[Any, Any]) -> KernelMap:
        """Create a new unpinned map from ``spec`` (with a template inner map for map-of-maps).

        The map carries BTF for its key and value types when ``bpf.btf`` has them
        (bpftool then prints entries as structs). Should the kernel refuse the map with
        BTF, it is created without and the reason logged once: BTF never stops the agent.
        """
        inner_fd = 0
        template: KernelMap | None = None
        if spec.type in MAP_OF_MAPS:
            if spec.inner is None:
                raise MapError(spec.name, "create", errno.EINVAL, "map-of-maps needs an inner spec")
            template = cls.create(spec.inner)
            inner_fd = template.fd
        args = (
            spec.type,
            spec.name,
            spec.key_size,
            spec.value_size,
            spec.max_entries,
            spec.flags,
            inner_fd,
        )
        try:
            types = btf.map_btf(spec)
            if types is None:
                fd = libbpf.map_create(*args)
            else:
                fd = libbpf.map_create(
                    *args, types.fd, types.key_type_id, types.value_type_id
                )
                if fd < 0 and -fd != errno.EPERM:
                    plain = libbpf.map_create(*args)
                    if plain >= 0:
                        btf.registry().refused(
                            spec, f"the kernel refuses it with BTF: {errno_name(-fd)}"
                        )
                    fd = plain
        finally:
            if template is not None:
                template.close()
        if fd < 0:
            raise MapError(spec.name, "create", -fd)
        return cls(spec, fd)

    @classmethod
    def open_pinned(cls, path: str, spec: MapSpec[Any, Any]) -> KernelMap:
        """Open the map pinned at ``path`` as ``spec`` (bpf.pinning checks the layout first)."""
        fd = libbpf.obj_get(path)
        if fd < 0:
            raise MapError(spec.name, f"open {path}", -fd)
        return cls(spec, fd, pinned_path=path)

    @staticmethod
    def is_pinned(path: str) -> bool:
        """Whether something is pinned at ``path``."""
        return os.path.exists(path)

    @staticmethod
    def remove_pin(path: str) -> None:
        """Unlink a pin without opening it."""
        os.unlink(path)

    @property
    def fd(self) -> int:
        """The map's file descriptor."""
        if self._fd < 0:
            raise MapError(self.name, "use", errno.EBADF, "map is closed")
        return self._fd

    @property
    def pinned_path(self) -> str | None:
        """Where this map is pinned, if it is."""
        return self._pinned_path

    def info(self) -> MapInfo:
        """The kernel's view of the map."""
        res = libbpf.map_info(self.fd)
        if isinstance(res, int):
            raise self._error("info", -res)
        mtype, mid, ksz, vsz, maxe, flags, name, btf_id = res
        return MapInfo(mtype, ksz, vsz, maxe, flags, name, mid, btf_id)

    def pin(self, path: str) -> None:
        """Pin at ``path`` (its directory must exist on bpffs)."""
        ret = libbpf.obj_pin(self.fd, path)
        if ret < 0:
            raise self._error(f"pin {path}", -ret)
        self._pinned_path = path

    def unpin(self) -> None:
        """Remove this map's pin."""
        if self._pinned_path is None:
            raise MapError(self.name, "unpin", errno.ENOENT, "map is not pinned")
        try:
            os.unlink(self._pinned_path)
        except OSError as exc:
            raise self._error(f"unpin {self._pinned_path}", exc.errno or errno.EIO) from exc
        self._pinned_path = None

    def close(self) -> None:
        """Close the fd (idempotent)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter shutdown: nothing useful to report
            pass

    # -- elements --------------------------------------------------------------------

    def _check_key(self, op: str, key: bytes) -> None:
        if len(key) != self._ksize:
            raise MapError(
                self.name, op, errno.EINVAL, f"key is {len(key)} bytes, want {self._ksize}"
            )

    def _check_value(self, op: str, value: bytes) -> None:
        if len(value) != self._vsize:
            raise MapError(
                self.name, op, errno.EINVAL, f"value is {len(value)} bytes, want {self._vsize}"
            )

    def lookup(self, key: bytes) -> bytes | None:
        """The value for ``key`` or None."""
        if len(key) != self._ksize:
            self._check_key("lookup", key)
        with self._buf_lock:  # the shared output buffer; ctypes releases the GIL
            ret = self._lookup(self._fd, key, self._vbuf)
            if ret == 0:
                return self._vbuf.raw
        if ret == -errno.ENOENT:
            return None
        raise self._error("lookup", -ret)

    def update(self, key: bytes, value: bytes, flags: int = UpdateFlag.ANY) -> None:
        """Create/replace ``key`` per ``flags``."""
        if len(key) != self._ksize or len(value) != self._vsize:
            self._check_key("update", key)
            self._check_value("update", value)
        ret = self._update(self._fd, key, value, _flag_arg(flags))
        if ret:
            raise self._error("update", -ret)

    def delete(self, key: bytes) -> None:
        """Delete ``key`` (ENOENT when absent)."""
        if len(key) != self._ksize:
            self._check_key("delete", key)
        ret = self._delete(self._fd, key)
        if ret:
            raise self._error("delete", -ret)

    def _first_key(self) -> bytes | None:
        with self._buf_lock:
            ret = self._next_key(self.fd, None, self._kbuf)
            first = self._kbuf.raw
        if ret == -errno.ENOENT:
            return None
        if ret:
            raise self._error("iterate", -ret)
        return first

    def keys(self) -> Iterator[bytes]:
        """Keys via get_next_key, fetching the next key before yielding the current one."""
        key = self._first_key()
        kbuf = libbpf.new_buffer(self._ksize)
        while key is not None:
            ret = self._next_key(self.fd, key, kbuf)
            if ret == -errno.ENOENT:
                nxt = None
            elif ret:
                raise self._error("iterate", -ret)
            else:
                nxt = kbuf.raw
            yield key
            key = nxt

    # -- batches ---------------------------------------------------------------------

    def lookup_batch(self, batch_size: int = 4096) -> Iterator[list[tuple[bytes, bytes]]]:
        """Entries in chunks via BPF_MAP_LOOKUP_BATCH; per-key fallback when unsupported."""
        ksz, vsz = self._ksize, self._vsize
        for kraw, vraw in self.dump_chunks(batch_size):
            yield list(zip(split_fixed(kraw, ksz), split_fixed(vraw, vsz)))

    def dump_chunks(self, batch_size: int = 4096) -> Iterator[tuple[bytes, bytes]]:
        """Raw (keys, values) buffers straight from BPF_MAP_LOOKUP_BATCH."""
        if not self._batch_supported or self.spec.type == MapType.LPM_TRIE:
            yield from self._dump_chunks_fallback(batch_size)
            return
        ksz, vsz = self._ksize, self._vsize
        token_size = max(ksz, 8)
        tokens = [libbpf.new_buffer(token_size), libbpf.new_buffer(token_size)]
        in_token: libbpf.Buffer | None = None
        size = batch_size
        keys, values = libbpf.new_buffer(ksz * size), libbpf.new_buffer(vsz * size)
        turn = 0
        while True:
            out_token = tokens[turn]
            with self._batch_lock:  # BatchCall's count/opts are shared
                ret, n = self._batch.lookup(self.fd, in_token, out_token, keys, values, size)
            if ret and ret != -errno.ENOENT:
                unsupported = -ret in _UNSUPPORTED or ret == -errno.EINVAL
                if unsupported and in_token is None:
                    self._batch_supported = False
                    yield from self._dump_chunks_fallback(batch_size)
                    return
                if ret == -errno.ENOSPC and n == 0:
                    size *= 2  # a hash bucket holds more entries than the buffer
                    keys, values = libbpf.new_buffer(ksz * size), libbpf.new_buffer(vsz * size)
                    continue
                raise self._error("lookup_batch", -ret)
            if n:
                yield keys.raw[: n * ksz], values.raw[: n * vsz]
            if ret == -errno.ENOENT:
                return
            in_token = out_token
            turn ^= 1

    def count(self) -> int:
        """Number of entries, via batch lookups where the map type has them."""
        if not self._batch_supported or self.spec.type == MapType.LPM_TRIE:
            return super().count()
        return sum(len(kraw) for kraw, _ in self.dump_chunks()) // self._ksize

    def _dump_chunks_fallback(self, batch_size: int) -> Iterator[tuple[bytes, bytes]]:
        for chunk in self._lookup_batch_fallback(batch_size):
            yield b"".join(k for k, _ in chunk), b"".join(v for _, v in chunk)

    def _lookup_batch_fallback(self, batch_size: int) -> Iterator[list[tuple[bytes, bytes]]]:
        chunk: list[tuple[bytes, bytes]] = []
        for item in self.items():
            chunk.append(item)
            if len(chunk) >= batch_size:
                yield chunk
                chunk = []
        if chunk:
            yield chunk

    def update_batch(
        self, keys: Sequence[bytes] | bytes, values: Sequence[bytes] | bytes, flags: int = 0
    ) -> int:
        """BPF_MAP_UPDATE_BATCH, or per-element updates when the map type lacks it.

        The kernel's batch accepts no NOEXIST/EXIST element flags (EINVAL), so those
        batches run element by element with the same stop-at-first-error result.
        """
        kbuf, n = join_fixed(self.name, "update_batch", keys, self._ksize)
        vbuf, nv = join_fixed(self.name, "update_batch", values, self._vsize)
        if n != nv:
            raise MapError(self.name, "update_batch", errno.EINVAL, f"{n} keys but {nv} values")
        if n == 0:
            return 0
        if self._batch_supported and flags == _ANY:
            with self._batch_lock:  # BatchCall's count/opts are shared
                ret, done = self._batch.update(self.fd, kbuf, vbuf, n, flags)
            if ret == 0:
                return n
            if -ret not in _UNSUPPORTED:
                raise BatchError(self.name, "update_batch", -ret, done)
            self._batch_supported = False
        for i in range(n):
            ret = self._update(
                self.fd,
                kbuf[i * self._ksize : (i + 1) * self._ksize],
                vbuf[i * self._vsize : (i + 1) * self._vsize],
                _flag_arg(flags),
            )
            if ret:
                raise BatchError(self.name, "update_batch", -ret, i)
        return n

    def delete_batch(self, keys: Sequence[bytes] | bytes) -> int:
        """BPF_MAP_DELETE_BATCH, or per-element deletes when the map type lacks it."""
        kbuf, n = join_fixed(self.name, "delete_batch", keys, self._ksize)
        if n == 0:
            return 0
        if self._batch_supported:
            with self._batch_lock:  # BatchCall's count/opts are shared
                ret, done = self._batch.delete(self.fd, kbuf, n)
            if ret == 0:
                return n
            if -ret not in _UNSUPPORTED:
                raise BatchError(self.name, "delete_batch", -ret, done)
            self._batch_supported = False
        for i in range(n):
            ret = self._delete(self.fd, kbuf[i * self._ksize : (i + 1) * self._ksize])
            if ret:
                raise BatchError(self.name, "delete_batch", -ret, i)
        return n

    # -- map-in-map ------------------------------------------------------------------

    def set_inner(self, key: bytes, inner: MapBackend, flags: int = UpdateFlag.ANY) -> None:
        """Install ``inner`` (by fd) under ``key``."""
        if self.spec.type not in MAP_OF_MAPS:
            raise MapError(self.name, "set_inner", errno.EINVAL, "not a map-of-maps")
        self.update(key, inner.fd.to_bytes(4, "little"), flags)

    def get_inner(self, key: bytes) -> KernelMap | None:
        """Open the inner map stored under ``key`` by its id."""
        if self.spec.type not in MAP_OF_MAPS or self.spec.inner is None:
            raise MapError(self.name, "get_inner", errno.EINVAL, "not a map-of-maps")
        raw = self.lookup(key)
        if raw is None:
            return None
        fd = libbpf.map_fd_by_id(int.from_bytes(raw, "little"))
        if fd < 0:
            if fd == -errno.ENOENT:
                return None  # replaced or deleted since the lookup
            raise self._error("get_inner", -fd)
        return KernelMap(self.spec.inner, fd)
