"""Property: random frontend/backend churn with map faults converges to the fault-free maps.

Two runs apply the same random sequence of frontend updates and deletes:

* a fault-free run on plain maps;
* a run whose every map sits behind ``bpf.testing.FaultyMap``. A failing operation
  is retried (like the reconciler does) until it succeeds, after a random number of
  other operations that are applied meanwhile; a newer change of the same frontend
  replaces the pending retry.

After a final prune both runs' dumps must be the same once ids are replaced by the
addresses they stand for (faults reorder the id allocations); a second property with
retry-at-once keeps the order and compares the dumps exactly, ids included.
"""

from __future__ import annotations

import dataclasses
import errno
import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bpf.testing import FaultyMap
from bpfops.frontend_ops import FrontendOps, LBOpsError, StaticNodeView
from bpfops.lb_maps import LBMaps
from bpfops.maps_dump import dump_lines
from bpfops.model import FrontendSpec, ServiceSpec
from tests.bpfops.helpers import NO_TXN, be, fe, ip, new_ops, normalize_ids

FRONTENDS = [
    ("10.96.0.1:80", "ClusterIP"),
    ("10.96.0.1:53", "ClusterIP"),
    ("10.96.0.2:80", "ClusterIP"),
    ("10.0.0.5:80", "LoadBalancer"),
    ("0.0.0.0:30080", "NodePort"),
    ("[fd00::10]:80", "ClusterIP"),
]
BACKENDS4 = [f"10.244.0.{i}:8080" for i in range(1, 7)]
BACKENDS6 = [f"[fd00:244::{i}]:8080" for i in range(1, 4)]

# Faults hit the writes (as in Cilium's fault-injecting test maps); reads are exercised by
# the restore/prune tests.
WRITE_OPS = frozenset({"update", "delete", "update_batch", "delete_batch", "set_inner"})

step = st.tuples(
    st.integers(0, len(FRONTENDS) - 1),  # which frontend
    st.booleans(),  # delete?
    st.lists(st.tuples(st.integers(0, 5), st.integers(0, 3)), max_size=5),  # backends
    st.integers(0, 3),  # service flavour
)


def make_spec(i: int, bes: list[tuple[int, int]], flavour: int) -> FrontendSpec:
    text, svc_type = FRONTENDS[i]
    pool = BACKENDS6 if text.startswith("[") else BACKENDS4
    backends = tuple(
        be(pool[b % len(pool)], state) for b, state in {b % len(pool): s for b, s in bes}.items()
    )
    svc = ServiceSpec(
        f"test/svc{i}",
        session_affinity=flavour == 1,
        affinity_timeout=30 if flavour == 1 else 0,
        lb_algorithm="maglev" if flavour == 2 else "",
        source_ranges_deny=flavour == 3,
    )
    return dataclasses.replace(fe(text, svc_type, backends, svc))


def new_system(maps: LBMaps) -> FrontendOps[Any]:
    node = StaticNodeView(nodeport=[ip("1.1.1.1")])
    return new_ops(maps, node=node, wildcard_entries=True, algorithm_annotation=True)


def faulty(seed: int, probability: float) -> Any:
    counter = [0]

    def wrap(backend: Any) -> Any:
        counter[0] += 1
        return FaultyMap(
            backend, probability, errno=errno.EIO, seed=seed * 100 + counter[0], ops=WRITE_OPS
        )

    return wrap


def apply(ops: FrontendOps[Any], op: tuple[str, FrontendSpec]) -> None:
    kind, spec = op
    if kind == "update":
        ops.update(NO_TXN, 0, spec)
    else:
        ops.delete(NO_TXN, 0, spec)


def final_prune(ops: FrontendOps[Any], desired: dict[int, FrontendSpec]) -> None:
    for _ in range(200):
        try:
            ops.prune(NO_TXN, iter(desired.values()))
            return
        except LBOpsError:
            continue
    raise AssertionError("prune never succeeded")


