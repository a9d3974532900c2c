"""A frontend keeps its ids when another service takes its address over in one batch.

A pod with a hostPort is deleted and recreated under the same name with a new UID; both
events are applied in one write transaction (as a reflector applies a batch). The new
pod's HostPort service owns the same frontends, so the service and reverse-NAT ids of
``0.0.0.0:4444`` and of its node-address expansion ``1.1.1.1:4444`` must not change.
Applied one after the other with the maps caught up in between, the frontends really
disappear and come back with new ids (hostport.txtar expects that too).
"""

from __future__ import annotations

import copy
import re
import uuid
from typing import Any

import anyio

from tables.node_addresses import NodeAddress
from tests.conformance.lb_system import LBSystem, MapsLocation, SystemOptions

POD: dict[str, Any] = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "my-app", "namespace": "default", "uid": "1111-aaaa"},
    "spec": {
        "nodeName": "testnode",
        "containers": [
            {"name": "c", "ports": [{"containerPort": 80, "hostPort": 4444, "protocol": "TCP"}]}
        ],
    },
    "status": {"phase": "Running", "podIP": "10.244.1.113", "podIPs": [{"ip": "10.244.1.113"}]},
}
POD2 = copy.deepcopy(POD)
POD2["metadata"]["uid"] = "2222-bbbb"
POD2["status"]["podIP"] = "10.244.1.200"
POD2["status"]["podIPs"] = [{"ip": "10.244.1.200"}]



def _rev_ids(dump: str) -> dict[str, str]:
    return {m.group(2): m.group(1) for m in re.finditer(r"REV: ID=(\d+) ADDR=(\S+)", dump)}


async def _settle(system: LBSystem) -> None:
    with anyio.fail_after(10):
        while not system.idle():
            await anyio.sleep(0.005)


def _run(root: str, one_batch: bool) -> tuple[dict[str, str], dict[str, str], str]:
    loc = MapsLocation("memory", f"{root}/{uuid.uuid4().hex[:8]}")
    out: list[Any] = []

    async def main() -> None:
        system = LBSystem(
            ["--lb-test-fault-probability=0.0"], SystemOptions(maps=loc, harness_defaults=True)
        )
        system.upsert_node_addresses(
            [NodeAddress.from_dict({"addr": "1.1.1.1", "nodeport": True, "primary": True})]
        )
        async with anyio.create_task_group() as tg:
            await system.start(tg)
            system.k8s.upsert(POD)
            await _settle(system)
            before = system.maps_dump()
            if one_batch:
                with system.writer.write_txn() as txn:
                    system.converter.delete(txn, POD)
                    system.converter.upsert(txn, POD2)
            else:
                system.k8s.delete(POD)
                await _settle(system)
                system.k8s.upsert(POD2)
            await _settle(system)
            after = system.maps_dump()
            await system.stop()
            tg.cancel_scope.cancel()
        out.extend([_rev_ids(before), _rev_ids(after), after])

    try:
        anyio.run(main)
    finally:
        loc.cleanup()
    return out[0], out[1], out[2]


def test_one_batch_keeps_ids(memory_root: str) -> None:
    """Delete and re-add in one transaction: same ids, new backend in the slots."""
    before, after, dump = _run(memory_root, one_batch=True)
    assert before == {"0.0.0.0:4444": "1", "1.1.1.1:4444": "2"}
    assert after == before
    assert "ADDR=10.244.1.200:80/TCP" in dump and "10.244.1.113" not in dump


def test_separate_events_renumber(memory_root: str) -> None:
    """Deleted and reconciled first, then re-added: the frontends get new ids."""
    before, after, _ = _run(memory_root, one_batch=False)
    assert before == {"0.0.0.0:4444": "1", "1.1.1.1:4444": "2"}
    assert after == {"0.0.0.0:4444": "3", "1.1.1.1:4444": "4"}
