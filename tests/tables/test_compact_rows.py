"""The compact LB records keep the value semantics of the frozen dataclasses they replace.

L3n4Addr holds its IP only in the encoded key and BackendParams its seven shared
details in one interned tuple; both still behave as frozen dataclasses of their fields.
"""

from __future__ import annotations

import copy
import dataclasses
import ipaddress
import pickle
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tables.backends import BackendParams, BackendState, new_backend_params
from tables.l3n4 import PROTOCOLS, AddressError, L3n4Addr, new_addr_packed

ips = st.one_of(
    st.integers(0, 2**32 - 1).map(ipaddress.IPv4Address),
    st.integers(0, 2**128 - 1).map(ipaddress.IPv6Address),
)


@settings(max_examples=300, deadline=None)
@given(ips, st.integers(0, 0xFFFF), st.sampled_from(PROTOCOLS), st.integers(0, 1))
def test_address_read_back_from_the_key(ip: Any, port: int, proto: str, scope: int) -> None:
    a = L3n4Addr(ip, port, proto, scope)
    assert a.address == ip and type(a.address) is type(ip)
    assert a.packed == ip.packed and a.version == ip.version
    assert a.is_unspecified == ip.is_unspecified and a.is_v6 == (ip.version == 6)
    assert a.sort_key() == (ip.version, ip.packed, port)
    host = f"[{ip}]" if ip.version == 6 else str(ip)
    assert a.addr_port() == f"{host}:{port}"
    assert pickle.loads(pickle.dumps(a)) == a and copy.deepcopy(a) == a


@settings(max_examples=300, deadline=None)
@given(ips, st.integers(0, 0xFFFF), st.sampled_from(PROTOCOLS), st.integers(0, 1))
def test_new_addr_packed_equals_constructor(ip: Any, port: int, proto: str, scope: int) -> None:
    a, b = new_addr_packed(ip.packed, port, proto, scope), L3n4Addr(ip, port, proto, scope)
    assert a == b and a._key == b._key and hash(a) == hash(b) and repr(a) == repr(b)
    assert (a.address, a.port, a.protocol, a.scope) == (b.address, b.port, b.protocol, b.scope)


@pytest.mark.parametrize(
    "args",
    [
        (b"\x0a\x00\x00\x01", 70000, "TCP", 0),
        (b"\x0a\x00\x00\x01", -1, "TCP", 0),
        (b"\x0a\x00\x00\x01", 80, "tcp", 0),
        (b"\x0a\x00\x00\x01", 80, "TCP", 2),
        (b"\x0a\x00\x00\x01", True, "TCP", 0),
    ],
)
def test_new_addr_packed_rejects_what_the_constructor_rejects(args: tuple[Any, ...]) -> None:
    with pytest.raises(AddressError) as fast:
        new_addr_packed(*args)
    with pytest.raises(AddressError) as slow:
        L3n4Addr(ipaddress.ip_address(args[0]), *args[1:])
    assert str(fast.value) == str(slow.value)


def test_address_is_a_frozen_dataclass_of_four_fields() -> None:
    a = L3n4Addr.parse("10.0.0.1:80/UDP/i")
    assert [f.name for f in dataclasses.fields(a)] == ["address", "port", "protocol", "scope"]
    assert dataclasses.replace(a, port=81) == L3n4Addr.parse("10.0.0.1:81/UDP/i")
    assert dataclasses.asdict(a)["address"] == ipaddress.ip_address("10.0.0.1")
    assert repr(a) == (
        "L3n4Addr(address=IPv4Address('10.0.0.1'), port=80, protocol='UDP', scope=1)"
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.port = 1  # type: ignore[misc]
    with pytest.raises(AttributeError):
        a.other = 1  # type: ignore[attr-defined]


@dataclasses.dataclass(frozen=True)
class _Reference:
    """BackendParams as the eleven-slot dataclass it was (the semantics to keep)."""

    address: L3n4Addr
    port_names: tuple[str, ...] = ()
    weight: int = 100
    node_name: str = ""
    zone: str = ""
    for_zones: tuple[str, ...] = ()
    cluster_id: int = 0
    source: str = "k8s"
    state: BackendState = BackendState.ACTIVE
    unhealthy: bool = False
    unhealthy_updated_at: float = 0.0


names = st.text(max_size=4)
params_args = st.tuples(
    st.integers(0, 2**32 - 1).map(lambda i: L3n4Addr(ipaddress.IPv4Address(i), 80)),
    st.lists(names, max_size=2).map(tuple),
    st.integers(0, 65535),
    names,
    names,
    st.lists(names, max_size=2).map(tuple),
    st.integers(0, 255),
    st.sampled_from(["k8s", "local", "kvstore"]),
    st.sampled_from(list(BackendState)),
    st.booleans(),
    st.sampled_from([0.0, 1.5, 1e9]),
)


@settings(max_examples=200, deadline=None)
@given(params_args, params_args)
def test_backend_params_behave_as_the_dataclass(x: tuple[Any, ...], y: tuple[Any, ...]) -> None:
    p, q, rp, rq = BackendParams(*x), new_backend_params(*y), _Reference(*x), _Reference(*y)
    assert (p == q) == (rp == rq)
    if p == q:
        assert hash(p) == hash(q)
    assert [getattr(p, f.name) for f in dataclasses.fields(rp)] == list(x)
    assert [f.name for f in dataclasses.fields(p)] == [f.name for f in dataclasses.fields(rp)]
    assert repr(p) == repr(rp).replace("_Reference(", "BackendParams(", 1)
    assert dataclasses.asdict(p) == dataclasses.asdict(rp)
    assert pickle.loads(pickle.dumps(p)) == p
    changed = dataclasses.replace(p, unhealthy=not p.unhealthy, node_name="n9")
    assert (changed.unhealthy, changed.node_name) == (not p.unhealthy, "n9")
    assert changed.address is p.address and changed.weight == p.weight


def test_backend_params_share_their_details_and_stay_frozen() -> None:
    a = L3n4Addr.parse("10.0.0.1:80")
    p = BackendParams(a, ("http",), node_name="n1", zone="z")
    q = BackendParams(L3n4Addr.parse("10.0.0.2:80"), ("http",), node_name="n1", zone="z")
    assert p._rest is q._rest
    # Other port names, weight or state: another tuple, the same details in it.
    o = BackendParams(a, ("dns",), 7, "n1", "z", state=BackendState.TERMINATING)
    assert o._rest is not p._rest and o._rest[:7] == p._rest[:7]
    assert (o.port_names, o.weight, o.state) == (("dns",), 7, BackendState.TERMINATING)
    # An equal tuple of other types is not shared: the fields read back as given.
    r = BackendParams(a, unhealthy=0, unhealthy_updated_at=0)  # type: ignore[arg-type]
    assert type(r.unhealthy) is int and type(r.unhealthy_updated_at) is int
    assert type(BackendParams(a).unhealthy) is bool
    s = BackendParams(a, weight=True, state=0)  # type: ignore[arg-type]
    assert type(s.weight) is bool and type(s.state) is int
    assert type(BackendParams(a).state) is BackendState
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.weight = 1  # type: ignore[misc]
    assert p.effective_state is BackendState.ACTIVE
    assert dataclasses.replace(p, unhealthy=True).effective_state is BackendState.QUARANTINED
