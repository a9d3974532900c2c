"""Egress policy enforced by the socket program on real connections, end to end: two pods
created with statewright-cni in network namespaces of the test's own, a test agent
(db, endpoints, policy-maps components on kernel maps pinned in a unique directory), the
socket program attached to a cgroup of the test's own holding pod1's client process.

The policy tables are filled as the policy control plane would fill them; a ClusterIP
service with pod2 as its backend shows that the check applies to the translated
destination (pod2's identity and port, not the service's). Each change is
timed from its commit to the first connection that shows it (printed as JSON; bounded,
never asserted below the bound). Everything created is removed afterwards, also on failure.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from bpf.datapath import DEFAULT_OBJECT, DatapathConfig, DatapathError, SockLB, cgroup2_mount
from bpf.policy import policy_map_name
from bpfops.frontend_ops import FrontendOps
from bpfops.lb_maps import LBMaps, LBMapsConfig
from bpfops.model import Addr, BackendSpec, FrontendSpec, LBOpsConfig, ServiceSpec
from statedb import DB
from statewright.agent.components.endpoints import EndpointsConfig
from statewright.agent.components.policy_maps import PolicyMapsComponent, PolicyMapsConfig
from statewright.component import Hive
from tables.endpoints import Endpoint, EndpointState
from tables.policy_entries import PolicyEndpoint, PolicyEntry, PolicyKey
from tests.datapath.conftest import _readline, _remove_cgroup, _stop
from tests.endpoints.agent_server import AgentUnderTest
from tests.endpoints.helpers import DBComponent, new_pin_dir
from tests.endpoints.test_cni import CONF, netns_names, run_plugin  # noqa: F401
from tests.pins import remove_pin_dir

HERE = Path(__file__).resolve().parent
CLIENT = str(HERE / "policy_client.py")
PID = os.getpid()
PORT = 8765  # allowed by the test's rule
OTHER_PORT = 9001  # allowed only by the port-range rule
BOUND_S = 5.0  # every change must show within this time
VIP = "10.96.79.10"  # a ClusterIP whose backend is pod2:PORT (routed nowhere: translated)
VIP_PORT = 80

SERVER = """
import socket, sys, threading
def serve(port):
    s = socket.create_server(("::", port), family=socket.AF_INET6, dualstack_ipv6=True)
    while True:
        c, _ = s.accept()
        c.close()
for p in sys.argv[1:]:
    threading.Thread(target=serve, args=(int(p),), daemon=True).start()
