"""The public reconciler state machine (`reconciler.testing.machine`) on a real target: the
load-balancing `FrontendOps` over in-memory LB maps.

Rows are frontends (six addresses: ClusterIP v4 and v6, LoadBalancer, NodePort with its
expansion) with random backends and service flavours (session affinity, maglev, source
ranges). The machine writes and deletes them at random while `FaultyOps` makes FrontendOps
fail before or after applying, per entry and per batch, and tampers with the target by
writing frontends the table does not hold through the ops themselves (leftovers of an
earlier run, which prune must remove). Once settled, the maps must be those a fresh
FrontendOps writes for the table's rows, ids replaced by the addresses they stand for
(faults change the order in which ids are allocated).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from bpfops.frontend_ops import FrontendOps, StaticNodeView
from bpfops.lb_maps import LBMaps
from bpfops.maps_dump import dump_lines
from bpfops.model import FrontendSpec, LBOpsConfig
from reconciler import Status, status_pending
from reconciler.testing.machine import MachineSpec, reconciler_state_machine
from statedb import Index, Table, keys
from tests.bpfops.helpers import NO_TXN, ip, normalize_ids
from tests.bpfops.test_faults import FRONTENDS, make_spec


@dataclass(frozen=True, slots=True)
class FrontendRow:
    """A row of the test table: frontend number ``i`` (an index into FRONTENDS) and its spec."""

    i: int
    spec: FrontendSpec
    status: Status = field(default_factory=status_pending)


def new_table() -> Table[FrontendRow]:
    return Table("frontends", Index("i", key=lambda r: r.i, encode=keys.uint64))


def new_target() -> FrontendOps[FrontendRow]:
    """FrontendOps on fresh in-memory maps, reading the spec out of each row (the settings
    of test_faults' ``new_system``: wildcard entries, a NodePort address, annotations)."""
    return FrontendOps(
        LBMaps.in_memory(maglev_table_size=1021),
        LBOpsConfig(wildcard_entries=True, algorithm_annotation=True, maglev_table_size=1021),
        node=StaticNodeView(nodeport=[ip("1.1.1.1")]),
        to_spec=lambda txn, row: row.spec,
    )


def observe(ops: FrontendOps[FrontendRow]) -> list[str]:
    """The maps' dump with ids replaced by the addresses they stand for."""
    return normalize_ids(dump_lines(ops.maps))


def expected(rows: list[FrontendRow]) -> list[str]:
    """What a fresh FrontendOps writes for ``rows``, without faults."""
    ops = new_target()
    for row in sorted(rows, key=lambda r: r.i):
        ops.update(NO_TXN, 0, row)
    return observe(ops)


def leftover(ops: FrontendOps[FrontendRow], wanted: frozenset[bytes], n: int) -> None:
    """Write frontend ``n`` (mod 6) through the ops when the table does not hold it."""
    i = n % len(FRONTENDS)
    if keys.uint64(i) not in wanted:
        ops.update_spec(NO_TXN, make_spec(i, [(n, 0)], n % 4))


# Backend states 0-3 (active, terminating, quarantined, maintenance).
rows = st.builds(
    lambda i, bes, flavour: FrontendRow(i, make_spec(i, bes, flavour)),
    st.integers(0, len(FRONTENDS) - 1),
    st.lists(st.tuples(st.integers(0, 5), st.integers(0, 3)), max_size=5),
    st.integers(0, 3),
)

SPEC: MachineSpec[FrontendRow, FrontendOps[FrontendRow]] = MachineSpec(
    new_table=new_table,
    rows=rows,
    new_target=new_target,
    observe=observe,
    expected=expected,
    get_object_status=lambda r: r.status,
    set_object_status=lambda r, s: dataclasses.replace(r, status=s),
    tamper=leftover,
)

TestFrontendOpsMachine = reconciler_state_machine(SPEC).TestCase
TestFrontendOpsMachine.settings = settings(
    max_examples=40,
    stateful_step_count=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def test_affinity_entry_of_backend_going_to_maintenance_is_removed() -> None:
    """Found by the machine: a session-affinity service whose only backend goes to
    maintenance (affinity off) keeps the backend's affinity match entry, which a fresh
    FrontendOps given the same final row does not write."""
    with_affinity = FrontendRow(3, make_spec(3, [(0, 0)], 1))
    maintenance = FrontendRow(3, make_spec(3, [(0, 3)], 0))
    ops = new_target()
    ops.update(NO_TXN, 0, with_affinity)
    ops.update(NO_TXN, 0, maintenance)
    ops.prune(NO_TXN, iter([maintenance]))
    assert observe(ops) == expected([maintenance])
