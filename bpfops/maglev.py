"""Maglev consistent hashing, computed the way Cilium computes it (same table for the same input).

The datapath hashes a flow's 5-tuple to a slot of a per-service lookup table of prime
size M and sends it to the backend id stored there. Building the table (Eisenbud et
al., "Maglev", NSDI 2016):

* Every backend is named by a stable *hash string*, ``[<ip>:<port>/<PROTO>,State:active]``
  (IPv6 in brackets, ``/i`` before the comma for internal scope). Names, not node-local
  ids, feed the hash, so every node computes the same table.
* MurmurHash3 x64-128 of the name, seeded with the first four bytes (big endian) of the
  base64 cluster seed, gives ``(h1, h2)``; the backend's permutation of the slots starts
  at ``h1 % M`` and steps by ``h2 % (M - 1) + 1``.
* Backends are sorted by name and take turns (round robin over ``n = 0..M-1``); in its
  turn a backend takes the next slot of its permutation that is still empty.
* Weights: when the mean weight exceeds 1, a backend whose running counter (starting at
  ``weight / N`` and growing by the weight sum each time it takes a slot) is ahead of
  ``(n + 1) * weight`` passes its turn to the next backend. Slot counts come out
  proportional to the weights. Equal weights give plain round robin.
"""

from __future__ import annotations

import base64
import ipaddress
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

DEFAULT_TABLE_SIZE = 16381
DEFAULT_HASH_SEED = "JLfvgnHc2kaSUFaI"
SUPPORTED_TABLE_SIZES = (251, 509, 1021, 2039, 4093, 8191, 16381, 32749, 65521, 131071)
DEFAULT_WEIGHT = 100

_M64 = 0xFFFF_FFFF_FFFF_FFFF
_C1 = 0x87C37B91114253D5
_C2 = 0x4CF5AD432745937F


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (64 - r))) & _M64


def _fmix(k: int) -> int:
    k ^= k >> 33
    k = (k * 0xFF51AFD7ED558CCD) & _M64
    k ^= k >> 33
    k = (k * 0xC4CEB9FE1A85EC53) & _M64
    k ^= k >> 33
    return k


def murmur3_128(data: bytes, seed: int) -> tuple[int, int]:
    """MurmurHash3 x64 128-bit of ``data`` (little-endian blocks) as ``(h1, h2)``."""
    h1 = h2 = seed & 0xFFFF_FFFF
    n = len(data)
    nblocks = n // 16
    for i in range(nblocks):
        k1 = int.from_bytes(data[i * 16 : i * 16 + 8], "little")
        k2 = int.from_bytes(data[i * 16 + 8 : i * 16 + 16], "little")
        k1 = (_rotl((k1 * _C1) & _M64, 31) * _C2) & _M64
        h1 ^= k1
        h1 = (_rotl(h1, 27) + h2) & _M64
        h1 = (h1 * 5 + 0x52DCE729) & _M64
        k2 = (_rotl((k2 * _C2) & _M64, 33) * _C1) & _M64
        h2 ^= k2
        h2 = (_rotl(h2, 31) + h1) & _M64
        h2 = (h2 * 5 + 0x38495AB5) & _M64
    tail = data[nblocks * 16 :]
    if len(tail) > 8:
        k2 = int.from_bytes(tail[8:], "little")
        h2 ^= (_rotl((k2 * _C2) & _M64, 33) * _C1) & _M64
    if tail:
        k1 = int.from_bytes(tail[:8], "little")
        h1 ^= (_rotl((k1 * _C1) & _M64, 31) * _C2) & _M64
    h1 ^= n
    h2 ^= n
    h1 = (h1 + h2) & _M64
    h2 = (h2 + h1) & _M64
    h1 = _fmix(h1)
    h2 = _fmix(h2)
    h1 = (h1 + h2) & _M64
    h2 = (h2 + h1) & _M64
    return h1, h2


