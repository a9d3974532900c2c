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

from statedb import rowbuild

T = TypeVar("T")


def slot_constructor(cls: type[T], name: str | None = None) -> Callable[..., T]:
    """Return ``new(field1, field2, ...) -> cls`` filling the slots of dataclass ``cls``.

    ``cls`` must be a slotted dataclass (``@dataclass(slots=True)``, frozen or not).
    The function builds the object as `slot_builder` does, over every field.
    """
    if not dataclasses.is_dataclass(cls) or "__slots__" not in cls.__dict__:
        raise TypeError(f"{cls.__name__} is not a slotted dataclass")
    names = [f.name for f in dataclasses.fields(cls)]
    fn = _builder(cls, names, name or f"new_{cls.__name__.lower()}")
    fn.__doc__ = f"Build a {cls.__name__} from every field, positionally ({', '.join(names)})."
    return fn


def slot_builder(cls: type[T], *slots: str, name: str | None = None) -> Callable[..., T]:
    """Return ``new(value1, value2, ...) -> cls`` that fills the named slots of ``cls``, in
    the order given, and leaves its other slots unset.

    For row classes that are not dataclasses (a `FrozenValue` holding its fields in a
    compact form): one call instead of ``object.__new__`` and one `slot_setters` setter
    per slot, at about a third of their cost. As with `slot_constructor`, no
    ``__init__`` or ``__post_init__`` runs: the caller passes already valid values.
    """
    for s in slots:
        if type(getattr(cls, s, None)) is not _MEMBER:
            raise TypeError(f"{cls.__name__} has no slot {s!r}")
    if len(set(slots)) != len(slots):
        raise TypeError(f"{cls.__name__}: slots named twice: {slots}")
    fn = _builder(cls, list(slots), name or f"new_{cls.__name__.lower()}")
    fn.__doc__ = f"Build a {cls.__name__} from its slots, positionally ({', '.join(slots)})."
    return fn


_MEMBER = type(type("_Probe", (), {"__slots__": ("x",)}).__dict__["x"])


def _builder(cls: type[T], slots: list[str], fn_name: str) -> Callable[..., T]:
    """``fn_name(*slots)``: `statedb.rowbuild`'s compiled row builder when it is built
    (it stores each value at its slot's offset in a new ``cls``: about a fifth of the
    cost), else `_python_builder`'s."""
    make = rowbuild.row_builder
    if make is not None:
        built: Callable[..., T] = make(cls, tuple(getattr(cls, s) for s in slots), fn_name)
        return built
    return _python_builder(cls, slots, fn_name)


def _python_builder(cls: type[T], slots: list[str], fn_name: str) -> Callable[..., T]:
    """Compile ``fn_name(*slots)``: make an empty `assignable_twin` of ``cls``, store each
    slot (a plain attribute store, which the interpreter specialises to a direct slot
    write), then turn the object into a ``cls`` by assigning ``__class__``."""
    twin = assignable_twin(cls)
    # Names the generated code uses besides the parameters, chosen not to be one of them.
    taken = set(slots)
    obj, twin_name, cls_name, new_name = (_free(n, taken) for n in ("o", "_twin", "_cls", "_new"))
    # ``twin()`` takes object's own __new__ and __init__ (see `assignable_twin`) unless a
    # class of ``cls``'s defines its own __new__, which ``object.__new__`` bypasses.
    own_new = cls.__new__ is not object.__new__
    make = f"{new_name}({twin_name})" if own_new else f"{twin_name}()"
    # The twin and the class are the function's globals, not keyword-only defaults: a
    # function with keyword-only parameters takes the interpreter's slower generic call.
    params = ", ".join(slots)
    body = "".join(f"    {obj}.{s} = {s}\n" for s in slots)
    src = (
        f"def {fn_name}({params}):\n"
        f"    {obj} = {make}\n{body}"
        f"    {obj}.__class__ = {cls_name}\n"
        f"    return {obj}\n"
    )
    ns: dict[str, Any] = {twin_name: twin, cls_name: cls, new_name: object.__new__}
    exec(compile(src, f"<{fn_name}>", "exec"), ns)
    fn: Callable[..., T] = ns[fn_name]
    return fn


def _free(name: str, taken: set[str]) -> str:
    """``name``, with underscores appended until it is not in ``taken`` (then taken)."""
    while name in taken:
        name += "_"
    taken.add(name)
    return name


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

    A loader that builds many rows makes an empty one with ``twin()`` (or, when a class of
    ``cls``'s defines its own ``__new__``, with ``object.__new__(twin)``), assigns each
    slot (a plain store is about a tenth of a call of the slot's ``__set__``) and then
    sets ``__class__`` to ``cls``: the twin adds no slot, so the layouts are the same and
    the object is exactly what ``cls`` would have built. No ``__post_init__`` runs and no
    default applies: the caller assigns every slot, already valid. `slot_constructor`
    and `slot_builder` compile such a loader's steps into one function."""
    ns: dict[str, Any] = {
        "__slots__": (),
        # Both: together they are the type's one attribute-setting slot, then the
        # generic one (which plain stores to slots take at C speed).
        "__setattr__": object.__setattr__,
        "__delattr__": object.__delattr__,
        # ``twin()`` then calls object's C-level __init__ directly: an empty object for
        # about two thirds of ``object.__new__(twin)``'s cost.
        "__init__": object.__init__,
        "__doc__": f"A {cls.__name__} under construction (see `assignable_twin`).",
    }
    return type(f"_Assignable{cls.__name__}", (cls,), ns)
