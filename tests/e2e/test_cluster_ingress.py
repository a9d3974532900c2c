"""Ingress policy across nodes (issue #29) on the three-node bed (cluster_harness.py): a
NetworkPolicy in the API server selects a server pod on node 1; clients on node 2 are
known to node 1 by their cluster-wide identities (CiliumIdentity, CiliumEndpoint ->
node 1's ipcache), so node 1's tc program on the server's veth lets exactly the allowed
peers in. The server's own outgoing connections to node 2 keep working.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from tables.identities import IDENTITY_WORLD
from tests.e2e.cluster_harness import ClusterEnv, cluster_env, cluster_leftovers, node_name
from tests.e2e.conftest import need_machine
from tests.e2e.harness import BACKEND_PORT, ident

pytestmark = pytest.mark.kernel

NAMESPACE = "web"


def pod_object(name: str, node: int, labels: dict[str, str]) -> dict[str, Any]:
    """The Pod as the API server holds it (its labels give the endpoint's identity)."""
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": NAMESPACE, "uid": f"uid-{name}",
                         "labels": labels},
            "spec": {"nodeName": node_name(node), "containers": [{"name": "c"}]},
            "status": {"phase": "Running"}}


def policy(rules: list[dict[str, Any]] | None) -> dict[str, Any]:
    """Ingress policy for ``app=server``: default deny without rules."""
    spec: dict[str, Any] = {"podSelector": {"matchLabels": {"app": "server"}},
                            "policyTypes": ["Ingress"]}
    if rules:
        spec["ingress"] = rules
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": {"name": "server-ingress", "namespace": NAMESPACE}, "spec": spec}


@pytest.fixture(scope="module")
def cluster() -> Iterator[ClusterEnv]:
    """Node 1: ``web/server``; node 2: ``web/client`` (app=client), ``web/other``
    (app=other), each serving."""
    need_machine()
    with cluster_env() as env:
        for i, name, app in ((1, "server", "server"), (2, "client", "client"),
                             (2, "other", "other")):
            env.apiserver.upsert(pod_object(name, i, {"app": app}))
            n = env.node(i)
            n.serve(n.add_pod(name, NAMESPACE, {"app": app}))
        yield env
    assert not cluster_leftovers(env)


def _result(env: ClusterEnv, node: int, pod: str, host: str) -> dict[str, Any]:
    key = (id(env), node, pod)
    if key not in _CLIENTS:  # one client process per pod, started at its first check
        n = env.node(node)
        _CLIENTS[key] = n.client_in(n.pods[pod])
    result: dict[str, Any] = _CLIENTS[key].tcp(host, BACKEND_PORT)[0]
    return result


_CLIENTS: dict[tuple[int, int, str], Any] = {}


def _served(env: ClusterEnv, node: int, pod: str, host: str) -> bool:
    return _result(env, node, pod, host).get("id") == ident(host)


def _blocked(env: ClusterEnv, node: int, pod: str, host: str) -> bool:
    result = _result(env, node, pod, host)
    return "id" not in result and "timed out" in str(result.get("error", ""))


def test_ingress_policy_across_nodes(cluster: ClusterEnv) -> None:
    server = cluster.node(1).pods["server"]
    s4, s6 = server.address(4), server.address(6)
    client4 = cluster.node(2).pods["client"].address(4)
    other4 = cluster.node(2).pods["other"].address(4)

    # node 1 knows node 2's pods by their identities (not world)
    def identity(addr: str) -> int:
        entry = cluster.ipcache(1).get(f"{addr}/32")
        return int(entry["identity"]) if entry else IDENTITY_WORLD

    cluster.wait(lambda: IDENTITY_WORLD not in (identity(client4), identity(other4)),
                 "node 2's pods in node 1's ipcache")
    cluster.wait(lambda: _served(cluster, 2, "client", s4), "baseline across nodes")
    assert _served(cluster, 2, "other", s4)

    cluster.apiserver.upsert(policy(None))
    cluster.wait(lambda: _blocked(cluster, 2, "client", s4), "default deny across nodes")
    assert _blocked(cluster, 2, "other", s4)
    assert _blocked(cluster, 2, "client", s6)
    assert _served(cluster, 1, "server", client4)  # the server's own outgoing flows

    allow = [{"from": [{"podSelector": {"matchLabels": {"app": "client"}}}],
              "ports": [{"protocol": "TCP", "port": BACKEND_PORT}]}]
    cluster.apiserver.upsert(policy(allow))
    cluster.wait(lambda: _served(cluster, 2, "client", s4), "allow app=client across nodes")
    assert _served(cluster, 2, "client", s6)
    assert _blocked(cluster, 2, "other", s4)
    drops = cluster.node(1).api.get("/ct/stats")["drops"]
    assert any(d["reason"] == 133 and d["direction"] == "ingress" for d in drops), drops
    print(json.dumps({"cluster_ingress": "ok"}))
