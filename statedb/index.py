"""Index definitions: how to derive ordered bytes keys from a row, and queries on them."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import FrozenInstanceError, dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar, overload

from statedb import keys as keycodec

O = TypeVar("O")
K = TypeVar("K")


@dataclass(frozen=True, slots=True)
class Query(Generic[O]):
    """An encoded key to look up in one index of a table whose rows are of type O.

    Built by an index (`Index.query`), so a type checker rejects a query of an index over
    other rows than the table's (``Query[Host]`` on a ``Table[Zone]``). The row type is
    for type checkers only: at run time a query is its index name and key bytes.
    """

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

    if TYPE_CHECKING:
        # The constructor as type checkers see it; at run time it is the dataclass's own.
        @overload
        def __init__(
            self: Index[O, str],
            name: str,
            key: Callable[[O], str],
            *,
            encode: Callable[[str], bytes] = ...,
            unique: bool = ...,
            parse: Callable[[str], str] | None = ...,
        ) -> None: ...

        @overload
        def __init__(
            self: Index[O, str],
            name: str,
            *,
            keys: Callable[[O], Iterable[str]],
            encode: Callable[[str], bytes] = ...,
            unique: bool = ...,
            parse: Callable[[str], str] | None = ...,
        ) -> None: ...

        @overload
        def __init__(
            self,
            name: str,
            key: Callable[[O], K],
            *,
            encode: Callable[[K], bytes],
            unique: bool = ...,
            parse: Callable[[str], K] | None = ...,
        ) -> None: ...

        @overload
        def __init__(
            self,
            name: str,
            *,
            keys: Callable[[O], Iterable[K]],
            encode: Callable[[K], bytes],
            unique: bool = ...,
            parse: Callable[[str], K] | None = ...,
        ) -> None: ...

        def __init__(self, *args: Any, **kwargs: Any) -> None: ...

    def __post_init__(self) -> None:
        if (self.key is None) == (self.keys is None):
            raise ValueError(f"index {self.name!r}: give exactly one of key= or keys=")

    def keys_of(self, obj: O) -> list[bytes]:
        """Return the encoded keys of ``obj`` in this index."""
        if self.key is not None:
            return [self.encode(self.key(obj))]
        assert self.keys is not None
        return [self.encode(k) for k in self.keys(obj)]

    def query(self, value: K) -> Query[O]:
        """Return a query for the key ``value``."""
        return Query(self.name, self.encode(value))

    def query_bytes(self, key: bytes) -> Query[O]:
        """Return a query for an already-encoded key (e.g. a partial key for prefix search)."""
        return Query(self.name, key)

    def query_str(self, text: str) -> Query[O]:
        """Return a query from a command-line string (uses ``parse``, else the text as is)."""
        value: Any = self.parse(text) if self.parse is not None else text
        return Query(self.name, self.encode(value))


def _refuse_assignment(self: object, name: str, value: Any) -> None:
    raise FrozenInstanceError(f"cannot assign to field {name!r}")


def _refuse_deletion(self: object, name: str) -> None:
    raise FrozenInstanceError(f"cannot delete field {name!r}")


# A frozen dataclass with slots refuses assignments through a method bound to the class as
# it was before slots were added, which on Python 3.11 raises TypeError (not AttributeError)
# for a name that is not a field. Subscripted construction, ``Index[Host, str](...)``, sets
# ``__orig_class__`` on the new object and ignores only AttributeError, so it failed: these
# refuse every assignment with FrozenInstanceError, an AttributeError, as dataclasses mean.
for _cls in (Query, Index):
    _cls.__setattr__ = _refuse_assignment  # type: ignore[method-assign]
    _cls.__delattr__ = _refuse_deletion  # type: ignore[method-assign]
