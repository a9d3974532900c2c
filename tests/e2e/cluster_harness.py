"""A cluster of three nodes in network namespaces: the proof bed of issue #25.

* ``underlay``: a network namespace with a bridge (``br0``), the cluster's network. The
  fake API server (tests/k8s/fake_apiserver.py) runs in this test process and listens on
  the bridge's address (`API_HOST`), its socket made inside the underlay namespace: the
  agents reach it over the bridge, as real agents reach kube-apiserver.
* three nodes: each a network namespace whose ``eth0`` is a veth port of the bridge
  (``192.168.200.<i>/24`` and ``fd20:200::<i>/64``, the Node's InternalIPs), forwarding
  on, running the whole agent (``nsenter --net``) with its own pin directory, state
  directory, cgroup, API socket and manifests directory, netlink on (its devices say
  which networks are directly connected), ``auto-direct-node-routes: true`` and the API
  server in its kubeconfig; no ``pod-cidrs``: IPAM takes the Node's ``spec.podCIDRs``
  (``10.248.<i>.0/24``, ``fd00:248:<i>::/112``).
* the test plays the kubelet and the control plane: it writes the Node objects (and
  Services, EndpointSlices...) into the fake API server, and creates pods with
  ``statewright-cni`` on each node (tests/e2e/node_harness.py's `NodeEnv`).

* kvstore mode (``cluster_env(kvstore=True)``): an etcd member runs in the underlay
  namespace on the bridge's address (`API_HOST`, port 2379; data under the bed's
  temporary directory; stopped by PID), and every agent runs with
  ``identity-allocation-mode: kvstore`` and an etcd config file naming it: identities,
  remote endpoints and the other nodes go through etcd, Services, Pods and policies
  still come from the API server. `ClusterEnv.etcd_keys` reads etcd from the test.

Nothing here touches the machine's own routes: every address and route lives in a
namespace the bed created. Everything is removed when :func:`cluster_env` exits, also on
failure: processes by PID, the agents' pins and links, cgroups, every namespace (the
veths, addresses and routes go with them), the API server and temporary directories.

Reusable: `ClusterEnv` gives each node's `NodeEnv` (pods, clients, its agent's API), the
API server, the Node objects and helpers to look at routes and ipcache entries; further
tests (identities, policy across nodes) take the same fixture.
"""

from __future__ import annotations

import ctypes
import ipaddress
import json
import os
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from statewright.node_routes import RTPROT_STATEWRIGHT
from tests.datapath.conftest import _run, _run_quiet
from tests.datapath.conftest import _stop as _stop_proc
from tests.e2e.harness import EnvUnavailable, _cleanup_agent_state, _start_client, scratch
from tests.e2e.node_harness import (
    CNI_CONF,
    NodeAgent,
    NodeEnv,
    _setup_node_netns,
    check_node_machine,
)
from tests.k8s.fake_apiserver import FakeAPIServer
from tests.kvstore.etcd_cluster import EtcdCluster, etcd_available, in_netns

NODES = 3
API_HOST = "192.168.200.254"
API_HOST6 = "fd20:200::fe"
#: How long the bed waits for anything to converge (bounded waits, never measured).
BOUND = 30.0
CLONE_NEWNET = 0x40000000


def node_name(i: int) -> str:
    """The name of node ``i`` (1-based)."""
    return f"node-{i}"


def node_ips(i: int) -> tuple[str, str]:
    """Node ``i``'s InternalIPs (IPv4, IPv6) on the underlay."""
    return f"192.168.200.{i}", f"fd20:200::{i}"


def pod_cidrs(i: int) -> tuple[str, str]:
    """Node ``i``'s pod CIDRs (IPv4, IPv6)."""
    return f"10.248.{i}.0/24", f"fd00:248:{i}::/112"


