"""Fast constructors for frozen, slotted dataclass rows, and a base for compact rows.

A frozen dataclass's ``__init__`` assigns every field through ``object.__setattr__``,
which costs about as much as the rest of building a small row. Loaders that build
thousands of rows per transaction can use `slot_constructor` instead: it returns a
function taking every field positionally, in declaration order, that fills the slots
through their descriptors. The object is the same as the dataclass would build; no
``__post_init__`` runs and no default applies, so the caller passes already valid values.

Rows kept by the hundred thousand are often held more compactly than a dataclass would
(a shared tuple for fields many rows have alike, one slot for two fields): `FrozenValue`
gives such a class a frozen dataclass's value semantics over its fields, and
`slot_setters` the functions that fill its slots.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from operator import attrgetter
from typing import Any, ClassVar, TypeVar

T = TypeVar("T")


def slot_constructor(cls: type[T], name: str | None = None) -> Callable[..., T]:
    """Return ``new(field1, field2, ...) -> cls`` filling the slots of dataclass ``cls``.

    ``cls`` must be a slotted dataclass (``@dataclass(slots=True)``, frozen or not).
    """
    if not dataclasses.is_dataclass(cls) or "__slots__" not in cls.__dict__:
        raise TypeError(f"{cls.__name__} is not a slotted dataclass")
    names = [f.name for f in dataclasses.fields(cls)]
    fn_name = name or f"new_{cls.__name__.lower()}"
    ns: dict[str, Any] = {"_new": object.__new__, "_cls": cls}
    for i, n in enumerate(names):
        ns[f"_s{i}"] = cls.__dict__[n].__set__
    setters = "".join(f", _s{i}=_s{i}" for i in range(len(names)))
    body = "".join(f"    _s{i}(o, {n})\n" for i, n in enumerate(names))
    src = (
        f"def {fn_name}({', '.join(names)}, *, _new=_new, _cls=_cls{setters}):\n"
        "    o = _new(_cls)\n" + body + "    return o\n"
    )
    exec(compile(src, f"<{fn_name}>", "exec"), ns)
    fn: Callable[..., T] = ns[fn_name]
    fn.__doc__ = f"Build a {cls.__name__} from every field, positionally ({', '.join(names)})."
    return fn


class FrozenValue:
    """Base of immutable, slotted row classes that hold their fields in a compact form.

    A row class that packs its fields (shared tuples, an int for a string, one slot for
    two fields) still behaves as a frozen dataclass of its fields: a subclass lists them in
    ``__match_args__`` (or names a dataclass of them with ``fields=``, which also gives
    ``dataclasses.fields``/``replace``/``asdict`` their list), returns their values in that
    order from ``_fields`` and sets its slots through `slot_setters` (assignment raises
    ``dataclasses.FrozenInstanceError``). This class gives it ``__repr__`` and pickling from
    ``_fields``, and, unless the subclass defines its own, ``__eq__`` and ``__hash__`` over
    its slots: the stored form must then be canonical (equal fields, equal slots).
    """

    __slots__ = ()
    __match_args__: ClassVar[tuple[str, ...]] = ()

    def __init_subclass__(cls, fields: type | None = None, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if fields is not None:
            cls.__dataclass_fields__ = fields.__dataclass_fields__  # type: ignore[attr-defined]
            cls.__match_args__ = tuple(  # type: ignore[misc]
                f.name for f in dataclasses.fields(fields)
            )
        if "__eq__" in cls.__dict__:
            return
        names = [n for n in cls.__dict__.get("__slots__", ()) if n != "__weakref__"]
        if not names:
            return
        stored = attrgetter(*names)

        def __eq__(self: Any, other: object) -> bool:
            if other.__class__ is not self.__class__:
                return NotImplemented
            return stored(self) == stored(other)

        def __hash__(self: Any) -> int:
            return hash(stored(self))

        cls.__eq__ = __eq__  # type: ignore[method-assign]
        cls.__hash__ = __hash__  # type: ignore[method-assign]

    def _fields(self) -> tuple[Any, ...]:
        """Every field's value, in ``__match_args__`` order."""
        raise NotImplementedError

    def __setattr__(self, name: str, value: Any) -> None:
        raise dataclasses.FrozenInstanceError(f"cannot assign to field {name!r}")

    def __delattr__(self, name: str) -> None:
        raise dataclasses.FrozenInstanceError(f"cannot delete field {name!r}")

    def __repr__(self) -> str:
        parts = ", ".join(
            f"{name}={value!r}" for name, value in zip(self.__match_args__, self._fields())
        )
        return f"{type(self).__name__}({parts})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), self._fields())


def slot_setters(cls: type, *names: str) -> tuple[Callable[[Any, Any], None], ...]:
    """The ``__set__`` of each named slot of ``cls``: how a `FrozenValue` (or any frozen
    slotted class) fills its slots, bypassing its refusing ``__setattr__``."""
    return tuple(cls.__dict__[n].__set__ for n in names)


def assignable_twin(cls: type[T]) -> type[T]:
    """A subclass of the frozen, slotted ``cls`` whose slots plain assignment fills.

    A loader that builds many rows makes one with ``object.__new__(twin)``, assigns each
    slot (a plain store is about a tenth of a call of the slot's ``__set__``) and then
    sets ``__class__`` to ``cls``: the twin adds no slot, so the layouts are the same and
    the object is exactly what ``cls`` would have built. No ``__post_init__`` runs and no
    default applies: the caller assigns every slot, already valid."""
    ns: dict[str, Any] = {
        "__slots__": (),
        # Both: together they are the type's one attribute-setting slot, then the
        # generic one (which plain stores to slots take at C speed).
        "__setattr__": object.__setattr__,
        "__delattr__": object.__delattr__,
        "__doc__": f"A {cls.__name__} under construction (see `assignable_twin`).",
    }
    return type(f"_Assignable{cls.__name__}", (cls,), ns)
