"""The converter's fast IP parsing gives what ipaddress.ip_address gives, errors included."""

from __future__ import annotations

import ipaddress

from hypothesis import given
from hypothesis import strategies as st

from sources.k8s_convert import _parse_ip


@given(st.integers(0, 2**32 - 1))
def test_ipv4_like_ipaddress(n: int) -> None:
    text = str(ipaddress.IPv4Address(n))
    got, want = _parse_ip(text), ipaddress.ip_address(text)
    assert type(got) is type(want) and got == want and hash(got) == hash(want)
    assert repr(got) == repr(want) and got.packed == want.packed


@given(st.text(alphabet="0123456789.:abcdef x", max_size=20))
def test_any_text_like_ipaddress(text: str) -> None:
    try:
        want = ipaddress.ip_address(text)
    except ValueError:
        want = None
    try:
        got = _parse_ip(text)
    except ValueError:
        got = None
    assert got == want and type(got) is type(want)
