"""statewright-cni called exactly as a container runtime calls it (environment, network
configuration on stdin, result on stdout), against a test agent on a unix socket. The
node side lives in a network namespace of the test's own; pods in their own namespaces.
Also: argument and configuration errors with the specification's codes (no privileges)."""

from __future__ import annotations

import io
import ipaddress
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from typing import Any

import pytest

from statewright import cni
from statewright.agent.components.endpoints import EndpointsConfig
from tables.endpoints import Endpoint

from .agent_server import AgentUnderTest
from .helpers import new_pin_dir, remove_pins

PID = os.getpid()
CONF = {"cniVersion": "1.0.0", "name": "statewright", "type": "statewright-cni", "mtu": 1400}


def plugin_cmd() -> list[str]:
    """The console script next to this interpreter (``python -m`` if not installed)."""
    script = os.path.join(os.path.dirname(sys.executable), "statewright-cni")
    return [script] if os.path.exists(script) else [sys.executable, "-m", "statewright.cni"]


def run_plugin(
    command: str, conf: dict[str, Any], node_ns: str | None = None, **env: str
) -> tuple[int, Any]:
    """Run the plugin as a runtime does; (exit status, decoded stdout or None)."""
    full = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "CNI_COMMAND": command,
        "CNI_PATH": os.path.dirname(plugin_cmd()[0]),
        **env,
    }
    prefix = ["ip", "netns", "exec", node_ns] if node_ns else []
    proc = subprocess.run(
        [*prefix, *plugin_cmd()],
        input=json.dumps(conf),
        env=full,
        capture_output=True,
        text=True,
        timeout=60,
    )
    out = json.loads(proc.stdout) if proc.stdout.strip() else None
    return proc.returncode, out


def test_errors_and_version() -> None:
    def runs(env: dict[str, str], stdin: str) -> tuple[int, Any]:
        buf = io.StringIO()
        rc = cni.run(env, stdin, buf)
        return rc, json.loads(buf.getvalue()) if buf.getvalue() else None

    assert runs({"CNI_COMMAND": "VERSION"}, "")[1]["supportedVersions"][-1] == "1.0.0"
    base = {"CNI_CONTAINERID": "c", "CNI_IFNAME": "eth0", "CNI_NETNS": "/nonexistent"}
    cases = [
        ({"CNI_COMMAND": "FOO"}, CONF, cni.ERR_INVALID_ENV),
        ({"CNI_COMMAND": "ADD"}, CONF, cni.ERR_INVALID_ENV),  # no CNI_CONTAINERID ...
        ({**base, "CNI_COMMAND": "ADD"}, "{not json", cni.ERR_DECODE),
        ({**base, "CNI_COMMAND": "ADD"}, {**CONF, "type": ""}, cni.ERR_INVALID_CONFIG),
        ({**base, "CNI_COMMAND": "ADD"}, {**CONF, "mtu": 10}, cni.ERR_INVALID_CONFIG),
        (
            {**base, "CNI_COMMAND": "ADD"},
            {**CONF, "cniVersion": "9.9.9"},
            cni.ERR_INCOMPATIBLE_VERSION,
        ),
        ({**base, "CNI_COMMAND": "ADD", "CNI_ARGS": "bad"}, CONF, cni.ERR_INVALID_ENV),
        ({**base, "CNI_COMMAND": "ADD", "CNI_IFNAME": "../eth0"}, CONF, cni.ERR_INVALID_ENV),
        ({**base, "CNI_COMMAND": "ADD", "CNI_IFNAME": "x" * 16}, CONF, cni.ERR_INVALID_ENV),
        ({**base, "CNI_COMMAND": "ADD"}, {**CONF, "ipam": {"type": ""}}, cni.ERR_INVALID_CONFIG),
        (
            {**base, "CNI_COMMAND": "ADD"},
            {**CONF, "agent-socket": f"/nonexistent/sw-{PID}.sock"},
            cni.ERR_TRY_AGAIN,
        ),
    ]
    for env, conf, code in cases:
        stdin = conf if isinstance(conf, str) else json.dumps(conf)
        rc, doc = runs(env, stdin)
        assert rc == 1 and doc["code"] == code, (env, conf, doc)
        assert doc["msg"]


