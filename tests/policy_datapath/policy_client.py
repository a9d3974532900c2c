"""A client for the policy tests, run inside a pod's network namespace and the test's
cgroup: it reads one JSON command per line on stdin and answers one JSON line.

* ``{"op": "tcp", "host": H, "port": P}``: connect(); ``{"ok": true}`` or
  ``{"errno": N}`` (EPERM: refused by the egress policy);
* ``{"op": "udp", "host": H, "port": P}``: one unconnected sendto();
* ``{"op": "cookie"}``: ``{"cookie": C}``, this namespace's SO_NETNS_COOKIE.

It waits for a line ``go`` first (the test moves it into the cgroup before that).
"""

from __future__ import annotations

import json
import socket
import sys
from typing import Any

SO_NETNS_COOKIE = 71


def handle(cmd: dict[str, Any]) -> dict[str, Any]:
    """One command's answer."""
    op = cmd.get("op")
    if op == "cookie":
        with socket.socket() as s:
            raw = s.getsockopt(socket.SOL_SOCKET, SO_NETNS_COOKIE, 8)
        return {"cookie": int.from_bytes(raw, sys.byteorder)}
    host, port = cmd["host"], int(cmd["port"])
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    kind = socket.SOCK_STREAM if op == "tcp" else socket.SOCK_DGRAM
    with socket.socket(family, kind) as s:
        s.settimeout(2)
        try:
            if op == "tcp":
                s.connect((host, port))
            else:
                s.sendto(b"ping", (host, port))
        except OSError as e:
            return {"errno": e.errno or -1}
    return {"ok": True}


def main() -> int:
    """Wait for ``go``, then answer commands until stdin closes."""
    if sys.stdin.readline().strip() != "go":
        return 1
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        try:
            reply = handle(json.loads(line))
        except Exception as e:  # report, keep serving
            reply = {"error": f"{type(e).__name__}: {e}"}
        print(json.dumps(reply), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
