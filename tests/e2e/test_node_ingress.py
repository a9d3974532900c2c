"""Ingress policy and connection tracking end to end (issue #29): the per-endpoint tc
programs on the pods' veths, on one node in network namespaces (node_harness.py).

Pods: ``web/server`` (``app=server``: the test servers on `BACKEND_PORT` and an echo
server on `ECHO_PORT`), ``web/client`` (``app=client``, servers too, so that the server
pod has somewhere to connect), ``web/other`` (``app=other``) and ``e2e/client``
(``app=client`` in another namespace). Connections go pod to pod through the node
namespace, as on a node; a dropped SYN shows as a connect timeout.

The chain under test: a NetworkPolicy manifest -> the policy computation -> the server's
policy map and its ``policy_endpoints`` entry (ingress enforced) -> ``sw_lxc_to`` on the
server's veth, which checks new flows against it and lets established flows and replies
pass through the CT map.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests.datapath.conftest import Client, _readline
from tests.e2e.conftest import need_machine, record
from tests.e2e.harness import BACKEND_PORT, ident
from tests.e2e.node_harness import NodeEnv, node_env

pytestmark = pytest.mark.kernel

BOUND_S = 30.0
NAMESPACE = "web"
ECHO_PORT = BACKEND_PORT + 7
POLICY = "server-ingress"
PROBE = str(Path(__file__).with_name("flow_probe.py"))


def ingress_policy(rules: list[dict[str, Any]] | None) -> str:
    """A NetworkPolicy selecting ``app=server`` for ingress: default deny without rules."""
    spec: dict[str, Any] = {"podSelector": {"matchLabels": {"app": "server"}},
                            "policyTypes": ["Ingress"]}
    if rules:
        spec["ingress"] = rules
    return json.dumps({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
                       "metadata": {"name": POLICY, "namespace": NAMESPACE}, "spec": spec})


#: Ingress from app=client pods of the policy's namespace on TCP BACKEND_PORT only.
ALLOW_CLIENTS = [{"from": [{"podSelector": {"matchLabels": {"app": "client"}}}],
                  "ports": [{"protocol": "TCP", "port": BACKEND_PORT}]}]


class Flows:
    """A flow_probe.py client in a pod: long-lived connections."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc
        self.n = 0

    def call(self, cmd: dict[str, Any]) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        answer: dict[str, Any] = json.loads(_readline(self.proc, 10, f"flow probe {cmd}"))
        return answer

    def open(self, host: str, port: int) -> int:
        self.n += 1
        answer = self.call({"op": "open", "id": self.n, "host": host, "port": port})
        assert answer.get("ok"), f"open {host}:{port}: {answer}"
        return self.n

    def ping(self, conn: int) -> dict[str, Any]:
        return self.call({"op": "ping", "id": conn})


@pytest.fixture(scope="module")
def node() -> Iterator[NodeEnv]:
    """The node with the four pods, their servers, and the tc programs on every veth."""
    need_machine()
    with node_env() as env:
        server = env.add_pod("server", NAMESPACE, {"app": "server"})
        env.serve(server)
        echo = env.run_in(server, sys.executable, PROBE, "serve",
                          f"{server.address(4)}:{ECHO_PORT}", f"[{server.address(6)}]:{ECHO_PORT}")
        assert _readline(echo, 10, "echo server").strip() == "ready"
        env.serve(env.add_pod("client", NAMESPACE, {"app": "client"}))
        env.add_pod("other", NAMESPACE, {"app": "other"})
        env.add_pod("client2", "e2e", {"app": "client"})
        _wait(env, "tc programs on 4 veths", lambda: "on 4 endpoint veth(s)" in _health(env))
        yield env


def _health(env: NodeEnv) -> str:
    lines = {h["name"]: h for h in env.api.get("/health")["components"]}
    line = lines.get("endpoint-datapath", {})
    return f"{line.get('state')}: {line.get('message')}"


def _wait(env: NodeEnv, what: str, ok: Callable[[], bool], since: float | None = None) -> float:
    start = time.monotonic() if since is None else since
    while not ok():
        if time.monotonic() - start > BOUND_S:
            raise AssertionError(f"{what}: not after {BOUND_S} s ({_health(env)})\n"
                                 f"{env.agent.logs()[-3000:]}")
        time.sleep(0.02)
    return time.monotonic() - start


def _served(client: Client, host: str, port: int = BACKEND_PORT) -> bool:
    return bool(client.tcp(host, port)[0].get("id") == ident(host, port))