@pytest.fixture
def netns_names() -> Iterator[dict[str, str]]:
    """A node and two pod namespaces with unique names; deleted afterwards."""
    names = {k: f"swep-{k}-{PID}" for k in ("node", "pod1", "pod2")}
    try:
        for n in names.values():
            subprocess.run(["ip", "netns", "add", n], check=True, capture_output=True)
        node = names["node"]
        # a node has local addresses (at least loopback's): without any, the kernel has no
        # local routing table and resolves every neighbour as broadcast
        subprocess.run(["ip", "-n", node, "link", "set", "lo", "up"], check=True)
        for key in ("net.ipv4.ip_forward=1", "net.ipv6.conf.all.forwarding=1"):
            subprocess.run(["ip", "netns", "exec", node, "sysctl", "-qw", key], check=True)
        yield names
    finally:
        for n in names.values():
            subprocess.run(["ip", "netns", "del", n], capture_output=True)


@pytest.fixture
def agent() -> Iterator[AgentUnderTest]:
    """A test agent (memory maps) with a socket and state directory of its own."""
    state = tempfile.mkdtemp(prefix=f"sw-cni-{PID}-")
    pin_dir = new_pin_dir("memory")
    a = AgentUnderTest(
        EndpointsConfig(("10.77.0.0/24", "fd00:77::/112"), state, "memory", pin_dir),
        os.path.join(state, "agent.sock"),
    )
    a.start()
    try:
        yield a
    finally:
        a.stop()
        remove_pins("memory", pin_dir)
        shutil.rmtree(state, ignore_errors=True)


def ns_run(ns: str, *cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["ip", "netns", "exec", ns, *cmd], capture_output=True, text=True, timeout=30
    )


SERVER = """
import socket, sys
s = socket.create_server(("::", int(sys.argv[1])), family=socket.AF_INET6, dualstack_ipv6=True)
print("ready", flush=True)
c, _ = s.accept()
c.sendall(b"pong")
c.close()
"""
# Retries: the first packets right after ADD may wait for neighbour resolution on both
# hops; 15 attempts bound the wait, nothing here measures time.
CLIENT = """
import socket, sys
for attempt in range(15):
    try:
        c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=2)
        break
    except OSError as e:
        err = e
else:
    raise err
print(c.recv(16).decode())
"""


