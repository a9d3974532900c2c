"""Example backend servers for the demo namespace (statewright/agent/demo_netns.py).

    ip netns exec NS python -m statewright.agent.demo_backend

One process serves every listener of the namespace, in one thread (a selector loop), so
thousands of backends cost thousands of sockets, not thousands of threads or processes.
A TCP listener answers any request with a small HTTP response naming itself
(``backend 10.244.1.10:8080``), so ``curl http://<service address>`` shows which backend
the datapath chose; a UDP listener answers each datagram the same way.

Control protocol, one JSON document per line: the process prints ``{"ready": true}`` when
it starts; each request on stdin, ``{"open": [SPEC...], "close": [SPEC...]}`` (closes
first), is answered by ``{"failed": {SPEC: "reason"}}``, empty when every listener was
opened or closed. A SPEC is ``tcp:10.244.1.10:8080`` or ``udp:[fd00::1]:53``. The process
exits when stdin closes (the agent stops, or dies: the pipe closes with it) or when it is
killed by PID.
"""

from __future__ import annotations

import json
import os
import resource
import selectors
import socket
import sys
import time
from dataclasses import dataclass, field

#: How long a TCP connection may stay silent before it gets its answer anyway (a client
#: that connects and waits, such as ``nc``).
REQUEST_WAIT = 1.0


def parse_spec(spec: str) -> tuple[str, str, int]:
    """``tcp:10.0.0.1:80`` -> ("tcp", "10.0.0.1", 80); IPv6 hosts are in brackets."""
    proto, _, rest = spec.partition(":")
    host, _, port = rest.rpartition(":")
    proto = proto.lower()
    if proto not in ("tcp", "udp") or not host:
        raise ValueError(f"bad listener spec {spec!r} (expected tcp|udp:HOST:PORT)")
    return proto, host.strip("[]"), int(port)


def format_spec(ip: str, port: int, proto: str) -> str:
    """The SPEC of a listener on ``ip``:``port`` (``proto`` TCP or UDP, any case)."""
    host = f"[{ip}]" if ":" in ip else ip
    return f"{proto.lower()}:{host}:{port}"


def http_reply(ident: str) -> bytes:
    """The HTTP/1.0 answer of the TCP listener ``ident``."""
    body = f"backend {ident}\n".encode()
    return (
        b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\nContent-Length: "
        + str(len(body)).encode()
        + b"\r\nConnection: close\r\n\r\n"
        + body
    )


@dataclass
class _Listener:
    sock: socket.socket
    proto: str
    ident: str


@dataclass
class _Connection:
    sock: socket.socket
    reply: bytes
    deadline: float


@dataclass
class Server:
    """The listeners of one namespace and the selector loop serving them and the control
    channel on stdin."""

    selector: selectors.BaseSelector = field(default_factory=selectors.DefaultSelector)
    listeners: dict[str, _Listener] = field(default_factory=dict)
    connections: dict[int, _Connection] = field(default_factory=dict)
    control: bytes = b""

    def open(self, spec: str) -> None:
        """Bind and register the listener ``spec`` (no-op when already open)."""
        if spec in self.listeners:
            return
        proto, host, port = parse_spec(spec)
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        kind = socket.SOCK_STREAM if proto == "tcp" else socket.SOCK_DGRAM
        sock = socket.socket(family, kind)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.setblocking(False)
            sock.bind((host, port))
            if proto == "tcp":
                sock.listen(64)
        except OSError:
            sock.close()
            raise
        ident = f"[{host}]:{port}" if family == socket.AF_INET6 else f"{host}:{port}"
        listener = _Listener(sock, proto, ident)
        self.selector.register(sock, selectors.EVENT_READ, listener)
        self.listeners[spec] = listener

    def close(self, spec: str) -> None:
        """Stop the listener ``spec`` (no-op when not open); accepted connections finish."""
        listener = self.listeners.pop(spec, None)
        if listener is not None:
            self.selector.unregister(listener.sock)
            listener.sock.close()

    def handle_request(self, line: bytes) -> dict[str, dict[str, str]]:
        """Apply one control request; the answer names what failed and why."""
        failed: dict[str, str] = {}
        try:
            request = json.loads(line)
            close, open_ = list(request.get("close", ())), list(request.get("open", ()))
        except (ValueError, AttributeError, TypeError) as e:
            return {"failed": {"": f"bad request: {e}"}}
        for spec in close:
            self.close(str(spec))
        for spec in open_:
            try:
                self.open(str(spec))
            except (OSError, ValueError) as e:
                failed[str(spec)] = str(e)
        return {"failed": failed}

    def _control_readable(self) -> bool:
        """Read stdin; answer each complete request. False when stdin closed."""
        chunk = os.read(0, 1 << 16)
        if not chunk:
            return False
        self.control += chunk
        while b"\n" in self.control:
            line, _, self.control = self.control.partition(b"\n")
            if line.strip():
                _answer(self.handle_request(line))
        return True

    def _accept(self, listener: _Listener) -> None:
        reply = http_reply(listener.ident)
        while True:
            try:
                conn, _ = listener.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # e.g. EMFILE: the client sees its connection closed
                return
            conn.setblocking(False)
            self.connections[conn.fileno()] = _Connection(
                conn, reply, time.monotonic() + REQUEST_WAIT)
            self.selector.register(conn, selectors.EVENT_READ, None)

    def _answer_connection(self, fd: int) -> None:
        conn = self.connections.pop(fd)
        self.selector.unregister(conn.sock)
        try:
            try:
                conn.sock.recv(4096)
            except OSError:
                pass
            conn.sock.send(conn.reply)
        except OSError:
            pass
        finally:
            conn.sock.close()

    def _udp(self, listener: _Listener) -> None:
        answer = f"backend {listener.ident}\n".encode()
        while True:
            try:
                _, peer = listener.sock.recvfrom(2048)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return
            try:
                listener.sock.sendto(answer, peer)
            except OSError:
                pass

    def serve(self) -> None:
        """Serve until stdin closes."""
        os.set_blocking(0, False)
        self.selector.register(0, selectors.EVENT_READ, "control")
        while True:
            timeout = None
            if self.connections:
                first = min(c.deadline for c in self.connections.values())
                timeout = max(0.0, first - time.monotonic())
            for key, _ in self.selector.select(timeout):
                if key.data == "control":
                    try:
                        if not self._control_readable():
                            return
                    except BlockingIOError:
                        pass
                elif key.data is None:
                    self._answer_connection(key.fd)
                elif key.data.proto == "tcp":
                    self._accept(key.data)
                else:
                    self._udp(key.data)
            now = time.monotonic()
            for fd in [fd for fd, c in self.connections.items() if c.deadline <= now]:
                self._answer_connection(fd)


def _answer(doc: object) -> None:
    sys.stdout.write(json.dumps(doc) + "\n")
    sys.stdout.flush()


def _raise_fd_limit() -> None:
    """One socket per listener: allow as many open files as the hard limit permits."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def main(argv: list[str]) -> int:
    """Open the listeners given as arguments, print ready, serve until stdin closes."""
    _raise_fd_limit()
    server = Server()
    for spec in argv:
        server.open(spec)
    _answer({"ready": True})
    server.serve()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
