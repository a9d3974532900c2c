"""The scale-to-zero map: opted-in frontends' ids are tracked, opting out or deleting
releases them, an existing entry's value (the datapath's demand timestamp) is kept, and
after a restart prune removes the entries nobody claims."""

from __future__ import annotations

import dataclasses

from bpf import lb
from bpfops.lb_maps import LBMaps
from bpfops.maps_dump import dump_lines, scale_to_zero_text
from bpfops.model import ServiceSpec
from tests.bpfops.helpers import NO_TXN, be, fe, new_ops

OPTED = ServiceSpec("test/echo", scale_to_zero=True)


def _maps() -> LBMaps:
    return LBMaps.in_memory(maglev_table_size=1021, scale_to_zero=True)


def test_tracks_opted_in_frontends_and_releases_them() -> None:
    maps = _maps()
    ops = new_ops(maps, scale_to_zero=True)
    a = fe("10.96.0.1:80", backends=(be("10.244.0.1:80"),), service=OPTED)
    b = fe("10.96.0.2:80", backends=(be("10.244.0.1:80"),))
    ops.update(NO_TXN, 1, a)
    ops.update(NO_TXN, 2, b)
    assert scale_to_zero_text(maps) == "SCALETOZERO: ID=1\n"
    # The map is not part of the LB dump.
    assert not any(line.startswith("SCALETOZERO") for line in dump_lines(maps))
    ops.update(NO_TXN, 3, dataclasses.replace(b, service=ServiceSpec("x/y", scale_to_zero=True)))
    assert scale_to_zero_text(maps) == "SCALETOZERO: ID=1\nSCALETOZERO: ID=2\n"
    ops.update(NO_TXN, 4, dataclasses.replace(a, service=ServiceSpec("test/echo")))
    assert scale_to_zero_text(maps) == "SCALETOZERO: ID=2\n"
    ops.delete(NO_TXN, 5, b)
    assert scale_to_zero_text(maps) == ""


def test_disabled_feature_writes_nothing() -> None:
    maps = _maps()
    ops = new_ops(maps)  # --enable-scale-to-zero not given
    ops.update(NO_TXN, 1, fe("10.96.0.1:80", service=OPTED))
    assert scale_to_zero_text(maps) == ""
    assert scale_to_zero_text(LBMaps.in_memory(maglev_table_size=1021)) == ""


def test_existing_value_is_kept_and_stale_entries_pruned_after_restart() -> None:
    maps = _maps()
    ops = new_ops(maps, scale_to_zero=True)
    a = fe("10.96.0.1:80", service=OPTED)
    gone = fe("10.96.0.2:80", service=OPTED)
    ops.update(NO_TXN, 1, a)
    ops.update(NO_TXN, 2, gone)
    stz = maps.scale_to_zero
    assert stz is not None
    # The datapath records demand in the value; the agent must not reset it.
    stz.update(lb.ScaleToZeroKey(1), lb.ScaleToZeroValue(12345))
    stz.update(lb.ScaleToZeroKey(77), lb.ScaleToZeroValue(1))  # nobody's id
    restarted = new_ops(maps, scale_to_zero=True)  # restores ids from the maps
    restarted.update(NO_TXN, 1, a)
    assert stz.lookup(lb.ScaleToZeroKey(1)) == lb.ScaleToZeroValue(12345)
    # Before the prune the stale entries stay (their objects may not have been read yet).
    assert "SCALETOZERO: ID=77\n" in scale_to_zero_text(maps)
    restarted.prune(NO_TXN, iter([a]))
    assert scale_to_zero_text(maps) == "SCALETOZERO: ID=1\n"
