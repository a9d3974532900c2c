"""A frontend's backend entries and slots are written with one batch call per map, and a
batch that stops part way leaves the ops' state matching the maps, so a retry converges."""

from __future__ import annotations

import errno
import random
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bpf.backend import split_fixed
from bpf.errors import BatchError
from bpf.testing import FaultyMap
from bpfops.lb_maps import LBMaps
from bpfops.maps_dump import dump_lines
from reconciler.operations import BatchEntry
from tests.bpfops.helpers import NO_TXN, be, fe, new_ops, normalize_ids
from tests.bpfops.test_faults import make_spec, new_system, step


class CountingMap(FaultyMap):
    """Counts the write calls by kind; never fails."""

    def __init__(self, inner: Any) -> None:
        super().__init__(inner, 0.0)
        self.calls: dict[str, int] = {}

    def update(self, key: bytes, value: bytes, flags: int = 0) -> None:
        self.calls["update"] = self.calls.get("update", 0) + 1
        super().update(key, value, flags)

    def update_batch(
        self, keys: Sequence[bytes] | bytes, values: Sequence[bytes] | bytes, flags: int = 0
    ) -> int:
        self.calls["update_batch"] = self.calls.get("update_batch", 0) + 1
        return super().update_batch(keys, values, flags)


class PartialBatchMap(FaultyMap):
    """update_batch fails now and then after applying a random leading part of the batch
    (as the kernel's batch does when an element fails); single updates fail too."""

    def __init__(self, inner: Any, seed: int) -> None:
        super().__init__(inner, 0.0)
        self.rng = random.Random(seed)

    def update(self, key: bytes, value: bytes, flags: int = 0) -> None:
        if self.rng.random() < 0.1:
            raise BatchError(self.name, "update", errno.EIO, 0)
        super().update(key, value, flags)

    def update_batch(
        self, keys: Sequence[bytes] | bytes, values: Sequence[bytes] | bytes, flags: int = 0
    ) -> int:
        ks = list(split_fixed(keys, self.spec.key_size)) if isinstance(keys, bytes) else keys
        vs = (
            list(split_fixed(values, self.spec.value_size)) if isinstance(values, bytes) else values
        )
        if len(ks) > 1 and self.rng.random() < 0.3:
            done = self.rng.randrange(len(ks))
            if done:
                self.inner.update_batch(list(ks[:done]), list(vs[:done]), flags)
            raise BatchError(self.name, "update_batch", errno.EIO, done)
        return self.inner.update_batch(ks, vs, flags)


def test_one_batch_call_per_map_for_a_frontend_of_ten_backends() -> None:
    wrappers: dict[str, CountingMap] = {}

    def wrap(backend: Any) -> Any:
        wrappers[backend.spec.name] = CountingMap(backend)
        return wrappers[backend.spec.name]

    maps = LBMaps.in_memory(max_entries=256, maglev_table_size=251, wrap=wrap)
    ops = new_ops(maps)
    bes = tuple(be(f"10.244.0.{i}:8080") for i in range(1, 11))
    ops.update(NO_TXN, 0, fe("10.96.0.1:80", "ClusterIP", bes))
    assert wrappers["lb4_backends"].calls == {"update_batch": 1}
    # The ten slots in one batch, then the master on its own.
    assert wrappers["lb4_services"].calls == {"update_batch": 1, "update": 1}
    assert len(dump_lines(maps.unwrapped())) > 20


@settings(max_examples=40, deadline=None, derandomize=True)
@given(st.lists(step, min_size=1, max_size=25), st.integers(0, 2**16))
def test_partial_batches_retried_at_once_give_identical_maps(
    steps: list[tuple[int, bool, list[tuple[int, int]], int]], seed: int
) -> None:
    from bpfops.frontend_ops import LBOpsError

    clean = LBMaps.in_memory(max_entries=256, maglev_table_size=251)
    counter = [0]

    def wrap(backend: Any) -> Any:
        counter[0] += 1
        return PartialBatchMap(backend, seed * 100 + counter[0])

    broken = LBMaps.in_memory(max_entries=256, maglev_table_size=251, wrap=wrap)
    for maps, retry in ((clean, False), (broken, True)):
        ops = new_system(maps)
        desired: dict[int, Any] = {}
        for i, delete, bes, flavour in steps:
            spec = make_spec(i, bes, flavour)
            if delete:
                if i not in desired:
                    continue
                kind, spec = "delete", desired.pop(i)
            else:
                desired[i] = spec
                kind = "update"
            for _ in range(200 if retry else 1):
                try:
                    if kind == "update":
                        ops.update(NO_TXN, 0, spec)
                    else:
                        ops.delete(NO_TXN, 0, spec)
                    break
                except LBOpsError:
                    continue
            else:
                raise AssertionError(f"{kind} {spec.addr} never succeeded")
        for _ in range(200):
            try:
                ops.prune(NO_TXN, iter(desired.values()))
                break
            except LBOpsError:
                continue
    assert dump_lines(broken.unwrapped()) == dump_lines(clean)


@pytest.mark.parametrize("batched", [False, True])
def test_unchanged_master_and_revnat_entries_are_not_written_again(batched: bool) -> None:
    """A backend replaced by another rewrites the slots and the backend entry, not the
    master (same counts, flags, id) nor the rev-NAT entry (same id and address), in the
    per-object and the batched path alike; a master whose count changes is written."""
    wrappers: dict[str, CountingMap] = {}

    def wrap(backend: Any) -> Any:
        wrappers[backend.spec.name] = CountingMap(backend)
        return wrappers[backend.spec.name]

    maps = LBMaps.in_memory(max_entries=256, maglev_table_size=251, wrap=wrap)
    ops = new_ops(maps)

    def write(spec: Any) -> None:
        if batched:
            entries = [BatchEntry(spec, 0)]
            ops.update_batch(NO_TXN, entries)
            assert entries[0].result is None
        else:
            ops.update(NO_TXN, 0, spec)

    bes = tuple(be(f"10.244.0.{i}:8080") for i in range(1, 4))
    write(fe("10.96.0.1:80", "ClusterIP", bes))
    for w in wrappers.values():
        w.calls.clear()
    replaced = (*bes[1:], be("10.244.0.99:8080"))
    write(fe("10.96.0.1:80", "ClusterIP", replaced))
    assert wrappers["lb4_reverse_nat"].calls == {}
    # The three slots in one batch; no master.
    assert wrappers["lb4_services"].calls == {"update_batch": 1}
    for w in wrappers.values():
        w.calls.clear()
    write(fe("10.96.0.1:80", "ClusterIP", (*replaced, be("10.244.0.100:8080"))))
    assert wrappers["lb4_reverse_nat"].calls == {}
    # The new slot, then the master with its new count.
    assert wrappers["lb4_services"].calls == {"update": 2}
    clean = LBMaps.in_memory(max_entries=256, maglev_table_size=251)
    fresh = new_ops(clean)
    final = fe("10.96.0.1:80", "ClusterIP", (*replaced, be("10.244.0.100:8080")))
    fresh.update(NO_TXN, 0, final)
    assert normalize_ids(dump_lines(maps.unwrapped())) == normalize_ids(dump_lines(clean))
