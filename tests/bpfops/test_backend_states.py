"""BackendStates: the packed per-backend state of FrontendOps against a plain model."""

from __future__ import annotations

import ipaddress
import sys

from hypothesis import given, settings
from hypothesis import strategies as st

from bpfops.backend_states import NONE, BackendStates
from bpfops.model import Addr

FES = [Addr(ipaddress.IPv4Address(f"10.0.0.{i}"), 80) for i in range(4)]
BE = Addr(ipaddress.IPv4Address("10.1.0.1"), 8080)

wants = st.sampled_from([0, 1, 5, 1 << 24, 3 << 24, 0xFFFFFFFF])


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 3), wants), max_size=40))
def test_wants_match_a_dict_of_wants(ops: list[tuple[bool, int, int]]) -> None:
    """set_want/pop_want/effective behave like a dict frontend -> want and its minimum;
    the frontends' own record of their want is passed in as ``prev``, as the ops do."""
    states = BackendStates()
    states.add(BE, 7)
    model: dict[Addr, int] = {}
    for put, i, want in ops:
        fe = FES[i]
        if put:
            states.set_want(BE, model.get(fe), want)
            model[fe] = want
        else:
            states.pop_want(BE, model.pop(fe, None))
        assert states.has_wants(BE) == bool(model)
        assert states.is_shared(BE) == (len(model) > 1)
        if model:
            assert states.effective(BE) == min(model.values())
        assert states.id(BE) == 7  # the other fields are untouched
        assert states.written(BE) is None and states.refcount(BE) == 0


@settings(max_examples=200, deadline=None, derandomize=True)
@given(
    st.integers(1, 0xFFFFFFFE),
    st.integers(0, 0xFFFFFF),
    st.one_of(st.none(), st.integers(0, 0xFFFFFFFF)),
    st.one_of(st.none(), st.integers(0, 0xFFFFFFFF)),
)
def test_fields_keep_their_values(
    id_: int, refcount: int, want: int | None, written: int | None
) -> None:
    """Each field holds any value of its range whatever the others hold."""
    states = BackendStates()
    states.add(BE, id_)
    states.set_refcount(BE, refcount)
    if want is not None:
        states.set_want(BE, None, want)
    states.set_written(BE, written)
    assert states.id(BE) == id_ and states.get(BE) == id_
    assert states.refcount(BE) == refcount
    assert states.written(BE) == written
    assert states.has_wants(BE) == (want is not None)
    if want is not None:
        assert states.effective(BE) == want


def test_unreferenced_lists_the_entries_with_no_reference() -> None:
    """What a prune deletes from the record alone: the entries whose count is 0, whatever
    their other fields hold."""
    states = BackendStates()
    states.add(BE, 1)
    states.add(FES[0], 2)
    states.add(FES[1], 3)
    states.set_refcount(FES[0], 1)
    states.set_refcount(FES[1], 0xFFFFFF)
    states.set_want(BE, None, 7)
    states.set_written(BE, 7)
    assert states.unreferenced() == [BE]
    states.set_refcount(FES[0], 0)
    assert sorted(states.unreferenced()) == sorted([BE, FES[0]])


def test_reference_count_out_of_range_is_an_error() -> None:
    states = BackendStates()
    states.add(BE, 1)
    try:
        states.set_refcount(BE, 1 << 24)
    except ValueError as exc:
        assert "10.1.0.1" in str(exc) and "reference count" in str(exc)
    else:
        raise AssertionError("no error")
    assert states.refcount(BE) == 0


def test_holders_protocol_and_removal() -> None:
    """The id allocator's view: ids by address; remove forgets the shared wants too."""
    states = BackendStates()
    states.add(BE, 3)
    states.add(FES[0], 4)
    states[BE] = 3  # recorded by add already
    assert dict(states.items()) == {BE: 3, FES[0]: 4}
    assert sorted(states.values()) == [3, 4] and len(states) == 2
    assert states.pop(BE, None) == 3 and BE in states  # the ops remove it next
    states.set_want(BE, None, 1)
    states.set_want(BE, None, 2)
    states.remove(BE)
    assert BE not in states and not states.shared and states.get(BE) is None
    states.reset()
    assert len(states) == 0


def test_an_active_backend_costs_one_small_int() -> None:
    """The usual entry (referenced once, active, written) is a 32-byte int."""
    states = BackendStates()
    states.add(BE, 40_000)
    states.set_refcount(BE, 1)
    states.set_want(BE, None, 0)
    states.set_written(BE, 0)
    v = states.packed[BE]
    assert sys.getsizeof(v) <= 32
    assert (v >> 89) != NONE
