"""`addrs_of_keys`: a list of 21-byte keys to their addresses in one call."""

from __future__ import annotations

import ipaddress

from hypothesis import given, settings
from hypothesis import strategies as st

from tables.l3n4 import (
    UDP,
    V4_KEY_PREFIX,
    L3n4Addr,
    addr_key_suffix,
    addr_of_key,
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