def node_object(i: int) -> dict[str, Any]:
    """Node ``i`` as the kubelet and the node IPAM controller make it."""
    v4, v6 = node_ips(i)
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": node_name(i), "labels": {"kubernetes.io/hostname": node_name(i)}},
        "spec": {"podCIDR": pod_cidrs(i)[0], "podCIDRs": list(pod_cidrs(i))},
        "status": {"addresses": [{"type": "InternalIP", "address": v4},
                                 {"type": "InternalIP", "address": v6},
                                 {"type": "Hostname", "address": node_name(i)}]},
    }


def _setns(path: str) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(path, os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns {path}: {os.strerror(err)}")
    finally:
        os.close(fd)


def api_server_in(netns: str) -> FakeAPIServer:
    """A fake API server whose listening socket lives in ``netns`` (made by a thread of its
    own that enters the namespace and ends: no other thread changes namespace)."""
    out: list[FakeAPIServer | BaseException] = []

    def make() -> None:
        try:
            _setns(f"/var/run/netns/{netns}")
            out.append(FakeAPIServer(host=API_HOST))
        except BaseException as e:  # handed to the caller
            out.append(e)

    t = threading.Thread(target=make)
    t.start()
    t.join()
    if isinstance(out[0], BaseException):
        raise out[0]
    return out[0]


@dataclass
class ClusterEnv:
    """The underlay namespace, the API server and the three nodes (module doc)."""

    underlay: str
    apiserver: FakeAPIServer
    nodes: list[NodeEnv]
    kubeconfig: str
    _stack: ExitStack = field(repr=False)
    #: The bed's etcd in kvstore mode, else None.
    etcd: EtcdCluster | None = None

    def etcd_keys(self, prefix: str) -> dict[str, str]:
        """Every key under ``prefix`` in the bed's etcd and its value (kvstore mode)."""
        assert self.etcd is not None, "not a kvstore-mode bed"
        return etcd_range(self.etcd, prefix)

    def node(self, i: int) -> NodeEnv:
        """Node ``i`` (1-based)."""
        return self.nodes[i - 1]

    def our_routes(self, i: int) -> set[tuple[str, str]]:
        """(destination, gateway) of the routes of the agents' protocol in node ``i``."""
        out = set()
        for fam in ("-4", "-6"):
            r = subprocess.run(["ip", "-j", fam, "-n", self.node(i).ns, "route", "show",
                                "proto", str(RTPROT_STATEWRIGHT)],
                               capture_output=True, text=True, check=True)
            out |= {(e["dst"], e.get("gateway", "")) for e in json.loads(r.stdout or "[]")}
        return out

    def expected_routes(self, i: int, nodes: tuple[int, ...] = (1, 2, 3)) -> set[tuple[str, str]]:
        """The routes node ``i`` should have to the other ``nodes``."""
        return {(cidr, gw) for j in nodes if j != i
                for cidr, gw in zip(pod_cidrs(j), node_ips(j), strict=True)}

    def ipcache(self, i: int) -> dict[str, dict[str, Any]]:
        """Node ``i``'s agent's desired ipcache rows by prefix (``GET /ipcache``)."""
        doc = self.node(i).api.get("/ipcache")
        return {e["prefix"]: e for e in doc["entries"]}

    def writes(self, i: int) -> dict[str, int]:
        """Map and route writes (and adopted entries) of node ``i``'s agent since start."""
        doc = self.node(i).api.get("/ipcache")["writes"]
        routes = self.node(i).api.get("/nodes")["route_ops"]
        return {
            "ipcache": doc["ipcache"]["writes"],
            "endpoint-map": doc["endpoint-map"]["writes"],
            "routes": routes["writes"],
            "route-deletes": routes["deletes"],
            "routes-adopted": routes["skipped"],
        }

    def ipcache_map(self, i: int) -> dict[str, dict[str, Any]]:
        """Node ``i``'s pinned ipcache map entries by prefix (as the map holds them)."""
        out = {}
        for e in self.node(i).map_entries("ipcache"):
            k = e["key"]
            fam = 4 if k["family"] == 1 else 6
            raw = ipaddress.ip_address(k["ip"])
            addr = ipaddress.ip_address(raw.packed[:4]) if fam == 4 and raw.version == 6 else raw
            out[f"{addr}/{k['prefixlen'] - 32}"] = e["value"]
        return out

    def wait(self, check: Callable[[], Any], what: str, bound: float = BOUND) -> Any:
        """Poll ``check`` until it returns something true; AssertionError with the agents'
        log tails after ``bound`` seconds."""
        deadline = time.monotonic() + bound
        last: Any = None
        while True:
            try:
                last = check()
                if last:
                    return last
            except AssertionError as e:
                last = e
            if time.monotonic() > deadline:
                tails = "\n".join(f"--- {n.ns}:\n{n.agent.logs()[-2000:]}" for n in self.nodes)
                raise AssertionError(f"not within {bound} s: {what} (last: {last})\n{tails}")
            time.sleep(0.1)

    def api_unreachable(self) -> None:
        """Take the API server's addresses off the bridge: no agent reaches it."""
        for addr in (f"{API_HOST}/24", f"{API_HOST6}/64"):
            _run("ip", "-n", self.underlay, "addr", "del", addr, "dev", "br0")

    def api_reachable(self) -> None:
        """Put the API server's addresses back."""
        _run("ip", "-n", self.underlay, "addr", "add", f"{API_HOST}/24", "dev", "br0")
        _run("ip", "-n", self.underlay, "addr", "add", f"{API_HOST6}/64", "dev", "br0", "nodad")


def _setup_underlay(ns: str) -> None:
    _run("ip", "-n", ns, "link", "set", "lo", "up")
    _run("ip", "-n", ns, "link", "add", "br0", "type", "bridge")
    _run("ip", "-n", ns, "addr", "add", f"{API_HOST}/24", "dev", "br0")
    _run("ip", "-n", ns, "addr", "add", f"{API_HOST6}/64", "dev", "br0", "nodad")
    _run("ip", "-n", ns, "link", "set", "br0", "up")


def _plug(underlay: str, i: int) -> Callable[[str], None]:
    """The set-up of node ``i``'s namespace: loopback, forwarding, and its port on br0."""

    def setup(ns: str) -> None:
        _setup_node_netns(ns)
        v4, v6 = node_ips(i)
        _run("ip", "-n", underlay, "link", "add", f"port{i}", "type", "veth", "peer", "name",
             "eth0", "netns", ns)
        _run("ip", "-n", underlay, "link", "set", f"port{i}", "master", "br0", "up")
        _run("ip", "-n", ns, "addr", "add", f"{v4}/24", "dev", "eth0")
        _run("ip", "-n", ns, "addr", "add", f"{v6}/64", "dev", "eth0", "nodad")
        _run("ip", "-n", ns, "link", "set", "eth0", "up")

    return setup


def _start_node(stack: ExitStack, underlay: str, tag: str, i: int, kubeconfig: str,
                extra: dict[str, Any]) -> NodeEnv:
    sc = scratch(stack, f"cn{i}", tag, _plug(underlay, i))
    sock = str(sc.tmp / "agent.sock")
    cfg = sc.agent_config_file(**{
        "netlink": True,
        "node-name": node_name(i),
        "k8s-kubeconfig": kubeconfig,
        "auto-direct-node-routes": True,
        **extra,
    })
    agent = NodeAgent(["--config", str(cfg)], sock, sc.tmp / "agent.log", netns=sc.ns)
    stack.callback(_cleanup_agent_state, sc.pin_dir, sock, sc.cgroup, sc.ns)
    stack.callback(agent.stop)
    agent.start()
    client = _start_client(sc.ns, sc.cgroup)
    stack.callback(_stop_proc, client.proc)
    return NodeEnv(sc.ns, sc.cgroup, sc.pin_dir, sc.manifests, agent, client, stack,
                   conf={**CNI_CONF, "agent-socket": sock}, tag=f"{i}{tag}")


def etcd_range(etcd: EtcdCluster, prefix: str) -> dict[str, str]:
    """Every key under ``prefix`` and its value, read over etcd's JSON gateway (from the
    bed's underlay namespace when etcd runs there)."""
    import base64
    import urllib.request

    def b64(raw: bytes) -> str:
        return base64.b64encode(raw).decode()

    end = bytearray(prefix.encode())
    end[-1] += 1
    body = json.dumps({"key": b64(prefix.encode()), "range_end": b64(bytes(end))}).encode()
    req = urllib.request.Request(etcd.members[0].client_url + "/v3/kv/range", data=body,
                                 method="POST")

    def get() -> dict[str, str]:
        with urllib.request.urlopen(req, timeout=5.0) as resp:
            kvs = json.loads(resp.read()).get("kvs") or []
        return {base64.b64decode(kv["key"]).decode(): base64.b64decode(kv.get("value", "")).decode()
                for kv in kvs}

    return in_netns(etcd.netns, get) if etcd.netns else get()


def _start_etcd(stack: ExitStack, underlay: str, tmp: str) -> tuple[EtcdCluster, dict[str, Any]]:
    """One etcd member in the underlay on the bridge's address; the agents' configuration
    keys of kvstore mode."""
    etcd = EtcdCluster(Path(tmp) / "etcd", size=1, host=API_HOST, netns=underlay)
    stack.callback(etcd.stop)
    etcd.start()
    config = Path(tmp) / "etcd.config"
    config.write_text(f"endpoints: [{etcd.members[0].client_url}]\n")
    return etcd, {"identity-allocation-mode": "kvstore", "kvstore": "etcd",
                  "kvstore-opt": {"etcd.config": str(config)}}


@contextmanager
def cluster_env(agent_config: dict[str, Any] | None = None,
                kvstore: bool = False) -> Iterator[ClusterEnv]:
    """Create the underlay, the API server (with the three Node objects) and the three
    nodes with their agents; remove everything after (module doc). ``agent_config``: more
    configuration keys for every agent; ``kvstore``: the bed in kvstore mode."""
    check_node_machine()
    if kvstore and not etcd_available():
        raise EnvUnavailable("etcd not installed (make setup installs Debian's etcd-server)")
    with ExitStack() as stack:
        tag = f"{os.getpid() % 100000}-{uuid.uuid4().hex[:4]}"
        underlay = f"swul-{tag}"
        _run("ip", "netns", "add", underlay)
        stack.callback(_run_quiet, "ip", "netns", "del", underlay)
        _setup_underlay(underlay)
        apiserver = api_server_in(underlay).start()
        stack.callback(apiserver.stop)
        for i in range(1, NODES + 1):
            apiserver.upsert(node_object(i))
        tmp = scratch_dir(stack, tag)
        kubeconfig = apiserver.write_kubeconfig(os.path.join(tmp, "kubeconfig"))
        etcd, extra = _start_etcd(stack, underlay, tmp) if kvstore else (None, {})
        extra.update(agent_config or {})
        nodes = [_start_node(stack, underlay, tag, i, kubeconfig, extra)
                 for i in range(1, NODES + 1)]
        yield ClusterEnv(underlay, apiserver, nodes, kubeconfig, stack, etcd)


def scratch_dir(stack: ExitStack, tag: str) -> str:
    """A temporary directory removed by ``stack``."""
    import shutil
    import tempfile

    path = tempfile.mkdtemp(prefix=f"statewright-cluster-{tag}-")
    stack.callback(shutil.rmtree, path, True)
    return path


def cluster_leftovers(env: ClusterEnv) -> list[str]:
    """What of ``env`` still exists (call after :func:`cluster_env` exited)."""
    from tests.e2e.node_harness import node_leftovers

    left = [f"netns {env.underlay}"] if os.path.exists(f"/var/run/netns/{env.underlay}") else []
    for n in env.nodes:
        left += node_leftovers(n)
    return left
