"""`statewright monitor` end to end on the node in namespaces (node_harness.py): pods from
statewright-cni, policies and a ClusterIP service from manifests, real connections from
the pods, and the flows the datapath reports through the agent (issue #31):

* a connection the client pod's egress policy denies appears in ``monitor -o json`` as
  DROPPED with both pods, their identities and the reason, and in the drop counter;
* one its policy allows appears as a policy verdict (FORWARDED, with the lpm prefix
  length of the entry that allowed it);
* a connection to the ClusterIP appears as a translation naming the service and the
  chosen backend;
* a connection the server's ingress policy denies (from the decoy pod) is dropped by the
  tc program and reported with the decoy's identity, direction ingress;
* the same for IPv6 connects, and an unconnected UDP socket's datagrams (one translation,
  a denial each);
* ``statewright explain`` on these kernel maps: a pod's ipcache entry to its pod, the pod
  to each of its entries and back.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.e2e.conftest import need_machine
from tests.e2e.harness import BACKEND_PORT, service_manifest
from tests.e2e.node_harness import NodeEnv, node_env

pytestmark = pytest.mark.kernel

NS = "web"
VIP = "10.96.247.31"
BOUND_S = 30.0


def _policy(name: str, spec: dict[str, Any]) -> str:
    return json.dumps({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
                       "metadata": {"name": name, "namespace": NS}, "spec": spec})


CLIENT_EGRESS = _policy("client-egress", {
    "podSelector": {"matchLabels": {"app": "client"}}, "policyTypes": ["Egress"],
    "egress": [{"to": [{"podSelector": {"matchLabels": {"app": "server"}}}],
                "ports": [{"protocol": "TCP", "port": BACKEND_PORT}]}],
})
SERVER_INGRESS = _policy("server-ingress", {
    "podSelector": {"matchLabels": {"app": "server"}}, "policyTypes": ["Ingress"],
    "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "client"}}}]}],
})


@pytest.fixture(scope="module")
def node() -> Iterator[NodeEnv]:
    need_machine()
    with node_env() as env:
        env.add_pod("client", NS, {"app": "client"})
        env.serve(env.add_pod("server", NS, {"app": "server"}))
        env.add_pod("decoy", "e2e", {"app": "decoy"})
        yield env


def _flows(node: NodeEnv, **query: str) -> list[dict[str, Any]]:
    q = "&".join(f"{k}={v}" for k, v in {**query, "follow": "0"}.items())
    text = node.api.get_text(f"/monitor?{q}")
    return [json.loads(line)["flow"] for line in text.splitlines() if line.strip()]


def _wait_flow(node: NodeEnv, probe: Callable[[], object], want: Callable[[dict[str, Any]], bool],
               what: str, **query: str) -> dict[str, Any]:
    deadline = time.monotonic() + BOUND_S
    while time.monotonic() < deadline:
        probe()
        for flow in _flows(node, **query):
            if want(flow):
                return flow
        time.sleep(0.2)
    raise AssertionError(f"{what}: no such flow in {_flows(node, **query)[-5:]}\n"
                         f"{node.agent.logs()[-2000:]}")


def _identity(node: NodeEnv, pod: str) -> int:
    ident: int = node.endpoints()[pod]["identity"]
    return ident


def test_monitor_reports_denied_allowed_and_translated_connections(node: NodeEnv) -> None:
    server_ip = node.pods["server"].address(4)
    client = node.client_in(node.pods["client"])
    node.write("svc", service_manifest("web", VIP, [server_ip]))
    node.write("policies", CLIENT_EGRESS + "\n---\n" + SERVER_INGRESS)
    # policy in force: the client may reach the server on BACKEND_PORT only
    deadline = time.monotonic() + BOUND_S
    while client.tcp(server_ip, BACKEND_PORT + 1)[0].get("errno") is None:
        assert time.monotonic() < deadline, "the egress policy never took effect"
        time.sleep(0.1)
    c_id, s_id = _identity(node, "client"), _identity(node, "server")

    denied = _wait_flow(
        node, lambda: client.tcp(server_ip, BACKEND_PORT + 1),
        lambda f: f["verdict"] == "DROPPED" and f["l4"]["TCP"]["destination_port"]
        == BACKEND_PORT + 1, "denied egress", pod="web/client", type="drop")
    assert denied["drop_reason_desc"] in ("POLICY_DENIED", "POLICY_DENY")
    assert denied["traffic_direction"] == "EGRESS"
    assert denied["source"]["pod_name"] == "client" and denied["source"]["namespace"] == NS
    assert denied["source"]["identity"] == c_id
    assert denied["destination"]["pod_name"] == "server"
    assert denied["destination"]["identity"] == s_id
    assert any(lbl.endswith("app=client") for lbl in denied["source"]["labels"])
    assert denied["IP"]["destination"] == server_ip and denied["Type"] == "SOCK"

    allowed = _wait_flow(
        node, lambda: client.tcp(server_ip, BACKEND_PORT),
        lambda f: f["verdict"] == "FORWARDED"
        and f["l4"]["TCP"]["destination_port"] == BACKEND_PORT,
        "allowed egress", pod="client", type="policy")
    assert allowed["source"]["identity"] == c_id and allowed["destination"]["identity"] == s_id
    assert allowed["policy_lpm_prefix_length"] == 24  # protocol and the full port matched

    trace = _wait_flow(
        node, lambda: client.tcp(VIP, 80),
        lambda f: f.get("service_frontend") == f"{VIP}:80", "translation", type="trace")
    assert trace["destination_service"] == {"name": "web", "namespace": "e2e"}
    assert trace["IP"]["destination"] == server_ip
    assert trace["l4"]["TCP"]["destination_port"] == BACKEND_PORT
    assert trace["source"]["pod_name"] == "client"

    decoy = node.client_in(node.pods["decoy"])
    ingress = _wait_flow(
        node, lambda: decoy.tcp(server_ip, BACKEND_PORT),
        lambda f: f["verdict"] == "DROPPED" and f["traffic_direction"] == "INGRESS",
        "denied ingress", pod="server")
    assert ingress["source"]["identity"] == _identity(node, "decoy")
    assert ingress["destination"]["pod_name"] == "server"
    assert ingress["Type"] == "L3_L4" and ingress["drop_reason_desc"] == "POLICY_DENIED"

    stats = node.api.get("/monitor/stats")
    drops = {(d["reason"], d["direction"]): d["count"] for d in stats["drops"]}
    assert drops.get(("POLICY_DENIED", "egress"), 0) + drops.get(("POLICY_DENY", "egress"),
                                                                 0) >= 1
    assert drops.get(("POLICY_DENIED", "ingress"), 0) >= 1
    assert any(v["action"] == "allowed" for v in stats["policy_verdicts"])

    # The CLI: human lines and Hubble JSON, filtered.
    out = subprocess.run(
        [sys.executable, "-m", "statewright", "monitor", "--socket", node.agent.socket,
         "--no-follow", "--type", "drop", "-o", "json"],
        capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    docs = [json.loads(line) for line in out.stdout.splitlines()]
    assert docs and all(d["flow"]["verdict"] == "DROPPED" for d in docs)
    assert all({"flow", "node_name", "time"} <= set(d) for d in docs)
    out = subprocess.run(
        [sys.executable, "-m", "statewright", "monitor", "--socket", node.agent.socket,
         "--no-follow", "--pod", "web/client", "--verdict", "TRANSLATED"],
        capture_output=True, text=True, timeout=30)
    assert out.returncode == 0 and f"TRANSLATED {VIP}:80 (service e2e/web)" in out.stdout


VIP6 = "fd00:96::247:32"
VIP_UDP = "10.96.247.33"


def _service6(name: str, vip: str, backend: str) -> str:
    """An IPv6 ClusterIP Service ``e2e/<name>`` (TCP, port 80) and its EndpointSlice."""
    svc = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": "e2e"},
           "spec": {"clusterIP": vip, "ipFamilies": ["IPv6"],
                    "ports": [{"name": "p", "port": 80, "protocol": "TCP",
                               "targetPort": BACKEND_PORT}]}}
    eps = {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
           "metadata": {"name": f"{name}-1", "namespace": "e2e",
                        "labels": {"kubernetes.io/service-name": name}},
           "addressType": "IPv6", "endpoints": [{"addresses": [backend],
                                                 "conditions": {"ready": True}}],
           "ports": [{"name": "p", "port": BACKEND_PORT, "protocol": "TCP"}]}
    return f"{json.dumps(svc)}\n---\n{json.dumps(eps)}\n"


#: Five datagrams from one unconnected UDP socket, once a line arrives on stdin.
SENDER = """
import socket, sys
sys.stdin.readline()
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for _ in range(5):
    try:
        s.sendto(b"x", (sys.argv[1], 53))
    except OSError:
        pass
