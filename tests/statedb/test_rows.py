"""slot_constructor, slot_builder and assignable_twin build the same objects as the
classes' own constructors."""

from __future__ import annotations

import copy
import dataclasses
import pickle
import sys
import weakref
from dataclasses import FrozenInstanceError, dataclass, field
from typing import Any, Generic, TypeVar

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from statedb.rows import FrozenValue, assignable_twin, slot_builder, slot_constructor, slot_setters

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Row:
    """A frozen slotted row with a default."""

    id: int
    name: str
    tags: tuple[str, ...] = field(default=())


new_row = slot_constructor(Row)

_values = st.one_of(st.integers(), st.text(max_size=5), st.none(), st.tuples(st.integers()))


def _same_object(built: Any, expected: Any) -> None:
    """``built`` is indistinguishable from ``expected``, built by the class itself."""
    assert built.__class__ is expected.__class__ and type(built) is type(expected)
    assert built == expected and (built != expected) is False
    assert hash(built) == hash(expected) and repr(built) == repr(expected)
    assert sys.getsizeof(built) == sys.getsizeof(expected)
    for proto in range(pickle.HIGHEST_PROTOCOL + 1):
        again = pickle.loads(pickle.dumps(built, proto))
        assert type(again) is type(expected) and again == expected
    assert copy.copy(built) == expected and copy.deepcopy(built) == expected


@settings(max_examples=200, deadline=None)
@given(st.integers(), st.text(), st.lists(st.text(), max_size=3).map(tuple))
def test_same_object_as_the_constructor(i: int, name: str, tags: tuple[str, ...]) -> None:
    built, expected = new_row(i, name, tags), Row(i, name, tags)
    _same_object(built, expected)
    assert dataclasses.astuple(built) == (i, name, tags)
    assert dataclasses.replace(built, id=i + 1) == Row(i + 1, name, tags)
    with pytest.raises(FrozenInstanceError):
        built.id = 1  # type: ignore[misc]
    with pytest.raises(FrozenInstanceError):
        del built.name  # type: ignore[misc]
    assert built.id == i


def test_every_field_is_required_and_positional() -> None:
    with pytest.raises(TypeError):
        new_row(1, "a")  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        new_row(id=1, name="a", tags=(), _cls=Row)  # type: ignore[call-arg]
    assert new_row.__name__ == "new_row"


def test_rejects_classes_without_slots() -> None:
    @dataclass(frozen=True)
    class Plain:
        x: int

    with pytest.raises(TypeError, match="Plain is not a slotted dataclass"):
        slot_constructor(Plain)


def test_extra_positional_arguments_are_refused() -> None:
    with pytest.raises(TypeError):
        new_row(1, "a", (), "extra")  # type: ignore[call-arg]


@dataclass(frozen=True, slots=True)
class Awkward:
    """Fields named as the generated code's own names."""

    o: Any
    _cls: Any
    _twin: Any
    _new: Any
    o_: Any = None


@settings(max_examples=100, deadline=None)
@given(_values, _values, _values, _values, _values)
def test_field_names_of_the_generated_code(a: Any, b: Any, c: Any, d: Any, e: Any) -> None:
    _same_object(slot_constructor(Awkward)(a, b, c, d, e), Awkward(a, b, c, d, e))


@dataclass(slots=True)
class Mutable:
    """A slotted dataclass that is not frozen: it stays assignable."""

    x: int
    y: list[int]


@dataclass(frozen=True, slots=True, weakref_slot=True)
class Referenced:
    """A frozen row that can be weakly referenced."""

    x: int


@dataclass(frozen=True, slots=True)
class Base:
    """A slotted base."""

    a: int


@dataclass(frozen=True, slots=True)
class Derived(Base):
    """A slotted subclass: its slots and its base's."""

    b: str


@dataclass(frozen=True, slots=True)
class Box(Generic[T]):
    """A generic row, as `statedb.index.Query` is."""

    value: T


