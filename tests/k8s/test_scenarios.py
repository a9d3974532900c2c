"""End-to-end scenarios: the agent's components (statedb, lb, k8s, maps) against the fake
API server through a kubeconfig, down to the LB maps.

The hive here is the agent's own component list minus what needs a machine (API socket,
netlink, datapath): `KubernetesComponent` feeds the same `LoadBalancer`, reconciler and
maps the agent runs. Memory maps (pinned in-process, so a "restart" adopts them) for most
scenarios; one runs on kernel maps.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import socket
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
import trustme

from reconciler.status import StatusKind
from sources.k8s_source import SourceConfig
from statewright.agent.components.kubernetes import (
    K8S_SOURCE,
    KubernetesComponent,
    KubernetesConfig,
)
from statewright.agent.components.lb import (
    LB,
    LBComponentConfig,
    LBMapsComponent,
    LoadBalancerComponent,
    maps_placement,
)
from statewright.agent.components.statedb import StateDBComponent
from statewright.agent.config import AgentConfig
from statewright.api_types import Request
from statewright.component import DEGRADED, OK, Hive
from statewright.loadbalancer import LoadBalancer
from tests.pins import BPFFS, remove_memory_pins, remove_pin_dir

from .fake_apiserver import FakeAPIServer
from .helpers import FAST, NODE, wait_for
from .objects import endpoint_slice, node, service
from .rbac import disallowed

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def memory_pins(request: pytest.FixtureRequest) -> Iterator[str]:
    """A unique memory-map pin directory, emptied after the test."""
    path = f"/statewright-test/k8s-{os.getpid()}-{request.node.name}"
    try:
        yield path
    finally:
        remove_memory_pins(path)


@pytest.fixture
def kernel_pins(request: pytest.FixtureRequest) -> Iterator[str]:
    """A unique bpffs pin directory, removed after the test."""
    path = f"{BPFFS}/statewright-test-k8s-{os.getpid()}"
    try:
        yield path
    finally:
        remove_pin_dir(path)


def _config(kubeconfig: str, pin_dir: str, backend: str = "memory") -> AgentConfig:
    return AgentConfig(
        pin_dir=pin_dir,
        backend=backend,
        manifests=(),
        netlink=False,
        datapath=False,
        node_name=NODE,
        k8s_kubeconfig=kubeconfig,
    )


@contextlib.asynccontextmanager
async def agent(config: AgentConfig) -> AsyncIterator[Hive]:
    """The agent's LB components with the Kubernetes source, started; stopped on exit."""
    hive = Hive(
        [
            StateDBComponent(),
            LoadBalancerComponent(LBComponentConfig.from_agent_config(config)),
            KubernetesComponent(
                KubernetesConfig.from_agent_config(config),
                SourceConfig(batch_delay=0.001, reflector=FAST),
            ),
            LBMapsComponent(maps_placement(config)),
        ]
    )
    async with anyio.create_task_group() as tg:
        await hive.start(tg)
        try:
            yield hive
        finally:
            await hive.stop()
            tg.cancel_scope.cancel()


def _lb(hive: Hive) -> LoadBalancer:
    return hive.lookup(LB)


def _all_done(lb: LoadBalancer) -> bool:
    txn = lb.db.read_txn()
    initialized, _ = lb.frontends.initialized(txn)
    return initialized and all(f.status.kind is StatusKind.DONE for f in lb.frontends.all(txn))


def _map_entries(lb: LoadBalancer, vip: str) -> dict[Any, Any]:
    """The services-map entries of ``vip`` (master and backend slots)."""
    assert lb.maps is not None
    raw = ipaddress.ip_address(vip).packed
    return {k: v for k, v in lb.maps.svc4.items() if k.address == raw}


def _backend_addrs(lb: LoadBalancer, vip: str) -> list[str]:
    """The backend addresses the map holds for ``vip``."""
    assert lb.maps is not None
    out = []
    for k, v in _map_entries(lb, vip).items():
        if k.backend_slot:
            be = lb.maps.be4.lookup(v.backend_id)
            assert be is not None
            out.append(socket.inet_ntoa(be.address))
    return sorted(out)


