"""The running agent's demo namespace: deleted behind the agent's back, it is noticed
(Degraded until it is back) and created again with its backends; an agent restarted on it
adopts it (the same namespace: processes inside keep it) instead of recreating it. And the
manifests' health names an empty manifest file."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest

from statewright.agent.demo_netns import delete_netns, netns_exists
from tests.agent.conftest import (
    running_agent,
    service_yaml,
    start_agent,
    stop_agent,
    wait_for,
)


def _demo_health(agent: Any) -> dict[str, Any]:
    health = agent.client.get("/health")
    return next(c for c in health["components"] if c["name"] == "demo")


def _mark(netns: str, name: str) -> None:
    """Leave a veth pair in ``netns`` (both ends): it tells this namespace from a new one
    (inode numbers do not: the kernel reuses a freed namespace's number)."""
    subprocess.run(["ip", "-n", netns, "link", "add", name, "type", "veth", "peer", "name",
                    f"{name}p"], check=True)


def _marked(netns: str, name: str) -> bool:
    return subprocess.run(["ip", "-n", netns, "link", "show", name],
                          capture_output=True).returncode == 0


def test_vanished_demo_namespace_is_recreated_and_a_restart_adopts_it(tmp_path: Path) -> None:
    if os.geteuid() != 0 or shutil.which("ip") is None:
        if os.environ.get("CI") == "true":
            pytest.fail("needs root and iproute2 (ip netns)")
        pytest.skip("needs root and iproute2 (ip netns)")
    netns = f"swtest-demo-{uuid.uuid4().hex[:8]}"
    proc = None
    try:
        with running_agent(tmp_path, "--demo-netns", netns) as agent:
            (agent.manifests / "a.yaml").write_text(
                service_yaml("a", "10.96.211.1", ["10.244.51.1"]))
            wait_for(lambda: "1 backend listener" in _demo_health(agent)["message"],
                     what="the demo backend served")
            _mark(netns, "swmark0")
            subprocess.run(["ip", "netns", "delete", netns], check=True)
            back = wait_for(lambda: netns_exists(netns) and (
                h := _demo_health(agent))["state"] == "OK" and "created again" in h["message"]
                and "1 backend listener" in h["message"] and h, timeout=15,
                what="the namespace created again")
            assert "created again 1 time(s)" in back["message"]
            assert not _marked(netns, "swmark0"), "the namespace was not created anew"
            assert "vanished" in agent.logs()
            # A restart adopts the namespace: same namespace, backends served again.
            _mark(netns, "swmark1")
            assert stop_agent(agent.proc, signal.SIGTERM) == 0
            assert netns_exists(netns) and _marked(netns, "swmark1")  # kept at a stop
            proc = start_agent(agent.args, agent.socket, agent.log)
            wait_for(lambda: "1 backend listener" in _demo_health(agent)["message"],
                     what="the demo backend served after the restart")
            assert _marked(netns, "swmark1"), "the restarted agent recreated the namespace"
            assert "adopted namespace" in agent.logs()
    finally:
        if proc is not None:
            stop_agent(proc)
        delete_netns(netns)


def test_status_names_an_empty_manifest_file(tmp_path: Path) -> None:
    with running_agent(tmp_path) as agent:
        (agent.manifests / "empty.yaml").write_text("")

        def manifests() -> dict[str, Any]:
            health = agent.client.get("/health")
            return next(c for c in health["components"] if c["name"] == "manifests")

        h = wait_for(lambda: "empty (no objects)" in (m := manifests())["message"] and m,
                     what="the empty file named")
        assert h["state"] == "OK" and "empty.yaml" in h["message"]
