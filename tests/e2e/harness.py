"""The end-to-end environment: a network namespace with backend servers, a cgroup, the real
agent (``statewright agent`` as a subprocess on kernel maps with the socket LB attached to
that cgroup), manifests written by the caller, and clients in the namespace and cgroup.

Shared by tests/e2e (the fixture in conftest.py) and benchmarks/e2e.py. It reuses the
pieces of the datapath and agent tests (backend server, client process, agent start and
stop); nothing here edits them.

Everything is created by :func:`e2e_env` and removed when it exits, also on failure: the
client and server processes and the agent (stopped by their own PIDs), the agent's pins
and links (``statewright agent --cleanup``, then a direct clean-up of what is left), the
cgroup and the namespace. The service addresses have no route in the namespace (it has
only ``lo``), so a connection the datapath did not translate fails with ENETUNREACH
instead of leaving the machine; NodePorts are reached on 127.0.0.1 inside the namespace.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.agent.conftest import REPO, start_agent, state_dir_of, stop_agent
from tests.datapath.conftest import (
    CLIENT,
    SERVER,
    Client,
    _readline,
    _remove_cgroup,
    _run,
    _run_quiet,
    _start,
    _stop,
)
from tests.pins import remove_pin_dir

BPFFS = "/sys/fs/bpf"
BACKEND_PORT = 8080
#: Backend addresses on the namespace's loopback device; services select subsets.
BACKENDS = tuple(f"10.245.0.{11 + i}" for i in range(6))
#: Extra client source addresses (maglev hashes on the client).
CLIENT_SOURCES = tuple(f"10.245.1.{100 + i}" for i in range(12))
#: How often the agent polls the manifests directory.
MANIFESTS_INTERVAL = 0.1


class EnvUnavailable(RuntimeError):
    """The machine cannot run the end-to-end environment (the reason says why)."""


def ident(host: str, port: int = BACKEND_PORT) -> str:
    """How a backend server names itself."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def ids(results: Sequence[dict[str, Any]]) -> list[str]:
    """Backend identities of client results; raises on any failed connection."""
    errors = [r for r in results if "errno" in r]
    if errors:
        raise AssertionError(f"{len(errors)} of {len(results)} connections failed: {errors[:3]}")
    return [str(r["id"]) for r in results]


# ----- manifests -----------------------------------------------------------------------------

ACTIVE = "active"
TERMINATING = "terminating"


def service_manifest(
    name: str,
    vip: str,
    backends: Sequence[str | tuple[str, str]],
    *,
    port: int = 80,
    proto: str = "TCP",
    node_port: int | None = None,
    annotations: dict[str, str] | None = None,
    affinity_timeout: int | None = None,
) -> str:
    """A Service ``e2e/<name>`` on ``vip``:``port`` and its EndpointSlice on BACKEND_PORT.

    ``backends`` are addresses (ready) or ``(address, ACTIVE|TERMINATING)`` pairs; with
    ``node_port`` the service is of type NodePort; with ``affinity_timeout`` it has
    ClientIP session affinity with that timeout."""
    spec: dict[str, Any] = {
        "type": "NodePort" if node_port else "ClusterIP",
        "clusterIP": vip,
        "ports": [{"name": "p", "port": port, "protocol": proto, "targetPort": BACKEND_PORT,
                   **({"nodePort": node_port} if node_port else {})}],
    }
    if affinity_timeout is not None:
        spec["sessionAffinity"] = "ClientIP"
        spec["sessionAffinityConfig"] = {"clientIP": {"timeoutSeconds": affinity_timeout}}
    endpoints = []
    for b in backends:
        addr, state = (b, ACTIVE) if isinstance(b, str) else b
        cond = ({"ready": True} if state == ACTIVE
                else {"ready": False, "serving": True, "terminating": True})
        endpoints.append({"addresses": [addr], "conditions": cond})
    svc = {"apiVersion": "v1", "kind": "Service",
           "metadata": {"name": name, "namespace": "e2e", "annotations": annotations or {}},
           "spec": spec}
    eps = {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
           "metadata": {"name": f"{name}-1", "namespace": "e2e",
                        "labels": {"kubernetes.io/service-name": name}},
           "addressType": "IPv4", "endpoints": endpoints,
           "ports": [{"name": "p", "port": BACKEND_PORT, "protocol": proto}]}
    # JSON is YAML; one document per line keeps it unambiguous.
    return f"{json.dumps(svc)}\n---\n{json.dumps(eps)}\n"


# ----- the environment -------------------------------------------------------------------------


