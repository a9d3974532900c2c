"""FrontendOps as BatchOperations: a reconciler round's frontends are written with one batch
call per map, a batch that stops part way fails exactly the frontends whose entries were not
written, and retrying those converges to the maps per-object writes give."""

from __future__ import annotations

import errno
from collections.abc import Sequence
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from bpf.backend import split_fixed
from bpf.errors import BatchError
from bpf.testing import FaultyMap
from bpfops.frontend_ops import FrontendOps, LBOpsError
from bpfops.frontend_plan import svc_key
from bpfops.lb_maps import LBMaps
from bpfops.maps_dump import dump_lines
from bpfops.model import FrontendSpec
from reconciler.operations import BatchEntry
from tests.bpfops.helpers import NO_TXN, be, fe, new_ops, normalize_ids
from tests.bpfops.test_batched_writes import CountingMap, PartialBatchMap
from tests.bpfops.test_faults import make_spec, new_system, step


class StopAtMap(FaultyMap):
    """update_batch applies the first ``stop`` entries of its next batch, then fails."""

    def __init__(self, inner: Any) -> None:
        super().__init__(inner, 0.0)
        self.stop: int | None = None

    def update_batch(
        self, keys: Sequence[bytes] | bytes, values: Sequence[bytes] | bytes, flags: int = 0
    ) -> int:
        stop, self.stop = self.stop, None
        if stop is None:
            return self.inner.update_batch(keys, values, flags)
        ks = list(split_fixed(keys, self.spec.key_size)) if isinstance(keys, bytes) else keys
        vs = (
            list(split_fixed(values, self.spec.value_size)) if isinstance(values, bytes) else values
        )
        if stop:
            self.inner.update_batch(list(ks[:stop]), list(vs[:stop]), flags)
        raise BatchError(self.name, "update_batch", errno.ENOSPC, stop)


def _assert_no_dangling(ops: FrontendOps[Any], entries: list[BatchEntry[Any]]) -> None:
    """Every slot of a frontend written without error names a backend the backends map
    holds (the datapath never follows its slots to nothing)."""
    maps = ops.maps
    have = {be_id for v6 in (False, True) for be_id, _ in maps.backends(v6).dump()}
    for e in entries:
        state = ops.frontends.get(e.obj.addr)
        if e.result is not None or state is None:
            continue
        assert state.master is not None
        svc = maps.services(state.v6).backend
        for slot in range(1, len(state.slots) + 1):
            raw = svc.lookup(svc_key(e.obj.addr, slot))
            assert raw is not None, (e.obj.addr, slot)
            be_id = int.from_bytes(raw[:4], "little")
            assert be_id in have, (e.obj.addr, slot, be_id)


def _stop_second_batch(m: StopAtMap) -> None:
    """Make ``m``'s second batch update stop after its first entry."""
    calls = [0]
    original = m.update_batch

    def second_batch_stops(keys: Any, values: Any, flags: int = 0) -> int:
        calls[0] += 1
        if calls[0] == 2:
            m.stop = 1
        return original(keys, values, flags)

    m.update_batch = second_batch_stops  # type: ignore[method-assign]


def _entries(specs: list[FrontendSpec]) -> list[BatchEntry[FrontendSpec]]:
    return [BatchEntry(s, 0) for s in specs]


def _maps(wrap: Any = None) -> LBMaps:
    return LBMaps.in_memory(max_entries=256, maglev_table_size=251, wrap=wrap)


def test_a_round_is_one_batch_call_per_map() -> None:
    wrappers: dict[str, CountingMap] = {}

    def wrap(backend: Any) -> Any:
        wrappers[backend.spec.name] = CountingMap(backend)
        return wrappers[backend.spec.name]

    maps = _maps(wrap)
    ops = new_ops(maps)
    specs = [
        fe(f"10.96.0.{n}:80", "ClusterIP", tuple(be(f"10.244.{n}.{i}:8080") for i in range(1, 11)))
        for n in range(1, 21)
    ]
    entries = _entries(specs)
    ops.update_batch(NO_TXN, entries)
    assert [e.result for e in entries] == [None] * 20
    assert wrappers["lb4_backends"].calls == {"update_batch": 1}
    # Every frontend's slots in one batch, then every master in one.
    assert wrappers["lb4_services"].calls == {"update_batch": 2}
    assert wrappers["lb4_reverse_nat"].calls == {"update_batch": 1}
    clean = _maps()
    per_object = new_ops(clean)
    for s in specs:
        per_object.update(NO_TXN, 0, s)
    assert dump_lines(maps.unwrapped()) == dump_lines(clean)
    # Frontends gaining a backend are batched too, and so is one losing a backend of its
    # own (deleted after the masters: see test_dropped_backends_go_after_the_masters).
    for w in wrappers.values():
        w.calls.clear()
    grown = [fe(f"10.96.0.{n}:80", "ClusterIP", (*s.backends, be(f"10.244.{n}.99:8080")))
             for n, s in enumerate(specs[:-1], 1)]
    shrunk = fe("10.96.0.20:80", "ClusterIP", specs[-1].backends[1:])
    entries = _entries([*grown, shrunk])
    ops.update_batch(NO_TXN, entries)
    assert [e.result for e in entries] == [None] * 20
    assert wrappers["lb4_backends"].calls == {"update_batch": 1}
    for s in [*grown, shrunk]:
        per_object.update(NO_TXN, 0, s)
    assert dump_lines(maps.unwrapped()) == dump_lines(clean)


