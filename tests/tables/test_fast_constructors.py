"""new_addr and new_backend_params build exactly what the dataclass constructors build."""

from __future__ import annotations

import ipaddress
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tables.backends import (
    BackendParams,
    BackendState,
    backend_details,
    new_backend_params,
    new_backend_params_with,
)
from tables.l3n4 import (
    PROTOCOLS,
    V4_KEY_PREFIX,
    AddressError,
    L3n4Addr,
    addr_key_suffix,
    addr_of_key,
    new_addr,
    new_addr_packed,
)

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


@settings(max_examples=200, deadline=None)
@given(
    st.one_of(
        st.integers(0, 2**32 - 1).map(lambda n: n.to_bytes(4, "big")),
        st.integers(0, 2**128 - 1).map(lambda n: n.to_bytes(16, "big")),
    ),
    st.integers(0, 0xFFFF),
    st.sampled_from(PROTOCOLS),
    st.integers(0, 1),
)
def test_addr_of_key_equals_new_addr_packed(
    packed: bytes, port: int, proto: str, scope: int
) -> None:
    v6 = len(packed) == 16
    prefix = b"" if v6 else V4_KEY_PREFIX
    a = addr_of_key(prefix + packed + addr_key_suffix(port, proto, v6, scope))
    b = L3n4Addr(ipaddress.ip_address(packed), port, proto, scope)
    assert type(a) is L3n4Addr and a == b and hash(a) == hash(b) and repr(a) == repr(b)
    assert a == new_addr_packed(packed, port, proto, scope)


@pytest.mark.parametrize(
    "args", [(70000, "TCP", False, 0), (-1, "TCP", False, 0), (80, "tcp", False, 0),
             (80, "TCP", True, 2), (True, "TCP", False, 0)],
)
def test_addr_key_suffix_rejects_what_the_constructor_rejects(args: tuple[Any, ...]) -> None:
    port, proto, v6, scope = args
    with pytest.raises(AddressError):
        addr_key_suffix(port, proto, v6, scope)
    with pytest.raises(AddressError):
        L3n4Addr(ipaddress.ip_address("::1" if v6 else "10.0.0.1"), port, proto, scope)


@settings(max_examples=100, deadline=None)
@given(
    st.text(max_size=5),
    st.lists(st.text(max_size=5), max_size=3).map(tuple),
    st.sampled_from(list(BackendState)),
    st.booleans(),
    st.floats(0, 1e9),
)
def test_new_backend_params_with_equals_constructor(
    text: str, names: tuple[str, ...], state: BackendState, unhealthy: bool, ts: float
) -> None:
    a = L3n4Addr(ipaddress.ip_address("10.0.0.1"), 8080)
    details = backend_details(text, text, names, 3, "k8s", unhealthy, ts)
    fast = new_backend_params_with(a, names, 7, state, details)
    slow = BackendParams(a, names, 7, text, text, names, 3, "k8s", state, unhealthy, ts)
    assert fast == slow and hash(fast) == hash(slow) and repr(fast) == repr(slow)
    # Equal details share one tuple.
    assert backend_details(text, text, names, 3, "k8s", unhealthy, ts) is details or (
        type(ts) is not float
    )


def test_frontend_pending_with_equals_pending() -> None:
    from reconciler.status import status_done
    from tables.frontends import Frontend, SVCType
    from tables.services import Service

    fe = Frontend(
        L3n4Addr(ipaddress.ip_address("10.0.0.1"), 80), SVCType.NODE_PORT, "ns/a", "http",
        8080, Service("ns/a"), (), 7, "ns/b", status_done(),
    )
    svc2 = Service("ns/a", source="api")
    bes = (BackendParams(L3n4Addr(ipaddress.ip_address("10.1.0.1"), 8080)),)
    got, ref = fe.pending_with(svc2, bes), fe.pending(service=svc2, backends=bes)
    # Each Pending status is a fresh object with an id of its own: compared by kind.
    assert got.copy_with(status=ref.status) == ref
    assert got.service is svc2 and got.backends is bes
    assert got.status.kind is ref.status.kind and got.status.kind.value == "Pending"
    assert got.status is not fe.status


def test_new_service_equals_constructor() -> None:
    import dataclasses

    from tables.services import Service, new_service

    svc = Service("ns/a", source="api", labels=(("a", "b"),), session_affinity=True,
                  session_affinity_timeout=30, traffic_distribution="PreferClose")
    fast = new_service(*[getattr(svc, f.name) for f in dataclasses.fields(Service)])
    assert fast == svc and hash(fast) == hash(svc) and repr(fast) == repr(svc)


