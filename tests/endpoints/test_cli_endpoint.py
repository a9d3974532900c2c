"""``statewright endpoint list|get`` and ``statewright ipam`` against a test agent on a unix
socket (no privileges needed: memory maps); no agent -> exit 2."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import pytest

from .agent_server import AgentUnderTest, memory_agent, run_cli


@pytest.fixture
def agent() -> Iterator[AgentUnderTest]:
    with memory_agent(AgentUnderTest, "10.88.0.0/24", "sw-cli") as a:
        yield a


cli = run_cli


def test_endpoint_and_ipam_commands(agent: AgentUnderTest) -> None:
    status, ep = agent.dispatch(
        "PUT",
        "/endpoint/0",
        {},
        json.dumps({"k8s-pod-name": "p", "k8s-namespace": "ns", "labels": ["k8s:app=x"]}).encode(),
    )
    assert status == 201, ep
    sock = ["--socket", agent.socket]
    out = cli("endpoint", "list", *sock)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    header = ["ID", "POD", "INTERFACE", "IPV4", "IPV6", "IDENTITY", "POLICY", "STATE"]
    assert lines[0].split() == header
    assert lines[1].split()[:4] == ["1", "ns/p", "(0)", "10.88.0.2"]
    got = json.loads(cli("endpoint", "get", "pod-name:ns/p", *sock).stdout)
    assert got["id"] == 1 and got["addressing"]["ipv4"] == "10.88.0.2"
    assert json.loads(cli("endpoint", "list", "-o", "json", *sock).stdout)[0]["id"] == 1
    missing = cli("endpoint", "get", "7", *sock)
    assert missing.returncode == 1 and "not found" in missing.stderr
    assert missing.stderr.startswith("statewright endpoint get: ")  # names the command
    ipam = cli("ipam", *sock)
    assert ipam.returncode == 0
    assert "10.88.0.0/24  2     254" in ipam.stdout and "router ipv4: 10.88.0.1" in ipam.stdout
    doc = json.loads(cli("ipam", "-o", "json", *sock).stdout)
    assert {a["ip"] for a in doc["allocations"]} == {"10.88.0.1", "10.88.0.2"}


def test_no_agent() -> None:
    out = cli("endpoint", "list", "--socket", f"/nonexistent/sw-{os.getpid()}.sock")
    assert out.returncode == 2, out.stderr
    assert "no agent is running" in out.stderr
    assert out.stderr.startswith("statewright endpoint list: ")


def test_concurrent_requests_never_share_ids_or_addresses(agent: AgentUnderTest) -> None:
    """Eight threads create endpoints and take addresses at once through the API: every
    endpoint id and address is distinct, and IPAM holds exactly what was handed out."""
    import threading

    results: list[tuple[str, Any]] = []
    lock = threading.Lock()

    def worker(n: int) -> None:
        for i in range(6):
            if i % 2:
                status, doc = agent.dispatch("POST", "/ipam", {"owner": f"t{n}"}, b"")
                kind = "ipam"
            else:
                body = json.dumps({"container-id": f"t{n}-{i}"}).encode()
                status, doc = agent.dispatch("PUT", "/endpoint/0", {}, body)
                kind = "ep"
            assert status == (201 if kind == "ep" else 200), doc
            with lock:
                results.append((kind, doc))

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    eps = [d for k, d in results if k == "ep"]
    ips = [d["addressing"]["ipv4"] for d in eps] + [
        d["address"]["ipv4"] for k, d in results if k == "ipam"
    ]
    assert len({d["id"] for d in eps}) == len(eps) == 24
    assert len(set(ips)) == len(ips) == 48
    assert agent.comp.ipam is not None
    held = {str(a.ip) for a in agent.comp.ipam.allocations()}
    assert held == set(ips) | {"10.88.0.1"}
