"""The first prune on maps created empty does not dump them: every entry is one the Ops
wrote and recorded. Maps that held entries at the start, a failed write or delete since,
and every later prune do look at the maps."""

from __future__ import annotations

import errno
import ipaddress
from typing import Any

import pytest

from bpf import lb
from bpf.testing import FaultyMap
from bpfops import frontend_ops
from bpfops.lb_maps import LBMaps
from bpfops.maps_dump import dump_lines
from tests.bpfops.conftest import MapsMaker
from tests.bpfops.helpers import NO_TXN, be, fe, new_ops


@pytest.fixture
def dumps(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the prunes that looked at the maps (``prune_maps`` calls)."""
    calls: list[int] = []
    real = frontend_ops.prune_maps

    def counting(writer: Any, errs: list[str]) -> None:
        calls.append(1)
        real(writer, errs)

    monkeypatch.setattr(frontend_ops, "prune_maps", counting)
    return calls


def _leftover(maps: LBMaps) -> None:
    a4 = ipaddress.ip_address("10.9.9.9").packed
    maps.be4.update(99, lb.Backend4(a4, 80, 6))


def test_the_first_prune_on_fresh_maps_dumps_nothing(
    make_maps: MapsMaker, dumps: list[int]
) -> None:
    maps = make_maps()
    ops = new_ops(maps)
    assert ops.maps_explained
    fes = [fe(f"10.96.0.{i}:80", backends=(be(f"10.244.0.{i}:80"),)) for i in range(1, 4)]
    for i, f in enumerate(fes):
        ops.update(NO_TXN, i, f)
    ops.delete(NO_TXN, 9, fes[0])
    before = dump_lines(maps)
    ops.prune(NO_TXN, iter(fes[1:]))
    assert dumps == [] and dump_lines(maps) == before
    # Entries written behind the agent's back go at the next prune, which looks.
    _leftover(maps)
    ops.prune(NO_TXN, iter(fes[1:]))
    assert dumps == [1] and dump_lines(maps) == before


def test_maps_holding_entries_at_the_start_are_dumped(
    make_maps: MapsMaker, dumps: list[int]
) -> None:
    first = make_maps()
    _leftover(first)
    first.close()
    second = make_maps()  # the same pins: the previous run's entry
    ops = new_ops(second)
    assert not ops.maps_explained
    ops.prune(NO_TXN, iter([]))
    assert dumps == [1] and dump_lines(second) == []


def test_a_failed_write_makes_the_first_prune_look(dumps: list[int]) -> None:
    maps = LBMaps.in_memory(
        max_entries=64,
        maglev_table_size=251,
        wrap=lambda b: FaultyMap(b, 1.0, errno.EIO, 1, frozenset({"update", "update_batch"})),
    )
    ops = new_ops(maps)
    with pytest.raises(frontend_ops.LBOpsError):
        ops.update(NO_TXN, 1, fe("10.96.0.1:80", backends=(be("10.244.0.1:80"),)))
    assert not ops.maps_explained
    ops.prune(NO_TXN, iter([]))
    assert dumps == [1]


def test_running_out_of_ids_is_no_failure_of_the_maps(dumps: list[int]) -> None:
    maps = LBMaps.in_memory(max_entries=64, maglev_table_size=251)
    ops = new_ops(maps, service_id_limit=3)
    fes = [fe(f"10.96.0.{i}:80", backends=(be(f"10.244.0.{i}:80"),)) for i in range(1, 5)]
    for i, f in enumerate(fes[:2]):
        ops.update(NO_TXN, i, f)
    with pytest.raises(frontend_ops.LBOpsError, match="no free service id"):
        ops.update(NO_TXN, 3, fes[2])
    assert ops.maps_explained
    ops.prune(NO_TXN, iter(fes))
    assert dumps == []
