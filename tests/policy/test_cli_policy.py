"""``statewright policy get|trace`` and the POLICY column of ``endpoint list``, against a test
agent (db, endpoints and policy components; memory maps, no privileges needed)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from statewright.agent.components.endpoints import EndpointsConfig
from statewright.agent.components.policy import PolicyComponent
from statewright.api_types import ApiError, Request
from statewright.component import Hive
from tests.endpoints.agent_server import AgentUnderTest, memory_agent, run_cli
from tests.endpoints.helpers import DBComponent

from .test_writer_and_sources import TO_DB_5432, cnp


class PolicyAgent(AgentUnderTest):
    """The endpoints test agent with the policy component and its routes."""

    def __init__(self, config: EndpointsConfig, socket_path: str) -> None:
        super().__init__(config, socket_path)
        self.policy = PolicyComponent()
        self._hive = Hive([DBComponent(), self.comp, self.policy])

    def dispatch(self, method: str, path: str, query: dict[str, str], body: bytes) -> Any:
        for route in self.policy.routes():
            params = route.match(path)
            if params is None or method not in route.methods:
                continue
            try:
                return 200, self._portal.call(route.handler, Request(params, query, method, body))
            except ApiError as e:
                return e.status, {"error": str(e)}
        return super().dispatch(method, path, query, body)

    def apply(self, obj: dict[str, Any]) -> None:
        comp = self.policy
        assert comp.db is not None and comp.policies is not None and comp.handler is not None
        with comp.db.write_txn(comp.policies) as txn:
            comp.handler.upsert(txn, obj)

    def wait_revision(self, endpoint: int, revision: int) -> None:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            status, doc = self.dispatch("GET", "/policy/endpoints", {}, b"")
            if status == 200 and any(
                e["endpoint_id"] == endpoint and e["revision"] >= revision for e in doc["endpoints"]
            ):
                return
            time.sleep(0.02)
        raise AssertionError(f"endpoint {endpoint} did not reach policy revision {revision}")


@pytest.fixture
def agent() -> Iterator[PolicyAgent]:
    with memory_agent(PolicyAgent, "10.89.0.0/24", "sw-pol") as a:
        yield a


cli = run_cli


def _put(agent: PolicyAgent, name: str, app: str) -> None:
    body = {
        "k8s-pod-name": name,
        "k8s-namespace": "default",
        "labels": [f"k8s:app={app}", "k8s:io.kubernetes.pod.namespace=default"],
    }
    status, doc = agent.dispatch("PUT", "/endpoint/0", {}, json.dumps(body).encode())
    assert status == 201, doc


def test_policy_get_trace_and_endpoint_list(agent: PolicyAgent) -> None:
    _put(agent, "web", "web")
    _put(agent, "db", "db")
    agent.apply(cnp("web-egress", TO_DB_5432))
    agent.wait_revision(1, 2)
    sock = ["--socket", agent.socket]

    out = cli("policy", "get", *sock)
    assert out.returncode == 0, out.stderr
    assert "CiliumNetworkPolicy default/web-egress" in out.stdout
    assert "egress allow" in out.stdout and "5432/TCP" in out.stdout

    doc = json.loads(cli("policy", "get", "--endpoint", "1", "-o", "json", *sock).stdout)
    assert doc["enforcement"]["egress_enforced"] is True
    assert [(e["dport"], e["rules"]) for e in doc["entries"]] == [(5432, ["default/web-egress"])]

    ok = cli("policy", "trace", "--from", "app=web", "--to", "app=db", "--port", "5432", *sock)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "allowed by default/web-egress" in ok.stdout and "verdict: ALLOWED" in ok.stdout
    assert "port: 5432/TCP " in ok.stdout  # the protocol's name, not its number
    no = cli("policy", "trace", "--from", "app=web", "--to", "app=db", "--port", "5433/tcp", *sock)
    assert no.returncode == 1
    assert "denied by default (selected by default/web-egress)" in no.stdout
    world = cli(
        "policy", "trace", "--from", "app=db", "--to", "reserved:world", "--port", "53/UDP", *sock
    )
    assert world.returncode == 0 and "no policy selects it" in world.stdout
    assert "port: 53/UDP " in world.stdout
    bad = cli("policy", "trace", "--from", "app=web", "--to", "app=db", "--port", "x", *sock)
    assert bad.returncode == 1 and "is not a port" in bad.stderr

    out = cli("endpoint", "list", *sock)
    lines = out.stdout.splitlines()
    assert lines[0].split()[6] == "POLICY"
    cells = {line.split()[0]: line.split()[-2] for line in lines[1:]}  # IPV6 is empty
    assert cells["1"] == "r2+egress" and cells["2"].startswith("r")


def test_policy_get_prints_a_default_deny_as_deny_all(agent: PolicyAgent) -> None:
    """A NetworkPolicy with policyTypes Egress and no egress rule reads "deny all egress"."""
    _put(agent, "web", "web")
    agent.apply({
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": "deny-egress", "namespace": "default"},
        "spec": {"podSelector": {"matchLabels": {"app": "web"}}, "policyTypes": ["Egress"]},
    })
    agent.wait_revision(1, 2)
    out = cli("policy", "get", "--socket", agent.socket)
    assert out.returncode == 0, out.stderr
    assert "deny all egress: subject" in out.stdout, out.stdout
    assert "peers nothing" not in out.stdout