print("sent", flush=True)
"""


def test_monitor_reports_ipv6_connects(node: NodeEnv) -> None:
    """connect6: a translation to the IPv6 ClusterIP, a denied and an allowed connection
    of the client pod, as for IPv4 (the socket program, type SOCK, IPv6 addresses)."""
    server6 = node.pods["server"].address(6)
    client = node.client_in(node.pods["client"])
    node.write("svc6", _service6("web6", VIP6, server6))
    node.write("policies", CLIENT_EGRESS + "\n---\n" + SERVER_INGRESS)
    c_id, s_id = _identity(node, "client"), _identity(node, "server")
    trace = _wait_flow(
        node, lambda: client.tcp(VIP6, 80),
        lambda f: f.get("service_frontend") == f"[{VIP6}]:80", "IPv6 translation",
        type="trace")
    assert trace["destination_service"] == {"name": "web6", "namespace": "e2e"}
    assert trace["IP"]["destination"] == server6 and trace["IP"]["ipVersion"] == "IPv6"
    assert trace["l4"]["TCP"]["destination_port"] == BACKEND_PORT
    assert trace["source"]["pod_name"] == "client" and trace["Type"] == "SOCK"
    denied = _wait_flow(
        node, lambda: client.tcp(server6, BACKEND_PORT + 1),
        lambda f: f["verdict"] == "DROPPED" and f["IP"]["destination"] == server6,
        "denied IPv6 egress", pod="web/client", type="drop")
    assert denied["drop_reason_desc"] in ("POLICY_DENIED", "POLICY_DENY")
    assert denied["source"]["identity"] == c_id and denied["destination"]["identity"] == s_id
    assert denied["traffic_direction"] == "EGRESS"
    allowed = _wait_flow(
        node, lambda: client.tcp(server6, BACKEND_PORT),
        lambda f: f["verdict"] == "FORWARDED" and f["IP"]["destination"] == server6,
        "allowed IPv6 egress", pod="client", type="policy")
    assert allowed["policy_lpm_prefix_length"] == 24
    assert allowed["destination"]["pod_name"] == "server"


def test_monitor_reports_unconnected_udp(node: NodeEnv) -> None:
    """sendmsg4: an unconnected socket's datagrams to a UDP ClusterIP. The translation is
    reported for its first datagram to the backend only, the egress denial (the client
    may send TCP only) for every one."""
    server_ip = node.pods["server"].address(4)
    node.write("svc-udp", service_manifest("dns", VIP_UDP, [server_ip], port=53, proto="UDP"))
    node.write("policies", CLIENT_EGRESS + "\n---\n" + SERVER_INGRESS)
    client = node.client_in(node.pods["client"])
    _wait_flow(node, lambda: client.udp(VIP_UDP, 53),
               lambda f: f.get("service_frontend") == f"{VIP_UDP}:53", "UDP translation",
               type="trace")

    def count(kind: str) -> int:
        return sum(1 for f in _flows(node, type=kind, pod="web/client")
                   if "UDP" in f.get("l4", {}) and f["IP"]["destination"] == server_ip)

    traces, drops = count("trace"), count("drop")
    sender = node.run_in(node.pods["client"], sys.executable, "-c", SENDER, VIP_UDP)
    with open(f"{node.cgroup}/cgroup.procs", "w", encoding="ascii") as f:
        f.write(str(sender.pid))
    assert sender.stdin is not None and sender.stdout is not None
    sender.stdin.write("go\n")
    sender.stdin.flush()
    assert sender.stdout.readline().strip() == "sent"
    deadline = time.monotonic() + BOUND_S
    while count("drop") < drops + 5:
        assert time.monotonic() < deadline, f"drops: {count('drop') - drops} of 5"
        time.sleep(0.2)
    assert count("trace") == traces + 1
    drop = [f for f in _flows(node, type="drop", pod="web/client") if "UDP" in f["l4"]][-1]
    assert drop["drop_reason_desc"] in ("POLICY_DENIED", "POLICY_DENY")
    assert drop["l4"]["UDP"]["destination_port"] == BACKEND_PORT


def _explain(node: NodeEnv, *args: str) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-m", "statewright", "explain", *args, "--socket", node.agent.socket,
         "-o", "json"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stdout + out.stderr
    doc: dict[str, Any] = json.loads(out.stdout)
    return doc


def test_explain_on_kernel_maps(node: NodeEnv) -> None:
    """`statewright explain` on the node's kernel maps: the client pod's ipcache entry
    back to its pod, and the pod to every entry it produced (endpoint map, ipcache,
    policy maps, ``policy_maps``, ``policy_netns``, ``policy_endpoints``), each of which
    explains back to the pod."""
    node.write("policies", CLIENT_EGRESS + "\n---\n" + SERVER_INGRESS)
    client_ip = node.pods["client"].address(4)
    entry = _explain(node, "ipcache", client_ip)
    assert entry["present"] and entry["rows"][0]["owner"].startswith("endpoint:")
    assert [(o["kind"], o["name"]) for o in entry["objects"]] == [("Pod", "client")]
    assert entry["value"]["sec_identity"] == _identity(node, "client")

    def maps() -> set[str]:
        listed = _explain(node, "pod", f"{NS}/client")["entries"]
        return {e["map"].rstrip("0123456789") for e in listed}

    want = {"endpoints", "ipcache", "cilium_policy_v2_", "policy_maps", "policy_netns",
            "policy_endpoints"}
    deadline = time.monotonic() + BOUND_S
    while maps() != want:
        assert time.monotonic() < deadline, maps()
        time.sleep(0.2)
    for e in _explain(node, "pod", f"{NS}/client")["entries"]:
        key = e["key"]
        text = " ".join(f"{k}={v}" for k, v in key.items()) if isinstance(key, dict) else str(
            key)
        back = _explain(node, e["map"], text)
        assert ("Pod", "client") in {(o["kind"], o["name"]) for o in back["objects"]}, (e, back)
