"""EndpointSlice weights end to end: from the slice annotation through the backends table
to the weighted Maglev lookup table; weight 0 takes a slice's backends out of it (state
maintenance, no slot) while the others share the table."""

from __future__ import annotations

import re
import uuid
from typing import Any

import anyio

from tests.conformance.lb_system import LBSystem, MapsLocation, SystemOptions

SERVICE: dict[str, Any] = {
    "apiVersion": "v1",
    "kind": "Service",
    "metadata": {"name": "web", "namespace": "shop"},
    "spec": {
        "clusterIP": "10.96.0.10",
        "externalIPs": ["192.0.2.10"],
        "ports": [{"name": "http", "port": 80, "protocol": "TCP"}],
    },
}


def _slice(name: str, ip: str, weight: str | None) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "namespace": "shop",
        "labels": {"kubernetes.io/service-name": "web"},
    }
    if weight is not None:
        meta["annotations"] = {"service.cilium.io/weight": weight}
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": meta,
        "addressType": "IPv4",
        "endpoints": [{"addresses": [ip]}],
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
    }



def _maglev_counts(dump: str) -> dict[str, int]:
    """backend address -> slots in the ExternalIP frontend's Maglev table."""
    be_addr = dict(re.findall(r"BE: ID=(\d+) ADDR=(\S+) ", dump))
    rev = dict(re.findall(r"REV: ID=(\d+) ADDR=(\S+)", dump))
    fe_id = next(i for i, a in rev.items() if a == "192.0.2.10:80")
    line = next(ln for ln in dump.splitlines() if ln.startswith(f"MAGLEV: ID={fe_id} "))
    return {be_addr[i]: int(n) for i, n in re.findall(r"(\d+)\((\d+)\)", line)}


def test_slice_weights_reach_the_maglev_table(memory_root: str) -> None:
    loc = MapsLocation("memory", f"{memory_root}/{uuid.uuid4().hex[:8]}")
    dumps: list[str] = []
    weights: list[dict[str, int]] = []

    async def settle(system: LBSystem) -> None:
        with anyio.fail_after(10):
            while not system.idle():
                await anyio.sleep(0.005)

    async def main() -> None:
        system = LBSystem(
            ["--lb-test-fault-probability=0.0", "--bpf-lb-algorithm=maglev"],
            SystemOptions(maps=loc, harness_defaults=True),
        )
        async with anyio.create_task_group() as tg:
            await system.start(tg)
            system.k8s.upsert(SERVICE)
            system.k8s.upsert(_slice("web-a", "10.244.0.1", None))
            system.k8s.upsert(_slice("web-b", "10.244.0.2", "300"))
            await settle(system)
            dumps.append(system.maps_dump())
            txn = system.db.read_txn()
            weights.append(
                {str(b.address): b.instance("shop/web").weight for b in system.backends.all(txn)}
            )
            system.k8s.upsert(_slice("web-b", "10.244.0.2", "0"))
            await settle(system)
            dumps.append(system.maps_dump())
            await system.stop()
            tg.cancel_scope.cancel()

    try:
        anyio.run(main)
    finally:
        loc.cleanup()
    assert weights[0] == {"10.244.0.1:8080/TCP": 100, "10.244.0.2:8080/TCP": 300}
    counts = _maglev_counts(dumps[0])
    assert sum(counts.values()) == 1021
    # Slots in proportion to the weights (1:3), within a few slots.
    assert abs(counts["10.244.0.2:8080/TCP"] - 3 * counts["10.244.0.1:8080/TCP"]) <= 8
    # Weight 0: maintenance, out of the Maglev table and the slots.
    assert "ADDR=10.244.0.2:8080/TCP STATE=maintenance" in dumps[1]
    assert _maglev_counts(dumps[1]) == {"10.244.0.1:8080/TCP": 1021}
    assert "COUNT=1 QCOUNT=0" in next(
        ln for ln in dumps[1].splitlines() if "ADDR=192.0.2.10:80/TCP SLOT=0" in ln
    )
