"""IPAM's pod CIDRs from the Node's spec.podCIDRs, through the fake API server.

`NodePodCIDRs` (sources/k8s_node_cidrs.py) against a running `K8sSource`: IPAM hands out
nothing before the Node's initial list, then takes its pod CIDRs; a change keeps the
existing allocations (reported until released); a configuration wins and a mismatch is
reported. Then the agent's components (statedb, lb, k8s, lb-maps, endpoints) with no
``pod-cidrs`` configured.
"""

from __future__ import annotations

import contextlib
import ipaddress
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from typing import Any

import anyio
import pytest

from sources.k8s_client import ClientSettings
from sources.k8s_node_cidrs import NodePodCIDRs
from statedb import DB
from statewright.agent.components.endpoints import (
    ENDPOINTS,
    EndpointsComponent,
    EndpointsConfig,
)
from statewright.agent.components.kubernetes import KubernetesComponent, KubernetesConfig
from statewright.agent.components.lb import (
    LBComponentConfig,
    LBMapsComponent,
    LoadBalancerComponent,
    maps_placement,
)
from statewright.agent.components.statedb import StateDBComponent
from statewright.agent.config import DEFAULT_POD_CIDRS, AgentConfig
from statewright.api_types import ApiError, Request
from statewright.component import DEGRADED, OK, Hive
from tables.endpoints import EndpointChange
from tables.ipam import IPAM, IPAMConfig, IPAMNotReadyError
from tables.lb_writer import LBWriter
from tests.endpoints.helpers import new_pin_dir, remove_pins

