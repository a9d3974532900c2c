"""Long-lived TCP connections for the ingress-policy tests (tests/e2e/test_node_ingress.py):
established flows must survive a policy change and an agent restart.

``flow_probe.py serve HOST:PORT ...``: an echo server on each address (one thread per
connection, every byte sent back); prints ``ready`` once listening.

``flow_probe.py client``: one JSON command per stdin line, one JSON answer per line:

* ``{"op": "open", "id": N, "host": H, "port": P}``: connect and keep the socket;
  ``{"ok": true}`` or ``{"errno": E, "error": "..."}``;
* ``{"op": "ping", "id": N}``: send a byte on connection N and read it back;
  ``{"ok": true}`` or ``{"errno": E, "error": "..."}`` (a timeout after `TIMEOUT` s).
"""

from __future__ import annotations

import json
import socket
import sys
import threading
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


if __name__ == "__main__":
    if sys.argv[1:2] == ["serve"]:
        sys.exit(serve(sys.argv[2:]))
    sys.exit(client())