def _blocked(client: Client, host: str, port: int = BACKEND_PORT) -> bool:
    """The connection attempt timed out: the SYN was dropped (not refused, not served)."""
    result = client.tcp(host, port)[0]
    return "id" not in result and "timed out" in str(result.get("error", ""))


def _concurrently(*checks: Callable[[], bool]) -> list[bool]:
    """The results of ``checks``, run at the same time: each a connection from a pod's
    client of its own (a dropped SYN is a 3 s timeout; three in turn took 9 s)."""
    with ThreadPoolExecutor(len(checks)) as pool:
        return list(pool.map(lambda check: check(), checks))


def _ping(pod_netns: str, host: str) -> bool:
    """One ICMP echo from a pod's namespace answered (flow_probe.py ping)."""
    cmd = ["ip", "netns", "exec", pod_netns, sys.executable, PROBE, "ping", host]
    return subprocess.run(cmd, capture_output=True, timeout=10).returncode == 0


def _drops(env: NodeEnv) -> dict[tuple[int, str], int]:
    return {(d["reason"], d["direction"]): d["packets"]
            for d in env.api.get("/ct/stats")["drops"]}


def test_ingress_policy_ct_and_restart(node: NodeEnv) -> None:
    pods = node.pods
    s4, s6 = pods["server"].address(4), pods["server"].address(6)
    c4 = pods["client"].address(4)
    client, other = node.client_in(pods["client"]), node.client_in(pods["other"])
    client2, server_out = node.client_in(pods["client2"]), node.client_in(pods["server"])
    timings: dict[str, float] = {}

    # no policy: everything connects (IPv6 may wait for neighbour discovery)
    for c in (client, other, client2):
        _wait(node, "baseline", lambda c=c: _served(c, s4))
    _wait(node, "baseline v6", lambda: _served(client, s6))
    _wait(node, "baseline ping", lambda: _ping(pods["client"].netns, s4))
    flows = Flows(node.run_in(pods["client"], sys.executable, PROBE, "client"))
    established = [flows.open(s4, ECHO_PORT), flows.open(s6, ECHO_PORT)]
    entries = node.api.get("/ct")["entries"]
    assert any(e["destination"] == f"{s4}:{ECHO_PORT}" and e["direction"] == "ingress"
               for e in entries), entries

    # default deny ingress on the server: new flows in are dropped, established ones and
    # the server's own outgoing flows (and their replies) keep working
    since = node.write(POLICY, ingress_policy(None))
    timings["default_deny_s"] = _wait(node, "default deny", lambda: _blocked(client, s4), since)
    assert _concurrently(lambda: _blocked(client, s6), lambda: _blocked(other, s4),
                         lambda: _blocked(client2, s4)) == [True, True, True]
    for conn in established:
        assert flows.ping(conn) == {"ok": True}
    assert _served(server_out, c4)
    # ICMP (no socket program sees it): an echo into the server is a new flow, dropped;
    # the server's own echo gets its reply back through its CT entry
    assert not _ping(pods["client"].netns, s4)
    assert _ping(pods["server"].netns, c4)
    assert _drops(node).get((133, "ingress"), 0) > 0

    # allow app=client of namespace web on BACKEND_PORT: exactly those peers get in
    since = node.write(POLICY, ingress_policy(ALLOW_CLIENTS))
    timings["allow_s"] = _wait(node, "allow rule", lambda: _served(client, s4), since)
    assert _served(client, s6)
    assert _concurrently(
        lambda: _blocked(other, s4),              # another label
        lambda: _blocked(client2, s4),            # the label, another namespace
        lambda: _blocked(client, s4, ECHO_PORT),  # another port
    ) == [True, True, True]

    # the agent SIGKILLed: pinned links and CT keep established flows and the policy;
    # restarted, it adopts them and new flows work again
    node.agent.kill()
    for conn in established:
        assert flows.ping(conn) == {"ok": True}
    assert _blocked(other, s4)
    start = time.monotonic()
    node.agent.start()
    _wait(node, "links adopted", lambda: "(4 adopted)" in _health(node))
    timings["restart_s"] = _wait(node, "new flow after restart",
                                 lambda: _served(client, s4), start)
    for conn in established:
        assert flows.ping(conn) == {"ok": True}
    assert _blocked(other, s4)

    # the policy removed: everyone gets in again
    since = node.remove(POLICY)
    timings["removed_s"] = _wait(node, "policy removed", lambda: _served(other, s4), since)
    assert _served(client2, s4)
    for what, seconds in timings.items():
        record(f"ingress {what}", seconds)
    print(json.dumps({"node_ingress_timings": timings, "bound_s": BOUND_S}))
