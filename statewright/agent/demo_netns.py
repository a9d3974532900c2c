"""The demo network namespace: where the example backends and the example clients live.

Why: ``make run`` loads examples/manifests, whose backends (10.244.x.y) and service
addresses (10.96.x.y, ...) are made up. The backends get those addresses on the
loopback device of a namespace the agent creates; that namespace has no other
device and no route, so no packet for an example service address can leave the
machine even when the datapath is not attached (the connect then fails with
ENETUNREACH). ``statewright exec -- CMD`` runs CMD in this namespace and in the
agent's cgroup, where the datapath translates service addresses to backends.

`DemoNetns.start` creates the namespace and starts one server process in it
(statewright/agent/demo_backend.py). `DemoNetns.sync` is given the backends of the tables
and makes the namespace match them: listeners of backends missing from the list are
closed and their addresses removed, new addresses are added and their listeners opened.
A sync costs at most one ``ip -n NS -batch -`` process for all address changes plus two
requests to the running server, whatever the number of backends (5,000 addresses: well
under a second), and may run in a worker thread: calls are serialised by a lock.
`stop` ends the server process (by its handle) and leaves the namespace, which the next
agent adopts (processes inside it keep it as it is); `recreate_if_gone` creates it again
when it vanished behind the agent's back.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import logging
import os
import re
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable

from statedb.errors import StatewrightError
from statewright.agent.demo_backend import format_spec

log = logging.getLogger("statewright.agent.demo")

#: (ip, port, protocol) of one backend, as the agent's tables give it.
Backend = tuple[str, int, str]

#: How long the server process may take to start or to answer a request.
SERVER_TIMEOUT = 30.0


class DemoError(StatewrightError, RuntimeError):
    """The namespace or a backend could not be set up; the message names the command."""


class _ServerGone(DemoError):
    """The backend server process exited (killed, crashed) while talking to it."""


def _ip(*args: str) -> None:
    res = subprocess.run(("ip", *args), capture_output=True, text=True)
    if res.returncode != 0:
        raise DemoError(f"ip {' '.join(args)}: exit {res.returncode}: {res.stderr.strip()}")


def netns_exists(name: str) -> bool:
    """Whether ``ip netns`` knows the namespace ``name``."""
    return os.path.exists(os.path.join("/var/run/netns", name))


def delete_netns(name: str) -> bool:
    """Delete the namespace ``name`` if it exists; return whether it did."""
    if not netns_exists(name):
        return False
    _ip("netns", "delete", name)
    return True


def lo_addresses(name: str) -> list[str]:
    """The addresses on ``lo`` of namespace ``name`` besides the loopback ones."""
    res = subprocess.run(("ip", "-n", name, "-j", "address", "show", "dev", "lo"),
                         capture_output=True, text=True)
    if res.returncode != 0:
        raise DemoError(f"ip -n {name} address show dev lo: {res.stderr.strip()}")
    out = []
    for link in json.loads(res.stdout or "[]"):
        for a in link.get("addr_info", []):
            ip = str(a.get("local", ""))
            if ip and not ipaddress.ip_address(ip).is_loopback:
                out.append(ip)
    return out


def _end_leftover_servers(name: str) -> None:
    """End backend servers an earlier agent left in namespace ``name`` (a killed agent's
    server exits when its pipe closes; this covers one still on its way out). Other
    processes in the namespace are left alone."""
    res = subprocess.run(("ip", "netns", "pids", name), capture_output=True, text=True)
    for pid in (int(p) for p in res.stdout.split() if p.isdigit()):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read()
        except OSError:
            continue
        if b"statewright.agent.demo_backend" in cmdline:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGTERM)
                for _ in range(50):
                    if not os.path.exists(f"/proc/{pid}"):
                        break
                    time.sleep(0.02)


_FAILED_LINE = re.compile(r"^Command failed -:(\d+)$", re.MULTILINE)


def ip_batch(netns: str, commands: list[str]) -> dict[int, str]:
    """Run ``commands`` (``ip`` command lines without ``ip``) in ``netns`` with one
    ``ip -n NETNS -force -batch -`` process; return {index: error} of those that failed
    (``-force`` carries on after a failure; ``ip`` names each failed line)."""
    if not commands:
        return {}
    res = subprocess.run(
        ("ip", "-n", netns, "-force", "-batch", "-"),
        input="".join(c + "\n" for c in commands), capture_output=True, text=True,
    )
    if res.returncode == 0:
        return {}
    failed_lines = [int(m) - 1 for m in _FAILED_LINE.findall(res.stderr)]
    message = _FAILED_LINE.sub("", res.stderr).strip() or f"exit {res.returncode}"
    if not failed_lines:  # ip itself failed (no such namespace, ...): nothing was done
        raise DemoError(f"ip -n {netns} -batch: {message}")
    return {i: message for i in failed_lines if 0 <= i < len(commands)}


class DemoNetns:
    """The namespace ``name`` with example backend servers on its loopback device.

    `served` and `addresses` say what is in place; they are replaced (never mutated) under
    the lock, so reading them from another thread without the lock is safe."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.served: frozenset[Backend] = frozenset()
        self.addresses: frozenset[str] = frozenset()
        self._lock = threading.Lock()
        self._server: subprocess.Popen[bytes] | None = None
        self._replies = b""
        self._stopped = False

    @property
    def server_pid(self) -> int | None:
        """PID of the backend server process while it runs."""
        server = self._server
        return server.pid if server is not None and server.poll() is None else None

    def start(self) -> None:
        """Create the namespace, or adopt the one an earlier agent left (processes inside
        it keep it; its addresses are kept until a sync says otherwise), and start the
        backend server process in it (a server an earlier agent left there is ended)."""
        with self._lock:
            self._stopped = False
            self._start_locked()

    def _start_locked(self) -> None:
        if netns_exists(self.name):
            _end_leftover_servers(self.name)
            self.addresses = frozenset(lo_addresses(self.name))
            _ip("-n", self.name, "link", "set", "lo", "up")
            self._start_server()
            log.info("demo: adopted namespace %s (%d address(es) kept)", self.name,
                     len(self.addresses))
            return
        _ip("netns", "add", self.name)
        _ip("-n", self.name, "link", "set", "lo", "up")
        self._start_server()
        log.info("demo: namespace %s created (loopback only, no route off the machine)",
                 self.name)

    def recreate_if_gone(self) -> bool:
        """Create the namespace again if it vanished (``ip netns delete`` behind the
        agent's back); return whether it had to. The server of the lost namespace is ended
        and every backend is served again at the next `sync`."""
        with self._lock:
            if self._stopped or netns_exists(self.name):
                return False
            log.warning("demo: namespace %s vanished; creating it again", self.name)
            self._stop_server()
            self.served = frozenset()
            self.addresses = frozenset()
            self._start_locked()
            return True

    def sync(self, backends: Iterable[Backend]) -> None:
        """Make the namespace serve exactly ``backends`` (ip, port, protocol; TCP and UDP,
        others are ignored): close the listeners of backends not listed and remove their
        addresses, add the new addresses and open their listeners. Blocks (run it in a
        worker thread from an event loop); concurrent calls run one after the other.
        Whatever can be applied is; DemoError then names what could not. After `stop` it
        does nothing (a sync racing the agent's shutdown)."""
        with self._lock:
            if self._stopped:
                return
            if self._server is None:
                raise DemoError(f"demo namespace {self.name} is not started")
            wanted = frozenset(
                (ip, int(port), proto.upper()) for ip, port, proto in backends
                if proto.upper() in ("TCP", "UDP"))
            if self._server.poll() is not None:
                self._restart_server()
            try:
                self._sync(wanted)
            except _ServerGone:
                self._restart_server()
                self._sync(wanted)

    def _sync(self, wanted: frozenset[Backend]) -> None:
        start = time.perf_counter()
        errors: list[str] = []
        gone = self.served - wanted
        if gone:
            failed = self._request(close=[format_spec(*b) for b in gone])
            errors += [f"close {spec}: {why}" for spec, why in failed.items()]
            self.served -= gone
        wanted_addrs = {ip for ip, _, _ in wanted}
        removed = sorted(self.addresses - wanted_addrs)
        added = sorted(wanted_addrs - self.addresses)
        commands = [f"address del {_prefix(ip)} dev lo" for ip in removed]
        commands += [f"address replace {_prefix(ip)} dev lo"
                     + (" nodad" if ":" in ip else "") for ip in added]
        failed_cmds = ip_batch(self.name, commands)
        errors += [f"ip {commands[i]}: {why}" for i, why in sorted(failed_cmds.items())]
        still_there = {removed[i] for i in failed_cmds if i < len(removed)}
        not_added = {added[i - len(removed)] for i in failed_cmds if i >= len(removed)}
        self.addresses = frozenset(
            (self.addresses - set(removed)) | still_there | (set(added) - not_added))
        new = sorted(b for b in wanted - self.served if b[0] in self.addresses)
        opened: set[Backend] = set()
        if new:
            specs = {format_spec(*b): b for b in new}
            failed = self._request(open=list(specs))
            errors += [f"listen {spec}: {why}" for spec, why in failed.items()]
            opened = {b for spec, b in specs.items() if spec not in failed}
            self.served |= opened
        if gone or removed or added or new:
            log.info("demo: %s: %d listener(s) opened, %d closed, %d address(es) added, "
                     "%d removed in %.0f ms; %d listener(s) serving", self.name, len(opened),
                     len(gone), len(added) - len(not_added), len(removed) - len(still_there),
                     (time.perf_counter() - start) * 1000, len(self.served))
        if errors:
            more = f" (and {len(errors) - 5} more)" if len(errors) > 5 else ""
            raise DemoError(f"demo namespace {self.name}: " + "; ".join(errors[:5]) + more)

    def describe(self) -> str:
        """For the health report."""
        return f"namespace {self.name}: {len(self.served)} backend listener(s)"

    def stop(self) -> None:
        """Stop the backend server process this object started. The namespace stays, with
        its addresses, for processes inside it and for the next agent to adopt
        (``statewright agent --cleanup`` deletes it)."""
        with self._lock:
            self._stopped = True
            self._stop_server()
            self.served = frozenset()

    # ----- the server process ----------------------------------------------------------------
    def _start_server(self) -> None:
        self._replies = b""
        self._server = subprocess.Popen(
            ("ip", "netns", "exec", self.name, sys.executable, "-m",
             "statewright.agent.demo_backend"),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, bufsize=0,
        )
        doc = self._reply()
        if doc.get("ready") is not True:
            raise DemoError(f"demo backend server in {self.name}: unexpected answer {doc}")

    def _restart_server(self) -> None:
        log.warning("demo: the backend server of %s exited (%s); starting it again",
                    self.name, self._server.returncode if self._server else None)
        self._stop_server()
        self.served = frozenset()
        self._start_server()

    def _stop_server(self) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        with contextlib.suppress(OSError):
            if server.stdin:
                server.stdin.close()
        try:
            server.wait(timeout=2)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(timeout=5)
        for f in (server.stdout, server.stderr):
            if f:
                f.close()

    def _request(self, **request: list[str]) -> dict[str, str]:
        """Send one control request; return the server's {spec: reason} of failures."""
        server = self._server
        assert server is not None and server.stdin is not None
        try:
            server.stdin.write(json.dumps(request).encode() + b"\n")
        except OSError as e:
            raise _ServerGone(f"demo backend server in {self.name}: {e}") from None
        failed = self._reply().get("failed")
        if not isinstance(failed, dict):
            raise DemoError(f"demo backend server in {self.name}: bad answer {failed!r}")
        return {str(k): str(v) for k, v in failed.items()}

    def _reply(self) -> dict[str, object]:
        """The server's next answer line, within SERVER_TIMEOUT."""
        server = self._server
        assert server is not None and server.stdout is not None
        fd = server.stdout.fileno()
        poller = select.poll()  # not select.select: the agent may hold more than 1024 fds
        poller.register(fd, select.POLLIN)
        deadline = time.monotonic() + SERVER_TIMEOUT
        while b"\n" not in self._replies:
            left = deadline - time.monotonic()
            if not poller.poll(max(0.0, left) * 1000):
                raise DemoError(f"demo backend server in {self.name} did not answer within "
                                f"{SERVER_TIMEOUT:.0f} s")
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                err = b""
                with contextlib.suppress(subprocess.TimeoutExpired):
                    server.wait(timeout=5)
                    if server.stderr is not None:
                        err = server.stderr.read()
                raise _ServerGone(f"demo backend server in {self.name} exited "
                                f"({server.returncode}): {err.decode(errors='replace').strip()}")
            self._replies += chunk
        line, _, self._replies = self._replies.partition(b"\n")
        try:
            doc = json.loads(line)
        except ValueError:
            doc = None
        if not isinstance(doc, dict):
            raise DemoError(f"demo backend server in {self.name}: bad answer {line!r}")
        return doc


def _prefix(ip: str) -> str:
    """``ip`` as a host prefix (/32 or /128)."""
    return f"{ip}/{ipaddress.ip_address(ip).max_prefixlen}"
