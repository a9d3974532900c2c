"""tables.slice_addresses: an EndpointSlice's IPv4 addresses handed from the converter's
keys to its origin row, which stores exactly what it would have parsed itself."""

from __future__ import annotations

import socket
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from tables import slice_addresses
from tables.origins import origin_of, origins_of
from tests.k8s.objects import endpoint_slice


def _slice(addresses: list[str]) -> dict[str, Any]:
    obj = endpoint_slice("svc", addresses)
    obj["metadata"].update(uid="d9279668-d9fb-404c-87a8-d0fe6cfb2891", resourceVersion="7")
    return obj


def _keys(obj: dict[str, Any], prefix: bytes, suffix: bytes) -> list[bytes]:
    """What the converter makes of each endpoint's one address."""
    return [prefix + socket.inet_pton(socket.AF_INET, ep["addresses"][0]) + suffix
            for ep in obj["endpoints"]]


def _stored(o: Any) -> tuple[Any, ...]:
    return (type(o), o.key_bytes, o._kind, o._uid, o._rv, o._where, o.owner, o._addrs)


@settings(max_examples=200, deadline=None)
@given(
    addresses=st.lists(st.ip_addresses(v=4).map(str), max_size=12),
    prefix=st.binary(max_size=6),
    suffix=st.binary(max_size=6),
)
def test_handed_addresses_store_what_the_origin_would_parse(
    addresses: list[str], prefix: bytes, suffix: bytes
) -> None:
    """origin_of and origins_of store the same row whether the converter's keys were
    handed over or not (duplicate addresses and an empty slice included)."""
    obj = _slice(addresses)
    want = _stored(origin_of(obj, "k8s"))
    with slice_addresses.holding():
        slice_addresses.remember(obj["endpoints"], _keys(obj, prefix, suffix), len(prefix))
        handed = slice_addresses.packed(obj["endpoints"])
        assert handed == (b"".join(socket.inet_pton(socket.AF_INET, a) for a in addresses)
                          or None)
        assert _stored(origin_of(obj, "k8s")) == want
        assert [_stored(o) for o in origins_of([obj], "k8s")] == [want]


def test_only_that_list_while_holding() -> None:
    """Nothing is kept outside `holding`, nor after it; an equal but other list is not
    the one remembered."""
    obj = _slice(["10.0.0.1", "10.0.0.2"])
    keys = _keys(obj, b"p", b"s")
    slice_addresses.remember(obj["endpoints"], keys, 1)
    assert not slice_addresses.HELD and slice_addresses.packed(obj["endpoints"]) is None
    with slice_addresses.holding():
        slice_addresses.remember(obj["endpoints"], keys, 1)
        assert slice_addresses.packed(obj["endpoints"]) == bytes([10, 0, 0, 1, 10, 0, 0, 2])
        assert slice_addresses.packed(list(obj["endpoints"])) is None
        assert slice_addresses.packed(None) is None
    assert not slice_addresses.HELD and slice_addresses.packed(obj["endpoints"]) is None
