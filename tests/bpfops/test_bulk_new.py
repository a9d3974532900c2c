"""The bulk path for new frontends (``FrontendWriter.bulk_new``) leaves the recorded state
and the maps exactly as the per-backend path does, ids included, for any mix of usual
new frontends and frontends the bulk path must leave to the per-backend one (backends
already written, other states, clusters, zones, duplicates, port 0, session affinity,
the other IP family)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bpfops.frontend_ops import FrontendOps
from bpfops.ids import IDAllocator
from bpfops.lb_maps import LBMaps
from bpfops.maps_dump import dump_lines
from bpfops.model import Addr, BackendSpec, FrontendSpec, LazyBackends, ServiceSpec
from reconciler.operations import BatchEntry
from tests.bpfops.helpers import NO_TXN, addr, fe, new_ops

FRONTENDS = [
    ("10.96.0.1:80", "ClusterIP"),
    ("10.96.0.2:80", "ClusterIP"),
    ("10.96.0.3:53", "ClusterIP"),
    ("10.0.0.5:80", "LoadBalancer"),
    ("[fd00::10]:80", "ClusterIP"),
]
BACKENDS = [f"10.244.0.{i}:8080" for i in range(1, 9)] + [
    "10.244.0.9:0",
    "[fd00:244::1]:8080",
    "[fd00:244::2]:8080",
]

backend = st.tuples(
    st.integers(0, len(BACKENDS) - 1),
    st.sampled_from([0, 0, 0, 1, 3]),  # state: mostly active
    st.sampled_from([0, 0, 0, 2]),  # cluster id
    st.sampled_from([0, 0, 0, 4]),  # zone
    st.sampled_from([False, False, False, True]),  # unhealthy
)
update = st.tuples(
    st.integers(0, len(FRONTENDS) - 1),
    # Often in slot order (BACKENDS is in address order), as a frontend row lists them.
    st.one_of(st.lists(backend, max_size=6), st.lists(backend, max_size=6).map(sorted)),
    st.sampled_from([False, False, True]),  # session affinity
    st.booleans(),  # delete instead
)


class _Lazy(LazyBackends):
    """Backends built on first use, telling their usual addresses without building (as
    the adapter's `RowBackends` does from the rows)."""

    __slots__ = ("given",)

    def __init__(self, given: tuple[BackendSpec, ...]) -> None:
        super().__init__()
        self.given = given

    def _build(self) -> tuple[BackendSpec, ...]:
        return self.given

    def __len__(self) -> int:
        return len(self.given)

    def usual_addresses(self) -> list[Addr] | None:
        if any(b.state or b.unhealthy or b.not_serving or b.cluster_id or b.zone
               for b in self.given):
            return None
        return [b.addr for b in self.given]


def _spec(
    i: int, bes: list[tuple[int, int, int, int, bool]], affinity: bool, lazy: bool = False
) -> FrontendSpec:
    text, svc_type = FRONTENDS[i]
    backends = tuple(
        BackendSpec(addr(BACKENDS[b]), state, cluster_id=c, zone=z, unhealthy=u)
        for b, state, c, z, u in bes
    )
    svc = ServiceSpec(f"test/svc{i}", session_affinity=affinity, affinity_timeout=10)
    spec = fe(text, svc_type, backends, svc)
    return spec._replace(backends=_Lazy(backends)) if lazy else spec


def _state(ops: FrontendOps[Any]) -> Any:
    """Everything the ops record, ids included."""
    fronts = {
        a: (s.id, dict(s.backends), list(s.slots), s.master, sorted(s.affinity), s.revnat)
        for a, s in ops.frontends.items()
    }
    states = ops.backend_states
    return (
        fronts,
        dict(states.packed),
        {a: dict(w) for a, w in states.shared.items()},
        ops.backend_ids.next_id,
        ops.service_ids.next_id,
    )


def _maps() -> LBMaps:
    return LBMaps.in_memory(max_entries=512, maglev_table_size=251)


@pytest.mark.parametrize("lazy", [False, True])
@settings(max_examples=150, deadline=None, derandomize=True)
@given(st.lists(st.lists(update, min_size=1, max_size=5), max_size=6))
def test_bulk_path_leaves_what_the_per_backend_path_leaves(
    lazy: bool, rounds: list[list[tuple[int, list[Any], bool, bool]]],
) -> None:
    """``lazy``: the bulk path's specs have `LazyBackends` (the per-backend path's a tuple)."""
    bulk, single = new_ops(_maps(), wildcard_entries=True), new_ops(_maps(), wildcard_entries=True)
    single.writer.bulk_new = False
    for round_ in rounds:
        results = []
        for ops in (bulk, single):
            is_lazy = lazy and ops is bulk
            updates = [
                BatchEntry(_spec(i, bes, aff, is_lazy), 0)
                for i, bes, aff, delete in round_
                if not delete
            ]
            deletes = [
                BatchEntry(_spec(i, bes, aff, is_lazy), 0)
                for i, bes, aff, delete in round_
                if delete
            ]
            ops.delete_batch(NO_TXN, deletes)
            ops.update_batch(NO_TXN, updates)
            results.append([repr(e.result) for e in updates + deletes])
        assert results[0] == results[1]
        assert _state(bulk) == _state(single)
        assert dump_lines(bulk.maps) == dump_lines(single.maps)


@pytest.mark.parametrize("lazy", [False, True])
def test_a_usual_new_frontend_takes_the_bulk_path(
    monkeypatch: pytest.MonkeyPatch, lazy: bool
) -> None:
    """Its backends' ids come from one run of the allocator, not one `acquire` each; given
    `LazyBackends`, no spec is built."""
    ops = new_ops(_maps())
    one_by_one = IDAllocator.acquire

    def acquire(self: IDAllocator[Any], a: Any) -> int:
        assert self.name != "backend", f"acquire({a}) on the bulk path"
        return one_by_one(self, a)

    monkeypatch.setattr(IDAllocator, "acquire", acquire)
    spec = fe("10.96.0.1:80", backends=tuple(BackendSpec(addr(b)) for b in BACKENDS[:3]))
    if lazy:
        backends = _Lazy(spec.backends)  # type: ignore[arg-type]
        spec = spec._replace(backends=backends)
    ops.update_batch(NO_TXN, [BatchEntry(spec, 0)])
    if lazy:
        assert backends._specs is None
    state = ops.frontends[spec.addr]
    assert list(state.slots) == [1, 2, 3]
    assert dict(state.backends) == dict.fromkeys((addr(b) for b in BACKENDS[:3]), 0)
    assert ops.maps.be4.count() == 3