def _ids(lb: LoadBalancer) -> dict[str, int]:
    return {str(f.address): f.id for f in lb.frontends.all(lb.db.read_txn())}


def _cluster(srv: FakeAPIServer, n: int = 4) -> None:
    for i in range(n):
        srv.upsert(service(f"s{i}", f"10.96.0.{i + 1}"))
        srv.upsert(endpoint_slice(f"s{i}", [f"10.244.{i}.1", f"10.244.{i}.2"]))
    srv.upsert(node(NODE, {"topology.kubernetes.io/zone": "a"}))


async def test_initial_sync_and_live_changes_reach_the_maps(
    apiserver: FakeAPIServer, kubeconfig: str, memory_pins: str
) -> None:
    _cluster(apiserver)
    async with agent(_config(kubeconfig, memory_pins)) as hive:
        lb = _lb(hive)
        await wait_for(lambda: _all_done(lb) and lb.frontends.count(lb.db.read_txn()) == 4, "sync")
        assert _backend_addrs(lb, "10.96.0.3") == ["10.244.2.1", "10.244.2.2"]
        health = {h.name: h for h in hive.health()}
        assert health["k8s"].state == OK and "synced" in health["k8s"].message
        assert health["k8s/services"].state == OK
        # /k8s on the agent's API: each reflector's state (watching once the watch that
        # follows its list is open).
        src = hive.lookup(K8S_SOURCE)
        await wait_for(lambda: all(r.health.state == "watching" for r in src.reflectors), "watch")
        (route,) = hive.component("k8s").routes()
        doc = await route.handler(Request(params={}, query={}))
        assert route.pattern == "/k8s" and doc["synced"] and not doc["errors"]
        assert {r["name"]: r["state"] for r in doc["resources"]} == {
            "services": "watching",
            "endpointslices": "watching",
            "pods": "watching",
            "nodes": "watching",
        }
        # Live: a new backend, a new service, a deleted service.
        apiserver.upsert(endpoint_slice("s0", ["10.244.0.1", "10.244.0.9"]))
        apiserver.upsert(service("s9", "10.96.0.99"))
        apiserver.upsert(endpoint_slice("s9", ["10.244.9.1"]))
        apiserver.delete("Service", "default", "s3")
        await wait_for(
            lambda: (
                _backend_addrs(lb, "10.96.0.1") == ["10.244.0.1", "10.244.0.9"]
                and _backend_addrs(lb, "10.96.0.99") == ["10.244.9.1"]
                and not _map_entries(lb, "10.96.0.4")
                and _all_done(lb)
            ),
            "live changes in the maps",
        )
    assert not disallowed(apiserver.requests)


async def test_relist_after_410_keeps_unchanged_entries(
    apiserver: FakeAPIServer, kubeconfig: str, memory_pins: str
) -> None:
    _cluster(apiserver)
    async with agent(_config(kubeconfig, memory_pins)) as hive:
        lb = _lb(hive)
        await wait_for(lambda: _all_done(lb) and lb.frontends.count(lb.db.read_txn()) == 4, "sync")
        ids = _ids(lb)
        entries = {vip: _map_entries(lb, vip) for vip in ("10.96.0.1", "10.96.0.3")}
        revs = {str(f.address): rev for f, rev in lb.frontends.revisions(lb.db.read_txn())}
        # The watches go down; meanwhile s1 is deleted and the history compacted.
        apiserver.fail_next(503, count=10_000, match="watch=true")
        apiserver.drop_watches()
        await wait_for(
            lambda: any(h.name == "k8s/services" and h.state == DEGRADED for h in hive.health()),
            "watch down",
        )
        apiserver.delete("Service", "default", "s1")
        apiserver.delete("EndpointSlice", "default", "s1-abcde")
        apiserver.expire()
        apiserver.clear_faults()
        await wait_for(lambda: not _map_entries(lb, "10.96.0.2") and _all_done(lb), "relist")
        src = hive.lookup(K8S_SOURCE)
        assert next(r for r in src.reflectors if r.name == "services").health.lists == 2
        # Unchanged services: same ids, same map entries, frontend rows never rewritten.
        after = _ids(lb)
        for addr in ("10.96.0.1:80/TCP", "10.96.0.3:80/TCP", "10.96.0.4:80/TCP"):
            assert after[addr] == ids[addr]
        for vip, before in entries.items():
            assert _map_entries(lb, vip) == before
        now = {str(f.address): rev for f, rev in lb.frontends.revisions(lb.db.read_txn())}
        for addr in ("10.96.0.1:80/TCP", "10.96.0.3:80/TCP", "10.96.0.4:80/TCP"):
            assert now[addr] == revs[addr], addr
    # Relists and re-watches included, every request is allowed by the ClusterRole.
    assert not disallowed(apiserver.requests)


