"""A whole node in network namespaces: the node side in a namespace of its own, the real
agent running in it, and pods made by calling ``statewright-cni`` as a container runtime
does. Used by tests/e2e/test_node.py.

* ``node``: a network namespace (loopback up) where the agent runs, with ``--sysctl``
  (it turns forwarding on there, as on a real node)
  (``nsenter --net``: only the network namespace changes, so bpffs and the cgroup2 mount
  stay visible; ``ip netns exec`` would remount /sys) with kernel maps pinned under a
  unique directory, its state directory and API socket in a temporary directory, its
  manifests directory, and the socket LB attached to the test's cgroup;
* pods: one network namespace each, connected by ``statewright-cni ADD`` run in the node
  namespace with ``CNI_*`` variables and the network configuration on stdin
  (tests/endpoints/test_cni.py's ``run_plugin``); their processes (backend servers,
  clients) run in the pod's namespace *and* in the test cgroup, so the socket LB
  translates their service connections.

Nothing here changes the machine's real routes: every address lives in a namespace the
harness created. Everything is removed when :func:`node_env` exits, also on failure:
processes by their PIDs, the agent's pins and links (``statewright agent --cleanup``),
the cgroup, the pod and node namespaces (veths, addresses and routes go with them) and
the temporary directory.
"""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any

from statewright.agent.client import AgentClient
from tests.agent.conftest import start_agent
from tests.datapath.conftest import SERVER, Client, _readline, _run, _run_quiet
from tests.datapath.conftest import _start as _start_proc
from tests.datapath.conftest import _stop as _stop_proc
from tests.e2e.harness import (
    BACKEND_PORT,
    Agent,
    E2EEnv,
    _cleanup_agent_state,
    _start_client,
    check_machine,
    leftovers,
    scratch,
)
from tests.endpoints.test_cni import run_plugin

#: The node's pod CIDRs (addresses exist only inside the test's namespaces).
POD_CIDRS = ("10.247.0.0/24", "fd00:247::/112")
CNI_CONF: dict[str, Any] = {
    "cniVersion": "1.0.0",
    "name": "statewright",
    "type": "statewright-cni",
    "mtu": 1400,
}


@dataclass
class Pod:
    """One pod: its namespace, the CNI environment it was added with and the ADD result."""

    name: str
    netns: str
    env: dict[str, str]
    result: dict[str, Any] = field(default_factory=dict)

    def address(self, version: int) -> str:
        """The pod's IPv4 or IPv6 address from the ADD result."""
        for entry in self.result.get("ips", []):
            iface = ipaddress.ip_interface(entry["address"])
            if iface.version == version:
                return str(iface.ip)
        raise KeyError(f"pod {self.name}: no IPv{version} address in {self.result}")


@dataclass
class NodeAgent(Agent):
    """The agent started inside the node namespace (``nsenter --net``, which execs it)."""

    netns: str = ""

    def start(self) -> None:
        """Start the agent in the node namespace and wait until its API answers."""
        prefix = ["nsenter", f"--net=/var/run/netns/{self.netns}"]
        # its kernel settings are the node namespace's: it sets them, as on a real node
        args = [*self.args, "--sysctl"]
        self.proc = start_agent(args, self.socket, self.log, timeout=30, prefix=prefix)
        self.started.append(self.proc)


