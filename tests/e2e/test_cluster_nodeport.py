"""North-south services (issue #29) on the three-node bed (cluster_harness.py), from a
client outside the cluster: a namespace plugged into node 1's external device ``ext0``
(tests/e2e/outside.py). Node 1's tc programs (bpf/nodeport.c) DNAT the client's packets
to a backend chosen from the LB maps; a backend on node 2 is reached masqueraded to node
1's address (SNAT, NAT map) and its replies translated back. The servers
(nodeport_probe.py) name the client address they saw.

Proved here: NodePort, LoadBalancer and externalIPs reached from outside with a backend on the same
node and on another node, replies from the right address (UDP on connected sockets),
IPv4 and IPv6, TCP and UDP; externalTrafficPolicy Local keeps the client's address and
drops without a local backend (158), a drop ``statewright monitor -o json`` reports with
the client, its identity and the service, as it reports each new flow's translation;
source ranges (177); a default-deny ingress policy
blocks new connections from outside to both backends (133, on each node); an agent
SIGKILLed and restarted keeps established connections (CT, NAT and links pinned and
adopted) and serves new ones; the clsact attach mode serves the same.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import ExitStack
from typing import Any

import pytest

from tests.e2e.cluster_harness import ClusterEnv, cluster_env, cluster_leftovers, node_ips
from tests.e2e.conftest import need_machine
from tests.e2e.outside import CLIENT_SIDE, NODE_SIDE, Outside, plug_outside, serve_probe

pytestmark = pytest.mark.kernel

NAMESPACE = "ns"
PORT = 8080
NODE_PORTS = {"np-local": 30081, "np-remote": 30082, "lb-remote": 30083, "lb-local": 30084,
              "np-local-none": 30085, "lb-ranges": 30086}
#: A ClusterIP service with external IPs (no node port).
EXTERNAL_IPS = {"ext-remote": ("192.168.210.20", "fd20:210::20")}
LB_IPS = {"lb-remote": ("192.168.210.10", "fd20:210::10"),
          "lb-local": ("192.168.210.11", "fd20:210::11"),
          "lb-ranges": ("192.168.210.12", "fd20:210::12")}


def pod_object(name: str, node: int, labels: dict[str, str]) -> dict[str, Any]:
    """The Pod as the API server holds it."""
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": NAMESPACE, "uid": f"uid-{name}",
                         "labels": labels},
            "spec": {"nodeName": f"node-{node}", "containers": [{"name": "c"}]},
            "status": {"phase": "Running"}}


def service_objects(name: str, n: int, backends: list[tuple[str, str, int]],
                    etp: str = "Cluster", ranges: list[str] | None = None) -> list[dict[str, Any]]:
    """A dual-stack NodePort (or, with an LB IP, LoadBalancer) Service with TCP and UDP
    ports and one EndpointSlice per family: ``backends`` are (IPv4, IPv6, node)."""
    lb = LB_IPS.get(name)
    ports = [{"name": p.lower(), "port": 80, "protocol": p, "targetPort": PORT,
              **({"nodePort": NODE_PORTS[name]} if name in NODE_PORTS else {})}
             for p in ("TCP", "UDP")]
    kind = "LoadBalancer" if lb else "NodePort" if name in NODE_PORTS else "ClusterIP"
    spec: dict[str, Any] = {
        "type": kind,
        "clusterIP": f"10.96.29.{n}", "clusterIPs": [f"10.96.29.{n}", f"fd00:96:29::{n}"],
        "ipFamilies": ["IPv4", "IPv6"], "ipFamilyPolicy": "RequireDualStack",
        "ports": ports,
    }
    if kind != "ClusterIP":
        spec["externalTrafficPolicy"] = etp
    if name in EXTERNAL_IPS:
        spec["externalIPs"] = list(EXTERNAL_IPS[name])
    if ranges:
        spec["loadBalancerSourceRanges"] = ranges
    svc: dict[str, Any] = {"apiVersion": "v1", "kind": "Service",
                           "metadata": {"name": name, "namespace": NAMESPACE}, "spec": spec}
    if lb:
        svc["status"] = {"loadBalancer": {"ingress": [{"ip": lb[0]}, {"ip": lb[1]}]}}
    slices = []
    for fam, idx in (("IPv4", 0), ("IPv6", 1)):
        slices.append({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": f"{name}-{fam.lower()}", "namespace": NAMESPACE,
                         "labels": {"kubernetes.io/service-name": name}},
            "addressType": fam,
            "endpoints": [{"addresses": [b[idx]], "conditions": {"ready": True},
                           "nodeName": f"node-{b[2]}"} for b in backends],
            "ports": [{"name": p.lower(), "port": PORT, "protocol": p} for p in ("TCP", "UDP")],
        })
    return [svc, *slices]


class Bed:
    """The cluster, the outside namespace and its client, the backend addresses."""

    def __init__(self, env: ClusterEnv, outside: Outside) -> None:
        self.env = env
        self.outside = outside
        self.client = outside.client()
        self.local = env.node(1).pods["web-local"]
        self.remote = env.node(2).pods["web-remote"]

    def ident(self, pod: Any, fam: int) -> str:
        a = pod.address(fam)
        return f"[{a}]:{PORT}" if fam == 6 else f"{a}:{PORT}"

    def ask(self, proto: str, host: str, port: int) -> dict[str, Any]:
        return self.client.call(op=proto.lower(), host=host, port=port)


def _setup(env: ClusterEnv, stack: ExitStack) -> Outside:
    for node, name in ((1, "web-local"), (2, "web-remote")):
        env.apiserver.upsert(pod_object(name, node, {"app": "web"}))
        n = env.node(node)
        pod = n.add_pod(name, NAMESPACE, {"app": "web"})
        serve_probe(stack, pod.netns, [pod.address(4), pod.address(6)])
    local, remote = env.node(1).pods["web-local"], env.node(2).pods["web-remote"]
    lo = (local.address(4), local.address(6), 1)
    re = (remote.address(4), remote.address(6), 2)
    objs = [*service_objects("np-local", 1, [lo]), *service_objects("np-remote", 2, [re]),
            *service_objects("lb-remote", 3, [re]),
            *service_objects("lb-local", 4, [lo, re], etp="Local"),
            *service_objects("np-local-none", 5, [re], etp="Local"),
            *service_objects("lb-ranges", 6, [lo], ranges=["10.0.0.0/8", "fd00:1::/32"]),
            *service_objects("ext-remote", 7, [re])]
    env.apiserver.upsert_many(objs)
    tag = env.underlay.removeprefix("swul-")
    return plug_outside(stack, env.node(1).ns, tag)


@pytest.fixture(scope="module", params=["auto"])
def bed(request: pytest.FixtureRequest) -> Iterator[Bed]:
    """The bed with the outside namespace on node 1 (``ext0``) and the services."""
    need_machine()
    config = {"tc-attach-mode": request.param}
    with cluster_env(config) as env:
        outside = _setup(env, env._stack)
        b = Bed(env, outside)
        env.wait(lambda: _nodeport_ready(env), "node 1's programs on eth0 and ext0")
        yield b
    assert not cluster_leftovers(env)
    assert not os.path.exists(f"/var/run/netns/{outside.ns}")


def _nodeport_ready(env: ClusterEnv) -> bool:
    doc = env.node(1).api.get("/nodeport")
    return {d["name"] for d in doc["devices"]} >= {"eth0", "ext0"}


def _frontends(name: str, fam: int) -> list[str]:
    """Where the client reaches service ``name``: node 1's address on ext0 (NodePort,
    on the node port), the LoadBalancer IP and the external IPs (on the service port)."""
    out = [NODE_SIDE[fam // 6]] if name in NODE_PORTS else []
    for extra in (LB_IPS, EXTERNAL_IPS):
        if name in extra:
            out.append(extra[name][fam // 6])
    return out


def _answers(bed: Bed, name: str, fam: int, proto: str) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for host in _frontends(name, fam):
        port = NODE_PORTS[name] if host in NODE_SIDE else 80
        out.append((f"{proto} {host}:{port}", bed.ask(proto, host, port)))
    return out


@pytest.mark.parametrize("fam", [4, 6])
@pytest.mark.parametrize("proto", ["TCP", "UDP"])
def test_served_from_outside(bed: Bed, fam: int, proto: str) -> None:
    """Local backend: the client's own address reaches the pod; remote backend: node 1's
    address (masqueraded); the answer comes back from the address the client used."""
    client = CLIENT_SIDE[fam // 6]
    node1 = node_ips(1)[fam // 6]

    def check() -> bool:
        for name, pod, peer in (("np-local", bed.local, client),
                                ("np-remote", bed.remote, node1),
                                ("lb-remote", bed.remote, node1),
                                ("lb-local", bed.local, client),
                                ("ext-remote", bed.remote, node1)):
            for what, got in _answers(bed, name, fam, proto):
                assert got.get("id") == bed.ident(pod, fam), (name, what, got)
                assert got.get("peer") == peer, (name, what, got)
        return True

    bed.env.wait(check, f"{proto} IPv{fam} services from outside")


def test_local_policy_without_local_backend_drops(bed: Bed) -> None:
    """externalTrafficPolicy Local and the only backend on node 2: dropped on node 1 with
    Cilium's "Service backend not found" (158)."""
    got = bed.ask("TCP", NODE_SIDE[0], NODE_PORTS["np-local-none"])
    assert "timed out" in got.get("error", ""), got
    drops = bed.env.node(1).api.get("/ct/stats")["drops"]
    assert any(d["reason"] == 158 for d in drops), drops


