"""Running out of service ids: the LB reconciler with a 20-id range (the
``LBOpsConfig.service_id_limit`` test hook) and Services through the Kubernetes converter.

Frontends beyond the range wait: each costs one allocator probe when it is first tried,
and nothing afterwards. A round that changes one frontend does the same work (one update,
no probe) whether 10 or 300 frontends wait; health names them and a metric counts them;
the frontends with an id keep working; deleting a Service gives its id to the frontend
that has waited longest, and to it alone.
"""

from __future__ import annotations

import dataclasses
import ipaddress
from typing import Any

import anyio

from bpfops.adapter import TablesNodeView, frontend_spec, ops_config, reconciler_config
from bpfops.frontend_ops import FrontendOps
from bpfops.lb_maps import LBMaps
from reconciler import Reconciler, StatusKind
from sources.k8s_convert import K8sConverter
from statedb import DB
from tables.lb_writer import LBWriter
from tests.conformance.lb_system import harness_config

IDS = 20  # service ids 1..20


def service(i: int) -> dict[str, Any]:
    ip = str(ipaddress.ip_address("10.96.0.0") + i + 1)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": f"svc{i}", "namespace": "test"},
        "spec": {
            "type": "ClusterIP",
            "clusterIP": ip,
            "clusterIPs": [ip],
            "ports": [{"name": "http", "port": 80, "protocol": "TCP"}],
        },
    }


def endpoints(i: int, gen: int = 0) -> dict[str, Any]:
    base = int(ipaddress.ip_address("10.244.0.0")) + i * 4
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": f"svc{i}-eps",
            "namespace": "test",
            "labels": {"kubernetes.io/service-name": f"svc{i}"},
        },
        "addressType": "IPv4",
        "endpoints": [
            {"addresses": [str(ipaddress.ip_address(base + 1 + j + gen))]} for j in range(2)
        ],
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
    }


class Bed:
    """Tables, memory maps, FrontendOps with a 20-id range and its reconciler."""

    def __init__(self) -> None:
        self.cfg = harness_config()
        self.db = DB()
        self.writer = LBWriter.create(self.db, self.cfg)
        self.conv = K8sConverter(self.writer, self.cfg)
        self.maps = LBMaps.in_memory(max_entries=4096, maglev_table_size=251)
        cfg = self.cfg
        self.ops: FrontendOps[Any] = FrontendOps(
            self.maps,
            dataclasses.replace(ops_config(cfg), service_id_limit=IDS + 1),
            node=TablesNodeView(
                self.writer.node_addresses, self.writer.frontends, cfg, self.writer.backends
            ),
            to_spec=lambda _txn, fe: frontend_spec(fe, cfg),
            key_of=lambda fe: fe.address,
        )
        self.rec = Reconciler(
            self.db,
            reconciler_config(
                self.writer, self.ops, cfg, prune_interval=None, batch_operations=self.ops
            ),
        )

    def add(self, first: int, count: int) -> None:
        with self.writer.write_txn() as txn:
            for i in range(first, first + count):
                self.conv.upsert(txn, service(i))
                self.conv.upsert(txn, endpoints(i))
            txn.commit()

    def remove(self, i: int) -> None:
        with self.writer.write_txn() as txn:
            self.conv.delete(txn, service(i))
            self.conv.delete(txn, endpoints(i))
            txn.commit()

    def move_backends(self, i: int, gen: int) -> None:
        with self.writer.write_txn() as txn:
            self.conv.upsert(txn, endpoints(i, gen))
            txn.commit()

    async def settle(self) -> None:
        """Every change attempted, and the parked frontends woken by it retried."""
        with anyio.fail_after(30):
            rev = self.writer.frontends.revision(self.db.read_txn())
            await self.rec.wait_until_reconciled(rev)
            while self.rec.retries.wakeable() or len(self.rec.retries) > self.rec.retries.parked:
                await anyio.sleep(0.005)

    def done(self) -> set[str]:
        return {
            f.service_name
            for f in self.writer.frontends.all(self.db.read_txn())
            if f.status.kind is StatusKind.DONE
        }

    def backends_in_maps(self, i: int) -> list[str]:
        """The backend addresses the maps hold for service ``i``'s frontend."""
        st = self.ops.frontends.get(self._addr(i))
        assert st is not None
        out = []
        for be_addr in st.backends:
            assert self.ops.backend_id(be_addr) is not None
            out.append(str(be_addr.ip))
        return sorted(out)

    def _addr(self, i: int) -> Any:
        for f in self.writer.frontends.all(self.db.read_txn()):
            if f.service_name == f"test/svc{i}":
                return f.address
        raise KeyError(i)


async def _exhaustion() -> None:
    bed = Bed()
    metrics = bed.rec.metrics
    ids = bed.ops.service_ids
    async with anyio.create_task_group() as tg:
        await tg.start(bed.rec.run)
        bed.add(0, IDS)
        await bed.settle()
        assert len(bed.done()) == IDS and metrics.waiting == 0
        assert ids.available() == 0
        served = IDS
        per_round: list[tuple[int, int]] = []
        for waiting in (10, 60, 300):
            probes = ids.probes
            bed.add(served, IDS + waiting - served)
            await bed.settle()
            new = IDS + waiting - served
            served = IDS + waiting
            assert metrics.waiting == waiting
            # One probe per new frontend: refused at once.
            assert ids.probes - probes == new
            # A change to a served frontend: one update, no probe, however many wait.
            updates, probes = metrics.updates.count, ids.probes
            bed.move_backends(3, gen=waiting)
            await bed.settle()
            per_round.append((metrics.updates.count - updates, ids.probes - probes))
            base = int(ipaddress.ip_address("10.244.0.0")) + 3 * 4 + 1 + waiting
            assert bed.backends_in_maps(3) == sorted(
                str(ipaddress.ip_address(base + j)) for j in range(2)
            )
        assert per_round == [(1, 0), (1, 0), (1, 0)]
        health = bed.rec.health
        assert health.waiting_count == 300 and health.error_count == 0
        assert "300 object(s) wait for a free service id (none left)" in health.message
        assert metrics.current_errors == 0
        samples = {name: v for name, _, v in metrics.samples()}
        assert samples["statewright_reconciler_waiting_objects"] == 300
        # A freed id goes to the frontend that waited longest (svc20), to it alone.
        updates = metrics.updates.count
        bed.remove(0)
        await bed.settle()
        assert "test/svc20" in bed.done() and "test/svc0" not in bed.done()
        assert metrics.waiting == 299
        assert metrics.updates.count - updates == 1
        assert len(bed.done()) == IDS
        tg.cancel_scope.cancel()


def test_frontends_beyond_the_id_space_wait_at_no_cost_per_round() -> None:
    anyio.run(_exhaustion)
