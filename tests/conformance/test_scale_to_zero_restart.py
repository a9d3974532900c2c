"""Scale to zero across an agent restart, on pinned memory and kernel maps: entries of
services that went away (or opted out) while the agent was down are pruned once the
restarted system has read its sources; the entries of services still opted in keep their
ids and values."""

from __future__ import annotations

import copy
import uuid
from typing import Any

import anyio
import pytest

from bpf import lb
from tests.conformance.lb_system import FakeKubernetes, LBSystem, MapsLocation, SystemOptions

FLAGS = ["--lb-test-fault-probability=0.0", "--enable-scale-to-zero"]


def _service(name: str, ip: str, opted_in: bool) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "shop"}
    if opted_in:
        meta["annotations"] = {"service.cilium.io/scale-to-zero": "true"}
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": meta,
        "spec": {"clusterIP": ip, "ports": [{"name": "http", "port": 80, "protocol": "TCP"}]},
    }


async def _settle(system: LBSystem) -> None:
    with anyio.fail_after(10):
        while not system.idle() or system.prune_count() == 0:
            await anyio.sleep(0.005)


def _scenario(backend: str, root: str) -> None:
    loc = MapsLocation(backend=backend, pin_dir=f"{root}/{uuid.uuid4().hex[:8]}")
    kept, gone, out = (
        _service("kept", "10.96.1.1", True),
        _service("gone", "10.96.1.2", True),
        _service("optout", "10.96.1.3", True),
    )

    async def main() -> None:
        with FakeKubernetes() as k8s:
            await _restart(k8s, loc, kept, gone, out)

    try:
        anyio.run(main)
    finally:
        loc.cleanup()


async def _restart(
    k8s: FakeKubernetes,
    loc: MapsLocation,
    kept: dict[str, Any],
    gone: dict[str, Any],
    out: dict[str, Any],
) -> None:
    """Start with the three services, mark "kept" as in demand, and restart after "gone"
    was deleted and "optout" lost its annotation."""
    for svc in (kept, gone, out):
        k8s.upsert(svc)
    system = LBSystem(FLAGS, SystemOptions(maps=loc, harness_defaults=True), k8s)
    async with anyio.create_task_group() as tg:
        await system.start(tg)
        await _settle(system)
        assert system.lb.scale_to_zero_dump() == (
            "SCALETOZERO: ID=1\nSCALETOZERO: ID=2\nSCALETOZERO: ID=3\n"
        )
        maps = system.plain_maps
        assert maps is not None and maps.scale_to_zero is not None
        # The datapath's demand timestamp of "kept" (id 2: services are applied by name).
        maps.scale_to_zero.update(lb.ScaleToZeroKey(2), lb.ScaleToZeroValue(777))
        await system.stop()

        # While the agent is down: one service is deleted, one opts out.
        k8s.delete(gone)
        plain = copy.deepcopy(out)
        del plain["metadata"]["annotations"]
        k8s.upsert(plain)

        again = system.recreate()
        await again.start(tg)
        await _settle(again)
        assert again.lb.scale_to_zero_dump() == "SCALETOZERO: ID=2\n"
        restarted = again.plain_maps
        assert restarted is not None and restarted.scale_to_zero is not None
        assert restarted.scale_to_zero.lookup(lb.ScaleToZeroKey(2)) == lb.ScaleToZeroValue(
            777
        )
        await again.stop()
        tg.cancel_scope.cancel()




def test_scale_to_zero_restart_memory(memory_root: str) -> None:
    """Stale entries pruned after a restart, on pinned memory maps."""
    _scenario("memory", memory_root)


@pytest.mark.kernel
def test_scale_to_zero_restart_kernel(kernel_root: str) -> None:
    """The same on pinned kernel maps."""
    _scenario("kernel", kernel_root)
