"""Probes for the NetworkPolicy matrix on the datapath (tests/e2e/test_netpol_matrix.py),
run inside a pod's network namespace.

``netpol_probe.py serve ADDRESS PORT...``: TCP listeners (accepting and closing) and UDP
sockets on each port; every datagram's payload (a probe token) is recorded. Prints
``ready``; then each stdin line ``tokens`` is answered with a JSON list of the tokens
received since the last such line.

``netpol_probe.py client``: waits for a line ``go`` (the test moves it into its cgroup
first), answers ``{"ready": true}``, then each stdin line ``[[token, host, port, proto],
...]`` is answered with one JSON object token -> outcome, the probes run at once:
``ok`` (TCP connected; UDP sent), ``eperm`` (refused by the egress policy at the socket),
``timeout`` (TCP: no answer, the SYN was dropped) or ``error: ...``.
"""

from __future__ import annotations

import errno
import json
import socket
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

TIMEOUT = 1.0


def serve(address: str, ports: list[int]) -> int:
    tokens: list[str] = []
    lock = threading.Lock()

    def tcp(port: int) -> None:
        srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        srv.bind((address, port))
        srv.listen(128)
        while True:
            conn, _ = srv.accept()
            conn.close()

    def udp(port: int) -> None:
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.bind((address, port))
        while True:
            data, _ = s.recvfrom(256)
            with lock:
                tokens.append(data.decode(errors="replace"))

    for port in ports:
        threading.Thread(target=tcp, args=(port,), daemon=True).start()
        threading.Thread(target=udp, args=(port,), daemon=True).start()
    print("ready", flush=True)
    for line in sys.stdin:
        if line.strip() == "tokens":
            with lock:
                out, tokens[:] = list(tokens), []
            print(json.dumps(out), flush=True)
    return 0


def probe(token: str, host: str, port: int, proto: str) -> str:
    kind = socket.SOCK_STREAM if proto == "TCP" else socket.SOCK_DGRAM
    with socket.socket(socket.AF_INET, kind) as s:
        s.settimeout(TIMEOUT)
        try:
            if proto == "TCP":
                s.connect((host, port))
            else:
                s.sendto(token.encode(), (host, port))
        except TimeoutError:
            return "timeout"
        except OSError as e:
            if e.errno == errno.EPERM:
                return "eperm"
            return f"error: {e}"
    return "ok"


def client() -> int:
    if sys.stdin.readline().strip() != "go":
        return 1
    print(json.dumps({"ready": True}), flush=True)
    with ThreadPoolExecutor(max_workers=64) as pool:
        for line in sys.stdin:
            batch: list[Any] = json.loads(line)
            futures = {t: pool.submit(probe, t, h, p, proto) for t, h, p, proto in batch}
            print(json.dumps({t: f.result() for t, f in futures.items()}), flush=True)
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["serve"]:
        sys.exit(serve(sys.argv[2], [int(p) for p in sys.argv[3:]]))
    sys.exit(client())
