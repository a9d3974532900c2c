"""Property: random Kubernetes object churn through the tables and the real reconciler,
with map faults, converges to the maps of the same churn without faults.

Services (ClusterIP / NodePort / LoadBalancer, with or without session affinity) and
their EndpointSlices are added, changed and deleted at random, through the Kubernetes
converter, the LB writer and the frontends reconciler running FrontendOps. One run has
every LB map behind ``bpf.testing.FaultyMap``; the reconciler retries failed
frontends. Once the faulty run has settled (no frontend waiting for a retry) and a
prune has run, its maps must equal those of the fault-free run, ids aside: faults
reorder the allocations, so ids are replaced by the addresses they stand for.
"""

from __future__ import annotations

import errno
import ipaddress
from typing import Any

import anyio
from hypothesis import given, settings
from hypothesis import strategies as st

from bpf.testing import FaultyMap
from bpfops.adapter import frontend_ops_for, reconciler_config
from bpfops.lb_maps import LBMaps
from bpfops.maps_dump import dump_lines
from reconciler import Reconciler
from sources.k8s_convert import K8sConverter
from statedb import DB
from tables.lb_writer import LBWriter
from tables.node_addresses import NodeAddress
from tests.bpfops.helpers import normalize_ids
from tests.conformance.lb_system import harness_config

WRITE_OPS = frozenset({"update", "delete", "update_batch", "delete_batch", "set_inner"})
TYPES = ("ClusterIP", "NodePort", "LoadBalancer")

# (which service, delete?, type, affinity, backends as (index, ready) pairs)
change = st.tuples(
    st.integers(0, 3),
    st.booleans(),
    st.sampled_from(TYPES),
    st.booleans(),
    st.lists(st.tuples(st.integers(0, 5), st.booleans()), max_size=4),
)


def service(i: int, svc_type: str, affinity: bool) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "type": svc_type,
        "clusterIP": f"10.96.0.{i + 1}",
        "clusterIPs": [f"10.96.0.{i + 1}"],
        "ports": [{"name": "http", "port": 80, "protocol": "TCP", "nodePort": 30080 + i}],
    }
    if affinity:
        spec["sessionAffinity"] = "ClientIP"
        spec["sessionAffinityConfig"] = {"clientIP": {"timeoutSeconds": 30}}
    obj: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": f"svc{i}", "namespace": "test"},
        "spec": spec,
    }
    if svc_type == "LoadBalancer":
        obj["status"] = {"loadBalancer": {"ingress": [{"ip": f"172.16.0.{i + 1}"}]}}
    return obj


def endpoints(i: int, backends: list[tuple[int, bool]]) -> dict[str, Any]:
    eps = []
    for b, ready in dict(backends).items():
        eps.append(
            {
                "addresses": [str(ipaddress.ip_address("10.244.0.1") + b)],
                "conditions": {"ready": ready, "serving": True, "terminating": not ready},
            }
        )
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": f"svc{i}-eps",
            "namespace": "test",
            "labels": {"kubernetes.io/service-name": f"svc{i}"},
        },
        "addressType": "IPv4",
        "endpoints": eps,
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
    }


async def run(
    changes: list[tuple[int, bool, str, bool, list[tuple[int, bool]]]],
    fault_seed: int | None,
    batch: bool = False,
) -> list[str]:
    """Apply the churn; return the settled, pruned maps. ``batch``: the reconciler hands
    FrontendOps whole rounds (its BatchOperations), as the LoadBalancer does."""
    cfg = harness_config(["--lb-test-fault-probability=0.0"])
    db = DB()
    writer = LBWriter.create(db, cfg)
    conv = K8sConverter(writer, cfg)
    counter = [0]

    def wrap(backend: Any) -> Any:
        counter[0] += 1
        assert fault_seed is not None
        return FaultyMap(backend, 0.2, errno.EIO, fault_seed * 31 + counter[0], WRITE_OPS)

    maps = LBMaps.in_memory(
        max_entries=256, maglev_table_size=251, wrap=wrap if fault_seed is not None else None
    )
    ops = frontend_ops_for(writer, maps, cfg)
    rec = Reconciler(
        db,
        reconciler_config(
            writer, ops, cfg, retry_min_backoff=0.001, retry_max_backoff=0.002,
            prune_interval=None, batch_operations=ops if batch else None,
        ),
    )
    with writer.write_txn() as txn:
        writer.upsert_node_address(
            txn, NodeAddress(ipaddress.ip_address("1.1.1.1"), True, True, "eth0")
        )
        txn.commit()
    live: set[int] = set()
    async with anyio.create_task_group() as tg:
        await tg.start(rec.run)
        for i, delete, svc_type, affinity, bes in changes:
            with writer.write_txn() as txn:
                if delete and i in live:
                    conv.delete(txn, service(i, svc_type, affinity))
                    conv.delete(txn, endpoints(i, []))
                    live.discard(i)
                elif not delete:
                    conv.upsert(txn, service(i, svc_type, affinity))
                    conv.upsert(txn, endpoints(i, bes))
                    live.add(i)
                txn.commit()
            await anyio.sleep(0)
        with anyio.fail_after(20):
            while True:
                rev = writer.frontends.revision(db.read_txn())
                if await rec.wait_until_reconciled(rev) == 0:
                    break
                await anyio.sleep(0.002)
            done = rec.metrics.prunes.count
            while rec.metrics.prunes.count == done or rec.metrics.prune_current_errors:
                rec.prune()
                await anyio.sleep(0.002)
        tg.cancel_scope.cancel()
    return dump_lines(maps.unwrapped())


@settings(max_examples=25, deadline=None, derandomize=True)
@given(st.lists(change, min_size=1, max_size=12), st.integers(0, 1000))
def test_k8s_churn_with_map_faults_converges(
    changes: list[tuple[int, bool, str, bool, list[tuple[int, bool]]]], seed: int
) -> None:
    clean = anyio.run(run, changes, None)
    faulty = anyio.run(run, changes, seed)
    assert normalize_ids(faulty) == normalize_ids(clean)


@settings(max_examples=25, deadline=None, derandomize=True)
@given(st.lists(change, min_size=1, max_size=12), st.integers(0, 1000))
def test_k8s_churn_with_map_faults_through_the_batch_path_converges(
    changes: list[tuple[int, bool, str, bool, list[tuple[int, bool]]]], seed: int
) -> None:
    clean = anyio.run(run, changes, None)
    faulty = anyio.run(run, changes, seed, True)
    assert normalize_ids(faulty) == normalize_ids(clean)