def tcp_exchange(server_ns: str, client_ns: str, address: str, port: int = 8765) -> str:
    """Connect from ``client_ns`` to a one-shot server in ``server_ns``; what it read."""
    server = subprocess.Popen(
        ["ip", "netns", "exec", server_ns, sys.executable, "-c", SERVER, str(port)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None and server.stdout.readline().strip() == "ready"
        out = ns_run(client_ns, sys.executable, "-c", CLIENT, address, str(port))
        assert out.returncode == 0, f"connect to {address}: {out.stderr}"
        return out.stdout.strip()
    finally:
        server.kill()
        server.wait()


@pytest.mark.kernel
def test_add_check_del_in_network_namespaces(
    netns_names: dict[str, str], agent: AgentUnderTest
) -> None:
    conf = {**CONF, "agent-socket": agent.socket}
    node = netns_names["node"]
    results = {}
    for i, pod in ((1, "pod1"), (2, "pod2")):
        env = {
            "CNI_CONTAINERID": f"ctr{i}-{PID}",
            "CNI_IFNAME": "eth0",
            "CNI_NETNS": f"/var/run/netns/{netns_names[pod]}",
            "CNI_ARGS": f"K8S_POD_NAMESPACE=default;K8S_POD_NAME=pod{i};IgnoreUnknown=1",
        }
        rc, res = run_plugin("ADD", conf, node, **env)
        assert rc == 0, res
        results[pod] = (env, res)
        assert res["cniVersion"] == "1.0.0"
        assert [i["name"] for i in res["interfaces"]][1] == "eth0"
        assert {ipaddress.ip_interface(ip["address"]).version for ip in res["ips"]} == {4, 6}
        # The gateways are those the pod's default routes use: the router address for
        # IPv4, the host side's link-local address for IPv6 (not the router address).
        gws = {ipaddress.ip_interface(ip["address"]).version: ip["gateway"] for ip in res["ips"]}
        routes = ns_run(netns_names[pod], "ip", "-j", "-6", "route", "show", "default")
        assert gws[6] == json.loads(routes.stdout)[0]["gateway"], routes.stdout
        assert ipaddress.ip_address(gws[6]).is_link_local
        assert gws[4] == "10.77.0.1"
        rc, out = run_plugin("CHECK", {**conf, "prevResult": res}, node, **env)
        assert (rc, out) == (0, None)
        wrong = {**res, "ips": [{"address": "10.77.0.250/32"}]}
        rc, out = run_plugin("CHECK", {**conf, "prevResult": wrong}, node, **env)
        assert rc == 1 and "prevResult" in out["msg"], out

    mgr = agent.comp.manager
    assert mgr is not None
    eps = {e.pod_name: e for e in mgr.all()}
    assert set(eps) == {"pod1", "pod2"}
    ep1 = eps["pod1"]
    assert ep1.container_interface_name == "eth0" and ep1.netns_path.endswith(netns_names["pod1"])
    link = ns_run(node, "ip", "-j", "link", "show", ep1.interface_name)
    assert json.loads(link.stdout)[0]["ifindex"] == ep1.ifindex
    assert json.loads(link.stdout)[0]["mtu"] == 1400

    # pods reach each other through the node namespace, over IPv4 and IPv6
    ip2 = {
        ipaddress.ip_interface(x["address"]).version: str(ipaddress.ip_interface(x["address"]).ip)
        for x in results["pod2"][1]["ips"]
    }
    for fam in (4, 6):
        got = tcp_exchange(netns_names["pod2"], netns_names["pod1"], ip2[fam])
        assert got == "pong", f"IPv{fam}: {got}"

    # DEL: endpoint, veth and addresses go; a second DEL succeeds too
    env1 = results["pod1"][0]
    assert run_plugin("DEL", conf, node, **env1) == (0, None)
    assert {e.pod_name for e in mgr.all()} == {"pod2"}
    assert ns_run(node, "ip", "link", "show", ep1.interface_name).returncode != 0
    assert agent.comp.ipam is not None
    held = {str(a.ip) for a in agent.comp.ipam.allocations()}
    assert not {str(a) for a in ep1.addresses()} & held
    assert run_plugin("DEL", conf, node, **env1) == (0, None)
    rc, out = run_plugin("CHECK", conf, node, **env1)
    assert rc == 1 and out["code"] == cni.ERR_UNKNOWN_CONTAINER

    # an ADD that died after POST /ipam left an address with the container: DEL frees it
    leak = {**env1, "CNI_CONTAINERID": f"dead-{PID}"}
    status, doc = agent.dispatch("POST", "/ipam", {"owner": leak["CNI_CONTAINERID"]}, b"")
    assert status == 200
    leaked = set(doc["address"].values())
    assert run_plugin("DEL", conf, node, **leak) == (0, None)
    assert not leaked & {str(a.ip) for a in agent.comp.ipam.allocations()}

    # ADD into a namespace that does not exist: error 3, nothing left behind
    before = {str(a.ip) for a in agent.comp.ipam.allocations()}
    bad = {**env1, "CNI_NETNS": f"/var/run/netns/swep-missing-{PID}"}
    rc, out = run_plugin("ADD", conf, node, **bad)
    assert rc == 1 and out["code"] == cni.ERR_UNKNOWN_CONTAINER, out
    assert {str(a.ip) for a in agent.comp.ipam.allocations()} == before
    assert len(mgr.all()) == 1


HOST_LOCAL_DIR = "/usr/lib/cni"  # Debian's containernetworking-plugins


@pytest.mark.kernel
def test_delegated_ipam_with_host_local(netns_names: dict[str, str], agent: AgentUnderTest) -> None:
    """Addresses from the third-party host-local IPAM plugin: the agent registers the
    endpoints as external-IPAM (its own pool untouched), pods reach each other, DEL gives
    the addresses back to host-local."""
    if not os.access(os.path.join(HOST_LOCAL_DIR, "host-local"), os.X_OK):
        reason = f"host-local not installed in {HOST_LOCAL_DIR} (apt: containernetworking-plugins)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(reason)
        pytest.skip(reason)
    data_dir = tempfile.mkdtemp(prefix=f"sw-hostlocal-{PID}-")
    conf: dict[str, Any] = {
        **CONF,
        "name": f"swnet{PID}",
        "agent-socket": agent.socket,
        "ipam": {"type": "host-local", "subnet": "10.66.0.0/24", "dataDir": data_dir},
    }
    node = netns_names["node"]
    own_before = {str(a.ip) for a in agent.comp.ipam.allocations()}  # type: ignore[union-attr]
    envs = {}
    try:
        for i, pod in ((1, "pod1"), (2, "pod2")):
            env = {
                "CNI_CONTAINERID": f"hl{i}-{PID}",
                "CNI_IFNAME": "eth0",
                "CNI_NETNS": f"/var/run/netns/{netns_names[pod]}",
                "CNI_PATH": HOST_LOCAL_DIR,
            }
            rc, res = run_plugin("ADD", conf, node, **env)
            assert rc == 0, res
            envs[pod] = env
            assert res["ips"][0]["address"].startswith("10.66.0.")
            assert run_plugin("CHECK", conf, node, **env) == (0, None)
        mgr = agent.comp.manager
        assert mgr is not None
        eps = mgr.all()
        assert all(e.external_ipam and str(e.ipv4).startswith("10.66.0.") for e in eps)
        assert {str(a.ip) for a in agent.comp.ipam.allocations()} == own_before  # type: ignore[union-attr]
        stored = sorted(os.listdir(os.path.join(data_dir, conf["name"])))
        assert {str(e.ipv4) for e in eps} <= set(stored)
        ip2 = next(str(e.ipv4) for e in eps if e.container_id.startswith("hl2"))
        assert tcp_exchange(netns_names["pod2"], netns_names["pod1"], ip2) == "pong"
        for pod in ("pod1", "pod2"):
            assert run_plugin("DEL", conf, node, **envs[pod]) == (0, None)
            assert run_plugin("DEL", conf, node, **envs[pod]) == (0, None)
        left = set(os.listdir(os.path.join(data_dir, conf["name"])))
        assert not {str(e.ipv4) for e in eps} & left
        assert mgr.all() == []
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)


def link_exists_in(netns: str) -> Any:
    """An endpoint interface check in ``netns`` (the test's node namespace)."""

    def check(ep: Endpoint) -> bool:
        from pyroute2 import IPRoute

        with IPRoute(netns=netns) as ipr:
            found = ipr.link_lookup(ifname=ep.interface_name)
            return bool(found) and found[0] == ep.ifindex

    return check


@pytest.mark.kernel
def test_agent_restart_keeps_pods_and_drops_vanished(netns_names: dict[str, str]) -> None:
    """ADD two pods, stop the agent, remove one pod's host interface, start a new agent
    on the same state directory: the other pod keeps its endpoint id, addresses and
    identity and passes CHECK; the vanished one is gone and its addresses are free."""
    state = tempfile.mkdtemp(prefix=f"sw-cni-restart-{PID}-")
    pin_dir = new_pin_dir("memory")
    cfg = EndpointsConfig(("10.78.0.0/24",), state, "memory", pin_dir)
    sock = os.path.join(state, "agent.sock")
    node = netns_names["node"]
    conf = {**CONF, "agent-socket": sock}
    envs = {
        pod: {
            "CNI_CONTAINERID": f"r{i}-{PID}",
            "CNI_IFNAME": "eth0",
            "CNI_NETNS": f"/var/run/netns/{netns_names[pod]}",
        }
        for i, pod in ((1, "pod1"), (2, "pod2"))
    }
    first = AgentUnderTest(cfg, sock)
    first.start()
    try:
        for env in envs.values():
            rc, res = run_plugin("ADD", conf, node, **env)
            assert rc == 0, res
        assert first.comp.manager is not None
        before = {e.container_id: e for e in first.comp.manager.all()}
    finally:
        first.stop()
    gone = before[envs["pod2"]["CNI_CONTAINERID"]]
    subprocess.run(["ip", "-n", node, "link", "del", gone.interface_name], check=True)
    second = AgentUnderTest(cfg, sock, link_exists=link_exists_in(f"/var/run/netns/{node}"))
    second.start()
    try:
        mgr, ipam = second.comp.manager, second.comp.ipam
        assert mgr is not None and ipam is not None
        kept = before[envs["pod1"]["CNI_CONTAINERID"]]
        now = mgr.all()
        assert [(e.id, e.addresses(), e.identity) for e in now] == [
            (kept.id, kept.addresses(), kept.identity)
        ]
        held = {a.ip for a in ipam.allocations()}
        assert not set(gone.addresses()) & held
        assert set(kept.addresses()) <= held
        assert run_plugin("CHECK", conf, node, **envs["pod1"]) == (0, None)
        assert run_plugin("DEL", conf, node, **envs["pod1"]) == (0, None)
        assert run_plugin("DEL", conf, node, **envs["pod2"]) == (0, None)
        assert mgr.all() == []
    finally:
        second.stop()
        remove_pins("memory", pin_dir)
        shutil.rmtree(state, ignore_errors=True)


def test_del_while_the_agent_is_down(netns_names: dict[str, str]) -> None:
    """DEL while the agent is down succeeds (it was code 11, leaving the veth and the
    node's routes): the plugin deletes the veth (the routes go with it), and the agent's
    next start removes the endpoint and frees its addresses."""
    state = tempfile.mkdtemp(prefix=f"sw-cni-down-{PID}-")
    pin_dir = new_pin_dir("memory")
    try:
        _del_while_down(netns_names, state, pin_dir)
    finally:
        remove_pins("memory", pin_dir)
        shutil.rmtree(state, ignore_errors=True)


def _del_while_down(netns_names: dict[str, str], state: str, pin_dir: str) -> None:
    cfg = EndpointsConfig(("10.79.0.0/24",), state, "memory", pin_dir)
    sock = os.path.join(state, "agent.sock")
    node = netns_names["node"]
    conf = {**CONF, "agent-socket": sock}
    env = {"CNI_CONTAINERID": f"d1-{PID}", "CNI_IFNAME": "eth0",
           "CNI_NETNS": f"/var/run/netns/{netns_names['pod1']}"}
    first = AgentUnderTest(cfg, sock)
    first.start()
    try:
        rc, res = run_plugin("ADD", conf, node, **env)
        assert rc == 0, res
        assert first.comp.manager is not None
        (ep,) = first.comp.manager.all()
    finally:
        first.stop()
    address = str(ep.addresses()[0])
    assert ns_run(node, "ip", "route", "show", address).stdout.strip()
    assert run_plugin("DEL", conf, node, **env) == (0, None)
    assert ns_run(node, "ip", "link", "show", ep.interface_name).returncode != 0
    assert ns_run(node, "ip", "route", "show", address).stdout.strip() == ""
    second = AgentUnderTest(cfg, sock, link_exists=link_exists_in(f"/var/run/netns/{node}"))
    second.start()
    try:
        mgr, ipam = second.comp.manager, second.comp.ipam
        assert mgr is not None and ipam is not None
        assert mgr.all() == []
        assert not set(ep.addresses()) & {a.ip for a in ipam.allocations()}
        assert run_plugin("DEL", conf, node, **env) == (0, None)  # again: still fine
    finally:
        second.stop()


def test_agent_answers_over_the_plugins_http(tmp_path: Any) -> None:
    """The plugin's own HTTP exchange: bodies by Content-Length, chunked or to EOF; an
    allowed 404; error statuses and malformed answers as CNI errors (5)."""
    import socket
    import threading

    answers = [
        b'HTTP/1.1 200 OK\r\nContent-Length: 8\r\n\r\n{"a": 1}trailing',
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        b'4\r\n{"b"\r\n3\r\n: 2\r\n1\r\n}\r\n0\r\n\r\n',
        b'HTTP/1.0 200 OK\r\n\r\n{"c": 3}',
        b"HTTP/1.1 404 Not Found\r\nContent-Length: 2\r\n\r\n{}",
        b'HTTP/1.1 409 Conflict\r\nContent-Length: 17\r\n\r\n{"error": "busy"}',
        b"garbage",
    ]
    path = str(tmp_path / "agent.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen()
    requests: list[bytes] = []

    def serve() -> None:
        for answer in answers:
            conn, _ = server.accept()
            with conn:
                requests.append(conn.recv(65536))
                conn.sendall(answer)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    api = cni.AgentAPI(path, timeout=5)
    try:
        assert api.request("PUT", "/endpoint/x", {"k": "v"}) == {"a": 1}
        assert api.request("GET", "/ipam") == {"b": 2}
        assert api.request("GET", "/ipam") == {"c": 3}
        assert api.request("GET", "/endpoint/y", not_found_ok=True) is None
        with pytest.raises(cni.CNIError) as ei:
            api.request("DELETE", "/endpoint/z")
        assert ei.value.code == cni.ERR_IO and "409" in ei.value.msg and "busy" in ei.value.msg
        with pytest.raises(cni.CNIError) as ei:
            api.request("GET", "/ipam")
        assert ei.value.code == cni.ERR_IO
    finally:
        thread.join(5)
        server.close()
    head, _, body = requests[0].partition(b"\r\n\r\n")
    assert head.startswith(b"PUT /endpoint/x HTTP/1.1\r\n")
    assert b"Content-Length: 10" in head and json.loads(body) == {"k": "v"}


def test_plugin_imports_nothing_heavy() -> None:
    """The plugin is a new process per call: its import must not pull in pyroute2,
    http.client (and the email package), asyncio or subprocess (docs/endpoints.md)."""
    code = (
        "import sys, statewright.cni\n"
        "heavy = ('pyroute2', 'http', 'email', 'asyncio', 'anyio', 'subprocess', 'ssl')\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in heavy))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True)
    assert out.stdout.strip() == "[]", out.stdout
