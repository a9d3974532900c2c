"""The map backend interface shared by the kernel, in-memory and fault-injecting backends.

Backends work on raw bytes of the spec's key/value sizes; TypedMap adds the codecs.
Every failure raises MapError (map name, operation, errno), with kernel errnos.
"""

from __future__ import annotations

import abc
import errno
from collections.abc import Iterator, Sequence
from typing import Any, Self

from bpf.errors import MapError
from bpf.spec import MapInfo, MapSpec, UpdateFlag


class MapBackend(abc.ABC):
    """One open map. Iteration tolerates deletion of the entry just yielded."""

    spec: MapSpec[Any, Any]

    @property
    def name(self) -> str:
        """The map's name (from its spec)."""
        return self.spec.name

    @property
    @abc.abstractmethod
    def fd(self) -> int:
        """The handle inner maps are installed by (kernel fd; memory map id)."""

    @property
    @abc.abstractmethod
    def pinned_path(self) -> str | None:
        """Where the map is pinned, if it is."""

    @abc.abstractmethod
    def info(self) -> MapInfo:
        """What the live map reports (type, sizes, capacity, flags, id)."""

    @abc.abstractmethod
    def lookup(self, key: bytes) -> bytes | None:
        """The value for ``key`` (longest prefix for LPM tries), or None when absent."""

    @abc.abstractmethod
    def update(self, key: bytes, value: bytes, flags: int = UpdateFlag.ANY) -> None:
        """Create or replace an entry per ``flags`` (EEXIST/ENOENT/E2BIG on violation)."""

    @abc.abstractmethod
    def delete(self, key: bytes) -> None:
        """Remove ``key``; raises MapError ENOENT when absent."""

    @abc.abstractmethod
    def keys(self) -> Iterator[bytes]:
        """All keys; deleting the key just yielded is safe."""

    def __iter__(self) -> Iterator[bytes]:
        return self.keys()

    def items(self) -> Iterator[tuple[bytes, bytes]]:
        """All entries, one lookup per key; entries deleted meanwhile are skipped."""
        for key in self.keys():
            value = self.lookup_exact(key)
            if value is not None:
                yield key, value

    def lookup_exact(self, key: bytes) -> bytes | None:
        """The value stored under exactly ``key`` (differs from lookup for LPM tries only)."""
        return self.lookup(key)

    @abc.abstractmethod
    def lookup_batch(self, batch_size: int = 4096) -> Iterator[list[tuple[bytes, bytes]]]:
        """All entries in chunks (the kernel's batch lookup where available)."""

    def dump_chunks(self, batch_size: int = 4096) -> Iterator[tuple[bytes, bytes]]:
        """All entries as (concatenated keys, concatenated values) chunks, for bulk decoding."""
        for chunk in self.lookup_batch(batch_size):
            yield b"".join(k for k, _ in chunk), b"".join(v for _, v in chunk)

    def dump(self) -> list[tuple[bytes, bytes]]:
        """All entries, fetched in batches."""
        out: list[tuple[bytes, bytes]] = []
        for chunk in self.lookup_batch():
            out.extend(chunk)
        return out

    @abc.abstractmethod
    def update_batch(
        self, keys: Sequence[bytes] | bytes, values: Sequence[bytes] | bytes, flags: int = 0
    ) -> int:
        """Apply updates in order; returns the count. On failure raises BatchError whose
        ``done`` says how many leading elements were applied."""

    @abc.abstractmethod
    def delete_batch(self, keys: Sequence[bytes] | bytes) -> int:
        """Delete keys in order; returns the count, or raises BatchError (``done``)."""

    def count(self) -> int:
        """Number of entries (walks the keys)."""
        return sum(1 for _ in self.keys())

    @abc.abstractmethod
    def set_inner(self, key: bytes, inner: MapBackend, flags: int = UpdateFlag.ANY) -> None:
        """Install ``inner`` under ``key`` of a map-of-maps."""

    @abc.abstractmethod
    def get_inner(self, key: bytes) -> MapBackend | None:
        """Open the inner map under ``key`` of a map-of-maps (caller closes it), or None."""

    @abc.abstractmethod
    def pin(self, path: str) -> None:
        """Pin the map at ``path`` so it outlives this process (kernel) or handle (memory)."""

    @abc.abstractmethod
    def unpin(self) -> None:
        """Remove the pin; the map lives on while handles are open."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release this handle (idempotent)."""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _error(self, op: str, err: int) -> MapError:
        return MapError(self.name, op, err)


def join_fixed(name: str, op: str, items: Sequence[bytes] | bytes, size: int) -> tuple[bytes, int]:
    """Concatenate fixed-size items (or check a pre-joined buffer); returns (buffer, count)."""
    buf = items if isinstance(items, bytes) else b"".join(items)
    if size == 0 or len(buf) % size:
        raise MapError(
            name, op, errno.EINVAL, f"buffer of {len(buf)} bytes is not a multiple of {size}"
        )
    if not isinstance(items, bytes) and len(buf) != size * len(items):
        raise MapError(name, op, errno.EINVAL, f"an element is not {size} bytes")
    return buf, len(buf) // size


def split_fixed(buf: bytes, size: int) -> list[bytes]:
    """Split a buffer into ``size``-byte chunks."""
    return [buf[i : i + size] for i in range(0, len(buf), size)]
