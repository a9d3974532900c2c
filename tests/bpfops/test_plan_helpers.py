"""The plan's joined encoders and combined tests give what their one-by-one forms give."""

from __future__ import annotations

import ipaddress
import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from bpf import lb
from bpfops.frontend_plan import (
    addr_head,
    backend_tail,
    backend_values,
    enabled,
    in_rounds,
    is_candidate,
    is_expansion,
    run_entries,
    usual_keys,
)
from bpfops.model import FRONTEND_TYPES, Addr, FrontendSpec, LBOpsConfig, ServiceSpec
from tests.bpfops.helpers import ip


@settings(max_examples=200, deadline=None)
@given(
    st.booleans(),
    st.lists(st.integers(1, 2**16), min_size=1, max_size=12, unique=True),
    st.sampled_from(["TCP", "UDP", "SCTP"]),
    st.sampled_from([0, 1 << 24, 2 << 24, (1 << 24) | (7 << 8) | 3]),
)
def test_backend_values_join_each_backends_value(
    v6: bool, hosts: list[int], proto: str, want: int
) -> None:
    base = ipaddress.ip_address("fd00::" if v6 else "10.0.0.0")
    addrs = [Addr(base + h, 1000 + h % 50000, proto) for h in hosts]
    tail = backend_tail(addrs[0][18], want)
    assert backend_values(b"".join(addrs), len(addrs), addrs[0][18], want) == b"".join(
        addr_head(a) + tail for a in addrs
    )


def test_backend_values_of_none_and_of_many() -> None:
    assert backend_values(b"", 0, 1, 0) == b""
    # Past the counts whose layouts are kept, too.
    addrs = [Addr(ipaddress.ip_address(0x0A000000 + h), 80 + h % 3, "UDP") for h in range(2000)]
    tail = backend_tail(addrs[0][18], 0)
    assert backend_values(b"".join(addrs), 2000, addrs[0][18], 0) == b"".join(
        addr_head(a) + tail for a in addrs
    )


def _usual_one_by_one(addrs: list[Addr], family: int) -> int | None:
    """`usual_keys` as a loop over the addresses."""
    proto = addrs[0][18] if addrs else 0
    for a in addrs:
        if a[20] != family or a[18] != proto or a.port == 0:
            return None
    return proto


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.booleans(),
            st.integers(1, 2**16),
            st.sampled_from([0, 1, 80, 255, 256, 257, 443, 512, 8080, 65280, 65535]),
            st.sampled_from(["TCP", "UDP", "SCTP", "ANY"]),
        ),
        max_size=12,
    ),
    st.sampled_from([4, 6]),
)
def test_usual_keys_checks_each_address(
    spec: list[tuple[bool, int, int, str]], family: int
) -> None:
    addrs = [
        Addr(ipaddress.ip_address("fd00::" if v6 else "10.0.0.0") + h, port, proto)
        for v6, h, port, proto in spec
    ]
    assert usual_keys(b"".join(addrs), len(addrs), family) == _usual_one_by_one(addrs, family)


@settings(max_examples=300, deadline=None)
@given(
    st.integers(0, 2**32 - 1),
    st.integers(0, 300),
    st.integers(0, 0xFFFF),
    st.integers(0, 0xFFFF),
)
def test_run_entries_are_the_codecs(start: int, n: int, fe_id: int, flags: int) -> None:
    n = min(n, 2**32 - start)  # ids are 32-bit
    ids = range(start, start + n)
    keys, values = run_entries(start, n, fe_id, flags)
    assert keys == b"".join(lb.U32_STRUCT.pack(i) for i in ids)
    assert values == b"".join(
        lb.SERVICE4_VALUE.encode(lb.ServiceValue(i, 0, fe_id, flags & 0xFF, flags >> 8, 0))
        for i in ids
    )


def test_run_entries_of_long_runs() -> None:
    # Past the counts whose multipliers are kept, too.
    n = 5000
    keys, values = run_entries(7, n, 513, 0x8001)
    assert keys == b"".join(lb.U32_STRUCT.pack(i) for i in range(7, 7 + n))
    assert values[-12:] == lb.SERVICE4_VALUE.encode(
        lb.ServiceValue(6 + n, 0, 513, 0x01, 0x80, 0)
    )


def test_in_rounds_is_enabled_candidate_and_not_expanded() -> None:
    addrs = [Addr(ip(t), 80) for t in ("10.96.0.1", "0.0.0.0", "fd00::1", "::")]
    for kpr, v4, v6 in itertools.product([False, True], repeat=3):
        cfg = LBOpsConfig(kube_proxy_replacement=kpr, enable_ipv4=v4, enable_ipv6=v6)
        for a, t in itertools.product(addrs, (*FRONTEND_TYPES, "LocalRedirect")):
            fe = FrontendSpec(a, t, ServiceSpec("ns/svc"))
            want = enabled(cfg, a) and is_candidate(cfg, fe) and not is_expansion(fe)
            assert in_rounds(cfg, fe) == want, (kpr, v4, v6, a, t)
