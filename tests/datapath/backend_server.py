"""Backend servers for the datapath tests, run inside the test's network namespace.

    python backend_server.py tcp:10.244.0.11:8080 udp:[fd00:244::11]:8080 ...

Every TCP listener sends its own ``ip:port`` to each client and closes the connection;
every UDP listener answers each datagram with its ``ip:port``. Prints ``ready`` once all
sockets are bound and runs until its stdin closes (the test closes it, or kills the
process by its PID).
"""

from __future__ import annotations

import socket
import sys
import threading


def _parse(spec: str) -> tuple[str, str, int]:
    proto, _, rest = spec.partition(":")
    host, _, port = rest.rpartition(":")
    return proto, host.strip("[]"), int(port)


def _identity(host: str, port: int) -> bytes:
    return (f"[{host}]:{port}" if ":" in host else f"{host}:{port}").encode()


def _serve_tcp(sock: socket.socket, ident: bytes) -> None:
    while True:
        conn, _ = sock.accept()
        with conn:
            try:
                conn.sendall(ident)
            except OSError:
                pass


def _serve_udp(sock: socket.socket, ident: bytes) -> None:
    while True:
        _, peer = sock.recvfrom(2048)
        sock.sendto(ident, peer)


def main(argv: list[str]) -> int:
    """Bind every listener, then serve until stdin closes."""
    for spec in argv:
        proto, host, port = _parse(spec)
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        kind = socket.SOCK_STREAM if proto == "tcp" else socket.SOCK_DGRAM
        sock = socket.socket(family, kind)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        target = _serve_tcp if proto == "tcp" else _serve_udp
        if proto == "tcp":
            sock.listen(128)
        threading.Thread(target=target, args=(sock, _identity(host, port)), daemon=True).start()
    print("ready", flush=True)
    sys.stdin.read()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