class OrderMap(FaultyMap):
    """Appends (map, operation, count) of every write and delete to a shared log."""

    def __init__(self, inner: Any, log: list[tuple[str, str, int]]) -> None:
        super().__init__(inner, 0.0)
        self.log = log

    def update(self, key: bytes, value: bytes, flags: int = 0) -> None:
        self.log.append((self.name, "update", 1))
        super().update(key, value, flags)

    def update_batch(
        self, keys: Sequence[bytes] | bytes, values: Sequence[bytes] | bytes, flags: int = 0
    ) -> int:
        n = super().update_batch(keys, values, flags)
        self.log.append((self.name, "update_batch", n))
        return n

    def delete(self, key: bytes) -> None:
        self.log.append((self.name, "delete", 1))
        super().delete(key)

    def delete_batch(self, keys: Sequence[bytes] | bytes) -> int:
        n = super().delete_batch(keys)
        self.log.append((self.name, "delete_batch", n))
        return n


def test_dropped_backends_go_after_the_masters() -> None:
    """Churn: each frontend replaces a backend of its own. The round is batched (no
    per-frontend path: two services batches, slots then masters), the dropped backends are
    deleted with one batch call after the masters (no slot a master counts ever names a
    missing backend), their ids are released, and the maps equal the per-object path's.
    A frontend dropping a shared backend still goes on its own."""
    log: list[tuple[str, str, int]] = []
    maps = _maps(lambda backend: OrderMap(backend, log))
    ops = new_ops(maps)
    shared = be("10.244.9.9:8080")
    specs = [
        fe(f"10.96.0.{n}:80", "ClusterIP", tuple(be(f"10.244.{n}.{i}:8080") for i in range(1, 4)))
        for n in range(1, 6)
    ]
    sharing = [fe(f"10.96.1.{n}:80", "ClusterIP", (shared,)) for n in (1, 2)]
    ops.update_batch(NO_TXN, _entries([*specs, *sharing]))
    ids_before = dict(ops.backend_states.items())
    replaced = [
        fe(f"10.96.0.{n}:80", "ClusterIP", (*s.backends[1:], be(f"10.244.{n}.99:8080")))
        for n, s in enumerate(specs, 1)
    ]
    log.clear()
    entries = _entries(replaced)
    ops.update_batch(NO_TXN, entries)
    assert [e.result for e in entries] == [None] * 5
    _assert_no_dangling(ops, entries)
    services = [i for i, (m, op, _) in enumerate(log) if m == "lb4_services"]
    # One batch of slots; each master keeps its counts, flags and id (one backend
    # replaced by another), so no master is written again, nor any rev-NAT entry.
    assert [log[i][1] for i in services] == ["update_batch"], log
    assert not [e for e in log if e[0] == "lb4_reverse_nat"], log
    deletes = [i for i, (m, op, _) in enumerate(log) if m == "lb4_backends" and "delete" in op]
    assert [log[i] for i in deletes] == [("lb4_backends", "delete_batch", 5)], log
    assert deletes[0] > services[-1]  # after the masters
    for s in specs:
        gone = s.backends[0].addr
        assert gone not in ops.backend_states and ops.backend_ids.lookup(gone) is None
    # The new backends take the ids the per-object path gives them (next-fit ids).
    clean = _maps()
    per_object = new_ops(clean)
    for s in [*specs, *sharing, *replaced]:
        per_object.update(NO_TXN, 0, s)
    assert dump_lines(maps.unwrapped()) == dump_lines(clean)
    assert dict(ops.backend_states.items()) == dict(per_object.backend_states.items())
    assert all(ids_before[a] == i for a, i in
               dict(ops.backend_states.items()).items() if a in ids_before)
    # Dropping the shared backend: that frontend is written on its own.
    log.clear()
    alone = fe("10.96.1.1:80", "ClusterIP", (be("10.244.8.8:8080"),))
    entries = _entries([alone])
    ops.update_batch(NO_TXN, entries)
    assert entries[0].result is None
    per_object.update(NO_TXN, 0, alone)
    assert dump_lines(maps.unwrapped()) == dump_lines(clean)


