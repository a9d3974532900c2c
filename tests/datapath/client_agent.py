"""The client of the datapath tests: runs inside the test's network namespace and, once
the test has written its PID into the test cgroup's ``cgroup.procs``, connects as told.

Protocol on stdin/stdout, one JSON object per line. First the test sends ``go`` (after
moving the process into the cgroup, so that every socket below is created inside it).
Then commands, each answered by one line:

* ``{"op": "tcp", "host": H, "port": P, "count": N, "bind": SRC|null}``: N connections;
  each result is ``{"id": "<backend ip:port>", "peer": [ip, port]}`` (peer from
  getpeername) or ``{"errno": E}``.
* ``{"op": "udp", "host": H, "port": P, "count": N, "connected": bool}``: N request/reply
  exchanges; results carry the reply's ``id``, its source ``src`` as recvfrom reports
  it, and for connected sockets the ``peer``; or ``{"errno": E}``.
* ``{"op": "netns_cookie"}``: ``{"cookie": C}`` (SO_NETNS_COOKIE of a socket).
"""

from __future__ import annotations

import json
import socket
import sys
from typing import Any

SO_NETNS_COOKIE = 71
TIMEOUT = 3.0


def _family(host: str) -> int:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def _addr(sockaddr: Any) -> list[Any]:
    return [sockaddr[0], sockaddr[1]]


def _tcp(host: str, port: int, bind: str | None) -> dict[str, Any]:
    with socket.socket(_family(host), socket.SOCK_STREAM) as s:
        s.settimeout(TIMEOUT)
        try:
            if bind:
                s.bind((bind, 0))
            s.connect((host, port))
            peer = _addr(s.getpeername())
            data = b""
            while True:
                chunk = s.recv(256)
                if not chunk:
                    break
                data += chunk
        except OSError as exc:
            return {"errno": exc.errno, "error": str(exc)}
    return {"id": data.decode(), "peer": peer}


def _udp(host: str, port: int, connected: bool) -> dict[str, Any]:
    with socket.socket(_family(host), socket.SOCK_DGRAM) as s:
        s.settimeout(TIMEOUT)
        try:
            out: dict[str, Any] = {}
            if connected:
                s.connect((host, port))
                out["peer"] = _addr(s.getpeername())
                s.send(b"hello")
            else:
                s.sendto(b"hello", (host, port))
            data, src = s.recvfrom(256)
        except OSError as exc:
            return {"errno": exc.errno, "error": str(exc)}
    out.update(id=data.decode(), src=_addr(src))
    return out


def _run(cmd: dict[str, Any]) -> dict[str, Any]:
    op = cmd["op"]
    if op == "tcp":
        res = [_tcp(cmd["host"], cmd["port"], cmd.get("bind")) for _ in range(cmd["count"])]
        return {"results": res}
    if op == "udp":
        res = [_udp(cmd["host"], cmd["port"], cmd["connected"]) for _ in range(cmd["count"])]
        return {"results": res}
    if op == "netns_cookie":
        with socket.socket() as s:
            raw = s.getsockopt(socket.SOL_SOCKET, SO_NETNS_COOKIE, 8)
        return {"cookie": int.from_bytes(raw, sys.byteorder)}
    return {"error": f"unknown op {op!r}"}


def main() -> int:
    """Wait for ``go``, then answer commands until stdin closes."""
    if sys.stdin.readline().strip() != "go":
        return 1
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            reply = _run(json.loads(line))
        except Exception as exc:  # report to the test instead of dying silently
            reply = {"error": repr(exc)}
        print(json.dumps(reply), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
