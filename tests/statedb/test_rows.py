"""slot_constructor and assignable_twin build the same objects as the dataclass constructor."""

from __future__ import annotations

from dataclasses import FrozenInstanceError, dataclass, field

import pytest
from hypothesis import given
from hypothesis import strategies as st

from statedb.rows import assignable_twin, slot_constructor


@dataclass(frozen=True, slots=True)
class Row:
    """A frozen slotted row with a default."""

    id: int
    name: str
    tags: tuple[str, ...] = field(default=())


new_row = slot_constructor(Row)


@given(st.integers(), st.text(), st.lists(st.text(), max_size=3).map(tuple))
def test_same_object_as_the_constructor(i: int, name: str, tags: tuple[str, ...]) -> None:
    built, expected = new_row(i, name, tags), Row(i, name, tags)
    assert built == expected and hash(built) == hash(expected) and repr(built) == repr(expected)
    with pytest.raises(FrozenInstanceError):
        built.id = 1  # type: ignore[misc]


def test_every_field_is_required_and_positional() -> None:
    with pytest.raises(TypeError):
        new_row(1, "a")  # type: ignore[call-arg]
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


_AssignableRow = assignable_twin(Row)


@given(st.integers(), st.text(), st.lists(st.text(), max_size=3).map(tuple))
def test_assignable_twin_builds_the_same_frozen_object(
    i: int, name: str, tags: tuple[str, ...]
) -> None:
    o: Row = object.__new__(_AssignableRow)
    o.id, o.name, o.tags = i, name, tags  # type: ignore[misc]
    o.__class__ = Row
    expected = Row(i, name, tags)
    assert type(o) is Row and o == expected and hash(o) == hash(expected)
    assert repr(o) == repr(expected)
    with pytest.raises(FrozenInstanceError):
        o.id = i + 1  # type: ignore[misc]