@dataclass(frozen=True, slots=True)
class WithNew:
    """A row whose class defines __new__: the constructor bypasses it, as before."""

    x: int

    def __new__(cls, *args: Any) -> WithNew:
        raise AssertionError("not called")


@settings(max_examples=100, deadline=None)
@given(st.integers(), st.text(max_size=5))
def test_other_kinds_of_slotted_dataclasses(i: int, s: str) -> None:
    m = slot_constructor(Mutable)(i, [i])
    assert type(m) is Mutable and m == Mutable(i, [i])
    m.x = i + 1
    assert m.x == i + 1
    r = slot_constructor(Referenced)(i)
    _same_object(r, Referenced(i))
    assert weakref.ref(r)() is r
    _same_object(slot_constructor(Derived)(i, s), Derived(i, s))
    _same_object(slot_constructor(Box)(s), Box(s))
    w = slot_constructor(WithNew)(i)
    assert type(w) is WithNew and w.x == i


class Pair(FrozenValue):
    """A compact row: two fields in one slot."""

    __slots__ = ("_both", "extra")
    __match_args__ = ("a", "b", "extra")

    @property
    def a(self) -> Any:
        return self._both[0]

    @property
    def b(self) -> Any:
        return self._both[1]

    def _fields(self) -> tuple[Any, ...]:
        return (*self._both, self.extra)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_pair, self._fields())


def _pair(a: Any, b: Any, extra: Any) -> Pair:
    o = object.__new__(Pair)
    set_both, set_extra = slot_setters(Pair, "_both", "extra")
    set_both(o, (a, b))
    set_extra(o, extra)
    return o


new_pair = slot_builder(Pair, "_both", "extra")


@settings(max_examples=200, deadline=None)
@given(_values, _values, _values)
def test_slot_builder_builds_what_the_setters_build(a: Any, b: Any, extra: Any) -> None:
    built, expected = new_pair((a, b), extra), _pair(a, b, extra)
    _same_object(built, expected)
    with pytest.raises(FrozenInstanceError):
        built.extra = 1
    with pytest.raises(FrozenInstanceError):
        del built.extra
    # In the order given, whatever the order of __slots__.
    _same_object(slot_builder(Pair, "extra", "_both")(extra, (a, b)), expected)


def test_slot_builder_leaves_the_other_slots_unset() -> None:
    o = slot_builder(Pair, "extra", name="only_extra")(1)
    assert type(o) is Pair and o.extra == 1
    with pytest.raises(AttributeError):
        o._both  # noqa: B018
    assert slot_builder(Pair, "extra", name="only_extra").__name__ == "only_extra"
    assert new_pair.__name__ == "new_pair"


def test_slot_builder_refuses_unknown_and_repeated_slots() -> None:
    with pytest.raises(TypeError, match="Pair has no slot 'a'"):
        slot_builder(Pair, "a")  # a property, not a slot
    with pytest.raises(TypeError, match="named twice"):
        slot_builder(Pair, "extra", "extra")
    with pytest.raises(TypeError):
        new_pair(1)  # type: ignore[call-arg]


_AssignableRow = assignable_twin(Row)


@settings(max_examples=200, deadline=None)
@given(st.integers(), st.text(), st.lists(st.text(), max_size=3).map(tuple))
def test_assignable_twin_builds_the_same_frozen_object(
    i: int, name: str, tags: tuple[str, ...]
) -> None:
    for o in (_AssignableRow(), object.__new__(_AssignableRow)):
        o.id, o.name, o.tags = i, name, tags  # type: ignore[misc]
        o.__class__ = Row
        expected = Row(i, name, tags)
        _same_object(o, expected)
        with pytest.raises(FrozenInstanceError):
            o.id = i + 1  # type: ignore[misc]


def test_assignable_twin_takes_no_arguments() -> None:
    with pytest.raises(TypeError):
        _AssignableRow(1, "a")  # type: ignore[call-arg]
