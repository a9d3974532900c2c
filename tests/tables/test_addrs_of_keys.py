"""`addrs_of_keys` and `addrs_of_ipv4`: a list of 21-byte keys, or of IPv4 texts, to their
addresses in one call."""

from __future__ import annotations

import ipaddress
import itertools
import socket

from hypothesis import given, settings
from hypothesis import strategies as st

from tables.l3n4 import (
    UDP,
    V4_KEY_PREFIX,
    L3n4Addr,
    addr_key_suffix,
    addr_of_key,
    addrs_of_ipv4,
    addrs_of_keys,
)


def _key(ip: int, v6: bool, port: int, proto: str, scope: int) -> bytes:
    head = ipaddress.IPv6Address(ip).packed if v6 else V4_KEY_PREFIX + ip.to_bytes(4, "big")
    return head + addr_key_suffix(port, proto, v6, scope)


_keys = st.lists(
    st.one_of(
        st.builds(_key, st.integers(0, 2**32 - 1), st.just(False), st.integers(1, 65535),
                  st.sampled_from(["TCP", UDP, "SCTP"]), st.integers(0, 1)),
        st.builds(_key, st.integers(0, 2**128 - 1), st.just(True), st.integers(1, 65535),
                  st.sampled_from(["TCP", UDP, "SCTP"]), st.integers(0, 1)),
    ),
    max_size=40,
)


@settings(max_examples=200, deadline=None)
@given(_keys)
def test_addrs_of_keys_is_addr_of_key_per_key(keys: list[bytes]) -> None:
    got = addrs_of_keys(keys)
    want = [addr_of_key(k) for k in keys]
    assert type(got) is list and got == want
    assert [type(a) for a in got] == [L3n4Addr] * len(keys)
    assert [str(a) for a in got] == [str(a) for a in want]
    # Called again (the map's repeat is shared by every call), the same addresses.
    assert addrs_of_keys(keys) == want


_texts = st.lists(
    st.one_of(
        st.integers(0, 2**32 - 1).map(lambda i: str(ipaddress.IPv4Address(i))),
        st.sampled_from([
            "1.2.3", "01.2.3.4", "1.2.3.4 ", "256.1.1.1", "1.2.3.4\0", "\ud800", "::1",
            "", "1.2.3.4.5", "\u0661.2.3.4",
        ]),
        st.text(alphabet="0123456789.", max_size=16),
        st.sampled_from([None, 7, b"1.2.3.4"]),
    ),
    max_size=12,
)


def _want(
    prefix: bytes, texts: list[object], suffix: bytes
) -> tuple[list[L3n4Addr], bool] | None:
    try:
        pton = socket.inet_pton
        keys = [prefix + pton(socket.AF_INET, t) + suffix for t in texts]  # type: ignore[arg-type]
    except (OSError, ValueError, TypeError):
        return None
    return [addr_of_key(k) for k in keys], all(a < b for a, b in itertools.pairwise(keys))


@settings(max_examples=300, deadline=None)
@given(_texts, st.integers(1, 65535), st.sampled_from(["TCP", UDP, "SCTP"]), st.integers(0, 1))
def test_addrs_of_ipv4_is_inet_pton_per_text(
    texts: list[object], port: int, proto: str, scope: int
) -> None:
    suffix = addr_key_suffix(port, proto, False, scope)
    got = addrs_of_ipv4(V4_KEY_PREFIX, texts, suffix)
    want = _want(V4_KEY_PREFIX, texts, suffix)
    assert got == want
    if got is not None and want is not None:
        addrs = got[0]
        assert [type(a) for a in addrs] == [L3n4Addr] * len(texts)
        assert [hash(a) for a in addrs] == [hash(bytes(a)) for a in addrs]
        assert [str(a) for a in addrs] == [str(a) for a in want[0]]
