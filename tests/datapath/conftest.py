"""Fixtures of the datapath tests: a network namespace with backend servers, a cgroup, LB
maps pinned in a unique directory, the socket LB attached to the cgroup, and a client
process placed in both the cgroup and the namespace.

Everything is created per test module and removed afterwards, also when a test or the
set-up fails: the namespace (and with it its addresses), the
processes the fixture started (stopped by their own handles), the cgroup, the links and
the pins. No address used here is routable outside the namespace: a service address
that the datapath failed to translate has no route (ENETUNREACH) instead of leaving the
machine.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from bpf.datapath import DEFAULT_OBJECT, DatapathConfig, DatapathError, SockLB, cgroup2_mount
from bpfops.frontend_ops import FrontendOps
from bpfops.lb_maps import LBMaps, LBMapsConfig
from bpfops.model import LBOpsConfig

HERE = Path(__file__).resolve().parent
SERVER = str(HERE / "backend_server.py")
CLIENT = str(HERE / "client_agent.py")
BPFFS = "/sys/fs/bpf"

# The backend and client addresses live on the namespace's loopback device (this kernel
# may lack the dummy and veth drivers); either way they are local to the namespace.
DEV = "lo"
BACKENDS4 = ("10.244.0.11", "10.244.0.12", "10.244.0.13")
LOOPBACK_BACKENDS = ("127.0.0.11", "127.0.0.12")
BACKENDS6 = ("fd00:244::11", "fd00:244::12", "fd00:244::13")
CLIENT_SOURCES = tuple(f"10.244.0.{100 + i}" for i in range(12))
BACKEND_PORT = 8080


def _need(condition: bool, why: str) -> None:
    if condition:
        return
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{why} (CI=true requires the datapath tests to run)", pytrace=False)
    pytest.skip(why)


def _run(*cmd: str) -> None:
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: exit {res.returncode}: {res.stderr.strip()}")


def _run_quiet(*cmd: str) -> None:
    subprocess.run(cmd, capture_output=True)


def _stop(proc: subprocess.Popen[str]) -> None:
    """Stop a process this fixture started: close its stdin, then kill it by its PID."""
    try:
        if proc.stdin:
            proc.stdin.close()
    except OSError:
        pass
    try:
        proc.wait(timeout=2)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=5)


def _readline(proc: subprocess.Popen[str], timeout: float, what: str) -> str:
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    if not ready:
        raise RuntimeError(f"{what}: no answer within {timeout} s")
    line = proc.stdout.readline()
    if not line:
        err = proc.stderr.read() if proc.stderr else ""
        raise RuntimeError(f"{what}: process exited ({proc.poll()}): {err}")
    return line


def _remove_cgroup(path: str) -> None:
    """Move any process left in the test cgroup to its parent, then remove the cgroup."""
    parent = os.path.dirname(path)
    deadline = time.monotonic() + 5
    while os.path.isdir(path):
        try:
            with open(os.path.join(path, "cgroup.procs"), encoding="ascii") as f:
                pids = [p for p in f.read().split() if p]
            for pid in pids:
                with open(os.path.join(parent, "cgroup.procs"), "w", encoding="ascii") as f:
                    f.write(pid)
            os.rmdir(path)
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def _remove_pins(maps: LBMaps, pin_dir: str) -> None:
    try:
        SockLB.cleanup(pin_dir)
    finally:
        maps.unpin()
        maps.close()
        if os.path.isdir(pin_dir):
            shutil.rmtree(pin_dir)


class Client:
    """The client process in the test's cgroup and namespace (see client_agent.py)."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc

    def call(self, cmd: dict[str, Any], timeout: float = 20.0) -> dict[str, Any]:
        """Send one command, return its answer."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        reply: dict[str, Any] = json.loads(_readline(self.proc, timeout, f"client {cmd}"))
        if "error" in reply:
            raise RuntimeError(f"client {cmd}: {reply['error']}")
        return reply

    def tcp(self, host: str, port: int, count: int = 1, bind: str | None = None) -> list[Any]:
        """``count`` TCP connections (see client_agent.py for the result dicts)."""
        cmd = {"op": "tcp", "host": host, "port": port, "count": count, "bind": bind}
        results: list[Any] = self.call(cmd)["results"]
        return results

    def udp(self, host: str, port: int, count: int = 1, connected: bool = False) -> list[Any]:
        """``count`` UDP request/reply exchanges."""
        cmd = {"op": "udp", "host": host, "port": port, "count": count, "connected": connected}
        results: list[Any] = self.call(cmd)["results"]
        return results

    def netns_cookie(self) -> int:
        """The client namespace's cookie (the datapath's session-affinity client id)."""
        return int(self.call({"op": "netns_cookie"})["cookie"])


@dataclass
class Env:
    """What the datapath tests work with."""

    ns: str
    cgroup: str
    pin_dir: str
    maps: LBMaps
    ops: FrontendOps[Any]
    dp: SockLB
    client: Client


def _start(*cmd: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        cmd,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _setup_netns(ns: str) -> None:
    ip = ("ip", "-n", ns)
    _run(*ip, "link", "set", "lo", "up")
    for a in (*BACKENDS4, *CLIENT_SOURCES):
        _run(*ip, "addr", "add", f"{a}/32", "dev", DEV)
    for a in BACKENDS6:
        _run(*ip, "-6", "addr", "add", f"{a}/128", "dev", DEV, "nodad")


@pytest.fixture(scope="module")
def env() -> Iterator[Env]:
    """The namespace, servers, cgroup, maps, attached datapath and client (module scope)."""
    _need(shutil.which("ip") is not None, "iproute2 (ip) not installed")
    _need(os.path.exists(DEFAULT_OBJECT), f"{DEFAULT_OBJECT} not built (make setup builds it)")
    try:
        mount = cgroup2_mount()
    except DatapathError as exc:
        _need(False, str(exc))
    tag = f"{os.getpid()}-{uuid.uuid4().hex[:6]}"
    ns = f"swdp-{tag}"
    cgroup = os.path.join(mount, f"statewright-dptest-{tag}")
    pin_dir = os.path.join(BPFFS, f"statewright-dptest-{tag}")
    with ExitStack() as stack:
        _run("ip", "netns", "add", ns)
        stack.callback(_run_quiet, "ip", "netns", "del", ns)
        _setup_netns(ns)

        specs = [f"{p}:{a}:{BACKEND_PORT}" for a in BACKENDS4 for p in ("tcp", "udp")]
        specs += [f"tcp:{a}:{BACKEND_PORT}" for a in LOOPBACK_BACKENDS]
        specs += [f"{p}:[{a}]:{BACKEND_PORT}" for a in BACKENDS6 for p in ("tcp", "udp")]
        servers = _start("ip", "netns", "exec", ns, sys.executable, SERVER, *specs)
        stack.callback(_stop, servers)
        assert _readline(servers, 10, "backend servers").strip() == "ready"

        os.mkdir(cgroup)
        stack.callback(_remove_cgroup, cgroup)

        maps = LBMaps.open(LBMapsConfig(backend="kernel", pin_dir=pin_dir))
        stack.callback(_remove_pins, maps, pin_dir)
        ops: FrontendOps[Any] = FrontendOps(maps, LBOpsConfig(algorithm_annotation=True))

        dp = SockLB(DatapathConfig(cgroup=cgroup, pin_dir=pin_dir))
        stack.callback(dp.detach)
        dp.attach()

        proc = _start("ip", "netns", "exec", ns, sys.executable, CLIENT)
        stack.callback(_stop, proc)
        with open(os.path.join(cgroup, "cgroup.procs"), "w", encoding="ascii") as f:
            f.write(str(proc.pid))
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()
        assert json.loads(_readline(proc, 10, "client")) == {"ready": True}

        yield Env(ns, cgroup, pin_dir, maps, ops, dp, Client(proc))
