"""The plan's joined encoders and combined tests give what their one-by-one forms give."""

from __future__ import annotations

import ipaddress
import itertools
from array import array

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
    slot_values,
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
    assert backend_values(addrs, addrs[0][18], want) == b"".join(
        addr_head(a) + tail for a in addrs
    )


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(1, 2**32 - 1), min_size=1, max_size=12),
    st.integers(1, 0xFFFF),
    st.integers(0, 0xFFFF),
)
def test_slot_values_are_the_codecs(ids: list[int], fe_id: int, flags: int) -> None:
    want = b"".join(
        lb.SERVICE4_VALUE.encode(lb.ServiceValue(i, 0, fe_id, flags & 0xFF, flags >> 8, 0))
        for i in ids
    )
    assert slot_values(array("I", ids), fe_id, flags) == want


def test_in_rounds_is_enabled_candidate_and_not_expanded() -> None:
    addrs = [Addr(ip(t), 80) for t in ("10.96.0.1", "0.0.0.0", "fd00::1", "::")]
    for kpr, v4, v6 in itertools.product([False, True], repeat=3):
        cfg = LBOpsConfig(kube_proxy_replacement=kpr, enable_ipv4=v4, enable_ipv6=v6)
        for a, t in itertools.product(addrs, (*FRONTEND_TYPES, "LocalRedirect")):
            fe = FrontendSpec(a, t, ServiceSpec("ns/svc"))
            want = enabled(cfg, a) and is_candidate(cfg, fe) and not is_expansion(fe)
            assert in_rounds(cfg, fe) == want, (kpr, v4, v6, a, t)
