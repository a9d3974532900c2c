"""new_addr and new_backend_params build exactly what the dataclass constructors build."""

from __future__ import annotations

import ipaddress
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tables.backends import BackendParams, BackendState, new_backend_params
from tables.l3n4 import PROTOCOLS, AddressError, L3n4Addr, new_addr

ips = st.one_of(
    st.integers(0, 2**32 - 1).map(ipaddress.IPv4Address),
    st.integers(0, 2**128 - 1).map(ipaddress.IPv6Address),
)


@given(ips, st.integers(0, 0xFFFF), st.sampled_from(PROTOCOLS), st.integers(0, 1))
def test_new_addr_equals_constructor(ip: Any, port: int, proto: str, scope: int) -> None:
    a, b = new_addr(ip, port, proto, scope), L3n4Addr(ip, port, proto, scope)
    assert a == b and a._key == b._key and hash(a) == hash(b) and repr(a) == repr(b)
    assert (a.address, a.port, a.protocol, a.scope) == (b.address, b.port, b.protocol, b.scope)


@pytest.mark.parametrize(
    "args",
    [
        (ipaddress.ip_address("10.0.0.1"), 70000, "TCP", 0),
        (ipaddress.ip_address("10.0.0.1"), -1, "TCP", 0),
        (ipaddress.ip_address("10.0.0.1"), 80, "tcp", 0),
        (ipaddress.ip_address("10.0.0.1"), 80, "TCP", 2),
        (ipaddress.ip_address("10.0.0.1"), True, "TCP", 0),
        ("10.0.0.1", 80, "TCP", 0),
    ],
)
def test_new_addr_rejects_what_the_constructor_rejects(args: tuple[Any, ...]) -> None:
    with pytest.raises(AddressError) as fast:
        new_addr(*args)
    with pytest.raises(AddressError) as slow:
        L3n4Addr(*args)
    assert str(fast.value) == str(slow.value)


@given(
    st.integers(0, 2**32 - 1).map(ipaddress.IPv4Address),
    st.lists(st.text(max_size=5), max_size=3).map(tuple),
    st.integers(0, 65535),
    st.text(max_size=5),
    st.sampled_from(list(BackendState)),
    st.booleans(),
    st.floats(0, 1e9),
)
def test_new_backend_params_equals_constructor(
    ip: Any,
    names: tuple[str, ...],
    weight: int,
    text: str,
    state: BackendState,
    unhealthy: bool,
    ts: float,
) -> None:
    a = L3n4Addr(ip, 8080)
    fast = new_backend_params(a, names, weight, text, text, names, 3, "k8s", state, unhealthy, ts)
    slow = BackendParams(a, names, weight, text, text, names, 3, "k8s", state, unhealthy, ts)
    assert fast == slow and hash(fast) == hash(slow) and repr(fast) == repr(slow)


def test_frontend_copy_with_equals_replace() -> None:
    import dataclasses

    from reconciler.status import status_done
    from tables.frontends import Frontend, SVCType
    from tables.services import Service

    fe = Frontend(
        L3n4Addr(ipaddress.ip_address("10.0.0.1"), 80),
        SVCType.NODE_PORT,
        "ns/a",
        "http",
        8080,
        Service("ns/a"),
        (BackendParams(L3n4Addr(ipaddress.ip_address("10.1.0.1"), 8080)),),
        7,
        "ns/b",
    )
    svc2, st = Service("ns/a", source="api"), status_done()
    cases: list[tuple[dict[str, Any], dict[str, Any]]] = [
        ({}, {}),
        ({"service": svc2}, {"service": svc2}),
        ({"service": None}, {"service": None}),
        ({"backends": ()}, {"backends": ()}),
        ({"id": 9, "status": st}, {"id": 9, "status": st}),
    ]
    for kw, want in cases:
        got, ref = fe.copy_with(**kw), dataclasses.replace(fe, **want)
        assert got == ref and repr(got) == repr(ref) and got.service is ref.service
        assert got.status is ref.status
    pend = fe.pending(backends=())
    assert pend.backends == () and pend.status.kind.value == "Pending"
    assert pend.status is not fe.status and pend.id == 7 and pend.redirect_to == "ns/b"
