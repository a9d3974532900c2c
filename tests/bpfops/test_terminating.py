"""Terminating backends that no longer serve: in the inactive tail (QCOUNT), kept as
terminating by a restore from the maps, active again once ready."""

from __future__ import annotations

import dataclasses

from bpf import lb
from bpfops.lb_maps import LBMaps
from bpfops.maps_dump import dump_lines
from tests.bpfops.helpers import NO_TXN, be, fe, new_ops


def _master(lines: list[str]) -> str:
    return next(line for line in lines if "SLOT=0" in line)


def test_not_serving_sits_in_the_inactive_tail_and_survives_a_restore() -> None:
    maps = LBMaps.in_memory(maglev_table_size=1021)
    ops = new_ops(maps)
    gone = be("10.0.0.1:80", lb.BACKEND_TERMINATING, not_serving=True)
    active = be("10.0.0.2:80")
    f = fe("10.96.0.1:80", backends=(gone, active))
    ops.update(NO_TXN, 1, f)
    lines = dump_lines(maps)
    assert "COUNT=1 QCOUNT=1" in _master(lines)
    gone_id, active_id = ops.backend_id(gone.addr), ops.backend_id(active.addr)
    assert f"SLOT=1 BEID={active_id} " in "\n".join(lines)
    assert f"SLOT=2 BEID={gone_id} " in "\n".join(lines)
    assert f"BE: ID={gone_id} ADDR=10.0.0.1:80/TCP STATE=terminating" in lines

    # Only not-serving backends left: none becomes active (unlike serving terminating ones).
    only = dataclasses.replace(f, backends=(gone,))
    ops.update(NO_TXN, 2, only)
    assert "COUNT=0 QCOUNT=1" in _master(dump_lines(maps))
    serving = be("10.0.0.3:80", lb.BACKEND_TERMINATING)
    ops.update(NO_TXN, 3, dataclasses.replace(f, backends=(gone, serving)))
    lines = dump_lines(maps)
    assert "COUNT=1 QCOUNT=1" in _master(lines)
    assert f"SLOT=1 BEID={ops.backend_id(serving.addr)} " in "\n".join(lines)
    ops.update(NO_TXN, 4, f)

    # Restart: the tail entry is terminating in the backends map, so it is not taken for
    # a quarantined backend, and the same update leaves the maps as they were.
    before = dump_lines(maps)
    restarted = new_ops(maps)
    assert not restarted.restored_quarantined
    restarted.update(NO_TXN, 5, f)
    assert dump_lines(maps) == before

    # Ready again: active, in the active slots.
    ready = dataclasses.replace(f, backends=(be("10.0.0.1:80"), active))
    restarted.update(NO_TXN, 6, ready)
    lines = dump_lines(maps)
    assert "COUNT=2 QCOUNT=0" in _master(lines)
    assert f"BE: ID={gone_id} ADDR=10.0.0.1:80/TCP STATE=active" in lines


def test_restored_tail_entry_of_a_shared_backend_turns_active_when_ready() -> None:
    """A backend terminating for one frontend and active for another: their shared entry
    holds "active", so after a restart the first frontend's tail slot looks like a
    quarantined backend's. Listed as terminating after the restart, it is no quarantine
    (the tail is explained); turning ready, it is active and load-balanced."""
    maps = LBMaps.in_memory(maglev_table_size=1021)
    ops = new_ops(maps)
    term = be("10.0.0.1:80", lb.BACKEND_TERMINATING, not_serving=True)
    other = be("10.0.0.2:80")
    first = fe("10.96.0.1:80", backends=(term, other))
    second = fe("10.96.0.2:80", backends=(be("10.0.0.1:80"), other))
    ops.update(NO_TXN, 1, first)
    ops.update(NO_TXN, 2, second)
    lines = dump_lines(maps)
    term_id = ops.backend_id(term.addr)
    assert f"BE: ID={term_id} ADDR=10.0.0.1:80/TCP STATE=active" in lines
    assert "COUNT=1 QCOUNT=1" in _master([x for x in lines if "10.96.0.1:80" in x])

    restarted = new_ops(maps)
    assert restarted.restored_quarantined == {first.addr: {term.addr}}
    restarted.update(NO_TXN, 3, first)
    restarted.update(NO_TXN, 4, second)
    assert not restarted.restored_quarantined
    ready = dataclasses.replace(first, backends=(be("10.0.0.1:80"), other))
    restarted.update(NO_TXN, 5, ready)
    lines = dump_lines(maps)
    assert "COUNT=2 QCOUNT=0" in _master([x for x in lines if "10.96.0.1:80" in x])
    assert f"BE: ID={term_id} ADDR=10.0.0.1:80/TCP STATE=active" in lines


def test_restored_quarantine_of_an_active_backend_stands_until_health_is_known() -> None:
    """The other side: listed active after the restart (as before it), a restored
    quarantine stands for its health until a health check reports; a backend in
    maintenance after the restart gets no slot at all."""
    maps = LBMaps.in_memory(maglev_table_size=1021)
    ops = new_ops(maps)
    sick = be("10.0.0.1:80", unhealthy=True, health_known=True)
    down = be("10.0.0.3:80", lb.BACKEND_TERMINATING, not_serving=True)
    other = be("10.0.0.2:80")
    f = fe("10.96.0.1:80", backends=(sick, down, other))
    ops.update(NO_TXN, 1, f)
    assert "COUNT=1 QCOUNT=2" in _master(dump_lines(maps))

    restarted = new_ops(maps)
    assert restarted.restored_quarantined == {f.addr: {sick.addr}}
    unknown = dataclasses.replace(
        f,
        backends=(be("10.0.0.1:80"), be("10.0.0.3:80", lb.BACKEND_MAINTENANCE), other),
    )
    restarted.update(NO_TXN, 2, unknown)
    lines = dump_lines(maps)
    assert "COUNT=1 QCOUNT=1" in _master(lines)  # the quarantined one; no maintenance slot
    down_id = ops.backend_id(down.addr)
    assert f"BE: ID={down_id} ADDR=10.0.0.3:80/TCP STATE=maintenance" in lines
    assert f"BEID={down_id} " not in "\n".join(lines)
    healthy = dataclasses.replace(
        unknown, backends=(be("10.0.0.1:80", health_known=True), *unknown.backends[1:])
    )
    restarted.update(NO_TXN, 3, healthy)
    assert "COUNT=2 QCOUNT=0" in _master(dump_lines(maps))
    assert not restarted.restored_quarantined
