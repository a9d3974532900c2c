"""Identities and policy across nodes (issue #25; the bed is tests/e2e/cluster_harness.py):
the same labels on two nodes give the same identity number, and an egress policy selecting
pods on other nodes by label allows exactly them.

The test plays the kubelet: each pod is a Pod object in the API server (labels, node, the
uid its CiliumEndpoint is owned by) and a CNI ADD on its node. The tests of this module run
in order on one cluster; waits are bounded, nothing here measures time.
"""

from __future__ import annotations

import errno
from collections.abc import Iterator
from typing import Any

import pytest

from tests.e2e.cluster_harness import ClusterEnv, cluster_env, cluster_leftovers, node_name
from tests.e2e.conftest import need_machine
from tests.e2e.harness import BACKEND_PORT, ident

pytestmark = pytest.mark.kernel

NS = "e2e"


def pod_object(name: str, node: int, labels: dict[str, str]) -> dict[str, Any]:
    """The Pod ``e2e/<name>`` on node ``node`` as the kubelet reports it."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NS, "labels": labels},
        "spec": {"nodeName": node_name(node), "containers": [{"name": "c"}]},
        "status": {"phase": "Running"},
    }


def add_pod(env: ClusterEnv, node: int, name: str, labels: dict[str, str],
            serve: bool = False) -> None:
    env.apiserver.upsert(pod_object(name, node, labels))
    pod = env.node(node).add_pod(name, NS, labels)
    if serve:
        env.node(node).serve(pod)


@pytest.fixture(scope="module")
def cluster() -> Iterator[ClusterEnv]:
    """The three nodes: ``same1``/``same2`` (app=same) on nodes 1 and 2; a client
    ``pclient`` (app=pclient) on node 1; serving pods ``allowed2`` (app=allowed) and
    ``denied2`` (app=denied) on node 2, ``allowed3`` (app=allowed) on node 3."""
    need_machine()
    with cluster_env() as env:
        for i in (1, 2, 3):
            env.wait(lambda i=i: env.our_routes(i) == env.expected_routes(i),
                     f"node {i}'s routes to the other nodes")
        add_pod(env, 1, "same1", {"app": "same"})
        add_pod(env, 2, "same2", {"app": "same"})
        add_pod(env, 1, "pclient", {"app": "pclient"})
        add_pod(env, 2, "allowed2", {"app": "allowed"}, serve=True)
        add_pod(env, 2, "denied2", {"app": "denied"}, serve=True)
        add_pod(env, 3, "allowed3", {"app": "allowed"}, serve=True)
        yield env
    assert not cluster_leftovers(env)


def _identity(env: ClusterEnv, node: int, pod: str) -> int:
    ep = env.node(node).endpoints().get(pod)
    return int(ep["identity"]) if ep else 0


def test_same_labels_on_two_nodes_give_the_same_identity(cluster: ClusterEnv) -> None:
    def agreed() -> int:
        a, b = _identity(cluster, 1, "same1"), _identity(cluster, 2, "same2")
        return a if a and a == b else 0

    num = cluster.wait(agreed, "same1 and same2 use one identity number")
    assert 256 <= num <= 65535
    # The number is the cluster's: one CiliumIdentity with the pods' labels...
    objs = {o["metadata"]["name"]: o for o in cluster.apiserver.objects("CiliumIdentity")}
    labels = objs[str(num)]["security-labels"]
    assert labels["k8s:app"] == "same" and labels["k8s:io.kubernetes.pod.namespace"] == NS
    # ... both pods' CiliumEndpoints name it, owned by their Pods ...
    def ceps() -> dict[str, Any]:
        return {o["metadata"]["name"]: o for o in cluster.apiserver.objects("CiliumEndpoint")}

    cluster.wait(lambda: {"same1", "same2"} <= set(ceps()), "both CiliumEndpoints")
    cluster.wait(lambda: all(ceps()[p]["status"]["identity"]["id"] == num
                             for p in ("same1", "same2")), "both CiliumEndpoints name it")
    for p, node in (("same1", 1), ("same2", 2)):
        owner = ceps()[p]["metadata"]["ownerReferences"][0]
        assert owner["kind"] == "Pod" and owner["name"] == p
        cep_node = ceps()[p]["status"]["networking"]["node"]
        assert cep_node == f"192.168.200.{node}"
    # ... and node 3 knows both pods' addresses under that identity, via their nodes.
    for p, node in (("same1", 1), ("same2", 2)):
        pod = cluster.node(node).pods[p]
        for fam in (4, 6):
            addr = pod.address(fam)
            prefix = f"{addr}/{32 if fam == 4 else 128}"
            entry = cluster.wait(lambda prefix=prefix: cluster.ipcache(3).get(prefix),
                                 f"node 3's ipcache entry of {p}")
            assert int(entry["identity"]) == num
            assert entry["tunnel_endpoint"] in (f"192.168.200.{node}", f"fd20:200::{node}")
    health = {h["name"]: h for h in cluster.node(3).api.get("/health")["components"]}
    assert health["endpoints/identities"]["state"] == "OK", health["endpoints/identities"]
    assert health["endpoints/cilium-endpoints"]["state"] == "OK", health[
        "endpoints/cilium-endpoints"]


def _connect(client: Any, host: str) -> dict[str, Any]:
    result: dict[str, Any] = client.tcp(host, BACKEND_PORT)[0]
    return result


def test_egress_policy_selects_pods_on_other_nodes_by_label(cluster: ClusterEnv) -> None:
    n1 = cluster.node(1)
    client = n1.client_in(n1.pods["pclient"])
    allowed = [cluster.node(2).pods["allowed2"], cluster.node(3).pods["allowed3"]]
    denied = cluster.node(2).pods["denied2"]
    targets = [(p.address(fam), True) for p in allowed for fam in (4, 6)]
    targets += [(denied.address(fam), False) for fam in (4, 6)]
    # Without a policy every target is reached.
    for addr, _ in targets:
        cluster.wait(lambda addr=addr: _connect(client, addr).get("id") == ident(addr),
                     f"baseline connection to {addr}")
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
