"""Table.insert encodes a str or int primary key as its encoder does (through the
encoder's C-level equivalent), and get_many reads keys from any iterable."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from statedb import DB, Index, Table, keys
from tests.statedb.helpers import new_db, obj


@dataclass(frozen=True, slots=True)
class Named:
    """A row keyed by a str."""

    name: str
    value: int


@settings(max_examples=100, deadline=None)
@given(st.lists(st.text(max_size=6) | st.sampled_from(["a", "\ud800", "é"]), max_size=12))
def test_str_keys_are_stored_under_their_encoding(names: list[str]) -> None:
    table: Table[Named, str] = Table("named", Index("name", key=lambda r: r.name))
    db = DB(table)
    with db.write_txn(table) as w:
        for i, name in enumerate(names):
            try:
                table.insert(w, Named(name, i))
            except UnicodeEncodeError:
                # A lone surrogate: the encoder's own error, nothing written.
                with pytest.raises(UnicodeEncodeError):
                    keys.string(name)
    txn = db.read_txn()
    last = {n: i for i, n in enumerate(names) if _ok(n)}
    assert {r.name: r.value for r in table.all(txn)} == last
    for name, value in last.items():
        assert table.get(txn, name) == Named(name, value)
        row, _ = table.get_revision(txn, table.primary.query_bytes(keys.string(name))) or (None, 0)
        assert row == Named(name, value)
    assert table.count(txn) == len(last)


def _ok(name: str) -> bool:
    try:
        keys.string(name)
    except UnicodeEncodeError:
        return False
    return True


def test_a_key_the_encoder_refuses_raises_its_error() -> None:
    table: Table[Named, str] = Table("named", Index("name", key=lambda r: r.name))
    db = DB(table)
    with db.write_txn(table) as w, pytest.raises(keys.KeyTypeError):
        table.insert(w, Named(5, 1))  # type: ignore[arg-type]


@settings(max_examples=60, deadline=None)
@given(st.sets(st.integers(0, 10), max_size=8), st.lists(st.integers(0, 12), max_size=12))
def test_get_many_takes_any_iterable(committed: set[int], keys_: list[int]) -> None:
    db, (t1,) = new_db("t1")
    with db.write_txn(t1) as w:
        for i in sorted(committed):
            t1.insert(w, obj(i))
    before = db.read_txn()
    w = db.write_txn(t1)
    for i in keys_[:3]:
        t1.insert(w, obj(i, None, "new"))  # heads newer than ``before`` while w is open
    for txn in (before, w):
        expected = [t1.get(txn, i) for i in keys_]
        assert t1.get_many(txn, iter(keys_)) == expected
        assert t1.get_many(txn, (i for i in keys_)) == expected
        assert t1.get_many(txn, tuple(keys_)) == expected
    w.abort()
