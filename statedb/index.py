"""Index definitions: how to derive ordered bytes keys from a row, and queries on them."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from statedb import keys as keycodec

O = TypeVar("O")
K = TypeVar("K")


@dataclass(frozen=True, slots=True)
class Query:
    """An encoded key to look up in one index of a table."""

    index: str
    key: bytes


@dataclass(frozen=True, slots=True, eq=False)
class Index(Generic[O, K]):
    """An index over rows of type O with key values of type K.

    Give ``key`` for one key per row or ``keys`` for several (a multi-key index,
    e.g. tags). ``encode`` turns a key value into ordered bytes (see statedb.keys); the
    default, ``keys.string``, takes ``str`` keys only: give any other key type its encoder
    (``encode=keys.uint64`` for ints), else the first insert raises ``keys.KeyTypeError``;
    ``parse`` turns a command-line string into a key value. The primary index of a
    table must be unique and single-key.
    """

    name: str
    key: Callable[[O], K] | None = None
    keys: Callable[[O], Iterable[K]] | None = None
    encode: Callable[[K], bytes] = keycodec.string  # type: ignore[assignment]
    unique: bool = True
    parse: Callable[[str], K] | None = None

    def __post_init__(self) -> None:
        if (self.key is None) == (self.keys is None):
            raise ValueError(f"index {self.name!r}: give exactly one of key= or keys=")

    def keys_of(self, obj: O) -> list[bytes]:
        """Return the encoded keys of ``obj`` in this index."""
        if self.key is not None:
            return [self.encode(self.key(obj))]
        assert self.keys is not None
        return [self.encode(k) for k in self.keys(obj)]

    def query(self, value: K) -> Query:
        """Return a query for the key ``value``."""
        return Query(self.name, self.encode(value))

    def query_bytes(self, key: bytes) -> Query:
        """Return a query for an already-encoded key (e.g. a partial key for prefix search)."""
        return Query(self.name, key)

    def query_str(self, text: str) -> Query:
        """Return a query from a command-line string (uses ``parse``, else the text as is)."""
        value: Any = self.parse(text) if self.parse is not None else text
        return Query(self.name, self.encode(value))
