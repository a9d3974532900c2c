"""KeyedMapOps: what the endpoint and ipcache Operations share: one map entry per row, found
by a key computed from the row; an update that reads first and writes only an entry that
differs (so a restarted agent whose rows still match the pinned map rewrites nothing;
``writes``/``skipped`` count both); deletes that tolerate an absent entry; a prune that
deletes every key no row explains. Subclasses say how a row becomes a key (``key_of``) and a
value (``value_of``) and how it is named in errors (``describe``); one whose map cannot
always tell its stored entry by a lookup overrides ``stored``. A map error is raised as
``bpfops.errors.KeyedMapError`` naming the map, the operation, the row and the key.
"""

from __future__ import annotations

import errno as errno_mod
from collections.abc import Iterator
from typing import Any, Generic, TypeVar

from bpf.errors import MapError
from bpf.typed_map import TypedMap
from bpfops.errors import KeyedMapError
from statedb import ReadTxn

R = TypeVar("R")


class KeyedMapOps(Generic[R]):
    """Delete and prune for a map with one entry per row (see the module doc)."""

    def __init__(self, bpf_map: TypedMap[Any, Any]) -> None:
        self.map = bpf_map
        self.writes = 0
        self.skipped = 0
        self.deletes = 0

    def key_of(self, obj: R) -> Any:
        """The map key of a row."""
        raise NotImplementedError

    def value_of(self, obj: R) -> Any:
        """The map value of a row."""
        raise NotImplementedError

    def describe(self, obj: R) -> str:
        """The row as errors name it."""
        raise NotImplementedError

    def stored(self, key: Any) -> Any:
        """The entry stored under ``key``, or None when absent (or when it cannot be told)."""
        return self.map.lookup(key)

    def update(self, txn: ReadTxn, revision: int, obj: R) -> None:
        """Write the entry of ``obj`` unless the map already holds exactly it."""
        key, value = self.key_of(obj), self.value_of(obj)
        try:
            if self.stored(key) == value:
                self.skipped += 1
                return
            self.map.update(key, value)
        except MapError as e:
            raise KeyedMapError(self.map.name, "update", self.describe(obj), key, e) from e
        self.writes += 1

    def delete(self, txn: ReadTxn, revision: int, obj: R) -> None:
        """Delete the entry of ``obj``; an absent entry is fine."""
        key = self.key_of(obj)
        try:
            self.map.delete(key)
        except MapError as e:
            if e.errno == errno_mod.ENOENT:
                return
            raise KeyedMapError(self.map.name, "delete", self.describe(obj), key, e) from e
        self.deletes += 1

    def prune(self, txn: ReadTxn, objects: Iterator[R]) -> None:
        """Delete every map entry that no row explains."""
        want = {self.key_of(o) for o in objects}
        try:
            stray = [k for k in self.map if k not in want]
        except MapError as e:
            raise KeyedMapError(self.map.name, "prune (iterate)", "", None, e) from e
        for key in stray:
            try:
                self.map.delete(key)
                self.deletes += 1
            except MapError as e:
                if e.errno != errno_mod.ENOENT:
                    raise KeyedMapError(self.map.name, "prune", repr(key), key, e) from e
