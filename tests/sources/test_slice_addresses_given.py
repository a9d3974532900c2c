"""The converter's loop for plain slices hands each endpoint's parsed IPv4 address to
`tables.slice_addresses` while a writer is holding them: what the origins table would
parse itself, in order; nothing outside `holding`, nothing for a slice it does not take.
"""

from __future__ import annotations

import socket

from hypothesis import given, settings
from hypothesis import strategies as st

from sources.k8s_convert import ConversionError, convert_endpoint_slice
from tables import slice_addresses


def _slice(addresses: list[list[str]]) -> dict[str, object]:
    return {
        "kind": "EndpointSlice",
        "metadata": {"name": "echo-abcde", "namespace": "default",
                     "labels": {"kubernetes.io/service-name": "echo"}},
        "addressType": "IPv4",
        "endpoints": [{"addresses": a, "conditions": {"ready": True}} for a in addresses],
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
    }


_ADDRESS = st.sampled_from(["10.0.0.1", "10.0.0.2", "192.168.1.7", "::1", "x"])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(_ADDRESS, min_size=1, max_size=2), max_size=4))
def test_remembered_addresses_are_the_parsed_ones(addresses: list[list[str]]) -> None:
    obj = _slice(addresses)
    endpoints = obj["endpoints"]
    with slice_addresses.holding():
        try:
            convert_endpoint_slice(obj)
        except ConversionError:
            pass
        got = slice_addresses.packed(endpoints)
    one_v4 = all(len(a) == 1 and a[0] not in ("::1", "x") for a in addresses)
    if got is not None:
        assert one_v4
        assert got == b"".join(socket.inet_pton(socket.AF_INET, a[0]) for a in addresses)
    else:
        assert not one_v4 or not addresses
    assert slice_addresses.packed(endpoints) is None  # dropped when the block ended
    convert_endpoint_slice(_slice([["10.0.0.1"]]))
    assert not slice_addresses.HELD  # nothing kept outside holding
