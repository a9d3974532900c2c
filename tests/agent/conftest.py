"""Fixtures of the agent tests: the agent as a subprocess on a temp socket, pin directory and
manifests directory, and the CLI run in-process against it.

Every agent process is started here and stopped here by its PID (SIGTERM, then SIGKILL
after a timeout), also when a test fails; temp directories are pytest's.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from statewright import cli
from statewright.agent.client import AgentClient, AgentUnavailable

REPO = Path(__file__).resolve().parents[2]

SERVICE = """\
apiVersion: v1
kind: Service
metadata: {{name: {name}, namespace: test}}
spec:
  clusterIP: {vip}
  ports: [{{name: http, port: 80, protocol: TCP, targetPort: 8080}}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: {name}-1
  namespace: test
  labels: {{kubernetes.io/service-name: {name}}}
addressType: IPv4
endpoints:
{endpoints}
ports: [{{name: http, port: 8080, protocol: TCP}}]
"""


def service_yaml(name: str, vip: str, backends: list[str]) -> str:
    """A ClusterIP service ``test/<name>`` on ``vip``:80 with ``backends``:8080."""
    eps = "\n".join(f"- addresses: [{b}]\n  conditions: {{ready: true}}" for b in backends)
    return SERVICE.format(name=name, vip=vip, endpoints=eps or "[]")


@dataclass
class AgentProc:
    """A running agent subprocess and what it was started with."""

    proc: subprocess.Popen[str]
    socket: str
    manifests: Path
    pin_dir: str
    args: list[str]
    log: Path
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def client(self) -> AgentClient:
        """A client on the agent's socket."""
        return AgentClient(self.socket, timeout=10)

    def logs(self) -> str:
        """What the agent logged so far."""
        return self.log.read_text(errors="replace") if self.log.exists() else ""


def state_dir_of(socket: str) -> str:
    """The endpoint state directory of a test agent on ``socket``."""
    return os.path.join(os.path.dirname(os.path.abspath(socket)), "state")


def _die_with_parent() -> None:
    """In the agent's child before exec: SIGTERM it when the test process dies, so a test
    run killed outright (SIGKILL, a timeout) leaves no agent behind. Tests start agents
    from pytest's main thread, whose exit is the process's (the signal follows the thread
    that forked)."""
    import ctypes

    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM, 0, 0, 0)


#: However starved the agent, a start gives up after this many times its ``timeout`` of
#: wall time (see `start_agent`).
STARVED_WALL_FACTOR = 6


def start_agent(args: list[str], socket: str, log: Path, timeout: float = 20.0,
                prefix: Sequence[str] = ()) -> subprocess.Popen[str]:
    """Start ``statewright agent ARGS`` and wait until its API answers /health. Its endpoint
    state goes beside its socket unless ARGS say where (never the machine's default), and
    without ``prefix`` (or ``--sysctl-netns``) it runs with ``--no-sysctl``.
    ``prefix`` runs the agent through a command that execs it (e.g. ``nsenter --net=..``:
    the PID is still the agent's).

    ``timeout`` counts the agent's own time: wall time less what the agent spent runnable
    but waiting for a CPU (`runqueue_wait`). A start needs about 0.7 s of CPU; on a loaded
    2-core machine it waited 10-20 times that for a CPU (9-20 s of wall time for 1-2 s of
    its own), which a fixed wall-time deadline cannot tell from a hung agent. A start
    that is slow by itself still fails after ``timeout``; a starved one after at most
    `STARVED_WALL_FACTOR` times it."""
    if "--state-dir" not in args:
        args = [*args, "--state-dir", state_dir_of(socket)]
    if not prefix and not any(a.startswith("--sysctl-netns") for a in args):
        # an agent in the machine's own network namespace never sets its kernel settings
        # (tests/conftest.py checks); one run inside a test's namespace sets that one's
        args = [*args, "--no-sysctl"]
    f = open(log, "a", encoding="utf-8")  # noqa: SIM115 - owned by the process below
    began = time.monotonic()
    proc = subprocess.Popen(
        [*prefix, sys.executable, "-m", "statewright", "agent", "--api-socket", socket, *args],
        stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True, cwd=REPO,
        preexec_fn=_die_with_parent,
    )
    f.close()
    try:
        _wait_started(proc, socket, log, timeout, began)
    except BaseException:
        # also interrupted (Ctrl-C, a test timeout): an agent left running would go on
        # pinning maps after the caller's clean-up, and outlive the test
        stop_agent(proc)
        raise
    return proc