@dataclass
class NodeEnv(E2EEnv):
    """The node (``ns`` is the node namespace; ``client`` runs there, in the test cgroup),
    its pods and the agent's API."""

    conf: dict[str, Any] = field(default_factory=dict)
    pods: dict[str, Pod] = field(default_factory=dict)
    servers: list[subprocess.Popen[str]] = field(default_factory=list)
    tag: str = ""

    @property
    def api(self) -> AgentClient:
        """A client of the agent's API socket."""
        return AgentClient(self.agent.socket, timeout=10)

    def cni(self, command: str, pod: Pod, conf: dict[str, Any] | None = None) -> tuple[int, Any]:
        """Run ``statewright-cni COMMAND`` for ``pod`` in the node namespace."""
        return run_plugin(command, conf or self.conf, self.ns, **pod.env)

    def add_pod(
        self, name: str, namespace: str = "e2e", labels: dict[str, str] | None = None,
        ports: list[dict[str, Any]] | None = None,
    ) -> Pod:
        """A new pod namespace connected by CNI ADD (removed with the environment): the pod
        ``namespace/name`` in ``CNI_ARGS``, its ``labels`` in the configuration's
        ``args.cni.labels`` and its container ``ports`` in ``args.cni.ports``, as a
        runtime passes them."""
        netns = f"swnp-{name}-{self.tag}"
        _run("ip", "netns", "add", netns)
        self._stack.callback(_run_quiet, "ip", "netns", "del", netns)
        env = {
            "CNI_CONTAINERID": f"ctr-{name}-{self.tag}",
            "CNI_IFNAME": "eth0",
            "CNI_NETNS": f"/var/run/netns/{netns}",
            "CNI_ARGS": f"IgnoreUnknown=1;K8S_POD_NAMESPACE={namespace};K8S_POD_NAME={name}",
        }
        pod = Pod(name, netns, env)
        conf = self.conf
        cni_args: dict[str, Any] = {}
        if labels:
            cni_args["labels"] = [{"key": k, "value": v} for k, v in sorted(labels.items())]
        if ports:
            cni_args["ports"] = ports
        if cni_args:
            conf = {**conf, "args": {"cni": cni_args}}
        rc, result = self.cni("ADD", pod, conf)
        if rc != 0:
            raise RuntimeError(f"CNI ADD {name}: {result}\n{self.agent.logs()[-3000:]}")
        pod.result = result
        self.pods[name] = pod
        return pod

    def serve(self, pod: Pod) -> None:
        """Backend servers (TCP, port BACKEND_PORT, both families) in ``pod``'s namespace
        and the test cgroup."""
        specs = [f"tcp:{pod.address(4)}:{BACKEND_PORT}", f"tcp:[{pod.address(6)}]:{BACKEND_PORT}"]
        proc = _start_proc("ip", "netns", "exec", pod.netns, sys.executable, SERVER, *specs)
        self._stack.callback(_stop_proc, proc)
        self.servers.append(proc)
        with open(os.path.join(self.cgroup, "cgroup.procs"), "w", encoding="ascii") as f:
            f.write(str(proc.pid))
        if _readline(proc, 10, f"servers of {pod.name}").strip() != "ready":
            raise RuntimeError(f"servers of {pod.name} did not start")

    def run_in(self, pod: Pod, *argv: str) -> subprocess.Popen[str]:
        """A process (pipes on stdin/stdout) in ``pod``'s namespace, outside the test
        cgroup; stopped by its PID with the environment."""
        proc = _start_proc("ip", "netns", "exec", pod.netns, *argv)
        self._stack.callback(_stop_proc, proc)
        self.servers.append(proc)
        return proc

    def client_in(self, pod: Pod) -> Client:
        """A client process in ``pod``'s namespace and the test cgroup."""
        client = _start_client(pod.netns, self.cgroup)
        self._stack.callback(_stop_proc, client.proc)
        return client

    def endpoints(self) -> dict[str, dict[str, Any]]:
        """The agent's endpoints by pod name (``GET /endpoint``)."""
        return {ep["k8s-pod-name"]: ep for ep in self.api.get("/endpoint")}

    def map_entries(self, name: str) -> list[dict[str, Any]]:
        """The decoded entries of the agent's map ``name`` (``GET /bpf/maps/{name}``)."""
        entries: list[dict[str, Any]] = self.api.get(f"/bpf/maps/{name}")["entries"]
        return entries

    def node_link(self, ifname: str) -> dict[str, Any] | None:
        """``ip -j link show`` of an interface in the node namespace, or None."""
        out = subprocess.run(["ip", "-n", self.ns, "-j", "link", "show", ifname],
                             capture_output=True, text=True)
        if out.returncode != 0:
            return None
        links: list[dict[str, Any]] = json.loads(out.stdout)
        return links[0] if links else None

    def node_routes(self) -> str:
        """The node namespace's IPv4 and IPv6 routes (``ip route`` text)."""
        out = [subprocess.run(["ip", "-n", self.ns, f"-{fam}", "route"], capture_output=True,
                              text=True).stdout for fam in (4, 6)]
        return "".join(out)


def _setup_node_netns(ns: str) -> None:
    """Loopback up (a namespace without local addresses resolves every neighbour as
    broadcast). Forwarding stays off as a new namespace has it: the agent, run inside,
    turns it on (its ``sysctl`` component), as it must on a real node."""
    _run("ip", "-n", ns, "link", "set", "lo", "up")


def check_node_machine() -> None:
    """What :func:`tests.e2e.harness.check_machine` checks, plus nsenter."""
    from tests.e2e.harness import EnvUnavailable

    check_machine()
    if shutil.which("nsenter") is None:
        raise EnvUnavailable("nsenter (util-linux) not installed")


@contextmanager
def node_env(extra_config: dict[str, Any] | None = None) -> Iterator[NodeEnv]:
    """Create the node namespace, cgroup and agent; remove everything after (module doc).
    Pods are added by the caller (`NodeEnv.add_pod`); ``extra_config``: more configuration
    keys for the agent."""
    check_node_machine()
    with ExitStack() as stack:
        tag = f"{os.getpid() % 100000}-{uuid.uuid4().hex[:4]}"
        sc = scratch(stack, "node", tag, _setup_node_netns)
        socket = str(sc.tmp / "agent.sock")
        cfg_file = sc.agent_config_file(**{"pod-cidrs": list(POD_CIDRS), **(extra_config or {})})
        agent = NodeAgent(["--config", str(cfg_file)], socket, sc.tmp / "agent.log", netns=sc.ns)
        stack.callback(_cleanup_agent_state, sc.pin_dir, socket, sc.cgroup, sc.ns)
        stack.callback(agent.stop)
        agent.start()
        client = _start_client(sc.ns, sc.cgroup)  # a host-network process of the node
        stack.callback(_stop_proc, client.proc)
        yield NodeEnv(sc.ns, sc.cgroup, sc.pin_dir, sc.manifests, agent, client, stack,
                      conf={**CNI_CONF, "agent-socket": socket}, tag=tag)


def node_leftovers(env: NodeEnv) -> list[str]:
    """What of ``env`` still exists (call after :func:`node_env` exited)."""
    left = leftovers(env)
    left += [f"netns {p.netns}" for p in env.pods.values()
             if os.path.exists(f"/var/run/netns/{p.netns}")]
    left += [f"server pid {p.pid}" for p in env.servers if p.poll() is None]
    return left
