"""Map specifications: what a map is (name, type, codecs, capacity, flags, inner map)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace
from typing import Any, Generic, TypeVar

from bpf.codec import Codec

K = TypeVar("K")
V = TypeVar("V")


class MapType(enum.IntEnum):
    """The kernel's ``enum bpf_map_type`` values this layer supports."""

    HASH = 1
    ARRAY = 2
    LRU_HASH = 9
    LPM_TRIE = 11
    ARRAY_OF_MAPS = 12
    HASH_OF_MAPS = 13


class MapFlag(enum.IntFlag):
    """Map creation flags (``map_flags``)."""

    NONE = 0
    NO_PREALLOC = 1  # BPF_F_NO_PREALLOC


class UpdateFlag(enum.IntEnum):
    """Element update flags: create or replace, create only, replace only."""

    ANY = 0  # BPF_ANY
    NOEXIST = 1  # BPF_NOEXIST
    EXIST = 2  # BPF_EXIST


MAP_OF_MAPS = frozenset({MapType.HASH_OF_MAPS, MapType.ARRAY_OF_MAPS})


@dataclass(frozen=True, slots=True)
class MapInfo:
    """What a live map reports about itself (kernel ``bpf_map_info`` or its memory twin).

    ``btf_id`` is the kernel id of the BTF describing the key and value (0: none, always
    for memory maps); it is informational and not part of the layout comparison.
    """

    type: int
    key_size: int
    value_size: int
    max_entries: int
    flags: int
    name: str = ""
    id: int = 0
    btf_id: int = 0


@dataclass(frozen=True, slots=True)
class MapSpec(Generic[K, V]):
    """A map to create or open: layout via codecs, capacity, flags, and inner map for map-in-map.

    For map-of-maps the value codec is u32 (the inner map fd on update, id on lookup)
    and ``inner`` describes the inner maps.
    """

    name: str
    type: MapType
    key: Codec[K]
    value: Codec[V]
    max_entries: int
    flags: int = 0
    inner: MapSpec[Any, Any] | None = None

    @property
    def key_size(self) -> int:
        """Key size in bytes."""
        return self.key.size

    @property
    def value_size(self) -> int:
        """Value size in bytes."""
        return self.value.size

    def resized(self, max_entries: int) -> MapSpec[K, V]:
        """The same map with another capacity."""
        return replace(self, max_entries=max_entries)

    def renamed(self, name: str) -> MapSpec[K, V]:
        """The same map under another name (tests, benchmarks)."""
        return replace(self, name=name)

    def expected_info(self) -> MapInfo:
        """The MapInfo a compatible live map must report."""
        return MapInfo(self.type, self.key_size, self.value_size, self.max_entries, self.flags)

    def mismatch(self, info: MapInfo) -> str | None:
        """Why a live map is incompatible with this spec, or None when it matches."""
        diffs = []
        for attr in ("type", "key_size", "value_size", "max_entries", "flags"):
            want, have = getattr(self.expected_info(), attr), getattr(info, attr)
            if want != have:
                diffs.append(f"{attr} {have} (want {want})")
        return ", ".join(diffs) or None
