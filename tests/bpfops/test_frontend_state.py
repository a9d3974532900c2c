"""FrontendState between updates: the backends of a frontend kept as a tuple when they all
want the same, given back as the dict the ops change, and never replaced while held."""

from __future__ import annotations

import dataclasses
import gc
import sys

from hypothesis import given, settings
from hypothesis import strategies as st

from bpfops.frontend_ops import FrontendOps
from bpfops.frontend_state import FrontendState
from bpfops.lb_maps import LBMaps
from bpfops.maps_dump import dump_lines
from bpfops.model import Addr
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


def _with_slots(ids: list[int], backends: int, shared: bool = False) -> FrontendState:
    st = FrontendState(7, False)
    st.slots.extend(ids)
    addrs = [addr(f"10.244.1.{i}:80") for i in range(backends)]
    if shared:
        st.set_compact(addrs, 0, tuple(_Row(a) for a in addrs))
    else:
        st.backends = dict.fromkeys(addrs, 0)
    return st


@dataclasses.dataclass(frozen=True)
class _Row:
    """An object of a shared backends tuple (as the frontend row's instances)."""

    address: Addr


def test_a_run_of_slot_ids_is_kept_as_its_first() -> None:
    st = _with_slots(list(range(5, 15)), 10)
    st.compact(5)
    assert st.is_compact and st.slots_compact
    no_run = _with_slots([*range(5, 14), 99], 10)
    no_run.compact(5)
    assert no_run.is_compact and not no_run.slots_compact
    assert _held_bytes(no_run) - _held_bytes(st) >= 80  # array of 10 ids, int of the first
    assert list(st.slots) == list(range(5, 15)) and not st.slots_compact
    st.compact()
    assert not st.slots_compact  # no run given
    st = _with_slots([5, 6, 7], 3)
    st.compact(5)
    assert st.slots_compact
    # The backends read (and changed) first: the slots are still the run of three.
    del st.backends[addr("10.244.1.0:80")]
    assert list(st.slots) == [5, 6, 7]


def test_slots_that_are_no_run_of_one_per_backend_stay_an_array() -> None:
    for ids, n in (([5, 6], 3), ([6, 7], 2), ([], 0)):  # one too few, another first
        st = _with_slots(ids, n)
        st.compact(5)
        assert not st.slots_compact and list(st.slots) == ids
    st = _with_slots([5, 6], 2)
    st.backends[addr("10.244.1.0:80")] = 1 << 24  # the wants differ: a dict
    st.compact(5)
    assert not st.is_compact and not st.slots_compact


def test_held_slots_are_not_replaced() -> None:
    st = _with_slots([5, 6], 2)
    held = st.slots
    st.compact(5)
    assert st.is_compact and not st.slots_compact
    held[0] = 0  # the holder's change is the state's
    assert list(st.slots) == [0, 6]


#: Slot ids that are a run of consecutive ids.
_runs = st.builds(lambda a, n: list(range(a, a + n)), st.integers(0, 99), st.integers(0, 6))


@settings(max_examples=300, deadline=None)
@given(
    st.one_of(_runs, st.lists(st.integers(0, 2**32 - 1), max_size=6)),
    st.integers(0, 6),
    st.booleans(),
    st.lists(st.sampled_from(["backends", "slots", "compact", "drop", "append"]), max_size=8),
)
def test_compact_slots_read_back_as_written(
    ids: list[int], n: int, shared: bool, steps: list[str]
) -> None:
    """Whatever the order of reads, changes and compactions, the slots read back as the
    array held them (a run or not, one per backend or not), and the backends as they were
    set (from a dict, or a shared tuple) and changed."""
    state = _with_slots(ids, n, shared)
    want = list(ids)
    backends = {addr(f"10.244.1.{i}:80"): 0 for i in range(n)}
    for step in steps:
        if step == "backends":
            assert state.backends == backends
        elif step == "slots":
            assert list(state.slots) == want
        elif step == "compact":
            # The run, when the slots are one (as the bulk path knows of its own).
            run = want[0] if want and want == list(range(want[0], want[0] + len(want))) else None
            state.compact(run)
        elif step == "drop" and state.backends:
            del state.backends[next(iter(state.backends))]
            del backends[next(iter(backends))]
        elif step == "append":
            state.slots.append(len(want) + 1)
            want.append(len(want) + 1)
    assert list(state.slots) == want
    assert state.backends == backends


def test_a_shared_tuple_is_kept_when_its_addresses_are_the_backends() -> None:
    addrs = [A, B, C]
    rows = tuple(_Row(a) for a in addrs)
    st = FrontendState(7, False)
    st.set_compact(addrs, 0, rows)
    assert st.is_compact and any(o is rows for o in gc.get_referents(st))
    assert list(st.backends.items()) == [(A, 0), (B, 0), (C, 0)]
    for other, want in (((rows[1], rows[0], rows[2]), 0), (rows[:2], 0), (rows, 1 << 24)):
        st = FrontendState(7, False)
        st.set_compact(addrs, want, other)
        assert st.is_compact and not any(o is other for o in gc.get_referents(st))
        assert list(st.backends.items()) == [(A, want), (B, want), (C, want)]


def test_new_frontends_of_a_batch_keep_their_slots_as_a_run(make_maps: MapsMaker) -> None:
    """The usual new frontends (their backends' ids from one run) keep their slots as the
    run's first id; a later update and delete read them back."""
    maps = make_maps()
    ops = new_ops(maps)
    fes = [
        fe(f"10.96.0.{i}:80", backends=tuple(be(f"10.244.{i}.{j}:80") for j in (1, 2, 3)))
        for i in (1, 2, 3)
    ]
    batch = [BatchEntry(f, i) for i, f in enumerate(fes)]
    ops.update_batch(NO_TXN, batch)
    assert all(e.result is None for e in batch)
    assert all(st.slots_compact for st in ops.frontends.values())
    fewer = dataclasses.replace(fes[0], backends=fes[0].backends[1:])
    ops.update(NO_TXN, 4, fewer)
    ops.delete(NO_TXN, 5, fes[1])
    fresh_maps: LBMaps = make_maps()
    fresh = new_ops(fresh_maps)
    fresh.update(NO_TXN, 1, fewer)
    fresh.update(NO_TXN, 2, fes[2])
    assert sorted(normalize_ids(dump_lines(maps))) == sorted(
        normalize_ids(dump_lines(fresh_maps))
    )
