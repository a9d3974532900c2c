"""After a restart, a backend restored as terminating that its EndpointSlice then calls
ready is active and load-balanced; one neither ready nor serving is in maintenance.

Runs the product's path end to end (fake API server, Kubernetes source, converter,
FrontendOps restoring ids from the pinned maps) on memory maps and, marked ``kernel``,
on pinned kernel maps. Backend 10.244.0.8 terminates for ``shop/web`` while ``shop/web2``
still lists it ready: their shared backend entry holds "active", so the restore reads
web's tail slot as a quarantined backend; the slice listing it terminating explains
that slot, and the slice then saying ready (with terminating still set: ready overrides
it, as in Kubernetes with publishNotReadyAddresses) makes it active.
"""

from __future__ import annotations

import re
import uuid
from typing import Any

import anyio
import pytest

from tests.conformance.lb_system import FakeKubernetes, LBSystem, MapsLocation, SystemOptions

FLAGS = ["--lb-test-fault-probability=0.0", "--bpf-lb-enable-wildcard-entries=false"]
READY = {"ready": True}
GONE = {"ready": False, "serving": False, "terminating": True}
DRAINING = {"ready": False, "serving": True, "terminating": True}


def _service(name: str, ip: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": "shop"},
        "spec": {
            "type": "ClusterIP",
            "clusterIP": ip,
            "ports": [{"name": "http", "port": 80, "protocol": "TCP"}],
        },
    }


def _slice(service: str, conditions: dict[str, dict[str, bool]]) -> dict[str, Any]:
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": f"{service}-1",
            "namespace": "shop",
            "labels": {"kubernetes.io/service-name": service},
        },
        "addressType": "IPv4",
        "endpoints": [
            {"addresses": [ip], "conditions": cond} for ip, cond in sorted(conditions.items())
        ],
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
    }


def _master(dump: str, vip: str) -> str:
    m = re.search(rf"^SVC: ID=\d+ ADDR={re.escape(vip)}/TCP SLOT=0 .*$", dump, re.M)
    assert m is not None, dump
    return m.group(0)


def _backend_line(dump: str, ip: str) -> str:
    m = re.search(rf"^BE: ID=\d+ ADDR={re.escape(ip)}:8080/TCP .*$", dump, re.M)
    assert m is not None, dump
    return m.group(0)


def _slot_ids(dump: str, vip: str) -> set[str]:
    return set(re.findall(rf"ADDR={re.escape(vip)}/TCP SLOT=[1-9]\d* BEID=(\d+)", dump))


def _id(line: str) -> str:
    m = re.match(r"BE: ID=(\d+)", line)
    assert m is not None
    return m.group(1)


async def _settle(system: LBSystem) -> None:
    with anyio.fail_after(10):
        while not system.idle():
            await anyio.sleep(0.01)


def _scenario(backend: str, root: str) -> None:
    loc = MapsLocation(backend=backend, pin_dir=f"{root}/{uuid.uuid4().hex[:8]}")
    web = "10.96.0.10:80"
    before = {"10.244.0.7": READY, "10.244.0.8": GONE, "10.244.0.9": DRAINING}

    async def main() -> None:
        with FakeKubernetes() as k8s:
            k8s.upsert(_service("web", "10.96.0.10"))
            k8s.upsert(_slice("web", before))
            k8s.upsert(_service("web2", "10.96.0.11"))
            k8s.upsert(_slice("web2", {"10.244.0.7": READY, "10.244.0.8": READY}))
            system = LBSystem(FLAGS, SystemOptions(maps=loc, harness_defaults=True), k8s)
            async with anyio.create_task_group() as tg:
                await system.start(tg)
                await _settle(system)
                dump = system.maps_dump()
                assert "COUNT=1 QCOUNT=2" in _master(dump, web)
                assert "STATE=terminating" in _backend_line(dump, "10.244.0.9")
                await system.stop()

                # Restart with the same slices: 10.244.0.8's tail slot is explained by its
                # terminating state, not taken for a quarantine; the maps stay as they were.
                again = system.recreate()
                await again.start(tg)
                await _settle(again)
                assert again.ops.restored_quarantined == {}
                assert again.maps_dump() == dump

                # Then the slice says ready (terminating still set) for one, neither ready
                # nor serving for the other.
                k8s.upsert(
                    _slice(
                        "web",
                        {
                            "10.244.0.7": READY,
                            "10.244.0.8": {"ready": True, "serving": False, "terminating": True},
                            "10.244.0.9": {"ready": False, "serving": False},
                        },
                    )
                )
                await again.wait_caught_up()
                await _settle(again)
                dump = again.maps_dump()
                ready, maint = _backend_line(dump, "10.244.0.8"), _backend_line(dump, "10.244.0.9")
                assert "STATE=active" in ready and "STATE=maintenance" in maint
                assert "COUNT=2 QCOUNT=0" in _master(dump, web)
                assert _id(ready) in _slot_ids(dump, web)
                assert _id(maint) not in _slot_ids(dump, web)
                await again.stop()
                tg.cancel_scope.cancel()

    try:
        anyio.run(main)
    finally:
        loc.cleanup()


def test_restored_terminating_backend_turns_active_memory(memory_root: str) -> None:
    """On memory maps."""
    _scenario("memory", memory_root)


@pytest.mark.kernel
def test_restored_terminating_backend_turns_active_kernel(kernel_root: str) -> None:
    """On pinned kernel maps."""
    _scenario("kernel", kernel_root)
