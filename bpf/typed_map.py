"""TypedMap: a backend seen through its spec's codecs (dataclasses in, dataclasses out)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Generic, TypeVar

from bpf.backend import MapBackend
from bpf.spec import MapSpec, UpdateFlag

K = TypeVar("K")
V = TypeVar("V")


class TypedMap(Generic[K, V]):
    """Encodes keys/values with the spec's codecs around a byte-level backend.

    The encoders are bound once so single operations cost one codec call each plus
    the backend call.
    """

    __slots__ = ("_be", "_dk", "_dv", "_ek", "_ev", "backend", "spec")

    def __init__(self, spec: MapSpec[K, V], backend: MapBackend) -> None:
        self.spec = spec
        self.backend = backend
        self._ek = spec.key.encode
        self._ev = spec.value.encode
        self._dk = spec.key.decode
        self._dv = spec.value.decode
        self._be = backend

    @property
    def name(self) -> str:
        """The map's name."""
        return self.spec.name

    def lookup(self, key: K) -> V | None:
        """The value for ``key`` (longest prefix for LPM tries), or None."""
        raw = self._be.lookup(self._ek(key))
        return None if raw is None else self._dv(raw)

    def update(self, key: K, value: V, flags: int = UpdateFlag.ANY) -> None:
        """Create or replace per ``flags``."""
        self._be.update(self._ek(key), self._ev(value), flags)

    def delete(self, key: K) -> None:
        """Delete ``key`` (MapError ENOENT if absent)."""
        self._be.delete(self._ek(key))

    def keys(self) -> Iterator[K]:
        """All keys."""
        return map(self._dk, self._be.keys())

    def __iter__(self) -> Iterator[K]:
        return self.keys()

    def items(self) -> Iterator[tuple[K, V]]:
        """All entries (one lookup per key)."""
        dk, dv = self._dk, self._dv
        for k, v in self._be.items():
            yield dk(k), dv(v)

    def dump(self) -> list[tuple[K, V]]:
        """All entries, fetched with batch lookups and decoded in bulk."""
        out: list[tuple[K, V]] = []
        key_codec, value_codec = self.spec.key, self.spec.value
        for kraw, vraw in self._be.dump_chunks():
            out.extend(zip(key_codec.decode_many(kraw), value_codec.decode_many(vraw)))
        return out

    def chunks(self, batch_size: int = 4096) -> Iterator[list[tuple[K, V]]]:
        """All entries in decoded chunks of up to ``batch_size``, read as they are asked
        for (a hash map's batch lookup resumes by bucket, so entries written or deleted
        between two chunks do not derail it)."""
        key_codec, value_codec = self.spec.key, self.spec.value
        for kraw, vraw in self._be.dump_chunks(batch_size):
            yield list(zip(key_codec.decode_many(kraw), value_codec.decode_many(vraw)))

    def update_batch(self, keys: Iterable[K], values: Iterable[V], flags: int = 0) -> int:
        """Batch update (BatchError.done tells how many leading entries were applied)."""
        return self._be.update_batch(
            self.spec.key.encode_many(keys), self.spec.value.encode_many(values), flags
        )

    def delete_batch(self, keys: Iterable[K]) -> int:
        """Batch delete (BatchError.done on partial failure)."""
        return self._be.delete_batch(self.spec.key.encode_many(keys))

    def count(self) -> int:
        """Number of entries."""
        return self._be.count()

    def set_inner(self, key: K, inner: TypedMap[Any, Any], flags: int = UpdateFlag.ANY) -> None:
        """Install an inner map (map-of-maps)."""
        self._be.set_inner(self._ek(key), inner.backend, flags)

    def get_inner(self, key: K) -> TypedMap[Any, Any] | None:
        """Open the inner map under ``key`` (close it with ``.close()``), or None."""
        inner = self._be.get_inner(self._ek(key))
        if inner is None:
            return None
        return TypedMap(inner.spec, inner)

    def close(self) -> None:
        """Close the backend handle."""
        self._be.close()

    def __enter__(self) -> TypedMap[K, V]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def typed(spec: MapSpec[K, V], backend: MapBackend) -> TypedMap[K, V]:
    """Shorthand for TypedMap(spec, backend)."""
    return TypedMap(spec, backend)


def pairs(items: Sequence[tuple[K, V]]) -> tuple[list[K], list[V]]:
    """Split (key, value) pairs into two lists for update_batch."""
    return [k for k, _ in items], [v for _, v in items]