async def test_restart_against_a_changed_cluster_prunes_exactly_the_stale_entries(
    apiserver: FakeAPIServer, kubeconfig: str, memory_pins: str
) -> None:
    _cluster(apiserver)
    config = _config(kubeconfig, memory_pins)
    async with agent(config) as hive:
        lb = _lb(hive)
        await wait_for(lambda: _all_done(lb) and lb.frontends.count(lb.db.read_txn()) == 4, "sync")
        ids = _ids(lb)
        kept = {vip: _map_entries(lb, vip) for vip in ("10.96.0.1", "10.96.0.4")}
    # While the agent is down: s1 goes away, s2 gets another backend, s7 appears.
    apiserver.delete("Service", "default", "s1")
    apiserver.delete("EndpointSlice", "default", "s1-abcde")
    apiserver.upsert(endpoint_slice("s2", ["10.244.2.1", "10.244.2.7"]))
    apiserver.upsert(service("s7", "10.96.0.77"))
    apiserver.upsert(endpoint_slice("s7", ["10.244.7.1"]))
    async with agent(config) as hive:
        lb = _lb(hive)
        await wait_for(lambda: _all_done(lb) and lb.frontends.count(lb.db.read_txn()) == 4, "sync")
        await wait_for(lambda: not _map_entries(lb, "10.96.0.2"), "stale service pruned")
        assert _backend_addrs(lb, "10.96.0.3") == ["10.244.2.1", "10.244.2.7"]
        assert _backend_addrs(lb, "10.96.0.77") == ["10.244.7.1"]
        after = _ids(lb)
        for addr in ("10.96.0.1:80/TCP", "10.96.0.3:80/TCP", "10.96.0.4:80/TCP"):
            assert after[addr] == ids[addr], addr
        for vip, before in kept.items():
            assert _map_entries(lb, vip) == before, vip
    assert not disallowed(apiserver.requests)


async def test_token_rotation_through_a_kubeconfig_token_file(
    apiserver: FakeAPIServer, tmp_path: Path, memory_pins: str
) -> None:
    """The agent's kubeconfig names a tokenFile: after the server rotates the token, the
    component is Degraded with the 401 until the file holds the new token, then changes
    reach the maps again."""
    _cluster(apiserver, 2)
    token = tmp_path / "token"
    token.write_text(apiserver.token)
    kubeconfig = apiserver.write_kubeconfig(tmp_path / "kc", token_file=str(token))
    async with agent(_config(kubeconfig, memory_pins)) as hive:
        lb = _lb(hive)
        await wait_for(lambda: _all_done(lb) and lb.frontends.count(lb.db.read_txn()) == 2, "sync")
        new = apiserver.rotate_token()
        apiserver.drop_watches()
        await wait_for(
            lambda: any(
                h.name == "k8s/services" and h.state == DEGRADED and "401" in h.message
                for h in hive.health()
            ),
            "Degraded with the 401",
        )
        tmp = tmp_path / "token.new"
        tmp.write_text(new)
        tmp.replace(token)
        apiserver.upsert(endpoint_slice("s1", ["10.244.1.9"]))
        await wait_for(
            lambda: _backend_addrs(lb, "10.96.0.2") == ["10.244.1.9"] and hive.overall() == OK,
            "recovered with the new token",
            30,
        )
    assert not disallowed(apiserver.requests)


