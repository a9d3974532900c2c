"""FrontendState between updates: the backends of a frontend kept as a tuple when they all
want the same, given back as the dict the ops change, and never replaced while held."""

from __future__ import annotations

import dataclasses
import gc
import sys

from bpfops.frontend_ops import FrontendOps
from bpfops.frontend_state import FrontendState
from bpfops.lb_maps import LBMaps
from bpfops.maps_dump import dump_lines
from reconciler.operations import BatchEntry
from tests.bpfops.conftest import MapsMaker
from tests.bpfops.helpers import NO_TXN, addr, be, fe, new_ops, normalize_ids

A, B, C = addr("10.244.0.1:80"), addr("10.244.0.2:80"), addr("10.244.0.3:80")


def test_compact_keeps_order_and_want() -> None:
    st = FrontendState(7, False)
    d = st.backends
    d.update({C: 0, A: 0, B: 0})
    del d
    st.compact()
    assert st.is_compact
    assert list(st.backends.items()) == [(C, 0), (A, 0), (B, 0)]
    assert not st.is_compact


def _held_bytes(st: FrontendState) -> int:
    """What the state's slots hold, shallow (the dict or tuple of its backends included)."""
    return sum(sys.getsizeof(o) for o in gc.get_referents(st) if not isinstance(o, type))


def test_compact_form_is_smaller_than_the_dict() -> None:
    st = FrontendState(7, False)
    st.backends = {addr(f"10.244.0.{i}:80"): 0 for i in range(10)}
    as_dict = _held_bytes(st)
    st.compact()
    assert st.is_compact
    assert as_dict - _held_bytes(st) >= 200  # 352 bytes of dict, 128 of tuple


def test_mixed_or_missing_wants_stay_a_dict() -> None:
    st = FrontendState(7, False)
    st.backends = {A: 0, B: 1 << 24}
    st.compact()
    assert not st.is_compact
    st.backends = {A: 0, B: None}
    st.compact()
    assert not st.is_compact
    st.backends = {A: None, B: None}
    st.compact()
    assert st.is_compact and st.backends == {A: None, B: None}


def test_no_backends() -> None:
    st = FrontendState(7, False)
    assert st.backends == {}
    st.compact()
    assert st.is_compact and st.backends == {}


def test_a_held_dict_is_not_replaced() -> None:
    st = FrontendState(7, False)
    held = st.backends
    held[A] = 0
    st.compact()
    assert not st.is_compact
    held[B] = 0  # the holder's change is the state's
    assert st.backends == {A: 0, B: 0}


def _compact_states(ops: FrontendOps[object]) -> list[bool]:
    return [st.is_compact for st in ops.frontends.values()]


def test_ops_keep_states_compact_and_updates_read_them(make_maps: MapsMaker) -> None:
    """After each update (one at a time and in a batch) every state is compact, and an
    update that drops a backend and changes another's state gives the maps a fresh ops
    writes for the final frontends."""
    maps = make_maps()
    ops = new_ops(maps)
    one = fe("10.96.0.1:80", backends=(be("10.244.0.1:80"), be("10.244.0.2:80")))
    two = fe("10.96.0.2:80", backends=(be("10.244.0.2:80"), be("10.244.0.3:80")))
    ops.update(NO_TXN, 1, one)
    assert _compact_states(ops) == [True]
    batch = [BatchEntry(two, 2), BatchEntry(one, 3)]
    ops.update_batch(NO_TXN, batch)
    assert all(e.result is None for e in batch)
    assert _compact_states(ops) == [True, True]
    one_after = dataclasses.replace(
        one, backends=(be("10.244.0.2:80", 1), be("10.244.0.4:80"))
    )
    two_after = dataclasses.replace(two, backends=(be("10.244.0.3:80"),))
    batch = [BatchEntry(one_after, 4)]
    ops.update_batch(NO_TXN, batch)
    ops.update(NO_TXN, 5, two_after)
    assert batch[0].result is None
    # one_after's backends want different values (active and terminating): a dict.
    assert ops.frontends[one.addr].backends == {
        addr("10.244.0.2:80"): 1 << 24,
        addr("10.244.0.4:80"): 0,
    }
    assert ops.frontends[two.addr].is_compact

    fresh_maps: LBMaps = make_maps()
    fresh = new_ops(fresh_maps)
    fresh.update(NO_TXN, 1, one_after)
    fresh.update(NO_TXN, 2, two_after)
    assert sorted(normalize_ids(dump_lines(maps))) == sorted(
        normalize_ids(dump_lines(fresh_maps))
    )