def test_backend_batch_stopping_fails_the_frontends_of_the_lost_entries() -> None:
    stoppers: dict[str, StopAtMap] = {}

    def wrap(backend: Any) -> Any:
        stoppers[backend.spec.name] = StopAtMap(backend)
        return stoppers[backend.spec.name]

    maps = _maps(wrap)
    ops = new_ops(maps)
    shared = be("10.244.9.9:8080")
    a = fe("10.96.0.1:80", "ClusterIP", (be("10.244.0.1:8080"), shared))
    b = fe("10.96.0.2:80", "ClusterIP", (be("10.244.0.2:8080"),))
    c = fe("10.96.0.3:80", "ClusterIP", (shared,))
    d = fe("10.96.0.4:80", "ClusterIP", (be("10.244.0.4:8080"),))
    # Backend entries in round order: a's two (0.1, 9.9), b's (0.2), d's (0.4); c has none
    # of its own (a collected the shared 9.9). Stopping after 1 loses 9.9 onwards: a and c
    # need 9.9, b and d their own lost entries.
    stoppers["lb4_backends"].stop = 1
    entries = _entries([a, b, c, d])
    ops.update_batch(NO_TXN, entries)
    assert all(isinstance(e.result, LBOpsError) for e in entries)
    assert "10.96.0.3:80" in str(entries[2].result)
    assert not [line for line in dump_lines(maps.unwrapped()) if line.startswith("SVC")]
    # Stopping after 2 (0.1 and 9.9 written) fails only b and d.
    ops2 = new_ops(_maps(wrap))
    stoppers["lb4_backends"].stop = 2
    entries = _entries([a, b, c, d])
    ops2.update_batch(NO_TXN, entries)
    assert [e.result is None for e in entries] == [True, False, True, False]
    _assert_no_dangling(ops2, entries)
    # The retry of the failed ones alone converges to the per-object maps.
    retry = [e.obj for e in entries if e.result is not None]
    entries = _entries(retry)
    ops2.update_batch(NO_TXN, entries)
    assert [e.result for e in entries] == [None, None]
    clean = _maps()
    per_object = new_ops(clean)
    for s in (a, b, c, d):
        per_object.update(NO_TXN, 0, s)
    assert dump_lines(ops2.maps.unwrapped()) == dump_lines(clean)


def test_master_batch_stopping_leaves_no_master_for_the_rest() -> None:
    stoppers: dict[str, StopAtMap] = {}

    def wrap(backend: Any) -> Any:
        stoppers[backend.spec.name] = StopAtMap(backend)
        return stoppers[backend.spec.name]

    maps = _maps(wrap)
    ops = new_ops(maps)
    specs = [fe(f"10.96.0.{n}:80", "ClusterIP", (be(f"10.244.0.{n}:8080"),)) for n in (1, 2, 3)]
    ops.update_batch(NO_TXN, _entries(specs[:1]))  # one frontend: single updates
    entries = _entries(specs)
    # Slots of 1..3 (1 unchanged, so two entries) in one batch, then the masters (1's is
    # in the map as it is, so 2's and 3's): stop the masters' batch after one.
    services = stoppers["lb4_services"]
    _stop_second_batch(services)
    ops.update_batch(NO_TXN, entries)
    assert [e.result is None for e in entries] == [True, True, False]
    assert ops.frontends[specs[2].addr].master is None
    assert not any("10.96.0.3:80" in line and "slot=0" in line.lower() for line in
                   dump_lines(maps.unwrapped()) if line.startswith("SVC"))
    entries = _entries(specs[2:])
    ops.update_batch(NO_TXN, entries)
    assert [e.result for e in entries] == [None]
    clean = _maps()
    per_object = new_ops(clean)
    for s in specs:
        per_object.update(NO_TXN, 0, s)
    assert dump_lines(maps.unwrapped()) == dump_lines(clean)


rounds = st.lists(st.lists(step, min_size=1, max_size=8), min_size=1, max_size=8)


def _round_ops(
    steps: list[tuple[int, bool, list[tuple[int, int]], int]],
    desired: dict[int, FrontendSpec],
) -> tuple[list[FrontendSpec], list[FrontendSpec]]:
    """A reconciler round of ``steps``: one change per frontend (the last), deletes first."""
    last: dict[int, tuple[bool, FrontendSpec]] = {}
    for i, delete, bes, flavour in steps:
        spec = make_spec(i, bes, flavour)
        if delete:
            if i in desired:
                last[i] = (True, desired.pop(i))
            elif i in last and not last[i][0]:
                del last[i]
        else:
            desired[i] = spec
            last[i] = (False, spec)
    deletes = [s for d, s in last.values() if d]
    updates = [s for d, s in last.values() if not d]
    return deletes, updates