async def test_stalled_watch_is_restarted_and_changes_reach_the_maps(
    apiserver: FakeAPIServer, kubeconfig: str, memory_pins: str
) -> None:
    _cluster(apiserver, 2)
    async with agent(_config(kubeconfig, memory_pins)) as hive:
        lb = _lb(hive)
        await wait_for(lambda: _all_done(lb) and lb.frontends.count(lb.db.read_txn()) == 2, "sync")
        src = hive.lookup(K8S_SOURCE)
        slices = next(r for r in src.reflectors if r.name == "endpointslices")
        await wait_for(lambda: slices.health.state == "watching", "watching")
        watches, lists = slices.health.watches, slices.health.lists
        apiserver.stall_watches()
        apiserver.upsert(endpoint_slice("s0", ["10.244.0.8"]))
        # Nothing arrives (not even bookmarks); after the stall timeout (1 s here) the
        # watch is restarted from its resourceVersion and replays the change.
        await wait_for(lambda: _backend_addrs(lb, "10.96.0.1") == ["10.244.0.8"], "change", 30)
        assert slices.health.watches > watches and slices.health.lists == lists
    assert not disallowed(apiserver.requests)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_api_server_unreachable_at_start(tmp_path: Path, memory_pins: str) -> None:
    ca = trustme.CA()
    port = _free_port()
    srv = FakeAPIServer(ca=ca, port=port)
    kubeconfig = srv.write_kubeconfig(tmp_path / "kc")
    token = srv.token
    srv.stop()  # nothing listens on the port now
    try:
        async with agent(_config(kubeconfig, memory_pins)) as hive:
            await wait_for(
                lambda: any(
                    h.name == "k8s" and h.state == DEGRADED and "refused" in h.message.lower()
                    for h in hive.health()
                ),
                "Degraded with the reason",
            )
            assert hive.overall() == DEGRADED
            lb = _lb(hive)
            assert not lb.frontends.initialized(lb.db.read_txn())[0]
            srv = FakeAPIServer(ca=ca, port=port, token=token)
            _cluster(srv, 2)
            srv.start()
            await wait_for(lambda: _all_done(lb) and hive.overall() == OK, "recovered", 30)
            assert _backend_addrs(lb, "10.96.0.2") == ["10.244.1.1", "10.244.1.2"]
    finally:
        srv.stop()


async def test_component_disabled_without_configuration(memory_pins: str) -> None:
    config = AgentConfig(pin_dir=memory_pins, backend="memory", manifests=(), netlink=False)
    comp = KubernetesComponent(KubernetesConfig.from_agent_config(config))
    assert not comp.enabled
    assert [h.state for h in comp.health()] == ["Disabled"]


@pytest.mark.kernel
async def test_kernel_maps(apiserver: FakeAPIServer, kubeconfig: str, kernel_pins: str) -> None:
    _cluster(apiserver, 2)
    async with agent(_config(kubeconfig, kernel_pins, backend="kernel")) as hive:
        lb = _lb(hive)
        assert lb.maps_kind == "kernel"
        await wait_for(lambda: _all_done(lb) and lb.frontends.count(lb.db.read_txn()) == 2, "sync")
        assert _backend_addrs(lb, "10.96.0.1") == ["10.244.0.1", "10.244.0.2"]
        apiserver.upsert(endpoint_slice("s1", ["10.244.1.5"]))
        await wait_for(lambda: _backend_addrs(lb, "10.96.0.2") == ["10.244.1.5"], "live change")
