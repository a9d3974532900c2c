"""Key encoders: byte order of the encoded keys must be the order of the values, since
every index compares encoded bytes only."""

from __future__ import annotations

import ipaddress
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from statedb import keys

SETTINGS = settings(max_examples=100, deadline=None)


def sign(a: Any, b: Any) -> int:
    """-1, 0 or 1 as a < b, a == b, a > b."""
    return (a > b) - (a < b)


@SETTINGS
@given(st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1))
def test_uint64_order(a: int, b: int) -> None:
    """Fixed-width big-endian: numeric order is byte order."""
    assert sign(keys.uint64(a), keys.uint64(b)) == sign(a, b)
    assert len(keys.uint64(a)) == 8


@SETTINGS
@given(st.integers(-(2**63), 2**63 - 1), st.integers(-(2**63), 2**63 - 1))
def test_int64_order(a: int, b: int) -> None:
    """Signed integers: negative numbers sort first."""
    assert sign(keys.int64(a), keys.int64(b)) == sign(a, b)


def test_small_uints_and_bools() -> None:
    """The narrow widths and booleans keep their order; out-of-range values are refused."""
    assert keys.uint8(1) < keys.uint8(255)
    assert keys.uint16(255) < keys.uint16(256)
    assert keys.uint32(2**16) < keys.uint32(2**31)
    assert keys.boolean(False) < keys.boolean(True)
    with pytest.raises(OverflowError):
        keys.uint8(256)
    with pytest.raises(OverflowError):
        keys.uint64(-1)


ADDRS = st.one_of(
    st.ip_addresses(v=4).map(lambda a: ipaddress.IPv6Address(b"\0" * 10 + b"\xff\xff" + a.packed)),
    st.ip_addresses(v=6),
)


@SETTINGS
@given(ADDRS, ADDRS)
def test_ip_address_order_matches_ipv6_order(
    a: ipaddress.IPv6Address, b: ipaddress.IPv6Address
) -> None:
    """Addresses sort as IPv6 numbers (IPv4 mapped into ::ffff:0:0/96)."""
    assert sign(keys.ip_address(a), keys.ip_address(b)) == sign(int(a), int(b))


@SETTINGS
@given(st.ip_addresses(v=4), st.ip_addresses(v=4))
def test_ipv4_keys_are_mapped(a: ipaddress.IPv4Address, b: ipaddress.IPv4Address) -> None:
    """An IPv4 address and its IPv4-mapped IPv6 form have the same key."""
    mapped = ipaddress.IPv6Address(f"::ffff:{a}")
    assert keys.ip_address(a) == keys.ip_address(mapped)
    assert sign(keys.ip_address(a), keys.ip_address(b)) == sign(a, b)
    assert keys.ip_address(str(a)) == keys.ip_address(a)


@SETTINGS
@given(st.ip_addresses(v=4), st.integers(0, 32), st.ip_addresses(v=4))
def test_network_prefix_matches_members(
    base: ipaddress.IPv4Address, plen: int, other: ipaddress.IPv4Address
) -> None:
    """Every network inside a byte-aligned network has a key starting with its prefix key."""
    plen -= plen % 8
    net = ipaddress.IPv4Network(f"{base}/{plen}", strict=False)
    inner = ipaddress.IPv4Network(f"{other}/32")
    inside = inner.subnet_of(net)
    assert keys.ip_network(inner).startswith(keys.ip_network_prefix(net)) == inside
    assert len(keys.ip_network(net)) == 17


@SETTINGS
@given(
    st.tuples(st.text(max_size=4), st.integers(0, 2**32 - 1)),
    st.tuples(st.text(max_size=4), st.integers(0, 2**32 - 1)),
)
def test_tuple_order(a: tuple[str, int], b: tuple[str, int]) -> None:
    """tuple_of keeps tuple order, even when a string part is a prefix of another or holds
    NUL characters."""
    enc = keys.tuple_of(keys.string, keys.uint32)
    ka, kb = enc(a), enc(b)
    assert sign(ka, kb) == sign((a[0].encode(), a[1]), (b[0].encode(), b[1]))
    assert keys.tuple_key(keys.string(a[0]), keys.uint32(a[1])) == ka


def test_tuple_arity_is_checked() -> None:
    """A tuple with the wrong number of parts is refused."""
    with pytest.raises(ValueError, match="2 items"):
        keys.tuple_of(keys.string, keys.uint8)(("a",))


def test_int_key_with_the_default_encoder_is_a_clear_error() -> None:
    """An index over int keys left with the default (str) encoder fails at the first insert
    with a KeyTypeError that says which encoder to give, not with an AttributeError."""
    from dataclasses import dataclass

    from statedb import DB, Index, StateDBError, Table

    @dataclass(frozen=True)
    class Row:
        id: int

    table = Table("rows", Index("id", key=lambda r: r.id))
    db = DB(table)
    with (
        pytest.raises(keys.KeyTypeError, match=r"keys\.string takes str, got int 7.*uint64"),
        db.write_txn(table) as txn,
    ):
        table.insert(txn, Row(7))
    named = Table("named", Index("name", key=lambda r: str(r.id)))
    named_db = DB(named)
    with pytest.raises(keys.KeyTypeError, match="got int 12345"):
        named.get(named_db.read_txn(), 12345)
    # Both a statedb error and a TypeError, so either kind of handler catches it.
    assert issubclass(keys.KeyTypeError, StateDBError)
    assert issubclass(keys.KeyTypeError, TypeError)


@pytest.mark.parametrize(
    ("encoder", "value"),
    [
        (keys.uint8, "1"),
        (keys.uint16, 1.5),
        (keys.uint32, None),
        (keys.uint64, b"1"),
        (keys.int64, "1"),
        (keys.string, 1),
        (keys.string, b"x"),
    ],
)
def test_encoders_refuse_wrong_types(encoder: Any, value: Any) -> None:
    with pytest.raises(keys.KeyTypeError, match=type(value).__name__):
        encoder(value)
