"""The direct encoders of bpf.lb (*_STRUCT) give exactly the codecs' bytes."""

from __future__ import annotations

import ipaddress
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from bpf import lb
from bpf.codec import BE16, U32
from bpfops.frontend_plan import addr_head, backend_tail, master_key, master_value, svc_key
from bpfops.frontend_state import FrontendState, PendingFrontend, backend_bytes, want_of
from bpfops.maps_dump import AFFINITY_TIMEOUT_MASK, LB_ALG_NUMBERS, LB_ALG_SHIFT
from bpfops.model import (
    Addr,
    BackendSpec,
    FrontendSpec,
    LBOpsConfig,
    ServiceSpec,
    fast_addr,
    fast_backend_spec,
    proto_number,
)

u8 = st.integers(0, 0xFF)
u16 = st.integers(0, 0xFFFF)
u32 = st.integers(0, 0xFFFFFFFF)
v4 = st.binary(min_size=4, max_size=4)
v6 = st.binary(min_size=16, max_size=16)
protos = st.sampled_from(["TCP", "UDP", "SCTP", "ANY"])


@given(v4, u16, u16, u8, u8)
def test_service4_key(address: bytes, dport: int, slot: int, proto: int, scope: int) -> None:
    want = lb.SERVICE4_KEY.encode(lb.Service4Key(address, dport, slot, proto, scope))
    got = lb.SERVICE4_KEY_STRUCT.pack(address, lb.swap16(dport), slot, proto, scope)
    assert got == want


@given(v6, u16, u16, u8, u8)
def test_service6_key(address: bytes, dport: int, slot: int, proto: int, scope: int) -> None:
    want = lb.SERVICE6_KEY.encode(lb.Service6Key(address, dport, slot, proto, scope))
    got = lb.SERVICE6_KEY_STRUCT.pack(address, lb.swap16(dport), slot, proto, scope)
    assert got == want


@given(u32, u16, u16, u8, u8, u16)
def test_service_value(be_id: int, count: int, rev: int, f1: int, f2: int, q: int) -> None:
    value = lb.ServiceValue(be_id, count, rev, f1, f2, q)
    got = lb.SERVICE_VALUE_STRUCT.pack(be_id, count, lb.swap16(rev), f1, f2, q)
    assert got == lb.SERVICE4_VALUE.encode(value) == lb.SERVICE6_VALUE.encode(value)


@given(v4, u16, u8, u8, u16, u8)
def test_backend4(address: bytes, port: int, proto: int, flags: int, cid: int, zone: int) -> None:
    want = lb.BACKEND4.encode(lb.Backend4(address, port, proto, flags, cid, zone))
    assert lb.BACKEND4_STRUCT.pack(address, lb.swap16(port), proto, flags, cid, zone) == want


@given(v6, u16, u8, u8, u16, u8)
def test_backend6(address: bytes, port: int, proto: int, flags: int, cid: int, zone: int) -> None:
    want = lb.BACKEND6.encode(lb.Backend6(address, port, proto, flags, cid, zone))
    assert lb.BACKEND6_STRUCT.pack(address, lb.swap16(port), proto, flags, cid, zone) == want


@given(v4, v6, u16)
def test_revnat(a4: bytes, a6: bytes, port: int) -> None:
    assert lb.REVNAT4_STRUCT.pack(a4, lb.swap16(port)) == lb.REVNAT4.encode(lb.RevNat4(a4, port))
    assert lb.REVNAT6_STRUCT.pack(a6, lb.swap16(port)) == lb.REVNAT6.encode(lb.RevNat6(a6, port))


@given(u32, u16)
def test_affinity_match_and_scalars(be_id: int, rev: int) -> None:
    want = lb.AFFINITY_MATCH_KEY.encode(lb.AffinityMatchKey(be_id, rev))
    assert lb.AFFINITY_MATCH_KEY_STRUCT.pack(be_id, lb.swap16(rev)) == want
    assert lb.U32_STRUCT.pack(be_id) == U32.encode(be_id)
    assert lb.BE16_STRUCT.pack(rev) == BE16.encode(rev)


ips = st.one_of(
    st.integers(0, 2**32 - 1).map(ipaddress.IPv4Address),
    st.integers(0, 2**128 - 1).map(ipaddress.IPv6Address),
)


@given(ips, st.integers(1, 0xFFFF), protos, u8, u16, u8)
def testbackend_bytes(ip, port: int, proto: str, state: int, cid: int, zone: int) -> None:  # type: ignore[no-untyped-def]
    addr = Addr(ip, port, proto)
    pn = proto_number(proto)
    if ip.version == 6:
        want = lb.BACKEND6.encode(lb.Backend6(ip.packed, port, pn, state, cid, zone))
    else:
        want = lb.BACKEND4.encode(lb.Backend4(ip.packed, port, pn, state, cid, zone))
    assert backend_bytes(addr, want_of(state, cid, zone)) == want


