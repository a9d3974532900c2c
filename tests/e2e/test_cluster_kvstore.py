"""The three-node bed in kvstore mode (tests/e2e/cluster_harness.py, ``kvstore=True``):
an etcd member on the underlay's bridge, every agent with ``identity-allocation-mode:
kvstore``. The API server still holds the Nodes (each agent reads only its own there),
Pods and policies; identities, remote endpoints and the node registry go through etcd.

Shown: every node's registry holds the three nodes (its own from the API server, the
others from etcd) and derives the routes and remote-node entries from them; the same
labels on two nodes give one identity key; the ipcache of the third node has both pods'
addresses under it, via their nodes; no CiliumIdentity or CiliumEndpoint is written;
pod-to-pod across nodes and an egress policy selecting pods on other nodes by label; an
agent SIGKILLed and restarted writes nothing and the other nodes write nothing either;
etcd SIGKILLed: the tables and traffic stay, a pod created meanwhile reaches the other
nodes once etcd is back.

The tests of this module run in order on one cluster; waits are bounded, nothing here
measures time.
"""

from __future__ import annotations

import errno
import json
import os
from collections.abc import Iterator
from typing import Any

import pytest

from tables.identities import IDENTITY_HOST, IDENTITY_REMOTE_NODE
from tests.e2e.cluster_harness import (
    ClusterEnv,
    cluster_env,
    cluster_leftovers,
    node_ips,
    node_name,
)
from tests.e2e.conftest import need_machine
from tests.e2e.harness import BACKEND_PORT, ident
from tests.e2e.test_cluster_policy import NS, add_pod
from tests.kvstore.etcd_cluster import etcd_available

pytestmark = pytest.mark.kernel

NODES = (1, 2, 3)
STATE = "cilium/state/"


def _need_etcd() -> None:
    if etcd_available():
        return
    reason = "etcd not installed (make setup installs Debian's etcd-server)"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{reason}; CI=true requires the kvstore bed to run", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="module")
def cluster() -> Iterator[ClusterEnv]:
    """The three nodes in kvstore mode: ``same1``/``same2`` (app=same) on nodes 1 and 2;
    a client ``pclient`` on node 1; serving pods ``allowed2`` (app=allowed) and
    ``denied2`` (app=denied) on node 2, ``allowed3`` (app=allowed) on node 3."""
    need_machine()
    _need_etcd()
    with cluster_env(kvstore=True) as env:
        for i in NODES:
            env.wait(lambda i=i: env.our_routes(i) == env.expected_routes(i),
                     f"node {i}'s routes to the other nodes (from etcd)")
        add_pod(env, 1, "same1", {"app": "same"})
        add_pod(env, 2, "same2", {"app": "same"})
        add_pod(env, 1, "pclient", {"app": "pclient"})
        add_pod(env, 2, "allowed2", {"app": "allowed"}, serve=True)
        add_pod(env, 2, "denied2", {"app": "denied"}, serve=True)
        add_pod(env, 3, "allowed3", {"app": "allowed"}, serve=True)
        yield env
    assert not cluster_leftovers(env)


def _health(env: ClusterEnv, i: int) -> dict[str, dict[str, Any]]:
    return {h["name"]: h for h in env.node(i).api.get("/health")["components"]}


def _node_entries(env: ClusterEnv, i: int) -> dict[str, tuple[int, str]]:
    addrs = {f"{a}/{32 if '.' in a else 128}" for j in NODES for a in node_ips(j)}
    return {p: (e["identity"], e.get("tunnel_endpoint", "")) for p, e in env.ipcache(i).items()
            if p in addrs}


def _expected_entries(i: int) -> dict[str, tuple[int, str]]:
    return {f"{a}/{32 if '.' in a else 128}":
            (IDENTITY_HOST, "") if j == i else (IDENTITY_REMOTE_NODE, a)
            for j in NODES for a in node_ips(j)}


