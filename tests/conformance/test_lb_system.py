"""LBSystem on its own (no corpus): objects in (through the fake API server and the
product's Kubernetes source), maps out, restart keeps ids, bad objects are reported and
disturb nothing else, a resync is seen by relisting, the node's labels. Runs on memory maps
and, marked ``kernel``, on pinned kernel maps under a temporary bpffs directory."""

from __future__ import annotations

import uuid
from typing import Any

import anyio
import pytest

from tests.conformance.lb_system import FakeKubernetes, LBSystem, MapsLocation, SystemOptions

SERVICE: dict[str, Any] = {
    "apiVersion": "v1",
    "kind": "Service",
    "metadata": {"name": "web", "namespace": "shop"},
    "spec": {
        "clusterIP": "10.96.0.10",
        "ports": [{"name": "http", "port": 80, "protocol": "TCP"}],
        "type": "ClusterIP",
    },
}
SLICE: dict[str, Any] = {
    "apiVersion": "discovery.k8s.io/v1",
    "kind": "EndpointSlice",
    "metadata": {
        "name": "web-1",
        "namespace": "shop",
        "labels": {"kubernetes.io/service-name": "web"},
    },
    "addressType": "IPv4",
    "endpoints": [
        {"addresses": ["10.244.0.7"], "conditions": {"ready": True}},
        {"addresses": ["10.244.0.8"], "conditions": {"ready": True}},
    ],
    "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
}
BAD_SERVICE: dict[str, Any] = {
    "apiVersion": "v1",
    "kind": "Service",
    "metadata": {"name": "broken", "namespace": "shop"},
    "spec": {"clusterIP": "10.96.0.300", "ports": [{"port": 80}]},
}


async def _settle(system: LBSystem) -> None:
    with anyio.fail_after(10):
        while not system.idle():
            await anyio.sleep(0.01)


def _scenario(backend: str, root: str) -> None:
    loc = MapsLocation(backend=backend, pin_dir=f"{root}/{uuid.uuid4().hex[:8]}")
    flags = ["--lb-test-fault-probability=0.0", "--bpf-lb-enable-wildcard-entries=false"]

    async def main() -> None:
        with FakeKubernetes() as k8s:
            system = LBSystem(flags, SystemOptions(maps=loc, harness_defaults=True), k8s)
            async with anyio.create_task_group() as tg:
                k8s.upsert(SERVICE)
                await system.start(tg)
                k8s.upsert(SLICE)
                k8s.upsert(BAD_SERVICE)  # reported, changes nothing
                await _settle(system)
                dump = system.maps_dump()
                assert "SVC: ID=1 ADDR=10.96.0.10:80/TCP SLOT=0" in dump
                assert dump.count("BE: ") == 2
                assert any("shop/broken" in e for e in system.source_errors)
                assert system.services.count(system.db.read_txn()) == 1
                await system.stop()

                # Restart: same API server and pinned maps, fresh database; ids are kept.
                again = system.recreate()
                await again.start(tg)
                await _settle(again)
                assert again.maps_dump() == dump
                k8s.delete(SERVICE)
                k8s.delete(SLICE)
                await _settle(again)
                assert again.maps_leftovers() == []
                await again.stop()
                tg.cancel_scope.cancel()

    try:
        anyio.run(main)
    finally:
        loc.cleanup()


def test_resync_is_seen_by_relisting(memory_root: str) -> None:
    """``k8s/resync``: the server's objects are replaced without watch events, the watch
    ends with 410 Gone, and the source's relist removes what disappeared; waiting for the
    replacement's revision returns once that relist is applied."""
    loc = MapsLocation(backend="memory", pin_dir=f"{memory_root}/{uuid.uuid4().hex[:8]}")
    flags = ["--lb-test-fault-probability=0.0", "--bpf-lb-enable-wildcard-entries=false"]

    async def main() -> None:
        with FakeKubernetes() as k8s:
            system = LBSystem(flags, SystemOptions(maps=loc, harness_defaults=True), k8s)
            async with anyio.create_task_group() as tg:
                k8s.upsert(SERVICE)
                k8s.upsert(SLICE)
                await system.start(tg)
                assert system.backends.count(system.db.read_txn()) == 2
                source = system.source
                assert source is not None
                lists = {r.name: r.health.lists for r in source.reflectors}
                k8s.replace("discovery.k8s.io.v1.endpointslices", [])
                await system.wait_caught_up()
                slices = next(r for r in source.reflectors if r.name == "endpointslices")
                assert slices.health.lists == lists["endpointslices"] + 1
                assert system.backends.count(system.db.read_txn()) == 0
                assert system.services.count(system.db.read_txn()) == 1
                await _settle(system)
                await system.stop()
                tg.cancel_scope.cancel()

    try:
        anyio.run(main)
    finally:
        loc.cleanup()


