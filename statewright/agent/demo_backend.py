"""Example backend servers for the demo namespace (statewright/agent/demo_netns.py).

    python -m statewright.agent.demo_backend tcp:10.244.1.10:8080 udp:10.244.1.10:5353 ...

A TCP listener answers any request with a small HTTP response naming itself
(``backend 10.244.1.10:8080``), so ``curl http://<service address>`` shows which
backend the datapath chose; a UDP listener answers each datagram the same way. It
runs until its stdin closes (the agent closes it on stop) or it is killed by PID.
"""

from __future__ import annotations

import socket
import sys
import threading


def _parse(spec: str) -> tuple[str, str, int]:
    proto, _, rest = spec.partition(":")
    host, _, port = rest.rpartition(":")
    return proto.lower(), host.strip("[]"), int(port)


def _serve_tcp(sock: socket.socket, ident: str) -> None:
    body = f"backend {ident}\n".encode()
    reply = (
        b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\nContent-Length: "
        + str(len(body)).encode()
        + b"\r\nConnection: close\r\n\r\n"
        + body
    )
    while True:
        conn, _ = sock.accept()
        with conn:
            try:
                conn.settimeout(1.0)
                try:
                    conn.recv(4096)
                except OSError:
                    pass
                conn.sendall(reply)
            except OSError:
                pass


def _serve_udp(sock: socket.socket, ident: str) -> None:
    while True:
        _, peer = sock.recvfrom(2048)
        try:
            sock.sendto(f"backend {ident}\n".encode(), peer)
        except OSError:
            pass


def main(argv: list[str]) -> int:
    """Bind every listener, print ``ready``, serve until stdin closes."""
    for spec in argv:
        proto, host, port = _parse(spec)
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        kind = socket.SOCK_STREAM if proto == "tcp" else socket.SOCK_DGRAM
        sock = socket.socket(family, kind)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        ident = f"[{host}]:{port}" if family == socket.AF_INET6 else f"{host}:{port}"
        if proto == "tcp":
            sock.listen(64)
            target = _serve_tcp
        else:
            target = _serve_udp
        threading.Thread(target=target, args=(sock, ident), daemon=True).start()
    print("ready", flush=True)
    sys.stdin.read()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
