"""The map layer's testing kit: `FaultyMap` makes a backend's operations fail at random,
reproducibly.

Used by reconciler tests (and the ``statewright run`` demo) to exercise retries: each
wrapped call fails with ``MapError(errno)`` with the given probability, drawn from a
seeded RNG.
"""

from __future__ import annotations

import errno as _errno
import random
from collections.abc import Iterator, Sequence

from bpf.backend import MapBackend
from bpf.errors import BatchError, MapError
from bpf.spec import MapInfo, UpdateFlag

ALL_OPS = frozenset(
    {
        "lookup",
        "update",
        "delete",
        "keys",
        "lookup_batch",
        "update_batch",
        "delete_batch",
        "set_inner",
        "get_inner",
    }
)


class FaultyMap(MapBackend):
    """Wraps ``inner``; failing calls raise before touching the map (batches: nothing applied)."""

    def __init__(
        self,
        inner: MapBackend,
        probability: float,
        errno: int = _errno.ENOMEM,
        seed: int = 0,
        ops: frozenset[str] = ALL_OPS,
    ) -> None:
        if not 0.0 <= probability <= 1.0:
            raise ValueError(f"probability must be in [0, 1], got {probability}")
        self.inner = inner
        self.spec = inner.spec
        self.probability = probability
        self.errno = errno
        self.ops = ops
        self.injected = 0
        self._rng = random.Random(seed)

    def _maybe_fail(self, op: str) -> None:
        if op in self.ops and self._rng.random() < self.probability:
            self.injected += 1
            if op.endswith("_batch") and op != "lookup_batch":
                raise BatchError(self.name, op, self.errno, 0)
            raise MapError(self.name, op, self.errno, "injected fault")

    @property
    def fd(self) -> int:
        """The wrapped map's handle."""
        return self.inner.fd

    @property
    def pinned_path(self) -> str | None:
        """The wrapped map's pin."""
        return self.inner.pinned_path

    def info(self) -> MapInfo:
        """The wrapped map's info (never faulted)."""
        return self.inner.info()

    def lookup(self, key: bytes) -> bytes | None:
        """Maybe fail, else delegate."""
        self._maybe_fail("lookup")
        return self.inner.lookup(key)

    def lookup_exact(self, key: bytes) -> bytes | None:
        """Maybe fail, else delegate."""
        self._maybe_fail("lookup")
        return self.inner.lookup_exact(key)

    def update(self, key: bytes, value: bytes, flags: int = UpdateFlag.ANY) -> None:
        """Maybe fail, else delegate."""
        self._maybe_fail("update")
        self.inner.update(key, value, flags)

    def delete(self, key: bytes) -> None:
        """Maybe fail, else delegate."""
        self._maybe_fail("delete")
        self.inner.delete(key)

    def keys(self) -> Iterator[bytes]:
        """Maybe fail, else delegate."""
        self._maybe_fail("keys")
        return self.inner.keys()

    def lookup_batch(self, batch_size: int = 4096) -> Iterator[list[tuple[bytes, bytes]]]:
        """Maybe fail, else delegate."""
        self._maybe_fail("lookup_batch")
        return self.inner.lookup_batch(batch_size)

    def update_batch(
        self, keys: Sequence[bytes] | bytes, values: Sequence[bytes] | bytes, flags: int = 0
    ) -> int:
        """Maybe fail (nothing applied), else delegate."""
        self._maybe_fail("update_batch")
        return self.inner.update_batch(keys, values, flags)

    def delete_batch(self, keys: Sequence[bytes] | bytes) -> int:
        """Maybe fail (nothing applied), else delegate."""
        self._maybe_fail("delete_batch")
        return self.inner.delete_batch(keys)

    def set_inner(self, key: bytes, inner: MapBackend, flags: int = UpdateFlag.ANY) -> None:
        """Maybe fail, else delegate."""
        self._maybe_fail("set_inner")
        self.inner.set_inner(key, inner, flags)

    def get_inner(self, key: bytes) -> MapBackend | None:
        """Maybe fail, else delegate."""
        self._maybe_fail("get_inner")
        return self.inner.get_inner(key)

    def pin(self, path: str) -> None:
        """Delegate."""
        self.inner.pin(path)

    def unpin(self) -> None:
        """Delegate."""
        self.inner.unpin()

    def close(self) -> None:
        """Delegate."""
        self.inner.close()
