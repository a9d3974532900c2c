"""Every Node of the cluster through the fake API server: the agent's ``nodes`` table and
the endpoints' node ipcache entries (remote-node for the others, host for this node's),
with the components statedb, lb, k8s, nodes, maps (memory) and endpoints. No route is
written here (auto-direct-node-routes stays off: this runs in the host's namespace);
tests/netlink/test_node_routes.py and tests/e2e/test_cluster.py do the routes."""

from __future__ import annotations

import contextlib
import ipaddress
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from typing import Any

import anyio
import pytest

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
from statewright.agent.components.nodes import NodesComponent, NodesConfig
from statewright.agent.components.statedb import StateDBComponent
from statewright.agent.config import AgentConfig
from statewright.component import DEGRADED, DISABLED, OK, Hive
from tables.identities import IDENTITY_HOST, IDENTITY_REMOTE_NODE
from tests.endpoints.helpers import new_pin_dir, remove_pins

from .fake_apiserver import FakeAPIServer
from .helpers import FAST, NODE, wait_for
from .rbac import disallowed

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def state_dir() -> Iterator[str]:
    path = tempfile.mkdtemp(prefix="sw-k8s-nodes-")
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def pins() -> Iterator[str]:
    path = new_pin_dir("memory")
    try:
        yield path
    finally:
        remove_pins("memory", path)


def k8s_node(name: str, addresses: dict[str, list[str]], cidrs: list[str],
             labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {"podCIDRs": cidrs} if cidrs else {},
        "status": {"addresses": [{"type": t, "address": a} for t, addrs in addresses.items()
                                 for a in addrs] + [{"type": "Hostname", "address": name}]},
    }


@contextlib.asynccontextmanager
async def agent(config: AgentConfig) -> AsyncIterator[tuple[Hive, NodesComponent]]:
    nodes = NodesComponent(NodesConfig.from_agent_config(config))
    k8s = KubernetesComponent(KubernetesConfig.from_agent_config(config))
    from sources.k8s_source import SourceConfig

    k8s.source_config = SourceConfig(reflector=FAST)
    hive = Hive([
        StateDBComponent(),
        LoadBalancerComponent(LBComponentConfig.from_agent_config(config)),
        k8s,
        nodes,
        LBMapsComponent(maps_placement(config)),
        EndpointsComponent(EndpointsConfig.from_agent_config(config),
                           link_exists=lambda ep: True),
    ])
    async with anyio.create_task_group() as tg:
        await hive.start(tg)
        try:
            yield hive, nodes
        finally:
            await hive.stop()
            tg.cancel_scope.cancel()


def ipcache(hive: Hive) -> dict[str, tuple[int, str, str]]:
    manager = hive.lookup(ENDPOINTS)
    rows = manager.entries.ipcache.all(manager.db.read_txn())
    return {str(r.prefix): (r.identity, r.owner, str(r.tunnel_endpoint or "")) for r in rows}


def names(nodes: NodesComponent) -> dict[str, Any]:
    assert nodes.table is not None and nodes.db is not None
    return {n.name: n for n in nodes.table.all(nodes.db.read_txn())}


