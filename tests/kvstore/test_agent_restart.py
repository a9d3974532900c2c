"""Two agent processes in kvstore mode against a real etcd cluster: one SIGKILLed and
restarted within the grace period causes no flap on the other; SIGKILLed for good, its
keys expire after the lease TTL and the other acts on it once."""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from statewright.cni import AgentAPI
from tests.agent.conftest import start_agent, stop_agent, wait_for
from tests.kvstore.etcd_cluster import EtcdCluster

TTL = 4  # seconds; the grace period is one TTL too


def node_manifest(name: str, ip: str, cidr: str) -> str:
    return (f"apiVersion: v1\nkind: Node\nmetadata: {{name: {name}}}\n"
            f"spec: {{podCIDRs: [{cidr}]}}\n"
            f"status: {{addresses: [{{type: InternalIP, address: {ip}}}]}}\n")


class AgentRun:
    def __init__(self, tmp: Path, etcd_config: Path, name: str, n: int, cluster: str) -> None:
        self.dir = tmp / name
        manifests = self.dir / "manifests"
        manifests.mkdir(parents=True)
        self.cidr = f"10.{70 + n}.0.0/24"
        self.ip = f"192.0.2.{n + 1}"
        (manifests / "node.yaml").write_text(node_manifest(name, self.ip, self.cidr))
        self.socket = str(self.dir / "agent.sock")
        self.args = [
            "--backend", "memory", "--pin-dir", str(self.dir / "pins"), "--no-netlink",
            "--manifests", str(manifests), "--manifests-interval", "0.1",
            "--node-name", name, "--pod-cidr", self.cidr, "--cluster-name", cluster,
            "--identity-allocation-mode", "kvstore", "--kvstore", "etcd",
            "--kvstore-opt", f"etcd.config={etcd_config}", "--kvstore-lease-ttl", str(TTL),
        ]
        self.log = self.dir / "agent.log"
        self.proc: Any = None

    def start(self) -> None:
        self.proc = start_agent(self.args, self.socket, self.log)

    def api(self) -> AgentAPI:
        return AgentAPI(self.socket)

    def remote(self) -> dict[str, dict[str, Any]]:
        out = self.api().request("GET", "/ipcache")
        return {e["prefix"]: e for e in out["entries"] if e["owner"].startswith("cep:")}

    def nodes(self) -> dict[str, str]:
        return {n["name"]: n["source"] for n in self.api().request("GET", "/nodes")["nodes"]}


@pytest.fixture
def agents(etcd: EtcdCluster, tmp_path: Path) -> Any:
    cfg = tmp_path / "etcd.config"
    cfg.write_text("endpoints:\n" + "".join(f"- {e}\n" for e in etcd.endpoints))
    cluster = f"c{int(time.time() * 1000) % 100000}"
    runs = [AgentRun(tmp_path, cfg, f"node-{x}", i, cluster) for i, x in enumerate("ab")]
    try:
        yield runs
    finally:
        for r in runs:
            if r.proc is not None:
                stop_agent(r.proc)


def health(run: AgentRun) -> dict[str, dict[str, str]]:
    return {h["name"]: h for h in run.api().request("GET", "/health")["components"]}


class Poller:
    """Polls b's view of one remote address in a thread: every change, in order."""

    def __init__(self, b: AgentRun, prefix: str) -> None:
        self.b, self.prefix = b, prefix
        self.seen: list[bool] = []
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                present = self.prefix in self.b.remote()
            except Exception:
                continue
            if not self.seen or self.seen[-1] != present:
                self.seen.append(present)
            time.sleep(0.02)

    def stop(self) -> list[bool]:
        self._stop.set()
        self._t.join(5)
        return self.seen


def test_sigkilled_agent_restart_without_flap_then_expiry(agents: list[AgentRun]) -> None:
    a, b = agents
    a.start()
    b.start()
    api = a.api()
    ip = api.request("POST", "/ipam?owner=ctr1&family=ipv4")["address"]["ipv4"]
    ep = api.request("PUT", "/endpoint/cni-attachment-id:ctr1:eth0", {
        "container-id": "ctr1", "interface-name": "eth0",
        "addressing": {"ipv4": ip}, "k8s-pod-name": "web", "k8s-namespace": "shop",
        "labels": ["k8s:app=web"]})
    prefix = f"{ip}/32"
    wait_for(lambda: prefix in b.remote(), 20, "b has a's endpoint")
    entry = b.remote()[prefix]
    assert entry["identity"] == ep["identity"] and entry["tunnel_endpoint"] == a.ip
    wait_for(lambda: b.nodes().get("node-a") == "kvstore", 20, "b has node-a from etcd")

    # SIGKILL and restart at once: b never loses the entry, nor the node.
    poll = Poller(b, prefix)
    stop_agent(a.proc, signal.SIGKILL)
    a.start()
    assert [e["id"] for e in a.api().request("GET", "/endpoint")] == [ep["id"]]  # restored
    wait_for(lambda: health(a).get("kvstore", {}).get("state") == "OK", 20, "a's session up")
    time.sleep(2 * TTL + 1)  # past the old lease's expiry and the grace period
    assert poll.stop() == [True]
    assert b.nodes().get("node-a") == "kvstore"
    assert b.remote()[prefix]["identity"] == ep["identity"]

    # SIGKILL for good: the entry and the node go once the lease expired and the grace
    # period passed, and stay gone.
    poll = Poller(b, prefix)
    t0 = time.monotonic()
    stop_agent(a.proc, signal.SIGKILL)
    a.proc = None
    wait_for(lambda: prefix not in b.remote(), 4 * TTL + 10, "b drops a's endpoint")
    took = time.monotonic() - t0
    assert took >= TTL - 1.5, took  # not before the lease could have expired (minus renewal)
    wait_for(lambda: "node-a" not in b.nodes(), 10, "b drops node-a")
    time.sleep(1.0)
    assert poll.stop() == [True, False]
    lines = health(b)
    for name in ("kvstore", "endpoints/identities", "endpoints/kvstore-ipcache", "nodes"):
        assert lines[name]["state"] == "OK", lines[name]
    assert "leader known" in lines["kvstore"]["message"]
