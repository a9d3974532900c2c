"""`Table.get` with a primary key value encodes it with a C-level equivalent of the index's
encoder when there is one: it must find exactly what the encoder's bytes find, and a key
the encoder rejects must raise the encoder's own error."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from statedb import DB, Index, Table, keys


@dataclass(frozen=True, slots=True)
class Row:
    """A row keyed by ``key`` (int or str, depending on the table)."""

    key: Any


WIDTHS: list[tuple[Callable[[int], bytes], int]] = [
    (keys.uint8, 8),
    (keys.uint16, 16),
    (keys.uint32, 32),
    (keys.uint64, 64),
]


def table_of(encode: Callable[[Any], bytes]) -> tuple[DB, Table[Row]]:
    table: Table[Row] = Table("t", Index("key", key=lambda r: r.key, encode=encode))
    return DB(table), table


@pytest.mark.parametrize(("encode", "bits"), WIDTHS)
@settings(max_examples=60, deadline=2000)
@given(data=st.data())
def test_uint_keys_found_as_the_encoder_finds_them(
    encode: Callable[[int], bytes], bits: int, data: st.DataObject
) -> None:
    stored = data.draw(st.sets(st.integers(0, 2**bits - 1), max_size=20))
    db, table = table_of(encode)
    with db.write_txn(table) as w:
        for k in stored:
            table.insert(w, Row(k))
    txn = db.read_txn()
    probes = data.draw(st.lists(st.integers(0, 2**bits - 1), max_size=20))
    for k in [*stored, *probes]:
        expected = Row(k) if k in stored else None
        assert table.get(txn, k) == expected
        assert table.get(txn, table.primary.query(k)) == expected
        assert table.primary_key_of(Row(k)) == encode(k)


@settings(max_examples=60, deadline=2000)
@given(st.sets(st.text(max_size=6), max_size=20), st.lists(st.text(max_size=6), max_size=20))
def test_str_keys_found_as_the_encoder_finds_them(stored: set[str], probes: list[str]) -> None:
    db, table = table_of(keys.string)
    with db.write_txn(table) as w:
        for k in stored:
            table.insert(w, Row(k))
    txn = db.read_txn()
    for k in [*stored, *probes]:
        assert table.get(txn, k) == (Row(k) if k in stored else None)


@pytest.mark.parametrize(("encode", "bits"), WIDTHS)
def test_uint_keys_out_of_range_raise_the_encoders_error(
    encode: Callable[[int], bytes], bits: int
) -> None:
    db, table = table_of(encode)
    txn = db.read_txn()
    for bad in (-1, 2**bits):
        with pytest.raises(OverflowError):
            encode(bad)
        with pytest.raises(OverflowError):
            table.get(txn, bad)


def test_keys_of_the_wrong_type_raise_key_type_error() -> None:
    db, table = table_of(keys.uint64)
    txn = db.read_txn()
    for bad in ("7", 7.0, b"\x00" * 8):
        with pytest.raises(keys.KeyTypeError):
            table.get(txn, bad)
    db, table = table_of(keys.string)
    with pytest.raises(keys.KeyTypeError):
        table.get(db.read_txn(), 7)
    with pytest.raises(UnicodeEncodeError):
        table.get(db.read_txn(), "\udc80")  # a lone surrogate: what str.encode raises


def test_int_subclass_keys_take_the_encoders_path() -> None:
    """bool is an int subclass: not the exact type, so the encoder itself encodes it."""
    db, table = table_of(keys.uint8)
    with db.write_txn(table) as w:
        table.insert(w, Row(1))
    assert table.get(db.read_txn(), True) == Row(1)
    assert table.get(db.read_txn(), False) is None
