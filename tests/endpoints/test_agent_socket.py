"""The endpoint and IPAM routes through the agent's own API server (the runtime's
ApiComponent on a unix socket), as the CNI plugin and the CLI reach them: the components
the agent lists (api, statedb, lb for the node-addresses table) plus EndpointsComponent."""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Any

import anyio
import anyio.to_thread
import pytest

from statewright.agent.components.api import ApiComponent, ApiConfig
from statewright.agent.components.endpoints import EndpointsComponent, EndpointsConfig
from statewright.agent.components.lb import LBComponentConfig, LoadBalancerComponent
from statewright.agent.components.statedb import StateDBComponent
from statewright.agent.config import AgentConfig
from statewright.cni import AgentAPI, CNIError, _http
from statewright.component import Hive

from .helpers import new_pin_dir, remove_pins


def test_routes_through_the_agent_socket() -> None:
    state = tempfile.mkdtemp(prefix=f"sw-sock-{os.getpid()}-")
    pin_dir = new_pin_dir("memory")
    sock = os.path.join(state, "agent.sock")
    config = AgentConfig(api_socket=sock, backend="memory", pin_dir=pin_dir)
    endpoints = EndpointsComponent(
        EndpointsConfig(("10.55.0.0/24", "fd00:55::/112"), state, "memory", pin_dir)
    )
    hive = Hive(
        [
            ApiComponent(ApiConfig.from_agent_config(config), dict),
            StateDBComponent(),
            LoadBalancerComponent(LBComponentConfig.from_agent_config(config)),
            endpoints,
        ]
    )

    def client_session() -> dict[str, Any]:
        api = AgentAPI(sock)
        out: dict[str, Any] = {}
        out["ipam"] = api.request("POST", "/ipam?owner=ctr1&family=ipv4")
        out["put"] = api.request(
            "PUT",
            "/endpoint/cni-attachment-id:ctr1:eth0",
            {
                "container-id": "ctr1",
                "interface-name": "lxcctr1",
                "addressing": {"ipv4": out["ipam"]["address"]["ipv4"]},
                "k8s-pod-name": "p",
                "k8s-namespace": "ns",
                "labels": ["k8s:app=a"],
            },
        )
        out["get"] = api.request("GET", "/endpoint/pod-name:ns%2Fp")
        out["patch"] = api.request("PATCH", "/endpoint/1", {"labels": ["k8s:app=b"]})
        out["list"] = api.request("GET", "/endpoint")
        out["maps"] = api.request("GET", "/bpf/maps")
        out["health"] = api.request("GET", "/health")
        with pytest.raises(CNIError) as ei:
            api.request("PUT", "/endpoint/2", {"mac": "nope"})
        out["bad"] = ei.value.msg
        out["delete"] = api.request("DELETE", "/endpoint/1")
        out["after"] = api.request("GET", "/endpoint/1", not_found_ok=True)
        out["ipam_status"] = api.request("GET", "/ipam")
        # Cilium's API answers a created endpoint with 201 Created (the client takes it)
        out["put_status"], _ = _http(sock, "PUT", "/endpoint/0",
                                     b'{"container-id": "c9", "interface-name": "lxc9"}', 10)
        return out

    async def main() -> dict[str, Any]:
        async with anyio.create_task_group() as tg:
            await hive.start(tg)
            try:
                return await anyio.to_thread.run_sync(client_session)
            finally:
                await hive.stop()
                tg.cancel_scope.cancel()

    try:
        out = anyio.run(main)
    finally:
        remove_pins("memory", pin_dir)
        shutil.rmtree(state, ignore_errors=True)
    assert out["ipam"]["address"]["ipv4"] == "10.55.0.2"
    assert out["put"]["id"] == 1 and out["put"]["container-id"] == "ctr1"
    assert out["put_status"] == 201
    assert out["get"]["id"] == 1
    assert out["patch"]["identity"] == out["put"]["identity"] + 1
    assert [e["id"] for e in out["list"]] == [1]
    names = {
        m["name"]
        for m in (out["maps"] if isinstance(out["maps"], list) else out["maps"].get("maps", []))
    }
    assert {"endpoints", "ipcache"} <= names, out["maps"]
    assert "endpoints" in str(out["health"])
    assert "400" in out["bad"] and "'mac'" in out["bad"]
    assert out["delete"] == {"deleted": 1} and out["after"] is None
    assert [a["owner"] for a in out["ipam_status"]["allocations"]] == ["router", "router"]
