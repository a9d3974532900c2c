"""Three nodes that find each other through the API server (issue #25; the bed is
tests/e2e/cluster_harness.py): native routes to every other node's pod CIDRs and the
nodes' ipcache entries; pod-to-pod across nodes over IPv4 and IPv6; a ClusterIP service
whose backends are on other nodes, through the socket LB; a Node deleted; an agent
SIGKILLed and restarted (its pods keep their connectivity, nothing of the other nodes is
written again); the API server unreachable for a while.

The tests of this module run in order on one cluster. Waits are bounded; nothing here
measures time.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from bpf.ipcache import FLAG_HAS_TUNNEL_EP
from tables.identities import IDENTITY_HOST, IDENTITY_REMOTE_NODE
from tests.e2e.cluster_harness import (
    ClusterEnv,
    cluster_env,
    cluster_leftovers,
    node_ips,
    node_name,
    node_object,
    pod_cidrs,
)
from tests.e2e.conftest import need_machine
from tests.e2e.harness import BACKEND_PORT, ident, ids
from tests.k8s.objects import endpoint_slice, service

pytestmark = pytest.mark.kernel

VIP = "10.96.248.10"
NODES = (1, 2, 3)


@pytest.fixture(scope="module")
def cluster() -> Iterator[ClusterEnv]:
    """The three nodes, each with a client pod and a serving pod ``web<i>``."""
    need_machine()
    with cluster_env() as env:
        for i in NODES:
            env.wait(lambda i=i: env.our_routes(i) == env.expected_routes(i),
                     f"node {i}'s routes to the other nodes")
            n = env.node(i)
            n.add_pod(f"client{i}")
            n.serve(n.add_pod(f"web{i}"))
        yield env
    assert not cluster_leftovers(env)


def _web(env: ClusterEnv, i: int, fam: int) -> str:
    return env.node(i).pods[f"web{i}"].address(fam)


def _reach(env: ClusterEnv, src: int, dst: int, fam: int, count: int = 2) -> None:
    """A connection from node ``src``'s client pod to node ``dst``'s web pod."""
    client = _client(env, src)
    addr = _web(env, dst, fam)
    assert ids(client.tcp(addr, BACKEND_PORT, count=count)) == [ident(addr)] * count


_CLIENTS: dict[tuple[int, int], Any] = {}


def _client(env: ClusterEnv, i: int) -> Any:
    key = (id(env), i)
    if key not in _CLIENTS:
        n = env.node(i)
        _CLIENTS[key] = n.client_in(n.pods[f"client{i}"])
    return _CLIENTS[key]


def _node_entries(env: ClusterEnv, i: int) -> dict[str, tuple[int, str]]:
    """Node ``i``'s ipcache rows of node addresses: prefix -> (identity, tunnel endpoint)."""
    node_addrs = {f"{a}/{32 if '.' in a else 128}" for j in NODES for a in node_ips(j)}
    return {p: (e["identity"], e.get("tunnel_endpoint", "")) for p, e in env.ipcache(i).items()
            if p in node_addrs}


def _expected_entries(i: int, nodes: tuple[int, ...] = NODES) -> dict[str, tuple[int, str]]:
    out = {}
    for j in nodes:
        for a in node_ips(j):
            prefix = f"{a}/{32 if '.' in a else 128}"
            out[prefix] = (IDENTITY_HOST, "") if j == i else (IDENTITY_REMOTE_NODE, a)
    return out


def test_routes_and_node_entries_on_every_node(cluster: ClusterEnv) -> None:
    for i in NODES:
        assert cluster.our_routes(i) == cluster.expected_routes(i)
        cluster.wait(lambda i=i: _node_entries(cluster, i) == _expected_entries(i),
                     f"node {i}'s node ipcache entries")
        status = cluster.node(i).api.get("/nodes")
        assert {n["name"] for n in status["nodes"]} == {node_name(j) for j in NODES}
        assert status["problems"] == {}
        # in the pinned map: remote-node identity and the node as tunnel endpoint
        in_map = cluster.ipcache_map(i)
        for j in NODES:
            if j == i:
                continue
            v4 = node_ips(j)[0]
            value = in_map[f"{v4}/32"]
            assert int(value["sec_identity"]) == IDENTITY_REMOTE_NODE
            assert int(value["flags"]) & FLAG_HAS_TUNNEL_EP
            assert v4 in str(value["tunnel_endpoint"])
        health = {h["name"]: h for h in cluster.node(i).api.get("/health")["components"]}
        assert health["nodes/routes"]["state"] == "OK", health["nodes/routes"]


def test_pod_to_pod_across_nodes(cluster: ClusterEnv) -> None:
    for src in NODES:
        for dst in NODES:
            for fam in (4, 6):
                _reach(cluster, src, dst, fam)