print("ready", flush=True)
sys.stdin.read()
"""


def _need(condition: bool, why: str) -> None:
    if condition:
        return
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{why} (CI=true requires the policy datapath tests to run)", pytrace=False)
    pytest.skip(why)


class PolicyAgent(AgentUnderTest):
    """The test agent with the policy-maps component after the endpoints component."""

    def __init__(self, config: EndpointsConfig, socket_path: str) -> None:
        super().__init__(config, socket_path)
        self.policy = PolicyMapsComponent(
            PolicyMapsConfig(backend=config.backend, pin_dir=config.pin_dir, prune_interval=None)
        )
        self._hive = Hive([DBComponent(), self.comp, self.policy])

    @property
    def db(self) -> DB:
        assert self.policy.manager is not None
        return self.policy.manager.db


class Proc:
    """A process this test started, answering JSON lines (see policy_client.py)."""

    def __init__(self, *cmd: str) -> None:
        self.proc = subprocess.Popen(
            cmd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def line(self, timeout: float = 10.0) -> str:
        return _readline(self.proc, timeout, str(self.proc.args))

    def send(self, text: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(text + "\n")
        self.proc.stdin.flush()

    def call(self, cmd: dict[str, Any]) -> dict[str, Any]:
        self.send(json.dumps(cmd))
        reply: dict[str, Any] = json.loads(self.line())
        if "error" in reply:
            raise RuntimeError(f"client {cmd}: {reply['error']}")
        return reply

    def stop(self) -> None:
        """Close stdin, then kill it by its own handle if it does not end."""
        _stop(self.proc)


@dataclass
class Pods:
    """What the test works with."""

    agent: PolicyAgent
    lb: FrontendOps[Any]
    client: Proc
    ep1: Endpoint
    ep2: Endpoint
    pin_dir: str


def _wait_ready(agent: PolicyAgent, pod: str) -> Endpoint:
    mgr = agent.comp.manager
    assert mgr is not None
    deadline = time.monotonic() + 20
    while True:
        ep = next(e for e in mgr.all() if e.pod_name == pod)
        if ep.state is EndpointState.READY:
            return ep
        if time.monotonic() > deadline:
            raise AssertionError(f"{pod}: endpoint not ready: {ep.state}")
        time.sleep(0.02)


@pytest.fixture
def pods(netns_names: dict[str, str]) -> Iterator[Pods]:  # noqa: F811
    """Agent, datapath, two pods, a server in pod2 and a client in pod1 and the cgroup."""
    _need(shutil.which("ip") is not None, "iproute2 (ip) not installed")
    _need(os.path.exists(DEFAULT_OBJECT), f"{DEFAULT_OBJECT} not built (make setup builds it)")
    try:
        mount = cgroup2_mount()
    except DatapathError as exc:
        _need(False, str(exc))
    tag = f"{PID}-{uuid.uuid4().hex[:6]}"
    with ExitStack() as stack:
        state = tempfile.mkdtemp(prefix=f"sw-poldp-{tag}-")
        stack.callback(shutil.rmtree, state, True)
        pin_dir = new_pin_dir("kernel")
        stack.callback(remove_pin_dir, pin_dir)
        agent = PolicyAgent(
            EndpointsConfig(("10.79.0.0/24", "fd00:79::/112"), state, "kernel", pin_dir),
            os.path.join(state, "agent.sock"),
        )
        agent.start()
        stack.callback(agent.stop)

        lb_maps = LBMaps.open(LBMapsConfig(backend="kernel", pin_dir=pin_dir))
        stack.callback(lb_maps.close)
        lb: FrontendOps[Any] = FrontendOps(lb_maps, LBOpsConfig())
        cgroup = os.path.join(mount, f"statewright-poltest-{tag}")
        os.mkdir(cgroup)
        stack.callback(_remove_cgroup, cgroup)
        dp = SockLB(DatapathConfig(cgroup=cgroup, pin_dir=pin_dir))
        stack.callback(SockLB.cleanup, pin_dir)
        stack.callback(dp.detach)
        dp.attach()

        conf = {**CONF, "agent-socket": agent.socket}
        node = netns_names["node"]
        for i, pod in ((1, "pod1"), (2, "pod2")):
            env = {
                "CNI_CONTAINERID": f"pol{i}-{tag}",
                "CNI_IFNAME": "eth0",
                "CNI_NETNS": f"/var/run/netns/{netns_names[pod]}",
                "CNI_ARGS": f"K8S_POD_NAMESPACE=default;K8S_POD_NAME=pod{i};IgnoreUnknown=1",
            }
            rc, res = run_plugin("ADD", conf, node, **env)
            assert rc == 0, res
            stack.callback(run_plugin, "DEL", conf, node, **env)
        ep1, ep2 = _wait_ready(agent, "pod1"), _wait_ready(agent, "pod2")

        server = Proc(
            "ip", "netns", "exec", netns_names["pod2"], sys.executable, "-c", SERVER,
            str(PORT), str(OTHER_PORT),
        )
        stack.callback(server.stop)
        assert server.line().strip() == "ready"
        client = Proc("ip", "netns", "exec", netns_names["pod1"], sys.executable, CLIENT)
        stack.callback(client.stop)
        with open(os.path.join(cgroup, "cgroup.procs"), "w", encoding="ascii") as f:
            f.write(str(client.proc.pid))
        client.send("go")
        assert json.loads(client.line()) == {"ready": True}
        yield Pods(agent, lb, client, ep1, ep2, pin_dir)


def _until(
    pods: Pods, what: str, cmd: dict[str, Any], want: Callable[[dict[str, Any]], bool]
) -> float:
    """Seconds until ``cmd`` answers as ``want`` says (AssertionError after BOUND_S)."""
    t0 = time.monotonic()
    while True:
        reply = pods.client.call(cmd)
        elapsed = time.monotonic() - t0
        if want(reply):
            return elapsed
        if elapsed > BOUND_S:
            raise AssertionError(f"{what}: not in effect after {BOUND_S} s: {reply}")
        time.sleep(0.002)


def _eperm(reply: dict[str, Any]) -> bool:
    return reply.get("errno") == errno.EPERM


def _ok(reply: dict[str, Any]) -> bool:
    return reply.get("ok") is True


@pytest.mark.kernel
def test_default_deny_then_allow_on_real_connections(pods: Pods) -> None:
    agent, client, ep1, ep2 = pods.agent, pods.client, pods.ep1, pods.ep2
    policy = agent.policy
    assert policy.entries is not None and policy.modes is not None
    entries, modes, db = policy.entries, policy.modes, agent.db
    ip4, ip6 = str(ep2.ipv4), str(ep2.ipv6)
    tcp4 = {"op": "tcp", "host": ip4, "port": PORT}
    timings: dict[str, float] = {}

    # the agent read pod1's namespace cookie; nothing is enforced yet
    assert ep1.netns_cookie != 0
    assert client.call({"op": "cookie"})["cookie"] == ep1.netns_cookie
    # (the first IPv6 packets may wait for neighbour discovery: retried within the bound)
    for host in (ip4, ip6):
        _until(pods, f"baseline {host}", {"op": "tcp", "host": host, "port": PORT}, _ok)

    # a service whose backend is pod2:PORT: the policy sees the backend, not the VIP
    vip = {"op": "tcp", "host": VIP, "port": VIP_PORT}
    fe = FrontendSpec(
        Addr.of(VIP, VIP_PORT, "TCP"),
        "ClusterIP",
        ServiceSpec("default/pod2-svc"),
        (BackendSpec(Addr.of(ip4, PORT, "TCP")),),
    )
    pods.lb.update_spec(None, fe)
    assert _ok(client.call(vip))

    # default deny: pod1 selected by an egress policy without rules
    with db.write_txn(modes) as txn:
        modes.insert(txn, PolicyEndpoint(ep1.id, egress_enforced=True, revision=1))
    timings["default_deny_s"] = _until(pods, "default deny", tcp4, _eperm)
    assert _eperm(client.call({"op": "tcp", "host": ip6, "port": PORT}))
    assert _eperm(client.call({"op": "udp", "host": ip4, "port": PORT}))
    assert _eperm(client.call(vip))

    # allow pod2's identity on TCP PORT
    allow = PolicyEntry(
        PolicyKey(ep1.id, ep2.identity, True, 6, PORT, 16), rules=("default/allow-pod2",)
    )
    with db.write_txn(entries) as txn:
        entries.insert(txn, allow)
    timings["allow_s"] = _until(pods, "allow rule", tcp4, _ok)
    assert _ok(client.call({"op": "tcp", "host": ip6, "port": PORT}))
    assert _eperm(client.call({"op": "tcp", "host": ip4, "port": OTHER_PORT}))
    assert _eperm(client.call({"op": "udp", "host": ip4, "port": PORT}))
    assert _ok(client.call(vip))  # checked after translation: pod2's identity, PORT
    names = {v.name for v in policy.bpf_maps()}
    assert policy_map_name(ep1.id) in names
    assert os.path.exists(os.path.join(pods.pin_dir, policy_map_name(ep1.id)))

    # a port range (a prefix of 12 bits: 8992-9007) covers OTHER_PORT
    ranged = PolicyEntry(PolicyKey(ep1.id, ep2.identity, True, 6, OTHER_PORT & ~0xF, 12))
    with db.write_txn(entries) as txn:
        entries.insert(txn, ranged)
    other4 = {"op": "tcp", "host": ip4, "port": OTHER_PORT}
    timings["port_range_allow_s"] = _until(pods, "port range", other4, _ok)

    # a deny for any identity on PORT wins over the allow
    deny = PolicyEntry(PolicyKey(ep1.id, 0, True, 6, PORT, 16), deny=True)
    with db.write_txn(entries) as txn:
        entries.insert(txn, deny)
    timings["deny_wins_s"] = _until(pods, "deny entry", tcp4, _eperm)
    assert _eperm(client.call(vip))
    assert _ok(client.call(other4))
    with db.write_txn(entries) as txn:
        entries.delete(txn, deny)
    timings["deny_removed_s"] = _until(pods, "deny removed", tcp4, _ok)

    # no longer selected by an egress policy: everything allowed again
    with db.write_txn(modes) as txn:
        modes.delete(txn, PolicyEndpoint(ep1.id))
    udp4 = {"op": "udp", "host": ip4, "port": PORT}
    timings["enforcement_off_s"] = _until(pods, "enforcement off", udp4, _ok)

    # the last entry gone: the endpoint's map is removed and unpinned
    with db.write_txn(entries) as txn:
        entries.delete(txn, allow)
        entries.delete(txn, ranged)
    deadline = time.monotonic() + BOUND_S
    while os.path.exists(os.path.join(pods.pin_dir, policy_map_name(ep1.id))):
        assert time.monotonic() < deadline, "policy map not removed"
        time.sleep(0.01)
    pods.lb.delete_spec(None, fe)
    print(json.dumps({"policy_enforcement_timings": timings, "bound_s": BOUND_S}))
