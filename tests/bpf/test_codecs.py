"""Codec round trips for every layout, plus byte-order spot checks against the C layouts."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bpf import endpoints, ipcache, lb
from bpf.codec import StructCodec

from .layouts import all_codecs, value_strategy

CODECS = all_codecs()
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.parametrize("name", sorted(CODECS))
@SETTINGS
@given(data=st.data())
def test_value_roundtrip(name: str, data: st.DataObject) -> None:
    """decode(encode(v)) == v, and the encoding has the codec's size."""
    codec = CODECS[name]
    value = data.draw(value_strategy(codec))
    raw = codec.encode(value)
    assert len(raw) == codec.size
    assert codec.decode(raw) == value
    assert codec.decode_many(codec.encode_many([value, value])) == [value, value]


@pytest.mark.parametrize("name", sorted(n for n, c in CODECS.items() if isinstance(c, StructCodec)))
@SETTINGS
@given(data=st.data())
def test_bytes_roundtrip(name: str, data: st.DataObject) -> None:
    """encode(decode(b)) == b for any bytes whose padding is zero."""
    codec: StructCodec[Any] = CODECS[name]
    raw = bytearray(data.draw(st.binary(min_size=codec.size, max_size=codec.size)))
    for member, placed in zip(codec.members, codec.layout()):
        if member.pad:
            raw[placed.offset : placed.offset + placed.size] = bytes(placed.size)
    assert codec.encode(codec.decode(bytes(raw))) == bytes(raw)


def test_service_key_byte_order() -> None:
    """Address and dport are network order, backend_slot host order."""
    key = lb.Service4Key(bytes([10, 0, 0, 1]), 0x1F90, backend_slot=0x0102, proto=6, scope=1)
    assert lb.SERVICE4_KEY.encode(key) == bytes([10, 0, 0, 1, 0x1F, 0x90, 0x02, 0x01, 6, 1, 0, 0])


def test_service_value_byte_order() -> None:
    """rev_nat_index is network order, the rest host order."""
    value = lb.ServiceValue(backend_id=0x01020304, count=2, rev_nat_index=0x0A0B, flags=1, qcount=3)
    assert lb.SERVICE4_VALUE.encode(value) == bytes([4, 3, 2, 1, 2, 0, 0x0A, 0x0B, 1, 0, 3, 0])


def test_endpoint_and_ipcache_layouts() -> None:
    """IPv4 fills the first four address bytes; prefixlen is host order."""
    key = endpoints.EndpointKey.ipv4(bytes([192, 168, 0, 5]))
    assert endpoints.ENDPOINT_KEY.encode(key) == bytes([192, 168, 0, 5]) + bytes(12) + b"\x01\0\0\0"
    ck = ipcache.IPCacheKey.for_cidr(bytes([10, 0, 0, 0]), 8)
    assert ipcache.IPCACHE_KEY.encode(ck)[:8] == bytes([40, 0, 0, 0, 0, 0, 0, 1])
    info = endpoints.EndpointInfo(ifindex=7, lxc_id=9, mac=0x0605040302 << 8 | 1)
    raw = endpoints.ENDPOINT_INFO.encode(info)
    assert raw[16:22] == bytes([1, 2, 3, 4, 5, 6])
    assert endpoints.ENDPOINT_INFO.to_json(info)["mac"] == "01:02:03:04:05:06"


def test_address_length_is_checked() -> None:
    """struct would silently pad a short address; the dataclasses refuse it."""
    with pytest.raises(ValueError, match="need 4 bytes"):
        lb.Backend4(b"\x0a\x00\x00", 80)
    with pytest.raises(ValueError, match="need 16 bytes"):
        lb.Service6Key(bytes(4), 80)


def test_to_json_renders_addresses() -> None:
    """Tools show addresses as text."""
    key = lb.Service4Key(bytes([10, 0, 0, 1]), 80)
    assert lb.SERVICE4_KEY.to_json(key)["address"] == "10.0.0.1"
    ck = ipcache.IPCacheKey.for_cidr(bytes([10, 0, 0, 0]), 8)
    assert ipcache.IPCACHE_KEY.to_json(ck)["ip"] == "10.0.0.0"