@given(ips, st.integers(1, 0xFFFF), protos, u8, u16, u8)
def test_backend_value_from_the_key_bytes(  # type: ignore[no-untyped-def]
    ip, port: int, proto: str, state: int, cid: int, zone: int
) -> None:
    """A backends-map value as the Ops build it: the address' key bytes and a shared tail."""
    addr = Addr(ip, port, proto)
    want = want_of(state, cid, zone)
    assert addr_head(addr) + backend_tail(addr[18], want) == backend_bytes(addr, want)
    # The rev-NAT value of a frontend at that address is its head.
    revnat = lb.RevNat6(ip.packed, port) if ip.version == 6 else lb.RevNat4(ip.packed, port)
    assert addr_head(addr) == (lb.REVNAT6 if ip.version == 6 else lb.REVNAT4).encode(revnat)


@given(
    st.tuples(u8, u16, u8),
    st.tuples(u8, u16, u8),
)
def test_want_orders_like_the_value_tuple(a: tuple[int, int, int], b: tuple[int, int, int]) -> None:
    assert (want_of(*a) < want_of(*b)) == (a < b)
    assert (want_of(*a) == want_of(*b)) == (a == b)


@given(ips, u16, u16, protos, st.integers(0, 1))
def test_svc_key(ip, port: int, slot: int, proto: str, scope: int) -> None:  # type: ignore[no-untyped-def]
    addr = Addr(ip, port, proto, scope)
    if ip.version == 6:
        want = lb.SERVICE6_KEY.encode(
            lb.Service6Key(ip.packed, port, slot, proto_number(proto), scope)
        )
    else:
        want = lb.SERVICE4_KEY.encode(
            lb.Service4Key(ip.packed, port, slot, proto_number(proto), scope)
        )
    assert svc_key(addr, slot) == want


@given(ips, u16, protos, st.integers(0, 1), u8, st.booleans(), st.booleans())
def test_fast_model_constructors(
    ip: Any, port: int, proto: str, scope: int, state: int, x: bool, y: bool
) -> None:
    a, b = fast_addr(ip, port, proto, scope), Addr(ip, port, proto, scope)
    assert a == b and hash(a) == hash(b) and repr(a) == repr(b)
    fast = fast_backend_spec(a, state, 100, x, 2, 3, 4, y, x)
    slow = BackendSpec(b, state, 100, x, 2, 3, 4, y, x)
    assert fast == slow and hash(fast) == hash(slow) and repr(fast) == repr(slow)


@settings(max_examples=300, deadline=None)
@given(ips, u16, protos, st.integers(0, 1))
def test_master_key_is_slot_zero(ip: Any, port: int, proto: str, scope: int) -> None:
    addr = Addr(ip, port, proto, scope)
    assert master_key(addr) == svc_key(addr, 0)


@settings(max_examples=300, deadline=None)
@given(
    st.booleans(),
    st.integers(1, 0xFFFF),
    u16,
    u16,
    u16,
    st.booleans(),
    st.integers(0, 1 << 24),
    st.sampled_from([0, 0, 8080]),
    st.sampled_from(["", "random", "maglev"]),
    st.booleans(),
)
def test_master_value_is_the_codecs(
    v6: bool,
    fe_id: int,
    active: int,
    inactive: int,
    flags: int,
    affinity: bool,
    timeout: int,
    l7: int,
    algorithm: str,
    annotation: bool,
) -> None:
    """`master_value` (encoded inline) gives the codec's bytes of the master's fields."""
    cfg = LBOpsConfig(algorithm_annotation=annotation)
    service = ServiceSpec(
        "ns/svc", session_affinity=affinity, affinity_timeout=timeout, lb_algorithm=algorithm,
        l7_proxy_port=l7,
    )
    addr = Addr(ipaddress.ip_address("f00d::1" if v6 else "10.0.0.1"), 80, "TCP", 0)
    fe = FrontendSpec(addr, "ClusterIP", service)
    p = PendingFrontend(fe, FrontendState(fe_id, v6), None, None, [], active, inactive, flags)  # type: ignore[arg-type]
    if l7:
        head = lb.swap16(l7)
    else:
        alg = LB_ALG_NUMBERS.get(algorithm, 0) if annotation else 0
        head = (alg << LB_ALG_SHIFT) | (timeout & AFFINITY_TIMEOUT_MASK if affinity else 0)
    value = lb.ServiceValue(head, active, fe_id, flags & 0xFF, flags >> 8, inactive)
    codec = lb.SERVICE6_VALUE if v6 else lb.SERVICE4_VALUE
    assert master_value(cfg, p) == codec.encode(value)
