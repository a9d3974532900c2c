"""statedb.rowbuild: rows and keys built in one call, compiled or in Python, the same objects;
the compiled helper imported only while built from the C source now in the tree."""

from __future__ import annotations

import dataclasses
import gc
import importlib.machinery
import json
import subprocess
import sys
from itertools import repeat
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from statedb import rowbuild
from statedb.rows import FrozenValue

ROOT = Path(__file__).resolve().parents[2]
SUFFIX = importlib.machinery.EXTENSION_SUFFIXES[0]


class Pair(FrozenValue):
    """A frozen row of two slots (as BackendParams and Backend are)."""

    __slots__ = ("left", "right")
    __match_args__ = ("left", "right")
    left: Any
    right: Any

    def _fields(self) -> tuple[Any, ...]:
        return (self.left, self.right)


class Wide(Pair):
    """A subclass with slots of its own: the base's slots are filled at their offsets."""

    __slots__ = ("__weakref__", "extra")


class Other:
    __slots__ = ("left", "right")


class Key(bytes):
    __slots__ = ()


LEFT, RIGHT = Pair.__dict__["left"], Pair.__dict__["right"]
IMPLEMENTATIONS = [pytest.param(rowbuild.py_new_rows, id="python")]
KEY_IMPLEMENTATIONS = [pytest.param(rowbuild.py_new_keys, id="python")]
if rowbuild.COMPILED:
    IMPLEMENTATIONS.append(pytest.param(rowbuild.new_rows, id="compiled"))
    KEY_IMPLEMENTATIONS.append(pytest.param(rowbuild.new_keys, id="compiled"))


def _slots(o: Any) -> tuple[Any, ...]:
    return tuple(getattr(o, s, "<unset>") for s in ("left", "right", "extra"))


@settings(max_examples=150, deadline=None)
@given(
    firsts=st.lists(st.integers() | st.text(max_size=3) | st.none(), max_size=12),
    seconds=st.lists(st.tuples(st.integers()) | st.binary(max_size=3), max_size=12),
    first_kind=st.sampled_from([list, tuple, iter]),
    second_kind=st.sampled_from([list, tuple, iter]),
    wide=st.booleans(),
)
def test_compiled_rows_are_the_pythons(
    firsts: list[Any], seconds: list[Any], first_kind: Any, second_kind: Any, wide: bool
) -> None:
    """Any lengths and kinds of iterable: zip's pairs, each row as the Python builds it."""
    cls = Wide if wide else Pair
    want = rowbuild.py_new_rows(cls, LEFT, RIGHT, first_kind(firsts), second_kind(seconds))
    got = rowbuild.new_rows(cls, LEFT, RIGHT, first_kind(firsts), second_kind(seconds))
    assert [type(o) for o in got] == [cls] * min(len(firsts), len(seconds))
    assert [_slots(o) for o in got] == [_slots(o) for o in want]
    assert all(o.left is f for o, f in zip(got, firsts))
    assert all(o.right is s for o, s in zip(got, seconds))
    if not wide:  # (Wide's equality compares its own slot, unset here)
        assert got == want


@pytest.mark.parametrize("new_rows", IMPLEMENTATIONS)
def test_rows_are_frozen_tracked_and_reference_their_values(new_rows: Any) -> None:
    value = object()
    before = sys.getrefcount(value)
    (row,) = new_rows(Pair, LEFT, RIGHT, [value], repeat("r"))
    assert row.left is value and row.right == "r"
    assert sys.getrefcount(value) == before + 1
    assert gc.is_tracked(row)
    with pytest.raises(dataclasses.FrozenInstanceError):
        row.left = 1
    del row
    assert sys.getrefcount(value) == before


