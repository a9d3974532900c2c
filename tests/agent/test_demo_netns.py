"""The demo namespace (statewright/agent/demo_netns.py) for real, in a uniquely named network
namespace: a sync serves exactly the backends it is given (removed backends' listeners stop
and their addresses go), many addresses cost one ``ip -batch`` process, concurrent syncs are
serialised, a dead server is replaced, and stop leaves nothing behind.

Needs root (``ip netns``) and iproute2: skips without them, fails instead under CI=true.
Every namespace is deleted and every server process stopped also when a test fails.
"""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from statewright.agent import demo_netns
from statewright.agent.demo_netns import Backend, DemoNetns, netns_exists


def _unavailable(reason: str) -> None:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{reason} (CI=true requires kernel tests to run)", pytrace=False)
    pytest.skip(reason)


@pytest.fixture
def demo() -> Iterator[DemoNetns]:
    """A started DemoNetns on a namespace named after this process; stopped afterwards."""
    if shutil.which("ip") is None or shutil.which("ss") is None:
        _unavailable("iproute2 (ip, ss) is not installed")
    if os.geteuid() != 0:
        _unavailable("ip netns needs root")
    d = DemoNetns(f"swtest-demo-{os.getpid()}-{uuid.uuid4().hex[:6]}")
    try:
        d.start()
        yield d
    finally:
        pid = d.server_pid
        d.stop()
        if pid is not None and os.path.exists(f"/proc/{pid}"):  # never expected
            os.kill(pid, signal.SIGKILL)
        # stop() leaves the namespace for the next agent; --cleanup deletes it
        demo_netns.delete_netns(d.name)
        assert not netns_exists(d.name), f"namespace {d.name} left behind"


def _addresses(ns: str) -> set[str]:
    """The addresses on lo in ``ns`` besides the loopback ones."""
    out = subprocess.run(["ip", "-n", ns, "-j", "address", "show", "dev", "lo"],
                         capture_output=True, text=True, check=True).stdout
    return {a["local"] for link in json.loads(out) for a in link["addr_info"]
            if a["local"] not in ("127.0.0.1", "::1")}


def _listeners(ns: str) -> set[Backend]:
    """(ip, port, protocol) of every TCP listener and bound UDP socket in ``ns``."""
    out = subprocess.run(["ip", "netns", "exec", ns, "ss", "-H", "-l", "-n", "-t", "-u"],
                         capture_output=True, text=True, check=True).stdout
    found = set()
    for line in out.splitlines():
        cols = line.split()
        host, _, port = cols[4].rpartition(":")
        found.add((host.strip("[]"), int(port), cols[0].upper()))
    return found


def _ask(ns: str, ip: str, port: int) -> subprocess.CompletedProcess[str]:
    """An HTTP request to ip:port from inside ``ns``; stdout is the answer's body."""
    code = (
        "import socket, sys\n"
        f"s = socket.create_connection(({ip!r}, {port}), timeout=5)\n"
        "s.sendall(b'GET / HTTP/1.0\\r\\n\\r\\n')\n"
        "data = b''\n"
        "while chunk := s.recv(4096):\n"
        "    data += chunk\n"
        "print(data.split(b'\\r\\n\\r\\n', 1)[1].decode().strip())\n"
    )
    return subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-c", code],
                          capture_output=True, text=True, timeout=30)


def _many(n: int, first: str = "10.250.0.1") -> list[Backend]:
    base = int(ipaddress.ip_address(first))
    return [(str(ipaddress.ip_address(base + i)), 8080, "TCP") for i in range(n)]


def test_sync_serves_exactly_the_backends_given(demo: DemoNetns) -> None:
    a, b, c6 = "10.244.77.1", "10.244.77.2", "fd00:77::3"
    first = [(a, 8080, "TCP"), (a, 53, "UDP"), (b, 8080, "tcp"), (c6, 8080, "TCP"),
             (a, 9999, "SCTP")]  # SCTP: not served, ignored
    demo.sync(first)
    assert demo.addresses == {a, b, c6} == _addresses(demo.name)
    assert _listeners(demo.name) == {(a, 8080, "TCP"), (a, 53, "UDP"), (b, 8080, "TCP"),
                                     (c6, 8080, "TCP")} == demo.served
    assert _ask(demo.name, b, 8080).stdout.strip() == f"backend {b}:8080"
    assert _ask(demo.name, c6, 8080).stdout.strip() == f"backend [{c6}]:8080"

    demo.sync([(a, 8080, "TCP")])  # b, c6 and a's UDP port removed from the tables
    assert _listeners(demo.name) == {(a, 8080, "TCP")} == demo.served
    assert _addresses(demo.name) == {a} == demo.addresses
    assert _ask(demo.name, a, 8080).stdout.strip() == f"backend {a}:8080"
    gone = _ask(demo.name, b, 8080)
    assert gone.returncode != 0 and "backend" not in gone.stdout
    assert demo.describe() == f"namespace {demo.name}: 1 backend listener(s)"

    demo.sync([(b, 8081, "TCP")])  # a new address again, on another port
    assert _listeners(demo.name) == {(b, 8081, "TCP")}
    assert _ask(demo.name, b, 8081).stdout.strip() == f"backend {b}:8081"