async def test_all_nodes_into_the_table_and_the_ipcache(
    apiserver: FakeAPIServer, kubeconfig: str, pins: str, state_dir: str
) -> None:
    apiserver.upsert(k8s_node(NODE, {"InternalIP": ["192.168.50.1", "fd50::1"]},
                              ["10.10.0.0/24", "fd10::/112"], {"zone": "a"}))
    apiserver.upsert(k8s_node("node-b", {"InternalIP": ["192.168.50.2", "fd50::2"],
                                         "ExternalIP": ["203.0.113.2"]},
                              ["10.11.0.0/24", "fd11::/112"]))
    cfg = AgentConfig(pin_dir=pins, backend="memory", manifests=(), netlink=False,
                      datapath=False, node_name=NODE, state_dir=state_dir,
                      k8s_kubeconfig=kubeconfig, pod_cidrs=("10.10.0.0/24",))
    async with agent(cfg) as (hive, nodes):
        await wait_for(lambda: set(names(nodes)) == {NODE, "node-b"}, "both Nodes")
        b = names(nodes)["node-b"]
        assert [str(c) for c in b.pod_cidrs] == ["10.11.0.0/24", "fd11::/112"]
        assert str(b.internal_ip(4)) == "192.168.50.2" and str(b.internal_ip(6)) == "fd50::2"
        assert dict(names(nodes)[NODE].labels) == {"zone": "a"}
        want_b = {
            "192.168.50.2/32": (IDENTITY_REMOTE_NODE, "remote-node:node-b", "192.168.50.2"),
            "fd50::2/128": (IDENTITY_REMOTE_NODE, "remote-node:node-b", "fd50::2"),
            "203.0.113.2/32": (IDENTITY_REMOTE_NODE, "remote-node:node-b", "192.168.50.2"),
        }
        await wait_for(lambda: want_b.items() <= ipcache(hive).items(), "remote-node entries")
        # this node's own Node addresses are host entries
        assert ipcache(hive)["192.168.50.1/32"] == (IDENTITY_HOST, "host", "")
        assert ipcache(hive)["fd50::1/128"] == (IDENTITY_HOST, "host", "")
        health = {h.name: h for h in hive.health()}
        assert health["nodes"].state == OK and "2 node(s)" in health["nodes"].message
        assert health["nodes/routes"].state == DISABLED

        # a bad Node gets its own error and changes nothing else; its earlier row stays
        before = ipcache(hive)
        bad = k8s_node("node-b", {"InternalIP": ["192.168.50.300"]}, ["10.11.0.0/24"])
        rv = apiserver.upsert(bad)["metadata"]["resourceVersion"]
        apiserver.upsert(k8s_node("node-c", {"InternalIP": ["192.168.50.3"]},
                                  ["10.12.0.0/24"]))
        await wait_for(lambda: "node-c" in names(nodes), "node-c after the bad node-b")
        assert int(rv) > 0
        assert names(nodes)["node-b"] == b
        health = {h.name: h for h in hive.health()}
        assert health["nodes"].state == DEGRADED
        assert "status.addresses[0].address" in health["nodes"].message
        await wait_for(lambda: "192.168.50.3/32" in ipcache(hive), "node-c's entry")
        after = ipcache(hive)
        assert {k: v for k, v in after.items() if k != "192.168.50.3/32"} == before

        # a Node deleted takes its entries, and only those
        apiserver.delete("Node", "", "node-c")
        await wait_for(lambda: "192.168.50.3/32" not in ipcache(hive), "node-c gone")
        assert ipcache(hive) == before
        # the fixed node-b applies; the error goes
        apiserver.upsert(k8s_node("node-b", {"InternalIP": ["192.168.50.22"]},
                                  ["10.11.0.0/24"]))
        await wait_for(lambda: "192.168.50.22/32" in ipcache(hive), "node-b's new address")
        assert "192.168.50.2/32" not in ipcache(hive)
        await wait_for(lambda: {h.name: h.state for h in hive.health()}["nodes"] == OK,
                       "error cleared")
    assert not disallowed(apiserver.requests)


def test_node_rows_from_objects() -> None:
    from tables.nodes import NodeError, node_from_object

    row = node_from_object(k8s_node("n", {"InternalIP": ["10.0.0.1"], "ExternalIP": ["::1"]},
                                    ["10.1.0.0/24"], {"a": "b"}))
    assert [str(a) for a in row.addresses] == ["InternalIP:10.0.0.1", "ExternalIP:::1"]
    assert row.pod_cidrs == (ipaddress.ip_network("10.1.0.0/24"),)
    assert row.to_json()["labels"] == {"a": "b"}
    single = k8s_node("n", {}, [])
    single["spec"] = {"podCIDR": "10.2.0.0/24"}
    assert [str(c) for c in node_from_object(single).pod_cidrs] == ["10.2.0.0/24"]
    for obj, field in [
        ({"kind": "Node", "metadata": {}}, "metadata.name"),
        (k8s_node("n", {}, ["10.1.0.1/24"]), "spec.podCIDRs[0]"),
        (k8s_node("n", {}, ["10.1.0.0/24", "10.2.0.0/24"]), "spec.podCIDRs[1]"),
        (k8s_node("n", {"InternalIP": ["x"]}, []), "status.addresses[0].address"),
        ({"kind": "Node", "metadata": {"name": "n", "labels": {"a": 1}}}, "metadata.labels"),
        ({"kind": "Node", "metadata": {"name": "n"}, "spec": {"podCIDRs": "10.0.0.0/8"}},
         "spec.podCIDRs"),
    ]:
        with pytest.raises(NodeError) as err:
            node_from_object(obj)
        assert err.value.field == field, obj
