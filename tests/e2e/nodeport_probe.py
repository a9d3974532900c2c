"""Servers and clients for the north-south tests (tests/e2e/test_cluster_nodeport.py) and
the NodePort benchmark: every answer names the server *and the client address it saw*,
so a test can tell a preserved client address from a masqueraded one.

``nodeport_probe.py serve HOST ...``: on each address, a TCP and a UDP listener on `PORT`.
TCP: the server sends one JSON line ``{"id": "ip:port", "peer": "client ip"}``, then echoes
every byte until the client closes. UDP: each datagram is answered with the same JSON.
Prints ``ready`` once listening; runs until stdin closes.

``nodeport_probe.py client``: one JSON command per stdin line, one JSON answer per line:

* ``{"op": "tcp", "host": H, "port": P}``: connect, read the greeting, close;
* ``{"op": "udp", "host": H, "port": P}``: one datagram on a *connected* socket (a reply
  from another address than H:P is not received: proof of the reverse translation);
* ``{"op": "open", "id": N, "host": H, "port": P}``: connect, read the greeting, keep it;
* ``{"op": "ping", "id": N}``: send a byte on connection N and read it back;
* ``{"op": "rate", "host": H, "port": P, "seconds": S}``: TCP connections (greeting read,
  closed) one after the other for S seconds: ``{"count": n, "seconds": s}``.

Answers carry the greeting's fields or ``{"errno": E, "error": "..."}`` (a timeout after
`TIMEOUT` s).
"""

from __future__ import annotations

import json
import socket
import sys
import threading
import time
from typing import Any

PORT = 8080
TIMEOUT = 3.0


def _family(host: str) -> int:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def _ident(host: str) -> str:
    return f"[{host}]:{PORT}" if ":" in host else f"{host}:{PORT}"


def _greeting(host: str, peer: str) -> bytes:
    return (json.dumps({"id": _ident(host), "peer": peer}) + "\n").encode()


def _tcp_conn(conn: socket.socket, host: str, peer: str) -> None:
    with conn:
        try:
            conn.sendall(_greeting(host, peer))
            while data := conn.recv(256):
                conn.sendall(data)
        except OSError:
            pass


def _listen(host: str) -> None:
    tcp = socket.socket(_family(host), socket.SOCK_STREAM)
    tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    tcp.bind((host, PORT))
    tcp.listen(256)
    udp = socket.socket(_family(host), socket.SOCK_DGRAM)
    udp.bind((host, PORT))

    def accept() -> None:
        while True:
            conn, peer = tcp.accept()
            threading.Thread(target=_tcp_conn, args=(conn, host, peer[0]), daemon=True).start()

    def answer() -> None:
        while True:
            _, peer = udp.recvfrom(2048)
            udp.sendto(_greeting(host, peer[0]), peer)

    threading.Thread(target=accept, daemon=True).start()
    threading.Thread(target=answer, daemon=True).start()


def serve(hosts: list[str]) -> int:
    for host in hosts:
        _listen(host)
    print("ready", flush=True)
    sys.stdin.read()
    return 0


def _read_line(s: socket.socket) -> dict[str, Any]:
    buf = b""
    while not buf.endswith(b"\n"):
        chunk = s.recv(256)
        if not chunk:
            raise ConnectionResetError(104, "closed before the greeting")
        buf += chunk
    answer: dict[str, Any] = json.loads(buf)
    return answer


def _connect(host: str, port: int) -> socket.socket:
    s = socket.socket(_family(host), socket.SOCK_STREAM)
    s.settimeout(TIMEOUT)
    try:
        s.connect((host, port))
    except OSError:
        s.close()
        raise
    return s


def _udp(host: str, port: int) -> dict[str, Any]:
    with socket.socket(_family(host), socket.SOCK_DGRAM) as s:
        s.settimeout(TIMEOUT)
        s.connect((host, port))
        s.send(b"hello")
        answer: dict[str, Any] = json.loads(s.recv(2048))
        return answer


def _rate(host: str, port: int, seconds: float) -> dict[str, Any]:
    n = 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        with _connect(host, port) as s:
            _read_line(s)
        n += 1
    return {"count": n, "seconds": time.perf_counter() - start}


def _run(cmd: dict[str, Any], conns: dict[int, socket.socket]) -> dict[str, Any]:
    op = cmd["op"]
    if op == "tcp":
        with _connect(cmd["host"], cmd["port"]) as s:
            return _read_line(s)
    if op == "udp":
        return _udp(cmd["host"], cmd["port"])
    if op == "open":
        s = _connect(cmd["host"], cmd["port"])
        conns[cmd["id"]] = s
        return _read_line(s)
    if op == "ping":
        s = conns[cmd["id"]]
        s.sendall(b"x")
        if s.recv(1) != b"x":
            raise ConnectionResetError(104, "connection closed")
        return {"ok": True}
    if op == "rate":
        return _rate(cmd["host"], cmd["port"], float(cmd["seconds"]))
    raise ValueError(f"unknown op {op!r}")


def client() -> int:
    conns: dict[int, socket.socket] = {}
    for line in sys.stdin:
        try:
            out = _run(json.loads(line), conns)
        except OSError as exc:
            out = {"errno": exc.errno, "error": str(exc)}
        print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["serve"]:
        sys.exit(serve(sys.argv[2:]))
    sys.exit(client())
