"""Fast constructors for frozen, slotted dataclass rows.

A frozen dataclass's ``__init__`` assigns every field through ``object.__setattr__``,
which costs about as much as the rest of building a small row. Loaders that build
thousands of rows per transaction can use `slot_constructor` instead: it returns a
function taking every field positionally, in declaration order, that fills the slots
through their descriptors. The object is the same as the dataclass would build; no
``__post_init__`` runs and no default applies, so the caller passes already valid values.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, TypeVar

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