def run(
    steps: list[tuple[int, bool, list[tuple[int, int]], int]],
    maps: LBMaps,
    rng: random.Random | None,
) -> dict[int, FrontendSpec]:
    """Apply ``steps``; with ``rng``, failed operations are retried later (reconciler-like)."""
    ops = new_system(maps)
    desired: dict[int, FrontendSpec] = {}
    pending: dict[int, tuple[tuple[str, FrontendSpec], int]] = {}  # frontend -> (op, delay)

    def attempt(key: int, op: tuple[str, FrontendSpec]) -> None:
        try:
            apply(ops, op)
            pending.pop(key, None)
        except LBOpsError:
            assert rng is not None
            pending[key] = (op, rng.randint(0, 3))

    for i, delete, bes, flavour in steps:
        spec = make_spec(i, bes, flavour)
        if delete:
            if i not in desired:
                continue
            op = ("delete", desired.pop(i))
        else:
            desired[i] = spec
            op = ("update", spec)
        if rng is None:
            apply(ops, op)
        else:
            attempt(i, op)  # replaces any pending retry of this frontend
            for key, (old, delay) in list(pending.items()):
                if key == i:
                    continue
                if delay == 0:
                    attempt(key, old)
                else:
                    pending[key] = (old, delay - 1)
    for _ in range(500):
        if not pending:
            break
        for key, (old, _delay) in list(pending.items()):
            attempt(key, old)
    assert not pending, f"retries never succeeded: {pending}"
    final_prune(ops, desired)
    return desired


@settings(max_examples=40, deadline=None, derandomize=True)
@given(st.lists(step, min_size=1, max_size=25), st.integers(0, 2**16))
def test_churn_with_faults_converges(
    steps: list[tuple[int, bool, list[tuple[int, int]], int]], seed: int
) -> None:
    clean = LBMaps.in_memory(max_entries=256, maglev_table_size=251)
    run(steps, clean, None)
    broken = LBMaps.in_memory(max_entries=256, maglev_table_size=251, wrap=faulty(seed, 0.2))
    run(steps, broken, random.Random(seed))
    assert normalize_ids(dump_lines(broken.unwrapped())) == normalize_ids(dump_lines(clean))


@settings(max_examples=40, deadline=None, derandomize=True)
@given(st.lists(step, min_size=1, max_size=25), st.integers(0, 2**16))
def test_retry_at_once_gives_identical_maps(
    steps: list[tuple[int, bool, list[tuple[int, int]], int]], seed: int
) -> None:
    clean = LBMaps.in_memory(max_entries=256, maglev_table_size=251)
    run(steps, clean, None)
    broken = LBMaps.in_memory(max_entries=256, maglev_table_size=251, wrap=faulty(seed, 0.2))
    ops = new_system(broken)
    desired: dict[int, FrontendSpec] = {}
    for i, delete, bes, flavour in steps:
        spec = make_spec(i, bes, flavour)
        if delete:
            if i not in desired:
                continue
            op = ("delete", desired.pop(i))
        else:
            desired[i] = spec
            op = ("update", spec)
        for _ in range(200):
            try:
                apply(ops, op)
                break
            except LBOpsError:
                continue
        else:
            raise AssertionError(f"{op} never succeeded")
    final_prune(ops, desired)
    assert dump_lines(broken.unwrapped()) == dump_lines(clean)


def kernel_maps(wrap: Any = None) -> LBMaps:
    """Unpinned kernel LB maps (closed by the caller)."""
    from bpfops.lb_maps import LBMapsConfig

    cfg = LBMapsConfig(backend="kernel", pin=False, max_entries=256, maglev_table_size=251)
    return LBMaps.open(cfg, wrap=wrap)


@pytest.mark.kernel
@settings(max_examples=15, deadline=None, derandomize=True)
@given(st.lists(step, min_size=1, max_size=20), st.integers(0, 2**16))
def test_churn_with_faults_converges_on_kernel_maps(
    steps: list[tuple[int, bool, list[tuple[int, int]], int]], seed: int
) -> None:
    clean = kernel_maps()
    broken = kernel_maps(faulty(seed, 0.2))
    try:
        run(steps, clean, None)
        run(steps, broken, random.Random(seed))
        assert normalize_ids(dump_lines(broken.unwrapped())) == normalize_ids(dump_lines(clean))
    finally:
        clean.close()
        broken.close()