def seed_from_base64(seed: str) -> int:
    """The murmur seed of a base64 cluster seed (12 bytes; the first four, big endian).

    Raises ValueError naming the seed when it is not base64 of exactly 12 bytes.
    """
    try:
        raw = base64.b64decode(seed, validate=True)
    except ValueError as exc:
        raise ValueError(f"maglev hash seed {seed!r}: not base64: {exc}") from None
    if len(raw) != 12:
        raise ValueError(f"maglev hash seed {seed!r}: decodes to {len(raw)} bytes, need 12")
    return int.from_bytes(raw[:4], "big")


def check_table_size(m: int) -> int:
    """``m`` when it is one of the supported prime sizes; ValueError otherwise."""
    if m not in SUPPORTED_TABLE_SIZES:
        raise ValueError(
            f"maglev table size {m} is not supported; use one of {list(SUPPORTED_TABLE_SIZES)}"
        )
    return m


def hash_string(ip: str, port: int, protocol: str, internal: bool = False) -> str:
    """The stable name of a backend that the permutation is derived from."""
    addr = ipaddress.ip_address(ip)
    host = f"[{addr}]" if addr.version == 6 else str(addr)
    scope = "/i" if internal else ""
    return f"[{host}:{port}/{protocol}{scope},State:active]"


@dataclass(frozen=True, slots=True)
class MaglevBackend:
    """One backend as maglev sees it: its id (what the table holds), name and weight."""

    id: int
    name: str
    weight: int = DEFAULT_WEIGHT


class Maglev:
    """Computes lookup tables of size ``table_size`` with the given cluster seed."""

    __slots__ = ("_perm_cache", "seed", "seed_murmur", "table_size")

    def __init__(self, table_size: int = DEFAULT_TABLE_SIZE, seed: str = DEFAULT_HASH_SEED) -> None:
        self.table_size = check_table_size(table_size)
        self.seed = seed
        self.seed_murmur = seed_from_base64(seed)
        self._perm_cache: dict[str, tuple[int, int]] = {}

    def offset_and_skip(self, name: str) -> tuple[int, int]:
        """Start slot and step of ``name``'s permutation (cached per name)."""
        hit = self._perm_cache.get(name)
        if hit is not None:
            return hit
        m = self.table_size
        h1, h2 = murmur3_128(name.encode(), self.seed_murmur)
        result = (h1 % m, h2 % (m - 1) + 1)
        if len(self._perm_cache) > 65536:
            self._perm_cache.clear()
        self._perm_cache[name] = result
        return result

    def lookup_table(self, backends: Iterable[MaglevBackend]) -> list[int]:
        """The table (``table_size`` backend ids); empty when there are no backends."""
        bes: Sequence[MaglevBackend] = sorted(backends, key=lambda b: b.name)
        count = len(bes)
        if count == 0:
            return []
        m = self.table_size
        offsets: list[int] = []
        skips: list[int] = []
        for be in bes:
            off, skip = self.offset_and_skip(be.name)
            offsets.append(off)
            skips.append(skip)
        weights = [be.weight for be in bes]
        weight_sum = sum(weights)
        weighted = weight_sum // count > 1
        counters = [w / count for w in weights]
        nxt = [0] * count
        ids = [be.id for be in bes]
        empty = -1
        entry = [empty] * m
        for n in range(m):
            i = n % count
            if weighted:
                while (n + 1) * weights[i] < int(counters[i]):
                    i = (i + 1) % count
                counters[i] += weight_sum
            off, skip, j = offsets[i], skips[i], nxt[i]
            c = (off + j * skip) % m
            while entry[c] != empty:
                j += 1
                c = (off + j * skip) % m
            entry[c] = ids[i]
            nxt[i] = j + 1
        return entry


def slot_counts(table: Iterable[int]) -> list[tuple[int, int]]:
    """(backend id, slots) pairs, most slots first, then by id: the dump's MAGLEV order."""
    counts: dict[int, int] = {}
    for be_id in table:
        counts[be_id] = counts.get(be_id, 0) + 1
    return sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
