"""SortedMap against a model: every frozen snapshot keeps reading what the model held when it
was frozen (keys, values, and the first items `firsts_from` iterates from its shared per-chunk
lists), whatever the transient writes afterwards."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from statedb import sortedmap
from statedb.sortedmap import SortedMap

KEYS = st.integers(0, 3000)
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("set"), KEYS, st.integers(0, 5)),
        st.tuples(st.just("set_run"), KEYS, st.integers(1, 700)),
        st.tuples(st.just("pop"), KEYS),
        st.tuples(st.just("pop_run"), KEYS, st.integers(1, 700)),
        st.tuples(st.just("freeze"), st.booleans()),
        st.tuples(
            st.just("transient"),
        ),
    ),
    max_size=40,
)


def check(m: SortedMap, model: dict[int, tuple[int, int]], probes: list[int]) -> None:
    items = sorted(model.items())
    assert len(m) == len(items)
    assert list(m.items_from()) == items
    assert list(m.firsts_from()) == [v[0] for _, v in items]
    for p in probes:
        assert list(m.firsts_from(p)) == [v[0] for k, v in items if k >= p]
        assert list(m.values_from(p)) == [v for k, v in items if k >= p]
        assert m.get(p) == model.get(p)


@settings(max_examples=150, deadline=None)
@given(OPS, st.lists(KEYS, max_size=5))
def test_frozen_maps_keep_their_contents_and_first_items(ops: list[Any], probes: list[int]) -> None:
    m = sortedmap.EMPTY.transient()
    model: dict[int, tuple[int, int]] = {}
    frozen: list[tuple[SortedMap, dict[int, tuple[int, int]]]] = []
    for step, op in enumerate(ops):
        if op[0] == "set":
            m.set(op[1], (op[1] * 10 + op[2], step))
            model[op[1]] = (op[1] * 10 + op[2], step)
        elif op[0] == "set_run":
            for k in range(op[1], op[1] + op[2]):
                m.set(k, (k, step))
                model[k] = (k, step)
        elif op[0] == "pop":
            assert m.pop(op[1]) == model.pop(op[1], None)
        elif op[0] == "pop_run":
            for k in range(op[1], op[1] + op[2]):
                assert m.pop(k) == model.pop(k, None)
        elif op[0] == "freeze":
            snap = m.freeze()
            # Read it at once (first items built and shared) or only later.
            if op[1]:
                check(snap, model, probes)
            frozen.append((snap, dict(model)))
        else:
            # A new writer from the newest frozen map (as ordered views are derived).
            if frozen:
                m = frozen[-1][0].transient()
                model = dict(frozen[-1][1])
        for snap, snap_model in frozen:
            check(snap, snap_model, probes)
    check(m.freeze(), model, probes)
