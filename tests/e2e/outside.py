"""A client outside the cluster for the north-south tests: a network namespace
(``swout-<tag>``) whose ``eth0`` is the peer of a veth ``ext0`` in one node's namespace.

* the node's ``ext0``: ``192.168.201.1/24`` and ``fd20:201::1/64`` (an external device:
  the agent's devices table selects it, its addresses become NodePort addresses);
* the outside namespace: ``192.168.201.2/24`` and ``fd20:201::2/64``, default routes via
  the node (so LoadBalancer and external IPs reach the node, as an upstream router would
  send them); the other nodes have no route back to it.

Processes in it (``nodeport_probe.py client``) are started by `Outside.client` and
stopped by PID. Everything is removed by the caller's ExitStack, also on failure.
"""

from __future__ import annotations

import json
import subprocess
import sys
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.datapath.conftest import _readline, _run, _run_quiet, _start, _stop

PROBE = str(Path(__file__).with_name("nodeport_probe.py"))
NODE_SIDE = ("192.168.201.1", "fd20:201::1")
CLIENT_SIDE = ("192.168.201.2", "fd20:201::2")


@dataclass
class ProbeClient:
    """A ``nodeport_probe.py client`` process."""

    proc: subprocess.Popen[str]

    def call(self, timeout: float = 20.0, **cmd: Any) -> dict[str, Any]:
        """One command; its answer (with ``errno``/``error`` when it failed)."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        answer: dict[str, Any] = json.loads(_readline(self.proc, timeout, f"probe {cmd}"))
        return answer


@dataclass
class Outside:
    """The outside namespace, the node namespace it is plugged into, and its clients."""

    ns: str
    node_ns: str
    _stack: ExitStack = field(repr=False)

    def client(self) -> ProbeClient:
        """A new probe client in the outside namespace (stopped with the stack)."""
        proc = _start("ip", "netns", "exec", self.ns, sys.executable, PROBE, "client")
        self._stack.callback(_stop, proc)
        return ProbeClient(proc)


def plug_outside(stack: ExitStack, node_ns: str, tag: str) -> Outside:
    """Create the outside namespace connected to ``node_ns`` (module doc)."""
    ns = f"swout-{tag}"
    _run("ip", "netns", "add", ns)
    stack.callback(_run_quiet, "ip", "netns", "del", ns)
    _run("ip", "-n", node_ns, "link", "add", "ext0", "type", "veth", "peer", "name", "eth0",
         "netns", ns)
    stack.callback(_run_quiet, "ip", "-n", node_ns, "link", "del", "ext0")
    _run("ip", "-n", ns, "link", "set", "lo", "up")
    for dev_ns, dev, (v4, v6) in ((node_ns, "ext0", NODE_SIDE), (ns, "eth0", CLIENT_SIDE)):
        _run("ip", "-n", dev_ns, "addr", "add", f"{v4}/24", "dev", dev)
        _run("ip", "-n", dev_ns, "addr", "add", f"{v6}/64", "dev", dev, "nodad")
        _run("ip", "-n", dev_ns, "link", "set", dev, "up")
    _run("ip", "-n", ns, "route", "add", "default", "via", NODE_SIDE[0])
    _run("ip", "-n", ns, "-6", "route", "add", "default", "via", NODE_SIDE[1])
    return Outside(ns, node_ns, stack)


def serve_probe(stack: ExitStack, netns: str, hosts: list[str]) -> subprocess.Popen[str]:
    """``nodeport_probe.py serve`` on ``hosts`` in ``netns`` (stopped with the stack)."""
    proc = _start("ip", "netns", "exec", netns, sys.executable, PROBE, "serve", *hosts)
    stack.callback(_stop, proc)
    if _readline(proc, 10, f"probe servers in {netns}").strip() != "ready":
        raise RuntimeError(f"probe servers in {netns} did not start")
    return proc