from .fake_apiserver import FakeAPIServer
from .helpers import FAST, NODE, running_source, wait_for
from .objects import node
from .rbac import disallowed

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def state_dir() -> Iterator[str]:
    path = tempfile.mkdtemp(prefix="sw-k8s-ipam-")
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def node_with_cidrs(*cidrs: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    obj = node(NODE, labels)
    obj["spec"] = {"podCIDR": cidrs[0], "podCIDRs": list(cidrs)} if cidrs else {}
    return obj


@contextlib.asynccontextmanager
async def following(
    kubeconfig: str, state_dir: str, configured: tuple[str, ...] = ()
) -> AsyncIterator[tuple[IPAM, NodePodCIDRs]]:
    """A K8sSource and IPAM on one DB, IPAM following the Node (or configured)."""
    db = DB()
    writer = LBWriter.create(db)
    pending = "" if configured else f"Node {NODE}'s spec.podCIDRs"
    cfg = IPAMConfig.parse(configured, state_dir) if configured else IPAMConfig(
        state_dir=state_dir, pending=pending
    )
    ipam = IPAM(db, cfg)
    ipam.restore()
    async with running_source(
        ClientSettings(kubeconfig=kubeconfig), reflector=FAST, db=db, writer=writer
    ) as run:
        follower = NodePodCIDRs(ipam, run.source, configured)
        async with anyio.create_task_group() as tg:
            await tg.start(follower.run)
            yield ipam, follower
            tg.cancel_scope.cancel()


async def test_ipam_waits_for_the_node_then_takes_its_pod_cidrs(
    apiserver: FakeAPIServer, kubeconfig: str, state_dir: str
) -> None:
    apiserver.fail_next(503, count=10_000, match="/nodes")
    async with following(kubeconfig, state_dir) as (ipam, follower):
        # The Node's list fails: nothing is handed out, and health says why.
        with pytest.raises(IPAMNotReadyError, match=r"spec\.podCIDRs"):
            ipam.allocate_next(4, "pod-a")
        with pytest.raises(IPAMNotReadyError):
            ipam.allocate("10.10.0.5", "pod-a")
        assert ipam.allocations() == []
        ok, msg = follower.health()
        assert not ok and "waiting for Node" in msg
        apiserver.upsert(node_with_cidrs("10.10.0.0/24", "fd00:10::/112"))
        apiserver.clear_faults()
        await wait_for(lambda: follower.changes == 1, "IPAM has the Node's pod CIDRs")
        assert [str(c) for c in ipam.config.pod_cidrs] == ["10.10.0.0/24", "fd00:10::/112"]
        # The router addresses come from the Node's CIDRs, then the pods'.
        assert ipam.status()["router"] == {"ipv4": "10.10.0.1", "ipv6": "fd00:10::1"}
        assert str(ipam.allocate_next(4, "pod-a")) == "10.10.0.2"
        assert follower.health() == (
            True,
            f"from Node {NODE}'s spec.podCIDRs: 10.10.0.0/24, fd00:10::/112",
        )


async def test_node_without_pod_cidrs_keeps_ipam_waiting(
    apiserver: FakeAPIServer, kubeconfig: str, state_dir: str
) -> None:
    apiserver.upsert(node_with_cidrs())
    async with following(kubeconfig, state_dir) as (ipam, follower):
        await wait_for(lambda: follower.problem != "", "the Node is seen")
        ok, msg = follower.health()
        assert not ok and "has no pod CIDRs" in msg and ipam.pending
        # Invalid ones are refused the same way.
        apiserver.upsert(node_with_cidrs("10.10.0.0/33"))
        await wait_for(lambda: "spec.podCIDRs[0]" in follower.problem, "invalid CIDR seen")
        assert ipam.pending
        apiserver.upsert(node_with_cidrs("10.10.0.0/24"))
        await wait_for(lambda: follower.changes == 1, "IPAM ready")
        assert follower.health()[0]


async def test_change_of_pod_cidrs_keeps_existing_allocations(
    apiserver: FakeAPIServer, kubeconfig: str, state_dir: str
) -> None:
    apiserver.upsert(node_with_cidrs("10.10.0.0/24"))
    async with following(kubeconfig, state_dir) as (ipam, follower):
        await wait_for(lambda: follower.changes == 1, "IPAM ready")
        held = ipam.allocate_next(4, "pod-a")
        apiserver.upsert(node_with_cidrs("10.11.0.0/24"))
        await wait_for(lambda: follower.changes == 2, "the new CIDRs taken")
        # pod-a's allocation stays; the router address follows the CIDRs (the gateway
        # handed out is in the new CIDR); new addresses come from the new CIDR; health
        # names what is kept outside it.
        owners = {str(a.ip): a.owner for a in ipam.allocations()}
        assert owners == {"10.11.0.1": "router", str(held): "pod-a"}
        new = ipam.allocate_next(4, "pod-b")
        assert new in ipaddress.ip_network("10.11.0.0/24") and str(new) != "10.11.0.1"
        ok, msg = follower.health()
        assert not ok and "1 allocation(s) outside them kept until released" in msg
        assert "10.10.0.2 (pod-a)" in msg
        # Released: nothing is outside any more.
        ipam.release(held, "pod-a")
        assert follower.health()[0]
        # Persisted: a restart with the new CIDRs keeps every allocation.
        again = IPAM(DB(), IPAMConfig.parse(["10.11.0.0/24"], state_dir))
        assert again.restore() == 2


async def test_configured_pod_cidrs_win_and_a_mismatch_is_reported(
    apiserver: FakeAPIServer, kubeconfig: str, state_dir: str
) -> None:
    apiserver.upsert(node_with_cidrs("10.10.0.0/24"))
    async with following(kubeconfig, state_dir, ("10.20.0.0/24",)) as (ipam, follower):
        await wait_for(lambda: follower.node_cidrs != (), "the Node is seen")
        assert [str(c) for c in ipam.config.pod_cidrs] == ["10.20.0.0/24"]
        ok, msg = follower.health()
        assert not ok
        assert "configured pod CIDRs 10.20.0.0/24 differ from Node" in msg
        assert "spec.podCIDRs 10.10.0.0/24; using the configuration" in msg
        apiserver.upsert(node_with_cidrs("10.20.0.0/24"))
        await wait_for(lambda: follower.health()[0], "agreement")
        assert "configured: 10.20.0.0/24" in follower.health()[1]


# ----- the agent's components -------------------------------------------------------------------
@contextlib.asynccontextmanager
async def agent(config: AgentConfig) -> AsyncIterator[tuple[Hive, EndpointsComponent]]:
    endpoints = EndpointsComponent(
        EndpointsConfig.from_agent_config(config), link_exists=lambda ep: True
    )
    hive = Hive(
        [
            StateDBComponent(),
            LoadBalancerComponent(LBComponentConfig.from_agent_config(config)),
            KubernetesComponent(KubernetesConfig.from_agent_config(config)),
            LBMapsComponent(maps_placement(config)),
            endpoints,
        ]
    )
    async with anyio.create_task_group() as tg:
        await hive.start(tg)
        try:
            yield hive, endpoints
        finally:
            await hive.stop()
            tg.cancel_scope.cancel()


@pytest.fixture
def pins() -> Iterator[str]:
    path = new_pin_dir("memory")
    try:
        yield path
    finally:
        remove_pins("memory", path)


def _config(kubeconfig: str, pins: str, state_dir: str, **kw: Any) -> AgentConfig:
    return AgentConfig(
        pin_dir=pins,
        backend="memory",
        manifests=(),
        netlink=False,
        datapath=False,
        node_name=NODE,
        state_dir=state_dir,
        k8s_kubeconfig=kubeconfig,
        **kw,
    )


def test_agent_config_says_where_pod_cidrs_come_from() -> None:
    assert AgentConfig().effective_pod_cidrs == DEFAULT_POD_CIDRS
    assert not AgentConfig().pod_cidrs_from_node
    k8s = AgentConfig(k8s_api_server="https://127.0.0.1:6443")
    assert k8s.pod_cidrs_from_node and k8s.effective_pod_cidrs == ()
    both = AgentConfig(k8s_api_server="https://127.0.0.1:6443", pod_cidrs=("10.1.0.0/24",))
    assert not both.pod_cidrs_from_node and both.effective_pod_cidrs == ("10.1.0.0/24",)
    assert EndpointsConfig.from_agent_config(k8s).pod_cidrs_from_node
    assert not EndpointsConfig.from_agent_config(both).pod_cidrs_from_node


async def test_agent_ipam_follows_the_node(
    apiserver: FakeAPIServer, kubeconfig: str, pins: str, state_dir: str
) -> None:
    apiserver.fail_next(503, count=10_000, match="/nodes")
    async with agent(_config(kubeconfig, pins, state_dir)) as (hive, endpoints):
        health = {h.name: h for h in hive.health()}
        assert health["endpoints/pod-cidrs"].state == DEGRADED
        assert "waiting for Node" in health["endpoints/pod-cidrs"].message
        # The API refuses to hand out addresses (503) and an endpoint without addresses.
        post = next(r for r in endpoints.routes() if r.pattern == "/ipam" and "POST" in r.methods)
        with pytest.raises(ApiError) as err:
            await post.handler(Request(params={}, query={}))
        assert err.value.status == 503
        manager = hive.lookup(ENDPOINTS)
        with pytest.raises(IPAMNotReadyError):
            manager.create("1", EndpointChange.parse({"interface-name": "lxc1"}))
        apiserver.upsert(node_with_cidrs("10.30.0.0/24"))
        apiserver.clear_faults()
        await wait_for(
            lambda: any(h.name == "endpoints/pod-cidrs" and h.state == OK for h in hive.health()),
            "pod CIDRs from the Node",
        )
        doc = await post.handler(Request(params={}, query={}))
        assert doc["ipv4"]["cidrs"] == ["10.30.0.0/24"] and doc["ipv4"]["gateway"] == "10.30.0.1"
        # The router address is a host entry (the endpoints component rewrote them).
        assert endpoints.ipam is not None
        await wait_for(
            lambda: any(
                "10.30.0.1" in str(k) for k in manager.entries.ipcache.all(manager.db.read_txn())
            ),
            "router host entry",
        )
    assert not disallowed(apiserver.requests)


async def test_agent_with_configured_pod_cidrs_reports_a_mismatch(
    apiserver: FakeAPIServer, kubeconfig: str, pins: str, state_dir: str
) -> None:
    apiserver.upsert(node_with_cidrs("10.30.0.0/24"))
    cfg = _config(kubeconfig, pins, state_dir, pod_cidrs=("10.40.0.0/24",))
    async with agent(cfg) as (hive, endpoints):
        await wait_for(
            lambda: any(
                h.name == "endpoints/pod-cidrs" and h.state == DEGRADED for h in hive.health()
            ),
            "mismatch reported",
        )
        assert endpoints.ipam is not None
        assert [str(c) for c in endpoints.ipam.config.pod_cidrs] == ["10.40.0.0/24"]


class _OneNode:
    """A NodeSource that delivers one Node, then nothing more."""

    node_name = NODE

    def __init__(self, obj: dict[str, Any]) -> None:
        self.obj = obj

    async def wait_node(self, after: int = 0) -> tuple[int, Any]:
        if after == 0:
            return 1, self.obj
        await anyio.sleep_forever()
        raise AssertionError("unreachable")


async def test_ipam_that_cannot_persist_is_retried(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Taking the CIDRs reserves router addresses, which IPAM persists; when it cannot
    (its state directory is a file here), nothing changes, health says why, and it is
    tried again without a change of the Node."""
    import sources.k8s_node_cidrs as mod

    monkeypatch.setattr(mod, "RETRY_INTERVAL", 0.05)
    state = tmp_path / "state"
    ipam = IPAM(DB(), IPAMConfig(state_dir=str(state), pending="the Node"))
    ipam.restore()
    shutil.rmtree(state)
    state.write_text("not a directory")
    follower = NodePodCIDRs(ipam, _OneNode(node_with_cidrs("10.10.0.0/24")))
    async with anyio.create_task_group() as tg:
        await tg.start(follower.run)
        await wait_for(lambda: follower.failed, "the failure")
        assert ipam.pending and ipam.allocations() == []
        ok, msg = follower.health()
        assert not ok and "IPAM could not take 10.10.0.0/24" in msg
        state.unlink()
        await wait_for(lambda: follower.changes == 1, "taken on a later attempt")
        assert not follower.failed and follower.health()[0]
        assert ipam.status()["router"] == {"ipv4": "10.10.0.1"}
        tg.cancel_scope.cancel()