def test_nodes_through_etcd_give_routes_and_node_entries(cluster: ClusterEnv) -> None:
    keys = cluster.wait(lambda: (k := cluster.etcd_keys(f"{STATE}nodes/v1/default/"))
                        and len(k) == 3 and k, "the three node keys in etcd")
    for i in NODES:
        value = json.loads(keys[f"{STATE}nodes/v1/default/{node_name(i)}"])
        assert {a["IP"] for a in value["IPAddresses"]} == set(node_ips(i))
        assert value["IPv4AllocCIDR"] == f"10.248.{i}.0/24"
    for i in NODES:
        sources = {n["name"]: n["source"] for n in cluster.node(i).api.get("/nodes")["nodes"]}
        assert sources == {node_name(j): "k8s" if j == i else "kvstore" for j in NODES}
        assert cluster.our_routes(i) == cluster.expected_routes(i)
        cluster.wait(lambda i=i: _node_entries(cluster, i) == _expected_entries(i),
                     f"node {i}'s node ipcache entries")
        health = _health(cluster, i)
        for name in ("kvstore", "nodes", "nodes/routes"):
            assert health[name]["state"] == "OK", health[name]
        assert "leader known" in health["kvstore"]["message"]


def _identity(env: ClusterEnv, node: int, pod: str) -> int:
    ep = env.node(node).endpoints().get(pod)
    return int(ep["identity"]) if ep else 0


def test_same_labels_on_two_nodes_one_identity_key(cluster: ClusterEnv) -> None:
    def agreed() -> int:
        a, b = _identity(cluster, 1, "same1"), _identity(cluster, 2, "same2")
        return a if a and a == b else 0

    num = cluster.wait(agreed, "same1 and same2 use one identity number")
    ids = cluster.wait(lambda: (k := cluster.etcd_keys(f"{STATE}identities/v1/id/"))
                       and f"{STATE}identities/v1/id/{num}" in k and k, "the identity key")
    labels = ids[f"{STATE}identities/v1/id/{num}"]
    assert "k8s:app=same;" in labels and f"k8s:io.kubernetes.pod.namespace={NS};" in labels
    refs = cluster.wait(
        lambda: (r := {k.rsplit("/", 1)[1]: v for k, v in cluster.etcd_keys(
            f"{STATE}identities/v1/value/{labels}/").items()}) and len(r) == 2 and r,
        "both nodes reference it")
    assert refs == {node_name(1): str(num), node_name(2): str(num)}
    # Nothing of it in the API server: kvstore mode writes no CRD objects.
    assert cluster.apiserver.objects("CiliumIdentity") == []
    assert cluster.apiserver.objects("CiliumEndpoint") == []
    # Node 3 has both pods' addresses under that identity, each via its node; etcd holds
    # the same pairs.
    for p, node in (("same1", 1), ("same2", 2)):
        pod = cluster.node(node).pods[p]
        for fam in (4, 6):
            addr = pod.address(fam)
            prefix = f"{addr}/{32 if fam == 4 else 128}"
            entry = cluster.wait(lambda prefix=prefix: cluster.ipcache(3).get(prefix),
                                 f"node 3's ipcache entry of {p}")
            assert int(entry["identity"]) == num
            assert entry["tunnel_endpoint"] in node_ips(node)
            pair = json.loads(cluster.etcd_keys(f"{STATE}ip/v1/default/{addr}")[
                f"{STATE}ip/v1/default/{addr}"])
            assert pair["ID"] == num and pair["HostIP"] == node_ips(node)[0]
    health = _health(cluster, 3)
    for name in ("endpoints/identities", "endpoints/kvstore-ipcache"):
        assert health[name]["state"] == "OK", health[name]


def _connect(client: Any, host: str) -> dict[str, Any]:
    result: dict[str, Any] = client.tcp(host, BACKEND_PORT)[0]
    return result