def test_cluster_ip_service_with_backends_on_other_nodes(cluster: ClusterEnv) -> None:
    backends = [_web(cluster, 2, 4), _web(cluster, 3, 4)]
    cluster.apiserver.upsert(service("web", VIP, ns="e2e"))
    cluster.apiserver.upsert(endpoint_slice("web", backends, ns="e2e"))
    client = _client(cluster, 1)
    want = {ident(b) for b in backends}
    seen: set[str] = set()

    def both_seen() -> bool:
        seen.update(ids(client.tcp(VIP, 80, count=6)))
        assert seen <= want, seen
        return seen == want

    cluster.wait(both_seen, "the VIP reaches both backends on nodes 2 and 3")


def test_node_deleted_takes_its_routes_and_entries(cluster: ClusterEnv) -> None:
    before = {i: cluster.ipcache(i) for i in (1, 2)}
    writes = {i: cluster.writes(i) for i in (1, 2)}
    cluster.apiserver.delete("Node", "", node_name(3))
    for i in (1, 2):
        cluster.wait(lambda i=i: cluster.our_routes(i) == cluster.expected_routes(i, (1, 2)),
                     f"node {i} drops node 3's routes")
        cluster.wait(lambda i=i: _node_entries(cluster, i) == _expected_entries(i, (1, 2)),
                     f"node {i} drops node 3's ipcache entries")
        gone = {f"{a}/{32 if '.' in a else 128}" for a in node_ips(3)}
        after = cluster.ipcache(i)
        assert {p: e for p, e in before[i].items() if p not in gone} == after
        now = cluster.writes(i)
        # two routes deleted, nothing written
        assert now["routes"] == writes[i]["routes"]
        assert now["route-deletes"] == writes[i]["route-deletes"] + 2
        assert now["ipcache"] == writes[i]["ipcache"]
        assert now["endpoint-map"] == writes[i]["endpoint-map"]
    # node 3 comes back: routes and entries again, traffic flows again
    cluster.apiserver.upsert(node_object(3))
    for i in (1, 2):
        cluster.wait(lambda i=i: cluster.our_routes(i) == cluster.expected_routes(i),
                     f"node {i} has node 3's routes again")
    _reach(cluster, 1, 3, 4)
    _reach(cluster, 2, 3, 6)


def test_agent_killed_and_restarted_rewrites_nothing(cluster: ClusterEnv) -> None:
    others = {i: cluster.writes(i) for i in (1, 3)}
    node2 = cluster.node(2)
    node2.agent.kill()
    # the datapath keeps working while the agent is down
    for fam in (4, 6):
        _reach(cluster, 2, 1, fam)
        _reach(cluster, 1, 2, fam)
        _reach(cluster, 3, 2, fam)
    node2.agent.start()

    def settled() -> bool:
        w = cluster.writes(2)
        return w["routes-adopted"] == 4 and all(
            e["status"] == "Done" for e in cluster.ipcache(2).values())

    cluster.wait(settled, "node 2's restarted agent adopted its routes and entries")
    assert cluster.writes(2) == {"ipcache": 0, "endpoint-map": 0, "routes": 0,
                                 "route-deletes": 0, "routes-adopted": 4}
    assert cluster.our_routes(2) == cluster.expected_routes(2)
    assert _node_entries(cluster, 2) == _expected_entries(2)
    for i in (1, 3):
        assert cluster.writes(i) == others[i], f"node {i} wrote something"
    for fam in (4, 6):
        _reach(cluster, 2, 3, fam)
        _reach(cluster, 1, 2, fam)


def test_api_server_unreachable_keeps_the_datapath_and_catches_up(cluster: ClusterEnv) -> None:
    cluster.api_unreachable()
    try:
        # meanwhile: a fourth Node joins, the service's backends change
        v4, v6 = "192.168.200.4", "fd20:200::4"
        cluster.apiserver.upsert({
            "apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-4"},
            "spec": {"podCIDRs": ["10.248.4.0/24", "fd00:248:4::/112"]},
            "status": {"addresses": [{"type": "InternalIP", "address": v4},
                                     {"type": "InternalIP", "address": v6}]},
        })
        only3 = _web(cluster, 3, 4)
        cluster.apiserver.upsert(endpoint_slice("web", [only3], ns="e2e"))
        # the datapath keeps working, with what the agents had
        for fam in (4, 6):
            _reach(cluster, 1, 2, fam)
            _reach(cluster, 3, 1, fam)
        assert ("10.248.4.0/24", v4) not in cluster.our_routes(1)
    finally:
        cluster.api_reachable()
    for i in NODES:
        cluster.wait(lambda i=i: {("10.248.4.0/24", v4), ("fd00:248:4::/112", v6)}
                     <= cluster.our_routes(i), f"node {i} learns node-4 after the outage",
                     bound=90)
        cluster.wait(lambda i=i: _node_entries_of(cluster, i, v4) == IDENTITY_REMOTE_NODE,
                     f"node {i}'s ipcache has node-4")
    client = _client(cluster, 1)
    cluster.wait(lambda: set(ids(client.tcp(VIP, 80, count=6))) == {ident(only3)},
                 "the VIP follows the EndpointSlice changed during the outage")
    assert pod_cidrs(1)[0] == "10.248.1.0/24"


def _node_entries_of(env: ClusterEnv, i: int, addr: str) -> int:
    entry = env.ipcache(i).get(f"{addr}/32")
    return int(entry["identity"]) if entry else 0