@dataclass
class Agent:
    """The agent subprocess and how to start it again."""

    args: list[str]
    socket: str
    log: Path
    proc: subprocess.Popen[str] | None = None
    started: list[subprocess.Popen[str]] = field(default_factory=list)

    def start(self) -> None:
        """Start the agent and wait until its API answers."""
        self.proc = start_agent(self.args, self.socket, self.log, timeout=30)
        self.started.append(self.proc)

    def kill(self) -> None:
        """SIGKILL the agent (by its PID) and reap it."""
        if self.proc is not None:
            stop_agent(self.proc, signal.SIGKILL)
            self.proc = None

    def stop(self) -> None:
        """Stop the agent gracefully (SIGTERM, then SIGKILL after a timeout)."""
        if self.proc is not None:
            stop_agent(self.proc)
            self.proc = None

    def logs(self) -> str:
        """What the agent logged so far."""
        return self.log.read_text(errors="replace") if self.log.exists() else ""


@dataclass
class E2EEnv:
    """What the end-to-end tests and the benchmark work with."""

    ns: str
    cgroup: str
    pin_dir: str
    manifests: Path
    agent: Agent
    client: Client
    _stack: ExitStack = field(repr=False)

    def write(self, name: str, text: str) -> float:
        """Atomically replace manifest ``name``.yaml; return ``time.monotonic()`` after."""
        tmp = self.manifests / f".{name}.tmp"
        tmp.write_text(text)
        os.replace(tmp, self.manifests / f"{name}.yaml")
        return time.monotonic()

    def remove(self, name: str) -> float:
        """Delete manifest ``name``.yaml; return ``time.monotonic()`` after."""
        (self.manifests / f"{name}.yaml").unlink()
        return time.monotonic()

    def new_client(self) -> Client:
        """Another client process in the namespace and cgroup (stopped with the env)."""
        client = _start_client(self.ns, self.cgroup)
        self._stack.callback(_stop, client.proc)
        return client

    def converge(
        self,
        host: str,
        port: int,
        done: Callable[[list[dict[str, Any]]], bool],
        since: float,
        timeout: float = 10.0,
        batch: int = 10,
        client: Client | None = None,
    ) -> float:
        """Connect in batches of ``batch`` until ``done(results)``; return the seconds since
        ``since`` (a manifest change). Raises AssertionError after ``timeout``."""
        c = client or self.client
        last: list[dict[str, Any]] = []
        while time.monotonic() - since < timeout:
            last = c.tcp(host, port, count=batch)
            if done(last):
                return time.monotonic() - since
        raise AssertionError(
            f"{host}:{port}: not converged within {timeout} s; last results {last[:5]}\n"
            f"agent log tail:\n{self.agent.logs()[-3000:]}")


def _start_client(ns: str, cgroup: str) -> Client:
    """A client_agent.py process in namespace ``ns``, moved into ``cgroup`` before ``go``."""
    proc = _start("ip", "netns", "exec", ns, sys.executable, CLIENT)
    try:
        with open(os.path.join(cgroup, "cgroup.procs"), "w", encoding="ascii") as f:
            f.write(str(proc.pid))
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()
        if json.loads(_readline(proc, 10, "client")) != {"ready": True}:
            raise RuntimeError("client did not start")
    except BaseException:
        _stop(proc)
        raise
    return Client(proc)


def _setup_netns(ns: str) -> None:
    ip = ("ip", "-n", ns)
    _run(*ip, "link", "set", "lo", "up")
    for a in (*BACKENDS, *CLIENT_SOURCES):
        _run(*ip, "addr", "add", f"{a}/32", "dev", "lo")


def check_machine() -> None:
    """Raise EnvUnavailable when this machine cannot run the environment."""
    from bpf.datapath import DEFAULT_OBJECT, DatapathError, cgroup2_mount
    from bpf.probe import kernel_support

    if shutil.which("ip") is None:
        raise EnvUnavailable("iproute2 (ip) not installed")
    if not os.path.exists(DEFAULT_OBJECT):
        raise EnvUnavailable(f"{DEFAULT_OBJECT} not built (make setup builds it)")
    support = kernel_support()
    if not support.ok:
        raise EnvUnavailable(f"kernel BPF unavailable: {support.reason}")
    try:
        cgroup2_mount()
    except DatapathError as exc:
        raise EnvUnavailable(str(exc)) from None


def _cleanup_agent_state(pin_dir: str, socket: str, cgroup: str, netns: str = "") -> None:
    """``statewright agent --cleanup`` on our pins, then remove whatever it left, also when
    the command failed, timed out or was interrupted (`remove_agent_pins`). ``netns``: the
    namespace the agent ran in (its kernel settings are restored there). Call it once the
    agent is stopped: the command refuses to clean up after a running agent."""
    where = ["--sysctl-netns", netns] if netns else []
    try:
        subprocess.run(
            [sys.executable, "-m", "statewright", "agent", "--cleanup", "--pin-dir", pin_dir,
             "--api-socket", socket, "--cgroup", cgroup, "--state-dir", state_dir_of(socket),
             *where],
            capture_output=True, text=True, timeout=120, cwd=REPO,
        )
    finally:
        remove_agent_pins(pin_dir)


