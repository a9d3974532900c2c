"""The node's identity reaches load balancing: with ``--node-name`` (or $NODE_NAME) a
service with ``externalTrafficPolicy: Local`` selects this node's own backends, and
``--node-label`` reaches the writer (the agent reports both)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.agent.conftest import cli_json, running_agent, wait_for

LOCAL_LB = """\
apiVersion: v1
kind: Service
metadata: {name: web, namespace: test}
spec:
  type: LoadBalancer
  clusterIP: 10.96.50.1
  externalTrafficPolicy: Local
  ports: [{name: http, port: 80, protocol: TCP, targetPort: 8080, nodePort: 30050}]
status:
  loadBalancer: {ingress: [{ip: 172.16.50.1}]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-1
  namespace: test
  labels: {kubernetes.io/service-name: web}
addressType: IPv4
endpoints:
- addresses: [10.244.1.10]
  nodeName: node-a
  conditions: {ready: true}
- addresses: [10.244.2.10]
  nodeName: node-b
  conditions: {ready: true}
ports: [{name: http, port: 8080, protocol: TCP}]
"""


def _backends(records: list[dict[str, Any]], address: str) -> list[str] | None:
    fe = next((r for r in records if r["address"] == address), None)
    return None if fe is None else sorted(b["address"] for b in fe["backends"])


@pytest.mark.parametrize("node", ["node-a", "node-b"])
def test_local_traffic_policy_selects_this_nodes_backends(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], node: str
) -> None:
    local = {"node-a": "10.244.1.10:8080/TCP", "node-b": "10.244.2.10:8080/TCP"}[node]
    with running_agent(tmp_path, "--node-name", node,
                       "--node-label", "topology.kubernetes.io/zone=zone-1") as agent:
        (agent.manifests / "web.yaml").write_text(LOCAL_LB)

        def lb_vip() -> list[str] | None:
            recs = cli_json(capsys, "lb", "list", "--socket", agent.socket)
            return _backends(recs, "172.16.50.1:80/TCP")

        assert wait_for(lb_vip, what="the LoadBalancer frontend") == [local]
        recs = cli_json(capsys, "lb", "list", "--socket", agent.socket)
        # The ClusterIP is not subject to the external traffic policy: both backends.
        assert _backends(recs, "10.96.50.1:80/TCP") == [
            "10.244.1.10:8080/TCP", "10.244.2.10:8080/TCP"]
        info = agent.client.get("/agent")
        assert info["node"] == node
        assert info["node_labels"] == {"topology.kubernetes.io/zone": "zone-1"}


def test_node_name_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """A DaemonSet sets NODE_NAME from the downward API; it is the default node name."""
    from statewright.agent import config

    monkeypatch.setenv("NODE_NAME", "worker-3")
    assert config.load().node_name == "worker-3"
    assert config.load(overrides={"node_name": "n1"}).node_name == "n1"
    cfg = config.load(overrides={"node_labels": ["a=1", "b=2"]})
    assert dict(cfg.node_labels) == {"a": "1", "b": "2"}
    with pytest.raises(config.ConfigError, match="expected key=value"):
        config.load(overrides={"node_labels": ["zone"]})