class _CountingPopen(subprocess.Popen[Any]):
    """subprocess.Popen recording the argv of every process started (subprocess.run too)."""

    started: list[list[str]] = []

    def __init__(self, args: Any, *rest: Any, **kwargs: Any) -> None:
        _CountingPopen.started.append([str(a) for a in args])
        super().__init__(args, *rest, **kwargs)


def test_a_sync_of_many_addresses_is_one_ip_batch(demo: DemoNetns,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    n = 5000
    backends = _many(n)
    started = _CountingPopen.started = []
    monkeypatch.setattr(demo_netns.subprocess, "Popen", _CountingPopen)
    demo.sync(backends)
    assert started == [["ip", "-n", demo.name, "-force", "-batch", "-"]]
    assert len(demo.served) == n and len(demo.addresses) == n
    del started[:]
    demo.sync(backends)  # nothing changed: no process at all
    assert started == []
    demo.sync(backends[: n // 2])  # half removed: one batch of deletions
    assert started == [["ip", "-n", demo.name, "-force", "-batch", "-"]]
    monkeypatch.undo()
    assert len(_listeners(demo.name)) == n // 2 and len(_addresses(demo.name)) == n // 2
    assert demo.served == set(backends[: n // 2])


def test_concurrent_syncs_run_one_after_the_other(demo: DemoNetns) -> None:
    sets = [_many(300, first=f"10.251.{i}.1") for i in range(4)]
    errors: list[BaseException] = []

    def sync(backends: list[Backend]) -> None:
        try:
            demo.sync(backends)
        except BaseException as e:  # reported by the assertion below
            errors.append(e)

    threads = [threading.Thread(target=sync, args=(s,)) for s in sets]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    # Whichever ran last won, entirely: the kernel agrees with the object.
    assert demo.served in [set(s) for s in sets]
    assert _listeners(demo.name) == demo.served
    assert _addresses(demo.name) == {ip for ip, _, _ in demo.served} == demo.addresses


def _kill(pid: int) -> None:
    """SIGKILL ``pid`` (the server a test's DemoNetns started) and wait until it has died."""
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat", encoding="ascii") as f:
                if f.read().rpartition(")")[2].split()[0] == "Z":
                    return
        except FileNotFoundError:
            return
        time.sleep(0.01)
    raise AssertionError(f"process {pid} still alive 10 s after SIGKILL")


@pytest.mark.parametrize("seen", ["before the sync", "by the sync's request"])
def test_a_dead_server_is_replaced_by_the_next_sync(
    demo: DemoNetns, seen: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    backends = _many(3)
    demo.sync(backends)
    pid = demo.server_pid
    assert pid is not None
    if seen != "before the sync":
        # It dies between the liveness check and the request for the new listener.
        assert demo._server is not None
        monkeypatch.setattr(demo._server, "poll", lambda: None)
        backends.append(("10.244.79.1", 8080, "TCP"))
    _kill(pid)
    demo.sync(backends)
    assert demo.server_pid not in (None, pid)
    assert _listeners(demo.name) == set(backends) == demo.served
    assert _ask(demo.name, backends[0][0], 8080).returncode == 0


def test_stop_ends_the_server_and_leaves_the_namespace_for_the_next_agent(
    demo: DemoNetns,
) -> None:
    backends = [*_many(10), ("fd00:78::1", 8080, "TCP")]
    demo.sync(backends)
    pid = demo.server_pid
    assert pid is not None and os.path.exists(f"/proc/{pid}")
    inode = os.stat(f"/var/run/netns/{demo.name}").st_ino
    demo.stop()
    assert not os.path.exists(f"/proc/{pid}")  # exited and reaped
    assert demo.server_pid is None and demo.served == set()
    demo.sync(_many(2))  # a sync racing the agent's shutdown does nothing
    assert demo.server_pid is None
    # The namespace stays, with its addresses: the next agent adopts it (processes inside
    # it keep their namespace and get the backends again).
    assert netns_exists(demo.name)
    assert os.stat(f"/var/run/netns/{demo.name}").st_ino == inode
    again = DemoNetns(demo.name)
    again.start()
    try:
        assert os.stat(f"/var/run/netns/{demo.name}").st_ino == inode, "recreated"
        assert again.addresses == {ip for ip, _, _ in backends}
        again.sync(backends[:3])
        assert _listeners(demo.name) == set(backends[:3]) == again.served
        assert _addresses(demo.name) == {ip for ip, _, _ in backends[:3]}
    finally:
        again.stop()


def test_a_vanished_namespace_is_created_again(demo: DemoNetns) -> None:
    backends = _many(3)
    demo.sync(backends)
    assert demo.recreate_if_gone() is False
    old_pid = demo.server_pid
    subprocess.run(["ip", "netns", "delete", demo.name], check=True)
    assert demo.recreate_if_gone() is True
    assert netns_exists(demo.name) and demo.server_pid not in (None, old_pid)
    assert old_pid is not None and not os.path.exists(f"/proc/{old_pid}")
    demo.sync(backends)
    assert _listeners(demo.name) == set(backends) == demo.served
    assert _ask(demo.name, backends[0][0], backends[0][1]).returncode == 0


