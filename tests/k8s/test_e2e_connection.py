"""The whole path: API server -> the agent (a subprocess, kernel maps, the socket load
balancer on a cgroup of the test's own) -> a connection from a network namespace.

Uses the end-to-end environment of tests/e2e (namespace with backend servers, cgroup,
agent, client; all removed afterwards) with the agent following the fake API server
through a kubeconfig instead of a manifest directory.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from statewright.agent.client import AgentClient
from tests.e2e.conftest import need_machine
from tests.e2e.harness import BACKENDS, e2e_env, ident

from .fake_apiserver import FakeAPIServer
from .objects import endpoint_slice, service

VIP = "10.96.61.1"


def _reached(want: set[str]) -> Any:
    def done(results: list[dict[str, Any]]) -> bool:
        return all("errno" not in r for r in results) and {str(r["id"]) for r in results} == want

    return done


def test_a_connection_reaches_a_backend_added_in_the_api_server(
    apiserver: FakeAPIServer, kubeconfig: str
) -> None:
    need_machine()
    with e2e_env({"k8s-kubeconfig": kubeconfig, "manifests": []}) as env:
        health = AgentClient(env.agent.socket, timeout=10).get("/health")
        if '"k8s"' not in json.dumps(health):
            pytest.skip("the agent's component list has no KubernetesComponent yet")
        apiserver.upsert(service("web", VIP))
        apiserver.upsert(endpoint_slice("web", [BACKENDS[0]]))
        since = time.monotonic()
        env.converge(VIP, 80, _reached({ident(BACKENDS[0])}), since, timeout=30)
        # A new endpoint in the API server: connections reach it too.
        apiserver.upsert(endpoint_slice("web", [BACKENDS[0], BACKENDS[1]]))
        since = time.monotonic()
        env.converge(
            VIP, 80, _reached({ident(BACKENDS[0]), ident(BACKENDS[1])}), since, 30, batch=40
        )
        # The service deleted in the API server: the address is unreachable again.
        apiserver.delete("Service", "default", "web")
        since = time.monotonic()
        deadline = since + 30
        while time.monotonic() < deadline:
            if all("errno" in r for r in env.client.tcp(VIP, 80, count=5)):
                break
        else:
            raise AssertionError("the deleted service still answers")