def _retry_until_done(
    ops: FrontendOps[Any], kind: str, specs: list[FrontendSpec]
) -> None:
    todo = specs
    for _ in range(300):
        if not todo:
            return
        entries = _entries(todo)
        if kind == "update":
            ops.update_batch(NO_TXN, entries)
            _assert_no_dangling(ops, entries)
        else:
            ops.delete_batch(NO_TXN, entries)
        todo = [e.obj for e in entries if e.result is not None]
    raise AssertionError(f"{kind} of {[s.addr for s in todo]} never succeeded")


@settings(max_examples=60, deadline=None, derandomize=True)
@given(rounds, st.integers(0, 2**16))
def test_rounds_with_partial_batches_converge_to_per_object_writes(
    round_steps: list[list[tuple[int, bool, list[tuple[int, int]], int]]], seed: int
) -> None:
    clean = _maps()
    counter = [0]

    def wrap(backend: Any) -> Any:
        counter[0] += 1
        return PartialBatchMap(backend, seed * 100 + counter[0])

    broken = _maps(wrap)
    per_object, batched = new_system(clean), new_system(broken)
    desired: dict[int, FrontendSpec] = {}
    for steps in round_steps:
        deletes, updates = _round_ops(steps, desired)
        for s in deletes:
            per_object.delete(NO_TXN, 0, s)
        for s in updates:
            per_object.update(NO_TXN, 0, s)
        _retry_until_done(batched, "delete", deletes)
        _retry_until_done(batched, "update", updates)
    for ops in (per_object, batched):
        for _ in range(300):
            try:
                ops.prune(NO_TXN, iter(desired.values()))
                break
            except LBOpsError:
                continue
        else:
            raise AssertionError("prune never succeeded")
    assert sorted(normalize_ids(dump_lines(broken.unwrapped()))) == sorted(
        normalize_ids(dump_lines(clean))
    )


def test_wildcard_entries_go_with_the_masters() -> None:
    stoppers: dict[str, StopAtMap] = {}

    def wrap(backend: Any) -> Any:
        stoppers[backend.spec.name] = StopAtMap(backend)
        return stoppers[backend.spec.name]

    counting: dict[str, CountingMap] = {}

    def wrap_counting(backend: Any) -> Any:
        counting[backend.spec.name] = CountingMap(backend)
        return counting[backend.spec.name]

    # Two ports of one VIP share its wildcard entry; a round writes it once, in the
    # masters' batch.
    specs = [
        fe(f"10.96.0.{n}:{port}", "ClusterIP", (be(f"10.244.0.{n}:8080"),))
        for n in (1, 2, 3)
        for port in (80, 53)
    ]
    maps = _maps(wrap_counting)
    ops = new_ops(maps, wildcard_entries=True)
    entries = _entries(specs)
    ops.update_batch(NO_TXN, entries)
    assert [e.result for e in entries] == [None] * 6
    assert counting["lb4_services"].calls == {"update_batch": 2}
    clean = _maps()
    per_object = new_ops(clean, wildcard_entries=True)
    for s in specs:
        per_object.update(NO_TXN, 0, s)
    assert dump_lines(maps.unwrapped()) == dump_lines(clean)

    # The masters' batch stops after the first master, before its wildcard entry: the
    # frontend fails (its master recorded as written) and so does every later one.
    broken = _maps(wrap)
    ops = new_ops(broken, wildcard_entries=True)
    services = stoppers["lb4_services"]
    _stop_second_batch(services)
    entries = _entries(specs)
    ops.update_batch(NO_TXN, entries)
    assert all(e.result is not None for e in entries)
    assert ops.frontends[specs[0].addr].master is not None
    assert not ops.wildcard_refs
    _retry_until_done(ops, "update", specs)
    assert dump_lines(broken.unwrapped()) == dump_lines(clean)


def test_orphans_deleted_by_a_round_free_their_ids_in_an_indexed_allocator() -> None:
    """A backend a round's frontend drops is deleted after the masters and its id given
    up: once the allocator indexes every id (after a wrap-around), the index must let
    the id go too, or it stays taken for good."""
    ops = new_ops(_maps())
    spec = fe("10.96.0.1:80", "ClusterIP", (be("10.244.0.1:8080"), be("10.244.0.2:8080")))
    ops.update_batch(NO_TXN, _entries([spec]))
    gone = be("10.244.0.2:8080").addr
    gone_id = ops.backend_ids.lookup(gone)
    assert gone_id is not None
    ops.backend_ids._index_all()  # as after the walk wrapped around
    entries = _entries([fe("10.96.0.1:80", "ClusterIP", (be("10.244.0.1:8080"),))])
    ops.update_batch(NO_TXN, entries)
    assert [e.result for e in entries] == [None]
    assert gone not in ops.backend_states and ops.backend_ids.lookup(gone) is None
    assert not ops.backend_ids.is_taken(gone_id)
    assert ops.backend_ids.owner_of(gone_id) is None