def test_fast_specs_equal_constructors() -> None:
    import dataclasses

    from bpfops.model import (
        BackendSpec,
        FrontendSpec,
        ServiceSpec,
        fast_frontend_spec,
        fast_service_spec,
    )

    ss = ServiceSpec("ns/a", True, 30, False, True, (), True, "maglev", "dsr", True, False,
                     "x", 15000, True)
    assert fast_service_spec(*[getattr(ss, f.name) for f in dataclasses.fields(ss)]) == ss
    addr = L3n4Addr(ipaddress.ip_address("10.0.0.1"), 80)
    fs = FrontendSpec(addr, "ClusterIP", ss, (BackendSpec(addr),), 80)
    fast = fast_frontend_spec(*[getattr(fs, f.name) for f in dataclasses.fields(fs)])
    assert fast == fs and repr(fast) == repr(fs)


def test_specs_behave_as_frozen_dataclasses() -> None:
    """The specs are named tuples that dataclasses.fields/replace/asdict see as frozen
    dataclasses of their fields (tests and tools use those)."""
    import dataclasses

    import pytest

    from bpfops.model import BackendSpec, FrontendSpec, ServiceSpec

    addr = L3n4Addr(ipaddress.ip_address("10.0.0.1"), 80)
    be = BackendSpec(addr)
    for cls in (BackendSpec, FrontendSpec, ServiceSpec):
        assert dataclasses.is_dataclass(cls)
        assert tuple(f.name for f in dataclasses.fields(cls)) == cls._fields
    changed = dataclasses.replace(be, state=1, not_serving=True)
    assert changed == BackendSpec(addr, 1, not_serving=True)
    assert changed == be._replace(state=1, not_serving=True)
    assert type(changed) is BackendSpec and be.state == 0  # a new spec; the old unchanged
    assert dataclasses.asdict(be)["weight"] == 100
    with pytest.raises(AttributeError):
        be.state = 2  # type: ignore[misc]
    svc = ServiceSpec("ns/a")
    fs = FrontendSpec(addr, "ClusterIP", svc, (be,))
    assert dataclasses.replace(fs, backends=()) == FrontendSpec(addr, "ClusterIP", svc)
    assert hash(fs) == hash(FrontendSpec(addr, "ClusterIP", svc, (BackendSpec(addr),)))


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.integers(0, 2**32 - 1), max_size=4, unique=True),
    st.lists(st.text(max_size=5), max_size=3).map(tuple),
    st.integers(0, 65535),
    st.sampled_from(list(BackendState)),
)
def test_bulk_backend_builders_equal_constructors(
    ips: list[int], names: tuple[str, ...], weight: int, state: BackendState
) -> None:
    """`backend_params_of`, `new_backend_params_from` and `single_backends` (plain slot
    stores, then the class) build exactly what the constructors build: same class, value,
    hash, repr, pickle, size, and they stay frozen."""
    import copy
    import dataclasses
    import pickle
    import sys

    from tables.backends import (
        Backend,
        backend_params_of,
        backend_rest,
        backend_shared_part,
        new_backend_params_from,
        single_backends,
    )

    addrs = [L3n4Addr(ipaddress.IPv4Address(n), 8080) for n in ips]
    details = backend_details("node", "zone", (), 0, "k8s", False, 0.0)
    rest = backend_rest(details, names, weight, state)
    slow = [BackendParams(a, names, weight, "node", "zone", (), 0, "k8s", state) for a in addrs]
    for fast in (backend_params_of(addrs, [rest] * len(addrs)),
                 [new_backend_params_from(a, rest) for a in addrs]):
        assert [type(p) for p in fast] == [BackendParams] * len(addrs)
        assert fast == slow and list(map(hash, fast)) == list(map(hash, slow))
        assert list(map(repr, fast)) == list(map(repr, slow))
        assert all(backend_shared_part(p) is rest for p in fast)
        assert [pickle.loads(pickle.dumps(p)) for p in fast] == slow
        assert [copy.copy(p) for p in fast] == slow
        assert [sys.getsizeof(p) for p in fast] == [sys.getsizeof(p) for p in slow]
        for p in fast:
            with pytest.raises(dataclasses.FrozenInstanceError):
                p.weight = 1  # type: ignore[misc]
        key = ("ns/svc", 3)
        rows = single_backends(key, fast)
        want = [Backend(p.address, ((key, p),)) for p in slow]
        assert [type(b) for b in rows] == [Backend] * len(addrs)
        assert rows == want and list(map(hash, rows)) == list(map(hash, want))
        assert list(map(repr, rows)) == list(map(repr, want))
        assert [b.instances[0][1] for b in rows] == fast
        assert [sys.getsizeof(b) for b in rows] == [sys.getsizeof(b) for b in want]
        for b in rows:
            with pytest.raises(dataclasses.FrozenInstanceError):
                b.address = addrs[0]  # type: ignore[misc]
