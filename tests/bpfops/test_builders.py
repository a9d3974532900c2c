"""The ops' plain-function builders give exactly what their classes' constructors give,
and `WildcardEntries.new_entry` (its checks and keys inline) what `applies`, `vip_key`
and the codecs give."""

from __future__ import annotations

import ipaddress
import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from bpf import lb
from bpfops.backend_states import BackendStates
from bpfops.frontend_plan import addr_head, master_key
from bpfops.frontend_state import (
    CollectedWrites,
    FrontendState,
    PendingFrontend,
    bulk_writes,
    new_pending,
    new_state,
)
from bpfops.model import FRONTEND_TYPES, Addr, FrontendSpec, LBOpsConfig, ServiceSpec
from bpfops.wildcards import WildcardEntries, entry_value, vip_key
from tests.bpfops.helpers import ip


def _slots(obj: object) -> dict[str, object]:
    """Every slot of ``obj`` (its class's ``__slots__``) that is set, by name."""
    out = {}
    for name in type(obj).__slots__:
        try:
            out[name] = getattr(obj, name)
        except AttributeError:
            pass
    return out


def test_new_state_is_a_fresh_frontend_state() -> None:
    for id_, v6 in itertools.product((1, 7, 0xFFFE), (False, True)):
        built, made = new_state(id_, v6), FrontendState(id_, v6)
        assert type(built) is FrontendState
        assert _slots(built) == _slots(made)
        assert len(_slots(built)) == len(FrontendState.__slots__)


def test_bulk_writes_are_collected_writes_with_their_run() -> None:
    states, st = BackendStates(), FrontendState(3, False)
    be = (b"k", b"v", (Addr(ip("10.0.0.1"), 80),), (None,))
    svc = (b"sk", b"sv", (0,), (0,))
    built = bulk_writes(states, st, be, svc, 41)
    made = CollectedWrites(states, st, be, svc)
    made.run = 41
    assert type(built) is CollectedWrites
    assert _slots(built) == _slots(made)
    assert len(_slots(built)) == len(CollectedWrites.__slots__)


def test_new_pending_is_a_pending_frontend() -> None:
    for a in (Addr(ip("10.96.0.1"), 80), Addr(ip("fd00::1"), 443, "UDP")):
        fe = FrontendSpec(a, "ClusterIP", ServiceSpec("ns/svc"))
        st = FrontendState(9, a.is_v6)
        for orphans in (None, [], [(Addr(ip("10.0.0.9"), 80), 4)]):
            built = new_pending(
                fe, st, None, None, (), 2, 1, 5, orphans, addr_head(a), master_key(a)  # type: ignore[arg-type]
            )
            made = PendingFrontend(fe, st, None, None, (), 2, 1, 5)  # type: ignore[arg-type]
            if orphans:
                made.orphans = orphans
            made.master_key = master_key(a)
            assert type(built) is PendingFrontend
            assert _slots(built) == _slots(made)
            assert len(_slots(built)) == len(PendingFrontend.__slots__)
            assert built.head == addr_head(a)


def _expected_entry(
    w: WildcardEntries, fe: FrontendSpec, local: bool
) -> tuple[bytes, bytes, bytes] | None:
    """What `new_entry` gives, from `applies`, `vip_key` and the codecs."""
    a = fe.addr
    if not (w.config.wildcard_entries and w.applies(fe)) or local:
        return None
    cls = lb.Service6Key if a.is_v6 else lb.Service4Key
    codec = lb.SERVICE6_KEY if a.is_v6 else lb.SERVICE4_KEY
    key = codec.encode(cls(a.packed, 0, 0, 0, a.scope))
    return vip_key(a), key, entry_value(fe.type)


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from(["10.96.0.1", "0.0.0.0", "fd00::1", "::", "192.168.1.2", "2001:db8::7"]),
    st.integers(0, 65535),
    st.sampled_from(["TCP", "UDP", "ANY"]),
    st.sampled_from([0, 1]),
    st.sampled_from([*FRONTEND_TYPES, "LocalRedirect"]),
    st.sampled_from([None, "io.cilium/l2-announcer", "other"]),
    st.booleans(),
    st.booleans(),
    st.booleans(),
    st.booleans(),
)
def test_new_entry_is_applies_and_the_codecs(
    text: str,
    port: int,
    proto: str,
    scope: int,
    fe_type: str,
    lb_class: str | None,
    enabled: bool,
    lbipam: bool,
    local: bool,
    referenced: bool,
) -> None:
    cfg = LBOpsConfig(wildcard_entries=enabled, default_lb_class_is_lbipam=lbipam)
    w = WildcardEntries(None, cfg)  # type: ignore[arg-type]
    a = Addr(ipaddress.ip_address(text), port, proto, scope)
    fe = FrontendSpec(a, fe_type, ServiceSpec("ns/svc", load_balancer_class=lb_class))
    if referenced:
        w.refs[vip_key(a)] = 5
    p = PendingFrontend(fe, FrontendState(5, a.is_v6), lambda _a: local, None, (), 0, 0, 0)  # type: ignore[arg-type]
    want = None if referenced else _expected_entry(w, fe, local)
    assert w.new_entry(p) == want
