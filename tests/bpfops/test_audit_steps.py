"""`FrontendOps.audit_in_steps`: the prune's look at the maps is an awaitable that works
in small steps; it deletes what the record does not explain, and what the Ops write or
delete between two of its steps is judged by the record as it is then."""

from __future__ import annotations

import ipaddress
from typing import Any

import anyio
import pytest

from bpf import lb
from bpfops import frontend_restore
from bpfops.lb_maps import LBMaps
from bpfops.maps_dump import dump_lines
from tests.bpfops.conftest import MapsMaker
from tests.bpfops.helpers import NO_TXN, be, fe, new_ops

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _frontends(n: int) -> list[Any]:
    return [fe(f"10.96.0.{i}:80", backends=(be(f"10.244.0.{i}:80"),)) for i in range(1, n + 1)]


def _leftovers(maps: LBMaps, rev_id: int) -> None:
    """One entry per map kind that no frontend explains."""
    a4 = ipaddress.ip_address("10.9.9.9").packed
    maps.be4.update(999, lb.Backend4(a4, 80, 6))
    maps.svc4.update(lb.Service4Key(a4, 80, 0, 6), lb.ServiceValue(0, 1, 77))
    maps.rev4.update(rev_id, lb.RevNat4(a4, 80))


async def test_the_stepwise_audit_deletes_what_the_record_does_not_explain(
    make_maps: MapsMaker, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(frontend_restore, "AUDIT_STEP", 2)
    maps = make_maps()
    ops = new_ops(maps)
    fes = _frontends(6)
    for i, f in enumerate(fes):
        ops.update(NO_TXN, i, f)
    before = dump_lines(maps)
    _leftovers(maps, rev_id=900)
    ops.audit_in_steps = True
    ops.maps_explained = False
    pending = ops.prune(NO_TXN, iter(fes))
    assert pending is not None
    await pending
    assert dump_lines(maps) == before


async def test_changes_between_steps_are_judged_by_the_record_then(
    make_maps: MapsMaker, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(frontend_restore, "AUDIT_STEP", 1)
    maps = make_maps()
    ops = new_ops(maps)
    fes = _frontends(4)
    for i, f in enumerate(fes):
        ops.update(NO_TXN, i, f)
    # A stray rev-NAT entry under the id the next frontend will get: unexplained when the
    # audit starts, the new frontend's own entry by the time the audit reaches it.
    next_id = max(ops.service_id(f.addr) or 0 for f in fes) + 1
    _leftovers(maps, rev_id=next_id)
    ops.audit_in_steps = True
    ops.maps_explained = False
    late = fe("10.96.1.1:80", backends=(be("10.244.1.1:80"),))
    pending = ops.prune(NO_TXN, iter(fes))
    assert pending is not None

    async def meanwhile() -> None:
        await anyio.sleep(0)
        ops.update(NO_TXN, 10, late)
        assert ops.service_id(late.addr) == next_id
        ops.delete(NO_TXN, 11, fes[0])

    async with anyio.create_task_group() as tg:
        tg.start_soon(meanwhile)
        await pending
    # What is left is exactly what the Ops now record: the late frontend's entries (its
    # rev-NAT entry included), not the deleted one's, none of the strays.
    assert maps.rev4.lookup(next_id) == lb.RevNat4(ipaddress.ip_address("10.96.1.1").packed, 80)
    after = dump_lines(maps)
    assert not [line for line in after if "10.9.9.9" in line]
    assert not [line for line in after if "10.96.0.1:" in line or "10.244.0.1:" in line]
    # A one-shot prune of the same record finds nothing more to delete.
    ops.audit_in_steps = False
    ops.prune(NO_TXN, iter([*fes[1:], late]))
    assert dump_lines(maps) == after
