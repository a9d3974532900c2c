"""A whole node end to end (issue #12): the agent in a node namespace of its own, pods
connected by ``statewright-cni`` exactly as a runtime calls it, pod-to-pod traffic, a
ClusterIP service whose backends are pods reached through the socket LB, SIGKILL and
restart of the agent, and DEL (see node_harness.py for the environment).

The tests of this module run in order on one node: pods, traffic, service, restart, DEL.
Waits are bounded (10 s); nothing here measures time.
"""

from __future__ import annotations

import ipaddress
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.e2e.conftest import need_machine
from tests.e2e.harness import BACKEND_PORT, ident, ids, service_manifest
from tests.e2e.node_harness import POD_CIDRS, NodeEnv, Pod, node_env, node_leftovers

pytestmark = pytest.mark.kernel

VIP = "10.96.247.10"
BOUND = 10.0
SERVER_PODS = ("web1", "web2")


@pytest.fixture(scope="module")
def node() -> Iterator[NodeEnv]:
    """The node with a client pod and two server pods (servers started)."""
    need_machine()
    with node_env() as env:
        env.add_pod("client")
        for name in SERVER_PODS:
            env.serve(env.add_pod(name))
        yield env


def _wait(check: Callable[[], Any], what: str, env: NodeEnv) -> Any:
    deadline = time.monotonic() + BOUND
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {BOUND} s: {what}\n{env.agent.logs()[-3000:]}")
        time.sleep(0.05)


def _all_ready(env: NodeEnv) -> dict[str, dict[str, Any]]:
    eps = env.endpoints()
    return eps if all(e["state"] == "ready" for e in eps.values()) else {}


def _lxc_ips(env: NodeEnv) -> dict[str, int]:
    """Address -> lxc_id of the pinned endpoint map's entries."""
    out = {}
    for e in env.map_entries("endpoints"):
        out[str(ipaddress.ip_address(e["key"]["ip"]))] = int(e["value"]["lxc_id"])
    return out


def _pod_to_pods(env: NodeEnv, client_pod: Pod) -> None:
    """Connect from ``client_pod`` to every server pod, over IPv4 and IPv6."""
    client = env.client_in(client_pod)
    for name in SERVER_PODS:
        pod = env.pods[name]
        for fam in (4, 6):
            addr = pod.address(fam)
            assert ids(client.tcp(addr, BACKEND_PORT, count=3)) == [ident(addr)] * 3


def test_pods_get_addresses_endpoints_and_map_entries(node: NodeEnv) -> None:
    nets = [ipaddress.ip_network(c) for c in POD_CIDRS]
    for pod in node.pods.values():
        for fam in (4, 6):
            assert any(ipaddress.ip_address(pod.address(fam)) in n for n in nets)
        assert node.cni("CHECK", pod, {**node.conf, "prevResult": pod.result}) == (0, None)
    eps = _wait(lambda: _all_ready(node), "every endpoint ready", node)
    assert set(eps) == set(node.pods)
    lxc = _lxc_ips(node)
    for name, ep in eps.items():
        pod = node.pods[name]
        assert ep["container-id"] == pod.env["CNI_CONTAINERID"]
        assert ep["k8s-namespace"] == "e2e"
        link = node.node_link(ep["interface-name"])
        assert link is not None and link["ifindex"] == ep["interface-index"]
        for fam in (4, 6):
            assert ep["addressing"][f"ipv{fam}"] == pod.address(fam)
            assert lxc[pod.address(fam)] == ep["id"]


def test_pods_reach_each_other(node: NodeEnv) -> None:
    """Through the node's forwarding, which the agent turned on (a new namespace has it
    off, and the harness leaves it so), recording the value it found."""
    def all_done() -> dict[str, Any]:
        rows = node.api.get("/tables/sysctls")
        return {r["name"]: r for r in rows} if all(r["status"] == "Done" for r in rows) else {}

    rows = _wait(all_done, "every sysctl Done", node)
    assert rows["net.ipv4.ip_forward"]["value"] == "1"
    assert rows["net.ipv4.ip_forward"]["original"] == "0"
    assert rows["net.ipv6.conf.all.forwarding"]["original"] == "0"
    for ep in node.endpoints().values():
        assert rows[f"net.ipv4.conf.{ep['interface-name']}.rp_filter"]["value"] == "0"
    _pod_to_pods(node, node.pods["client"])


