"""Long-lived TCP connections for the ingress-policy tests (tests/e2e/test_node_ingress.py):
established flows must survive a policy change and an agent restart.

``flow_probe.py serve HOST:PORT ...``: an echo server on each address (one thread per
connection, every byte sent back); prints ``ready`` once listening.

``flow_probe.py ping HOST``: one ICMP echo to an IPv4 address over a raw socket (there
is no ping binary on every machine); exit code 0 when answered within `TIMEOUT` s.

``flow_probe.py client``: one JSON command per stdin line, one JSON answer per line:

* ``{"op": "open", "id": N, "host": H, "port": P}``: connect and keep the socket;
  ``{"ok": true}`` or ``{"errno": E, "error": "..."}``;
* ``{"op": "ping", "id": N}``: send a byte on connection N and read it back;
  ``{"ok": true}`` or ``{"errno": E, "error": "..."}`` (a timeout after `TIMEOUT` s).
"""

from __future__ import annotations

import json
import os
import socket
import struct
import sys
import threading
import time
from typing import Any

TIMEOUT = 3.0


def _family(host: str) -> int:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def _echo(conn: socket.socket) -> None:
    with conn:
        while data := conn.recv(256):
            conn.sendall(data)


def _listen(host: str, port: int) -> None:
    srv = socket.socket(_family(host), socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind((host, port))
    srv.listen(64)

    def accept() -> None:
        while True:
            conn, _ = srv.accept()
            threading.Thread(target=_echo, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()


def serve(specs: list[str]) -> int:
    for spec in specs:
        host, _, port = spec.rpartition(":")
        _listen(host.strip("[]"), int(port))
    print("ready", flush=True)
    sys.stdin.read()  # until the test closes our stdin (or kills us)
    return 0


def _error(exc: OSError) -> dict[str, Any]:
    return {"errno": exc.errno, "error": str(exc)}


def client() -> int:
    conns: dict[int, socket.socket] = {}
    for line in sys.stdin:
        cmd = json.loads(line)
        out: dict[str, Any]
        try:
            if cmd["op"] == "open":
                s = socket.socket(_family(cmd["host"]), socket.SOCK_STREAM)
                s.settimeout(TIMEOUT)
                s.connect((cmd["host"], cmd["port"]))
                conns[cmd["id"]] = s
            else:
                s = conns[cmd["id"]]
                s.sendall(b"x")
                if s.recv(1) != b"x":
                    raise ConnectionResetError(104, "connection closed")
            out = {"ok": True}
        except OSError as exc:
            out = _error(exc)
        print(json.dumps(out), flush=True)
    return 0


def _checksum(data: bytes) -> int:
    total = sum(int.from_bytes(data[i : i + 2], "big") for i in range(0, len(data), 2))
    total = (total >> 16) + (total & 0xFFFF)
    return ~(total + (total >> 16)) & 0xFFFF


def ping(host: str) -> int:
    ident = os.getpid() & 0xFFFF
    # an even length: the checksum sums 16-bit words
    body = struct.pack("!BBHHH", 8, 0, 0, ident, 1) + b"statewright!"
    packet = body[:2] + _checksum(body).to_bytes(2, "big") + body[4:]
    with socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP) as s:
        s.settimeout(TIMEOUT)
        s.sendto(packet, (host, 0))
        deadline = time.monotonic() + TIMEOUT
        while time.monotonic() < deadline:
            try:
                data, (src, _) = s.recvfrom(1500)
            except TimeoutError:
                return 1
            icmp = data[(data[0] & 0x0F) * 4 :]
            if src == host and icmp[0] == 0 and int.from_bytes(icmp[4:6], "big") == ident:
                return 0
    return 1


if __name__ == "__main__":
    if sys.argv[1:2] == ["serve"]:
        sys.exit(serve(sys.argv[2:]))
    if sys.argv[1:2] == ["ping"]:
        sys.exit(ping(sys.argv[2]))
    sys.exit(client())