@pytest.mark.parametrize("new_rows", IMPLEMENTATIONS)
def test_rows_refuse_what_is_not_two_slots_of_the_class(new_rows: Any) -> None:
    with pytest.raises(TypeError):
        new_rows(Pair, LEFT, LEFT, [1], [2])
    with pytest.raises(TypeError):
        new_rows(Pair, LEFT, "right", [1], [2])
    with pytest.raises(TypeError):
        new_rows(Other, LEFT, RIGHT, [1], [2])
    with pytest.raises(TypeError):
        new_rows(Pair, LEFT, Wide.__dict__["extra"], [1], [2])
    with pytest.raises(ZeroDivisionError):
        new_rows(Pair, LEFT, RIGHT, [1, 2], (1 // x for x in (1, 0)))


@settings(max_examples=150, deadline=None)
@given(keys=st.lists(st.binary(max_size=24), max_size=12), hashed=st.booleans())
def test_compiled_keys_are_the_pythons(keys: list[bytes], hashed: bool) -> None:
    if hashed:
        for k in keys:
            hash(k)
    want = rowbuild.py_new_keys(Key, keys)
    got = rowbuild.new_keys(Key, keys)
    assert [type(k) for k in got] == [Key] * len(keys)
    assert got == want == keys
    assert [hash(k) for k in got] == [hash(k) for k in keys]


@pytest.mark.parametrize("new_keys", KEY_IMPLEMENTATIONS)
def test_keys_must_be_bytes(new_keys: Any) -> None:
    with pytest.raises(TypeError):
        new_keys(Key, [b"a", bytearray(b"b")])
    with pytest.raises(TypeError):
        new_keys(Key, [Key(b"a")])


def _fake_build(root: Path, source: str, *, digest: str | None = None,
                name: str = f"_rowbuild{SUFFIX}", present: bool = True) -> Path:
    (root / rowbuild.SOURCE).parent.mkdir(parents=True, exist_ok=True)
    (root / rowbuild.SOURCE).write_text(source)
    (root / rowbuild.BUILD_DIR).mkdir(parents=True)
    path = root / rowbuild.BUILD_DIR / name
    if present:
        path.write_bytes(b"")
    stamp = {"extension": name,
             "digest": rowbuild.source_digest(root) if digest is None else digest}
    (root / rowbuild.STAMP).write_text(json.dumps(stamp))
    return path


def test_only_a_build_of_the_source_in_the_tree_is_current(tmp_path: Path) -> None:
    assert rowbuild.current_extension(tmp_path)[0] is None
    path = _fake_build(tmp_path, "int x;\n")
    assert rowbuild.current_extension(tmp_path)[0] == path
    (tmp_path / rowbuild.SOURCE).write_text("int y;\n")
    assert rowbuild.current_extension(tmp_path) == (
        None, "the compiled row builder is stale (`make setup`)")


@pytest.mark.parametrize("fake", [
    {"digest": "0" * 64}, {"name": "_rowbuild.cpython-29-foo.so"}, {"present": False},
])
def test_a_wrong_partial_or_foreign_build_is_not_current(tmp_path: Path, fake: Any) -> None:
    _fake_build(tmp_path, "int x;\n", **fake)
    assert rowbuild.current_extension(tmp_path)[0] is None


def _in_child(code: str, **env: str) -> str:
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", **env},
    )
    return out.stdout.strip()


def test_the_environment_forces_python() -> None:
    code = "from statedb import rowbuild as r; print(r.COMPILED, r.new_rows is r.py_new_rows)"
    assert _in_child(code, STATEWRIGHT_PURE_PYTHON="1") == "False True"
    current = rowbuild.current_extension(ROOT)[0] is not None
    assert _in_child(code, STATEWRIGHT_PURE_PYTHON="0") == f"{current} {not current}"


@pytest.mark.skipif(rowbuild.row_builder is None, reason="the row builder is not compiled")
def test_compiled_row_builder_checks_its_slots_and_arguments() -> None:
    make = rowbuild.row_builder
    assert make is not None
    new_pair = make(Pair, (LEFT, RIGHT), "new_pair")
    assert new_pair.__name__ == "new_pair" and "new_pair" in repr(new_pair)
    new_pair.__doc__ = "Build a Pair."
    assert new_pair.__doc__ == "Build a Pair."
    value = object()
    before = sys.getrefcount(value)
    row = new_pair(value, 2)
    assert type(row) is Pair and _slots(row) == (value, 2, "<unset>")
    assert gc.is_tracked(row) and sys.getrefcount(value) == before + 1
    del row
    assert sys.getrefcount(value) == before
    assert _slots(make(Wide, (Wide.__dict__["extra"], LEFT), "w")(1, 2)) == (2, "<unset>", 1)
    for args in [(1,), (1, 2, 3)]:
        with pytest.raises(TypeError, match="takes 2 positional arguments"):
            new_pair(*args)
    with pytest.raises(TypeError, match="no keyword arguments"):
        new_pair(1, right=2)
    for slots in [(LEFT, LEFT), (LEFT, "right"), (LEFT, Wide.__dict__["extra"])]:
        with pytest.raises(TypeError):
            make(Pair, slots, "bad")
    with pytest.raises(TypeError):
        make(Other, (LEFT,), "other")


@settings(max_examples=200, deadline=None)
@given(
    texts=st.lists(
        st.integers(0, 2**32 - 1).map(lambda i: ".".join(str(b) for b in i.to_bytes(4, "big")))
        | st.text(alphabet="0123456789.x\0", max_size=16)
        | st.sampled_from([None, b"1.2.3.4", "\udc80", "1.2.3.4"]),
        max_size=8,
    ),
    prefix=st.binary(max_size=12),
    suffix=st.binary(max_size=5),
)
def test_compiled_ipv4_keys_are_the_pythons(
    texts: list[Any], prefix: bytes, suffix: bytes
) -> None:
    want = rowbuild.py_new_ipv4_keys(Key, prefix, texts, suffix)
    got = rowbuild.new_ipv4_keys(Key, prefix, texts, suffix)
    assert got == want
    if got is not None:
        keys, _ = got
        assert [type(k) for k in keys] == [Key] * len(texts)
        assert [hash(k) for k in keys] == [hash(bytes(k)) for k in keys]