def test_source_ranges(bed: Bed) -> None:
    """loadBalancerSourceRanges that do not hold the client: dropped (177)."""
    for fam in (4, 6):
        got = bed.ask("TCP", LB_IPS["lb-ranges"][fam // 6], 80)
        assert "timed out" in got.get("error", ""), got
    drops = bed.env.node(1).api.get("/ct/stats")["drops"]
    assert any(d["reason"] == 177 for d in drops), drops


def _monitor(env: ClusterEnv, node: int, *args: str) -> list[dict[str, Any]]:
    """The flows node ``node``'s agent kept, through ``statewright monitor -o json``."""
    out = subprocess.run(
        [sys.executable, "-m", "statewright", "monitor", "--socket", env.node(node).agent.socket,
         "--no-follow", "-o", "json", *args], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    return [json.loads(line)["flow"] for line in out.stdout.splitlines() if line.strip()]


def _wait_flow(bed: Bed, probe: Any, want: Any, what: str, *args: str) -> dict[str, Any]:
    found: list[dict[str, Any]] = []

    def seen() -> bool:
        probe()
        found[:] = [f for f in _monitor(bed.env, 1, *args) if want(f)]
        return bool(found)

    bed.env.wait(seen, what)
    return found[-1]


#: The world's identity as a dual-stack node's ipcache has it (world-ipv4, world-ipv6).
WORLD = {4: (2, 9), 6: (2, 10)}


def test_monitor_reports_drops_from_outside(bed: Bed) -> None:
    """externalTrafficPolicy Local without a local backend: node 1's north-south program
    reports the drop in ``monitor -o json`` (158, ingress, the outside client with the
    world's identity, the service it asked for)."""
    port = NODE_PORTS["np-local-none"]
    flow = _wait_flow(
        bed, lambda: bed.ask("TCP", NODE_SIDE[0], port),
        lambda f: f.get("drop_reason") == 158 and f["l4"]["TCP"]["destination_port"] == port,
        "the eTP Local drop in monitor", "--type", "drop")
    assert flow["verdict"] == "DROPPED"
    assert flow["drop_reason_desc"] == "SERVICE_BACKEND_NOT_FOUND"
    assert flow["traffic_direction"] == "INGRESS" and flow["Type"] == "L3_L4"
    assert flow["IP"] == {"source": CLIENT_SIDE[0], "destination": NODE_SIDE[0],
                          "ipVersion": "IPv4"}
    assert flow["source"]["identity"] in WORLD[4] and "pod_name" not in flow["source"]
    assert flow["destination_service"] == {"name": "np-local-none", "namespace": NAMESPACE}
    assert flow["statewright"] == {"type": "drop", "observed_by": "nodeport"}
    assert flow["node_name"] == "node-1"
    stats = bed.env.node(1).api.get("/monitor/stats")
    drops = {(d["reason"], d["direction"]) for d in stats["drops"]}
    assert ("SERVICE_BACKEND_NOT_FOUND", "ingress") in drops, stats


@pytest.mark.parametrize("fam", [4, 6])
def test_monitor_reports_translations_from_outside(bed: Bed, fam: int) -> None:
    """A new connection from outside to a NodePort: TRANSLATED, from the node's address
    and node port to the local pod, with the service and both identities; the flow's
    next packets report nothing more."""
    port, host = NODE_PORTS["np-local"], NODE_SIDE[fam // 6]
    frontend = f"[{host}]:{port}" if fam == 6 else f"{host}:{port}"
    pod_ip = bed.local.address(fam)
    flow = _wait_flow(
        bed, lambda: bed.ask("TCP", host, port),
        lambda f: f.get("service_frontend") == frontend
        and f["statewright"]["observed_by"] == "nodeport",
        f"the IPv{fam} NodePort translation in monitor", "--type", "trace")
    assert flow["verdict"] == "TRANSLATED" and flow["traffic_direction"] == "INGRESS"
    assert flow["destination_service"] == {"name": "np-local", "namespace": NAMESPACE}
    assert flow["IP"]["source"] == CLIENT_SIDE[fam // 6]
    assert flow["IP"]["destination"] == pod_ip
    assert flow["l4"]["TCP"]["destination_port"] == PORT
    assert flow["source"]["identity"] in WORLD[fam]
    assert flow["destination"]["pod_name"] == "web-local"
    assert flow["destination"]["identity"] == bed.env.node(1).endpoints()["web-local"]["identity"]

    def traces() -> int:
        return sum(f.get("service_frontend") == frontend
                   for f in _monitor(bed.env, 1, "--type", "trace"))

    before = traces()
    for _ in range(3):  # three connections, each of several packets each way
        assert "id" in bed.ask("TCP", host, port)
    assert traces() - before == 3


def test_nat_and_ct_entries(bed: Bed) -> None:
    """The service flows are in the CT map (direction "service") and the masqueraded
    ones in the NAT map (snat, rev-snat, rev-dnat)."""
    bed.env.wait(lambda: "id" in bed.ask("TCP", NODE_SIDE[0], NODE_PORTS["np-remote"]),
                 "np-remote answers")
    kinds = {e["kind"] for e in bed.env.node(1).api.get("/nodeport")["nat"]}
    assert kinds >= {"snat", "rev-snat", "rev-dnat"}, kinds
    cli = subprocess.run([sys.executable, "-m", "statewright", "nodeport", "--socket",
                          bed.env.node(1).agent.socket], capture_output=True, text=True,
                         check=True)
    assert cli.stdout.startswith("devices: eth0 (tcx), ext0 (tcx)"), cli.stdout
    assert "rev-snat" in cli.stdout and f"{NODE_SIDE[0]}" in cli.stdout, cli.stdout
    ct = bed.env.node(1).api.get("/ct")["entries"]
    assert any(e["direction"] == "service" and "node_port" in e["flags"] for e in ct), ct[:5]
    print(json.dumps({"cluster_nodeport": "ok"}))


def _deny_policy() -> dict[str, Any]:
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": {"name": "deny-web", "namespace": NAMESPACE},
            "spec": {"podSelector": {"matchLabels": {"app": "web"}},
                     "policyTypes": ["Ingress"]}}


def _policy_drops(env: ClusterEnv, node: int) -> int:
    drops = env.node(node).api.get("/ct/stats")["drops"]
    return sum(d["packets"] for d in drops if d["reason"] == 133 and d["direction"] == "ingress")


def test_default_deny_blocks_outside(bed: Bed) -> None:
    """A default-deny ingress policy on the backends: new connections from outside are
    dropped at the pod's veth (133), on node 1 (client address) and on node 2 (node 1's
    address, masqueraded); removed, they are served again."""
    env = bed.env
    before = (_policy_drops(env, 1), _policy_drops(env, 2))
    env.apiserver.upsert(_deny_policy())

    def blocked(name: str) -> bool:
        got = bed.ask("TCP", NODE_SIDE[0], NODE_PORTS[name])
        return "timed out" in got.get("error", "")

    env.wait(lambda: blocked("np-local") and blocked("np-remote"), "default deny from outside")
    assert _policy_drops(env, 1) > before[0]
    assert _policy_drops(env, 2) > before[1]
    env.apiserver.delete("NetworkPolicy", NAMESPACE, "deny-web")
    env.wait(lambda: not blocked("np-local") and not blocked("np-remote"), "policy removed")


def _restart(env: ClusterEnv, node: int, **config: Any) -> None:
    """SIGKILL node ``node``'s agent and start it again (with ``config`` changed)."""
    agent = env.node(node).agent
    agent.kill()
    if config:
        path = agent.args[agent.args.index("--config") + 1]
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
        doc.update(config)
        with open(path, "w", encoding="utf-8") as f:
            json.dump(doc, f)
    agent.start()


def test_restart_keeps_connections(bed: Bed) -> None:
    """Established connections from outside (local and masqueraded backends, both
    families) survive node 1's agent SIGKILLed (served meanwhile by the pinned programs)
    and restarted (links adopted, CT and NAT maps adopted); new ones work at each step.
    A restart in the clsact attach mode replaces the tcx links by clsact filters with the
    same connections still up."""
    env = bed.env
    conns = {1: ("np-local", NODE_SIDE[0]), 2: ("np-remote", NODE_SIDE[0]),
             3: ("np-remote", NODE_SIDE[1]), 4: ("np-local", NODE_SIDE[1])}
    holder = bed.outside.client()
    for cid, (name, host) in conns.items():
        got = holder.call(op="open", id=cid, host=host, port=NODE_PORTS[name])
        assert "id" in got, (cid, got)

    def all_alive() -> bool:
        for cid in conns:
            got = holder.call(op="ping", id=cid)
            assert got.get("ok"), (cid, got)
        return True

    def new_ones(fam: int) -> bool:
        for proto in ("TCP", "UDP"):
            got = bed.ask(proto, NODE_SIDE[fam // 6], NODE_PORTS["np-remote"])
            assert got.get("id") == bed.ident(bed.remote, fam), (proto, got)
        return True

    env.node(1).agent.kill()
    assert all_alive() and new_ones(4)  # the pinned programs serve while the agent is down
    _restart(env, 1)
    env.wait(lambda: env.node(1).api.get("/nodeport")["adopted"] >= 2, "links adopted")
    assert all_alive() and new_ones(4) and new_ones(6)

    _restart(env, 1, **{"tc-attach-mode": "clsact"})
    def clsact() -> bool:
        doc = env.node(1).api.get("/nodeport")
        assert {d["mode"] for d in doc["devices"]} == {"clsact"}, (doc["devices"], [
            ln for ln in env.node(1).agent.logs().splitlines() if "nodeport" in ln][-3:])
        return True

    env.wait(clsact, "clsact filters on node 1's devices")
    tc = subprocess.run(["ip", "-n", env.node(1).ns, "-j", "link", "show", "ext0"],
                        capture_output=True, text=True, check=True)
    assert json.loads(tc.stdout)[0]["ifname"] == "ext0"
    links = os.path.join(env.node(1).pin_dir, "nodeport", "links")
    pins = {n for d in os.listdir(links) for n in os.listdir(os.path.join(links, d))}
    assert pins == {"in-clsact-ingress", "out-clsact-egress"}, pins
    assert all_alive() and new_ones(4) and new_ones(6)
    print(json.dumps({"cluster_nodeport_restart": "ok"}))
