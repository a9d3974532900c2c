"""The demo network namespace: where the example backends and the example clients live.

Why: ``make run`` loads examples/manifests, whose backends (10.244.x.y) and service
addresses (10.96.x.y, ...) are made up. The backends get those addresses on the
loopback device of a namespace the agent creates; that namespace has no other
device and no route, so no packet for an example service address can leave the
machine even when the datapath is not attached (the connect then fails with
ENETUNREACH). ``statewright exec -- CMD`` runs CMD in this namespace and in the
agent's cgroup, where the datapath translates service addresses to backends.

`DemoNetns.sync` is given the backends of the tables and starts one server process
(statewright/agent/demo_backend.py) per new address (IPv4 and IPv6); `stop` ends the
processes it started (by their handles) and deletes the namespace.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import os
import select
import subprocess
import sys
from collections.abc import Iterable

log = logging.getLogger("statewright.agent.demo")


class DemoError(RuntimeError):
    """The namespace or a backend could not be set up; the message names the command."""


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


class DemoNetns:
    """The namespace ``name`` with example backend servers on its loopback device."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.addresses: set[str] = set()
        self.served: set[tuple[str, int, str]] = set()
        self.procs: list[subprocess.Popen[str]] = []

    def start(self) -> None:
        """Create the namespace (a leftover one of a killed agent is replaced)."""
        if netns_exists(self.name):
            log.info("demo: replacing the leftover namespace %s", self.name)
            delete_netns(self.name)
        _ip("netns", "add", self.name)
        _ip("-n", self.name, "link", "set", "lo", "up")
        log.info("demo: namespace %s created (loopback only, no route off the machine)",
                 self.name)

    def sync(self, backends: Iterable[tuple[str, int, str]]) -> None:
        """Serve every (ip, port, protocol) not served yet (TCP and UDP only)."""
        new = sorted(
            b for b in set(backends) if b not in self.served and b[2].upper() in ("TCP", "UDP")
        )
        if not new:
            return
        for ip, _port, _proto in new:
            if ip in self.addresses:
                continue
            addr = ipaddress.ip_address(ip)
            if addr.version == 4:
                _ip("-n", self.name, "addr", "add", f"{ip}/32", "dev", "lo")
            else:
                _ip("-n", self.name, "-6", "addr", "add", f"{ip}/128", "dev", "lo", "nodad")
            self.addresses.add(ip)
        specs = [
            f"{proto.lower()}:{f'[{ip}]' if ':' in ip else ip}:{port}" for ip, port, proto in new
        ]
        proc = subprocess.Popen(
            ("ip", "netns", "exec", self.name, sys.executable, "-m",
             "statewright.agent.demo_backend", *specs),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        self.procs.append(proc)
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], 10)
        line = proc.stdout.readline() if ready else ""
        if line.strip() != "ready":
            err = proc.stderr.read() if proc.poll() is not None and proc.stderr else ""
            raise DemoError(f"demo backends {' '.join(specs)} did not start: {err.strip()}")
        self.served.update(new)
        log.info("demo: backends serving in %s: %s", self.name, " ".join(specs))

    def describe(self) -> str:
        """For the health report."""
        return f"namespace {self.name}: {len(self.served)} backend listener(s)"

    def stop(self) -> None:
        """Stop the backend processes this object started and delete the namespace."""
        for proc in self.procs:
            with contextlib.suppress(OSError):
                if proc.stdin:
                    proc.stdin.close()
            try:
                proc.wait(timeout=2)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
            for f in (proc.stdout, proc.stderr):
                if f:
                    f.close()
        self.procs.clear()
        try:
            delete_netns(self.name)
        except DemoError as e:
            log.warning("demo: %s", e)