def _wait_started(proc: subprocess.Popen[str], socket: str, log: Path, timeout: float,
                  began: float) -> None:
    """Wait until the agent answers /health (`start_agent`); RuntimeError when it exits
    or does not answer in time."""
    client = AgentClient(socket, timeout=5)
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"agent exited with {proc.returncode}:\n{log.read_text()}")
        with contextlib.suppress(AgentUnavailable):
            client.get("/health")
            return
        waited = time.monotonic() - began
        starved = runqueue_wait(proc.pid)
        if waited - starved > timeout or waited > timeout * STARVED_WALL_FACTOR:
            cpu = cpu_seconds(proc.pid)
            raise RuntimeError(
                f"agent did not answer within {timeout} s of its own time: {waited:.1f} s "
                f"of wall time, {starved:.1f} s of which it waited for a CPU, {cpu:.2f} s "
                "of CPU used (a start takes about 0.7 s; its log says how far it got):\n"
                + log.read_text())
        time.sleep(0.05)


def cpu_seconds(pid: int) -> float:
    """The CPU time (user + system) process ``pid`` has used so far, from /proc; NaN when
    it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def runqueue_wait(pid: int) -> float:
    """Seconds the main thread of process ``pid`` has spent runnable but waiting for a CPU
    (the second field of /proc/PID/schedstat); 0 when the kernel does not say."""
    try:
        return int(Path(f"/proc/{pid}/schedstat").read_text().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0


def stop_agent(proc: subprocess.Popen[str], sig: int = signal.SIGTERM, timeout: float = 10.0
               ) -> int:
    """Stop an agent this module started, by its PID; return its exit code."""
    if proc.poll() is None:
        os.kill(proc.pid, sig)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
    return proc.returncode


@contextlib.contextmanager
def running_agent(tmp: Path, *extra: str, backend: str = "memory",
                  pin_dir: str | None = None) -> Iterator[AgentProc]:
    """An agent on a temp socket, pin dir and manifests dir (no netlink unless asked)."""
    manifests = tmp / "manifests"
    manifests.mkdir(exist_ok=True)
    sock = str(tmp / "agent.sock")
    pins = pin_dir or str(tmp / "pins")
    args = ["--backend", backend, "--pin-dir", pins, "--manifests", str(manifests),
            "--manifests-interval", "0.1", *extra]
    if "--netlink" not in extra:
        args.append("--no-netlink")
    else:
        args.remove("--netlink")
    log = tmp / "agent.log"
    proc = start_agent(args, sock, log)
    agent = AgentProc(proc, sock, manifests, pins, args, log)
    try:
        yield agent
    finally:
        stop_agent(agent.proc)  # a test may have restarted it: stop the one running now


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """Run ``statewright ARGV`` in-process; return (exit code, stdout, stderr)."""
    capsys.readouterr()
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def cli_json(capsys: pytest.CaptureFixture[str], *argv: str) -> Any:
    """Run a client command with ``-o json`` and decode its output."""
    code, out, err = run_cli(capsys, *argv, "-o", "json")
    assert code in (0, 1), f"statewright {' '.join(argv)}: exit {code}: {err}"
    return json.loads(out)


def wait_for(predicate: Any, timeout: float = 10.0, what: str = "condition") -> Any:
    """Poll ``predicate()`` until it returns something truthy; return it."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout} s waiting for {what} (last: {last!r})")


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentProc]:
    """One memory-maps agent shared by a module's tests."""
    with running_agent(tmp_path_factory.mktemp("agent")) as a:
        yield a
