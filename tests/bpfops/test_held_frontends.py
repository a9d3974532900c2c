"""A restarted agent's LB maps during the initial sync: a frontend with no backends that this
run has not written is held while the LB tables are not initialized, so the entries the
previous run left (its old backends) keep serving until the sources' state is in; once the
tables are initialized it is written at once, with no backends if it still has none. The
first prune waits until every frontend of the sync went to the maps, so no restored service
id is released (and no entry deleted) for a frontend still on its way.

The maps are memory maps kept across the two runs (a pinned map's entries outlive the
agent the same way)."""

from __future__ import annotations

import ipaddress
from typing import Any

from bpfops.adapter import frontend_ops_for, reconciler_config
from bpfops.frontend_ops import FrontendOps
from bpfops.lb_maps import LBMaps
from bpfops.maps_dump import dump_lines
from reconciler.testing import BackgroundReconciler
from sources.k8s_convert import K8sConverter
from statedb import DB
from tables.frontends import Frontend
from tables.l3n4 import L3n4Addr
from tables.lb_writer import LBWriter
from tests.bpfops.test_id_exhaustion import endpoints, service
from tests.conformance.lb_system import harness_config
from tests.reconciler.helpers import wait_for

TIMEOUT = 30.0


def _vip(i: int) -> L3n4Addr:
    return L3n4Addr.make(str(ipaddress.ip_address("10.96.0.0") + i + 1), 80)


class Run:
    """One agent run: fresh tables and FrontendOps restoring from ``maps``, its reconciler
    in the background; with ``initializer`` the LB tables wait for `initialized`."""

    def __init__(self, maps: LBMaps, initializer: bool, **config: Any) -> None:
        self.cfg = harness_config()
        self.db = DB()
        self.writer = LBWriter.create(self.db, self.cfg)
        self.conv = K8sConverter(self.writer, self.cfg)
        self._done: Any = None
        if initializer:
            with self.writer.write_txn() as txn:
                self._done = self.writer.register_initializer(txn, "test")
                txn.commit()
        self.ops: FrontendOps[Frontend] = frontend_ops_for(self.writer, maps, self.cfg)
        settings: dict[str, Any] = {"prune_interval": 3600.0, "batch_operations": self.ops}
        settings.update(config)
        self.bg = BackgroundReconciler(
            self.db, reconciler_config(self.writer, self.ops, self.cfg, **settings)
        )
        self.rec = self.bg.reconciler

    def apply(self, *objs: dict[str, Any], initialized: bool = False) -> None:
        with self.writer.write_txn() as txn:
            for o in objs:
                self.conv.upsert(txn, o)
            if initialized:
                self._done(txn)
            txn.commit()

    def initialized(self) -> None:
        with self.writer.write_txn() as txn:
            self._done(txn)
            txn.commit()

    def close(self) -> None:
        self.bg.close()


def _first_run(maps: LBMaps, count: int) -> dict[int, int]:
    """Services 0..count-1 with two backends each, in the maps; their service ids."""
    run = Run(maps, initializer=False)
    try:
        for i in range(count):
            run.apply(service(i), endpoints(i))
        run.bg.wait_done(TIMEOUT)
        ids = {i: run.ops.service_id(_vip(i)) for i in range(count)}
        assert None not in ids.values()
        return ids  # type: ignore[return-value]
    finally:
        run.close()


def _backend_slots(maps: LBMaps, i: int) -> int:
    """How many backend slots the master of service ``i``'s frontend counts in the maps."""
    packed = _vip(i).ip.packed
    for key, value in maps.svc4.dump():
        if key.address == packed and key.dport == 80 and key.backend_slot == 0:
            return int(value.count)
    raise KeyError(i)


def test_a_restored_frontend_keeps_its_backends_until_the_tables_are_initialized() -> None:
    maps = LBMaps.in_memory(max_entries=4096, maglev_table_size=251)
    ids = _first_run(maps, 2)
    before = dump_lines(maps)

    run = Run(maps, initializer=True)
    try:
        # The Services come first; their EndpointSlices are not listed yet.
        run.apply(service(0), service(1))
        wait_for(lambda: run.rec.held == 2, "both frontends held")
        assert dump_lines(maps) == before
        assert "2 row(s) held until the table is initialized" in run.rec.problems()

        # Service 0's slice arrives: written at once, with its backends and its old id.
        run.apply(endpoints(0))
        wait_for(lambda: run.ops.service_id(_vip(0)) is not None, "service 0 written")
        assert run.ops.service_id(_vip(0)) == ids[0]
        assert run.rec.held == 1
        assert _backend_slots(maps, 1) == 2  # service 1 still serves its old backends

        # The sync is done and service 1 has no endpoints any more: written at once, empty.
        run.initialized()
        run.bg.wait_done(TIMEOUT)
        assert run.ops.service_id(_vip(1)) == ids[1]
        assert _backend_slots(maps, 1) == 0
        assert _backend_slots(maps, 0) == 2
    finally:
        run.close()


def test_a_frontend_written_in_this_run_is_not_held() -> None:
    maps = LBMaps.in_memory(max_entries=4096, maglev_table_size=251)
    run = Run(maps, initializer=True)
    try:
        run.apply(service(0), endpoints(0))
        wait_for(lambda: run.ops.service_id(_vip(0)) is not None, "service 0 written")
        # Its endpoints go before the sync is done: the maps follow at once.
        empty = dict(endpoints(0), endpoints=[])
        run.apply(empty)
        wait_for(lambda: _backend_slots(maps, 0) == 0, "service 0 emptied")
        assert run.rec.held == 0
    finally:
        run.close()


def test_the_first_prune_waits_for_every_frontend_of_the_sync() -> None:
    """The tables are initialized with more frontends than a round takes: every restored
    service id is claimed by its frontend, none released and handed out anew."""
    maps = LBMaps.in_memory(max_entries=4096, maglev_table_size=251)
    ids = _first_run(maps, 12)
    run = Run(maps, initializer=True, incremental_round_size=3)
    try:
        objs = [o for i in range(12) for o in (service(i), endpoints(i))]
        run.apply(*objs, initialized=True)
        run.bg.wait_done(TIMEOUT)
        assert {i: run.ops.service_id(_vip(i)) for i in range(12)} == ids
        assert run.rec.metrics.prunes.count >= 1
    finally:
        run.close()