def test_clusterip_service_of_pods_through_the_socket_lb(node: NodeEnv) -> None:
    backends = [node.pods[n].address(4) for n in SERVER_PODS]
    since = node.write("web", service_manifest("web", VIP, backends))
    client = node.client_in(node.pods["client"])
    want = {ident(b) for b in backends}
    node.converge(VIP, 80, lambda r: all("id" in x for x in r) and set(ids(r)) == want,
                  since, timeout=BOUND, batch=20, client=client)
    # the socket LB translated at connect() and shows the service as the peer
    assert all(r["peer"] == [VIP, 80] for r in client.tcp(VIP, 80, count=5))


def test_sigkill_and_restart_keep_pods(node: NodeEnv) -> None:
    before = _wait(lambda: _all_ready(node), "every endpoint ready", node)
    lxc_before = _lxc_ips(node)
    node.agent.kill()
    # the pods' connectivity does not depend on the agent process
    _pod_to_pods(node, node.pods["client"])
    client = node.client_in(node.pods["client"])
    assert ids(client.tcp(VIP, 80, count=5))
    node.agent.start()
    after = _wait(lambda: _all_ready(node), "every endpoint ready after restart", node)
    keep = ("id", "addressing", "interface-name", "interface-index", "identity", "mac")
    assert {n: {k: e[k] for k in keep} for n, e in after.items()} == {
        n: {k: e[k] for k in keep} for n, e in before.items()
    }
    assert _lxc_ips(node) == lxc_before
    _pod_to_pods(node, node.pods["client"])
    assert set(ids(client.tcp(VIP, 80, count=20))) <= {
        ident(node.pods[n].address(4)) for n in SERVER_PODS
    }
    health = node.api.get("/health")
    line = next(c for c in health["components"] if c["name"] == "endpoints")
    assert "restored 3, removed 0" in line["message"], line
    # a new pod after the restart gets an address nobody holds
    late = node.add_pod("late")
    held = {p.address(4) for n, p in node.pods.items() if n != "late"}
    assert late.address(4) not in held


def _agent_running(node: NodeEnv) -> None:
    """Start the agent if an earlier test of the module left it stopped (its restart
    failed, and that test says so): each test's result is its own."""
    proc = node.agent.proc
    if proc is None or proc.poll() is not None:
        node.agent.start()


def test_del_removes_veth_addresses_endpoint_and_map_entries(node: NodeEnv) -> None:
    _agent_running(node)
    pod = node.add_pod("gone")
    ep = _wait(lambda: node.endpoints().get("gone"), "endpoint of pod gone", node)
    addrs = [pod.address(4), pod.address(6)]
    _wait(lambda: set(addrs) <= set(_lxc_ips(node)), "lxc entries of pod gone", node)
    assert node.cni("DEL", pod) == (0, None)
    assert "gone" not in node.endpoints()
    assert node.node_link(ep["interface-name"]) is None
    routes = node.node_routes()
    assert not [a for a in addrs if a in routes], routes
    allocated = {a["ip"] for a in node.api.get("/ipam")["allocations"]}
    assert not set(addrs) & allocated
    _wait(lambda: not set(addrs) & set(_lxc_ips(node)), "lxc entries of pod gone removed", node)
    ipcache = {str(ipaddress.ip_address(e["key"]["ip"])) for e in node.map_entries("ipcache")}
    assert not set(addrs) & ipcache
    assert node.cni("DEL", pod) == (0, None)  # again: already gone is fine
    # the other pods are untouched
    _pod_to_pods(node, node.pods["client"])


def test_everything_is_removed_afterwards_also_on_failure() -> None:
    need_machine()

    class Boom(Exception):
        pass

    created = None
    with pytest.raises(Boom), node_env() as env:
        created = env
        env.serve(env.add_pod("doomed"))
        env.agent.kill()
        raise Boom
    assert created is not None
    assert node_leftovers(created) == []
