"""Many rows of a slotted class, or many keys of a ``bytes`` subclass, built in one call.

A loader that builds a row per item (a slice's backends: an address key, a backend's
parameters and its row per endpoint) spends most of its time making objects: an empty
object, its slots stored, its class swapped in (`statedb.rows.assignable_twin`), about
1,500 instructions each in the interpreter. `new_rows`, `new_keys` and `new_ipv4_keys`
build a whole list of them in one call, and `row_builder` makes the one-row builders of
`statedb.rows.slot_builder`. Compiled (``statedb/_rowbuild.c``, built by `make setup`
into ``build/native/statedb/``), an object costs about a tenth of that. The Python
equivalents below are used where the helper is not built (a plain ``pip install``, no C
compiler), is stale, or ``STATEWRIGHT_PURE_PYTHON`` is set. Both build the same objects:
as ``object.__new__(cls)`` (no ``__init__``) with the slots stored, and as
``bytes.__new__(cls, key)``. Callers that have a faster Python path of their own test
`COMPILED` and keep it for the pure case.

The build is current when its stamp's digest is that of the C source now in the tree
and its extension file fits this interpreter (checked once, at import).
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import itertools
import json
import os
import socket
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")
B = TypeVar("B", bound=bytes)

#: The C source of the helper, relative to the repository root.
SOURCE = Path("statedb") / "_rowbuild.c"
#: Where the build puts the extension module, and its stamp (relative to the root).
BUILD_DIR = Path("build") / "native" / "statedb"
STAMP = Path("build") / "native" / "rowbuild.json"
#: The module's name (the extension's ``PyInit_`` function is named after it).
MODULE = "statedb._rowbuild"
#: Set to a non-empty value other than ``0``: the Python equivalents, whatever is built.
PURE_ENV = "STATEWRIGHT_PURE_PYTHON"


def py_new_rows(
    cls: type[T], slot_a: Any, slot_b: Any, firsts: Iterable[Any], seconds: Iterable[Any]
) -> list[T]:
    """``[cls without __init__, slot_a set to a, slot_b to b for a, b in zip(firsts,
    seconds)]``: ``slot_a`` and ``slot_b`` are two distinct slots' member descriptors
    (``cls.__dict__[name]`` of ``cls`` or a base); frozen rows (whose ``__setattr__``
    refuses) are built alike."""
    _check_slots(cls, slot_a, slot_b)
    new = object.__new__
    set_a, set_b = slot_a.__set__, slot_b.__set__
    out: list[T] = []
    for a, b in zip(firsts, seconds):
        o = new(cls)
        set_a(o, a)
        set_b(o, b)
        out.append(o)
    return out


def py_new_keys(cls: type[B], keys: Iterable[bytes]) -> list[B]:
    """``[bytes.__new__(cls, k) for k in keys]``: each key an exact ``bytes``."""
    out: list[B] = []
    for k in keys:
        if type(k) is not bytes:
            raise TypeError(f"new_keys: a key must be bytes, got {type(k).__name__}")
        out.append(bytes.__new__(cls, k))
    return out


def py_new_ipv4_keys(
    cls: type[B], prefix: bytes, texts: Iterable[Any], suffix: bytes
) -> tuple[list[B], bool] | None:
    """``[bytes.__new__(cls, prefix + socket.inet_pton(AF_INET, t) + suffix) for t in
    texts]`` (keys holding IPv4 addresses, as `statedb.keys` lays them out in a longer
    key) and whether they are in strictly increasing order (so distinct); None when a
    text is not one that ``inet_pton`` takes (not a string, or not a dotted quad)."""
    pton, af_inet = socket.inet_pton, socket.AF_INET
    try:
        keys = [bytes.__new__(cls, prefix + pton(af_inet, t) + suffix) for t in texts]
    except (OSError, ValueError, TypeError):
        return None
    return keys, all(a < b for a, b in itertools.pairwise(keys))


def _check_slots(cls: type, slot_a: Any, slot_b: Any) -> None:
    """The checks the C helper makes of its arguments (TypeError)."""
    member = type(type("_Probe", (), {"__slots__": ("x",)}).__dict__["x"])
    for slot in (slot_a, slot_b):
        if type(slot) is not member:
            raise TypeError(f"expected a slot's member descriptor, got {type(slot).__name__}")
        if not issubclass(cls, slot.__objclass__):
            raise TypeError(f"slot {slot.__name__} is not a slot of {cls.__name__}")
    if slot_a is slot_b:
        raise TypeError("new_rows: the same slot twice")


def _pure_forced() -> bool:
    return os.environ.get(PURE_ENV, "") not in ("", "0")


def source_digest(root: Path) -> str:
    """SHA-256 of the C source in the tree at ``root`` ("" when it is missing)."""
    try:
        return hashlib.sha256((root / SOURCE).read_bytes()).hexdigest()
    except OSError:
        return ""


def current_extension(root: Path) -> tuple[Path | None, str]:
    """The built extension's path if the build is current for the tree at ``root``, and why."""
    try:
        stamp = json.loads((root / STAMP).read_text())
        name, digest = str(stamp["extension"]), str(stamp["digest"])
    except (OSError, ValueError, KeyError, TypeError):
        return None, "no compiled row builder (run `make setup`)"
    stem = MODULE.rsplit(".", 1)[1]
    if not any(name == stem + suffix for suffix in importlib.machinery.EXTENSION_SUFFIXES):
        return None, f"the compiled row builder ({name}) is not for this interpreter"
    path = root / BUILD_DIR / name
    if not path.is_file():
        return None, f"the compiled row builder's {name} is missing"
    if digest != source_digest(root):
        return None, "the compiled row builder is stale (`make setup`)"
    return path, "compiled: built from the source now in the tree"


def _load() -> tuple[Any, str]:
    """The compiled module, or None, and why."""
    if _pure_forced():
        return None, f"pure: {PURE_ENV} is set"
    path, why = current_extension(Path(__file__).resolve().parent.parent)
    if path is None:
        return None, f"pure: {why}"
    spec = importlib.util.spec_from_file_location(MODULE, path)
    if spec is None or spec.loader is None:
        return None, f"pure: {path} cannot be loaded"
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module, why


_compiled, WHY = _load()
#: True when `new_rows` and `new_keys` are the compiled helper's.
COMPILED: bool = _compiled is not None
#: Compiled when current, else the Python equivalent.
new_rows: Callable[..., list[Any]] = _compiled.new_rows if COMPILED else py_new_rows
new_keys: Callable[..., list[Any]] = _compiled.new_keys if COMPILED else py_new_keys
new_ipv4_keys: Callable[..., tuple[list[Any], bool] | None] = (
    _compiled.new_ipv4_keys if COMPILED else py_new_ipv4_keys
)
#: ``row_builder(cls, slots, name)``: a C callable ``name(v1, ..., vn)`` that builds a
#: ``cls`` with the member descriptors ``slots`` set to the values (positional only, as
#: many as slots); for `statedb.rows.slot_builder`. None when not compiled.
row_builder: Callable[..., Any] | None = _compiled.row_builder if COMPILED else None