def test_node_labels(memory_root: str) -> None:
    """Without a Node object the source leaves the node's labels alone (the corpus sets
    them with ``test/set-node-labels``); a Node named as this node sets them; other nodes
    are not read."""
    loc = MapsLocation(backend="memory", pin_dir=f"{memory_root}/{uuid.uuid4().hex[:8]}")
    flags = ["--lb-test-fault-probability=0.0"]
    zone = "topology.kubernetes.io/zone"

    def node(name: str, labels: dict[str, str]) -> dict[str, Any]:
        return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}}

    async def main() -> None:
        with FakeKubernetes() as k8s:
            system = LBSystem(flags, SystemOptions(maps=loc, harness_defaults=True), k8s)
            async with anyio.create_task_group() as tg:
                system.set_node_labels({zone: "zone-a"})
                await system.start(tg)
                assert system.writer.node_labels == {zone: "zone-a"}
                k8s.upsert(node("elsewhere", {zone: "zone-x"}))
                k8s.upsert(node(system.config.node_name, {zone: "zone-b"}))
                await system.wait_caught_up()
                assert system.writer.node_labels == {zone: "zone-b"}
                # The watch delivers in revision order: had the other node been delivered,
                # it would have been before this node's change.
                assert system.source is not None
                nodes = next(r for r in system.source.reflectors if r.name == "nodes")
                assert "elsewhere" not in nodes.store
                await system.stop()
                tg.cancel_scope.cancel()

    try:
        anyio.run(main)
    finally:
        loc.cleanup()




def test_lb_system_memory(memory_root: str) -> None:
    """Objects in, maps out, restart, deletion, on memory maps."""
    _scenario("memory", memory_root)


@pytest.mark.kernel
def test_lb_system_kernel(kernel_root: str) -> None:
    """The same on pinned kernel maps."""
    _scenario("kernel", kernel_root)


def test_unsupported_flags_are_named() -> None:
    """Flags Statewright does not implement are listed, known ones are not."""
    bad = LBSystem.unsupported_flags(
        ["--bpf-lb-algorithm=maglev", "--bpf-lb-dsr-dispatch=geneve", "--no-such-flag=1"]
    )
    assert bad == ["--bpf-lb-dsr-dispatch=geneve", "--no-such-flag=1"]


def test_state_file_source_feeds_the_tables(memory_root: str, tmp_path: Any) -> None:
    """``--lb-state-file``: the file's services and slices appear (source ``api``), the
    frontends table counts as initialized once it was read, a broken file is reported and
    changes nothing, and an empty file clears the state."""
    import yaml

    state = tmp_path / "state.yaml"
    state.write_text(
        yaml.safe_dump(
            {
                "services": [{k: v for k, v in SERVICE.items() if k != "kind"}],
                "endpoints": [SLICE],
            }
        )
    )
    loc = MapsLocation(backend="memory", pin_dir=f"{memory_root}/{uuid.uuid4().hex[:8]}")
    flags = [
        "--lb-test-fault-probability=0.0",
        "--bpf-lb-enable-wildcard-entries=false",
        f"--lb-state-file={state}",
        "--lb-state-file-interval=10ms",
    ]
    assert LBSystem.unsupported_flags(flags) == []

    async def main() -> None:
        system = LBSystem(flags, SystemOptions(maps=loc, harness_defaults=True))
        try:
            async with anyio.create_task_group() as tg:
                await system.start(tg)
                await _settle(system)
                txn = system.db.read_txn()
                assert system.frontends.initialized(txn)[0]
                assert [s.source for s in system.services.all(txn)] == ["api"]
                dump = system.maps_dump()
                assert "ADDR=10.96.0.10:80/TCP SLOT=0" in dump and dump.count("BE: ") == 2

                tmp = tmp_path / "next.yaml"
                tmp.write_text("services: [\n")  # broken YAML
                tmp.replace(state)
                with anyio.fail_after(5):
                    while not system.source_errors:
                        await anyio.sleep(0.01)
                assert "state.yaml" in system.source_errors[-1]
                assert system.maps_dump() == dump  # nothing changed

                tmp.write_text("")
                tmp.replace(state)
                with anyio.fail_after(5):
                    while system.services.count(system.db.read_txn()):
                        await anyio.sleep(0.01)
                await _settle(system)
                assert system.source_errors == []
                assert system.maps_leftovers() == []
                await system.stop()
                tg.cancel_scope.cancel()
        finally:
            loc.cleanup()

    anyio.run(main)
