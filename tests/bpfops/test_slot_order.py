"""`sorted_backends` skips the sort for a frontend whose backends are in slot order already
(`in_slot_order`), and gives the order the sort gives for any list of backends."""

from __future__ import annotations

import ipaddress

from hypothesis import given, settings
from hypothesis import strategies as st

from bpfops.frontend_plan import in_slot_order, sorted_backends
from bpfops.model import Addr, BackendSpec, FrontendSpec, ServiceSpec

_IPS = ["10.0.0.1", "10.0.0.2", "10.0.1.1", "::1", "fd00::1", "2001:db8::5", "0.0.0.9"]


def _backend(ip: str, port: int, proto: str, state: int, unhealthy: bool, ns: bool) -> BackendSpec:
    return BackendSpec(
        Addr.of(ipaddress.ip_address(ip), port, proto), state=state, unhealthy=unhealthy,
        not_serving=ns,
    )


backends = st.builds(
    _backend,
    st.sampled_from(_IPS),
    st.sampled_from([80, 443, 8080]),
    st.sampled_from(["TCP", "UDP"]),
    st.sampled_from([0, 0, 0, 1, 2]),
    st.booleans() | st.just(False),
    st.booleans() | st.just(False),
)


def _reference(bes: list[BackendSpec]) -> list[BackendSpec]:
    return sorted(bes, key=lambda b: (b.unhealthy, b.state, b.not_serving, b.addr.sort_key()))


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.lists(backends, max_size=12), st.booleans())
def test_same_order_as_the_sort(bes: list[BackendSpec], presorted: bool) -> None:
    if presorted:
        bes = sorted(bes, key=lambda b: b.addr)  # a row's order: by address key bytes
    fe = FrontendSpec(Addr.of(ipaddress.ip_address("10.96.0.1"), 80), "ClusterIP",
                      ServiceSpec("ns/s"), tuple(bes))
    assert sorted_backends(fe, {}) == _reference(bes)


def test_a_row_of_active_backends_is_in_slot_order() -> None:
    bes = [_backend(f"10.0.0.{i}", 80, "TCP", 0, False, False) for i in range(1, 11)]
    assert in_slot_order(bes)
    assert not in_slot_order(bes[::-1])
    assert not in_slot_order([*bes[:3], _backend("::1", 80, "TCP", 0, False, False)])
    assert not in_slot_order([_backend("10.0.0.1", 80, "TCP", 1, False, False)])
    assert in_slot_order([])