def test_pod_to_pod_and_egress_policy_by_labels_across_nodes(cluster: ClusterEnv) -> None:
    n1 = cluster.node(1)
    client = n1.client_in(n1.pods["pclient"])
    allowed = [cluster.node(2).pods["allowed2"], cluster.node(3).pods["allowed3"]]
    denied = cluster.node(2).pods["denied2"]
    targets = [(p.address(fam), True) for p in allowed for fam in (4, 6)]
    targets += [(denied.address(fam), False) for fam in (4, 6)]
    for addr, _ in targets:
        cluster.wait(lambda addr=addr: _connect(client, addr).get("id") == ident(addr),
                     f"pod-to-pod to {addr} without a policy")
    cluster.apiserver.upsert({
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": "pclient-egress", "namespace": NS},
        "spec": {
            "podSelector": {"matchLabels": {"app": "pclient"}},
            "policyTypes": ["Egress"],
            "egress": [{"to": [{"podSelector": {"matchLabels": {"app": "allowed"}}}],
                        "ports": [{"protocol": "TCP", "port": BACKEND_PORT}]}],
        },
    })
    denied4 = denied.address(4)
    cluster.wait(lambda: _connect(client, denied4).get("errno") == errno.EPERM,
                 "the policy refuses the pod labelled app=denied on node 2")
    for addr, ok in targets:
        got = _connect(client, addr)
        if ok:
            assert got.get("id") == ident(addr), (addr, got)
        else:
            assert got.get("errno") == errno.EPERM, (addr, got)


def test_agent_killed_and_restarted_rewrites_nothing(cluster: ClusterEnv) -> None:
    """Its keys come back under a new lease before anyone acts on their absence."""
    others = {i: cluster.writes(i) for i in (1, 3)}
    remote = {i: cluster.ipcache(i) for i in (1, 3)}
    node2 = cluster.node(2)
    node2.agent.kill()
    node2.agent.start()

    def settled() -> bool:
        w = cluster.writes(2)
        h = _health(cluster, 2)
        return w["routes-adopted"] == 4 and h["kvstore"]["state"] == "OK" and all(
            h[n]["state"] == "OK" for n in ("endpoints/identities", "endpoints/kvstore-ipcache",
                                            "nodes")) and all(
            e["status"] == "Done" for e in cluster.ipcache(2).values())

    cluster.wait(settled, "node 2's restarted agent synced with etcd and adopted everything")
    assert cluster.writes(2) == {"ipcache": 0, "endpoint-map": 0, "routes": 0,
                                 "route-deletes": 0, "routes-adopted": 4}
    for i in (1, 3):
        assert cluster.writes(i) == others[i], f"node {i} wrote something"
        assert cluster.ipcache(i) == remote[i], f"node {i}'s ipcache changed"


def test_etcd_down_keeps_the_datapath_and_catches_up(cluster: ClusterEnv) -> None:
    """etcd SIGKILLed: every agent keeps its tables (nothing emptied, traffic and policy
    go on), health says disconnected; a pod added meanwhile is numbered at once and
    reaches the other nodes once etcd is back."""
    etcd = cluster.etcd
    assert etcd is not None
    member = etcd.members[0]
    before = {i: cluster.ipcache(i) for i in NODES}
    n1 = cluster.node(1)
    client = n1.client_in(n1.pods["pclient"])
    allowed3 = cluster.node(3).pods["allowed3"].address(4)
    etcd.stop_member(member)
    try:
        for i in NODES:
            cluster.wait(lambda i=i: _health(cluster, i)["kvstore"]["state"] == "Degraded",
                         f"node {i} sees etcd gone")
        add_pod(cluster, 3, "late3", {"app": "allowed"}, serve=True)
        assert _connect(client, allowed3).get("id") == ident(allowed3)
        for i in NODES:
            now = cluster.ipcache(i)
            assert {p: e for p, e in now.items() if p in before[i]} == before[i], i
        assert "disconnected" in _health(cluster, 1)["kvstore"]["message"]
    finally:
        etcd.start_member(member)
        etcd.wait_leader()
    late = cluster.node(3).pods["late3"].address(4)
    entry = cluster.wait(lambda: cluster.ipcache(1).get(f"{late}/32"),
                         "node 1 learns the pod added during the outage", bound=90)
    assert int(entry["identity"]) == _identity(cluster, 3, "allowed3")
    cluster.wait(lambda: _connect(client, late).get("id") == ident(late),
                 "the policy allows the new app=allowed pod on node 3")
    for i in NODES:
        cluster.wait(lambda i=i: all(_health(cluster, i)[n]["state"] == "OK" for n in (
            "kvstore", "nodes", "endpoints/identities", "endpoints/kvstore-ipcache")),
                     f"node {i} healthy again")