def remove_agent_pins(pin_dir: str) -> None:
    """Detach the socket LB's links pinned under ``pin_dir`` and remove every pin and the
    directory; an error names what could not be removed (a leak is never silent)."""
    from bpf.datapath import SockLB

    if not os.path.isdir(pin_dir):
        return
    try:
        SockLB.cleanup(pin_dir)
    finally:
        remove_pin_dir(pin_dir)


@dataclass
class Scratch:
    """The names and directories of one test environment (`scratch`)."""

    tag: str
    ns: str
    cgroup: str
    pin_dir: str
    tmp: Path
    manifests: Path

    def agent_config_file(self, **config: Any) -> Path:
        """The agent's configuration (kernel maps under the pin dir, the manifests directory,
        the socket LB on the cgroup, no netlink) plus ``config``, written to a file."""
        doc = {
            "backend": "kernel",
            "pin-dir": self.pin_dir,
            "manifests": [str(self.manifests)],
            "manifests-interval": MANIFESTS_INTERVAL,
            "cgroup": self.cgroup,
            "netlink": False,
            "node-name": "e2e-node",
            **config,
        }
        path = self.tmp / "agent.yaml"
        path.write_text(json.dumps(doc))
        return path


def scratch(stack: ExitStack, kind: str, tag: str, setup_netns: Callable[[str], None]) -> Scratch:
    """A temporary directory with an empty manifests directory, a network namespace set up by
    ``setup_netns`` and an empty cgroup, each removed by ``stack``; the pin dir's name."""
    from bpf.datapath import cgroup2_mount

    tmp = Path(tempfile.mkdtemp(prefix=f"statewright-{kind}-"))
    stack.callback(shutil.rmtree, tmp, True)
    manifests = tmp / "manifests"
    manifests.mkdir()
    ns = f"sw{kind}-{tag}"
    _run("ip", "netns", "add", ns)
    stack.callback(_run_quiet, "ip", "netns", "del", ns)
    setup_netns(ns)
    cgroup = os.path.join(cgroup2_mount(), f"statewright-{kind}-{tag}")
    os.mkdir(cgroup)
    stack.callback(_remove_cgroup, cgroup)
    pin_dir = os.path.join(BPFFS, f"statewright-{kind}-{tag}")
    return Scratch(tag, ns, cgroup, pin_dir, tmp, manifests)


@contextmanager
def e2e_env(extra_agent_config: dict[str, Any] | None = None) -> Iterator[E2EEnv]:
    """Create the namespace, servers, cgroup, agent and a client; remove them all after."""
    check_machine()
    with ExitStack() as stack:
        sc = scratch(stack, "e2e", f"{os.getpid()}-{uuid.uuid4().hex[:6]}", _setup_netns)
        specs = [f"{p}:{a}:{BACKEND_PORT}" for a in BACKENDS for p in ("tcp", "udp")]
        servers = _start("ip", "netns", "exec", sc.ns, sys.executable, SERVER, *specs)
        stack.callback(_stop, servers)
        if _readline(servers, 10, "backend servers").strip() != "ready":
            raise RuntimeError("backend servers did not start")

        socket = str(sc.tmp / "agent.sock")
        cfg_file = sc.agent_config_file(
            **{"lb-flags": ["--bpf-lb-algorithm-annotation=true"], **(extra_agent_config or {})}
        )
        agent = Agent(["--config", str(cfg_file)], socket, sc.tmp / "agent.log")
        stack.callback(_cleanup_agent_state, sc.pin_dir, socket, sc.cgroup)
        stack.callback(agent.stop)
        agent.start()

        client = _start_client(sc.ns, sc.cgroup)
        stack.callback(_stop, client.proc)
        yield E2EEnv(sc.ns, sc.cgroup, sc.pin_dir, sc.manifests, agent, client, stack)


def leftovers(env: E2EEnv) -> list[str]:
    """What of ``env`` still exists (call after :func:`e2e_env` exited)."""
    left = []
    if os.path.exists(f"/var/run/netns/{env.ns}"):
        left.append(f"netns {env.ns}")
    if os.path.exists(env.cgroup):
        left.append(f"cgroup {env.cgroup}")
    if os.path.exists(env.pin_dir):
        left.append(f"pins {env.pin_dir}")
    left += [f"agent pid {p.pid}" for p in env.agent.started if p.poll() is None]
    if env.client.proc.poll() is None:
        left.append(f"client pid {env.client.proc.pid}")
    if env.manifests.exists():
        left.append(f"dir {env.manifests.parent}")
    return left
