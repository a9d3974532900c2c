"""A real etcd cluster for tests: members on loopback ports of their own, data dirs under
a directory the caller owns, each member a child process stopped by its PID.

`EtcdCluster.start()` launches the members and waits until the cluster has a leader;
`stop_member`/`start_member` kill (SIGKILL, as a crash) and restart one member with its
data (its ports stay reserved for it); `stop()` ends every member, also after a failure.
`TCPProxy` sits between a client and one member so a test can cut (partition) and heal
that path without touching the member.

``host`` and ``netns``: the three-node bed (tests/e2e/cluster_harness.py) runs its etcd
inside the bed's underlay namespace on the bridge's address, where the node agents reach
it; the status requests of this module then go from a thread of their own that enters
that namespace (`in_netns`), so the test process stays where it is. ``extra_args`` adds
etcd flags (TLS: tests/kvstore/test_tls_auth.py).
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

ETCD = shutil.which("etcd") or "/usr/bin/etcd"


def etcd_available() -> bool:
    """Whether the etcd server binary (Debian's etcd-server) is installed."""
    return os.access(ETCD, os.X_OK)


def free_port() -> int:
    """A loopback TCP port nobody listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def in_netns(netns: str, fn: Callable[[], T]) -> T:
    """``fn()`` called by a new thread that enters network namespace ``netns`` first (its
    sockets live there) and ends after; no other thread changes namespace."""
    out: list[Any] = []

    def run() -> None:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            fd = os.open(f"/var/run/netns/{netns}", os.O_RDONLY)
            try:
                if libc.setns(fd, 0x40000000) != 0:  # CLONE_NEWNET
                    raise OSError(ctypes.get_errno(), f"setns {netns}")
            finally:
                os.close(fd)
            out.append((True, fn()))
        except BaseException as e:  # handed to the caller
            out.append((False, e))

    t = threading.Thread(target=run)
    t.start()
    t.join()
    ok, value = out[0]
    if not ok:
        raise value
    return value


@dataclass
class Member:
    name: str
    client_port: int
    peer_port: int
    data_dir: Path
    proc: subprocess.Popen[bytes] | None = None
    host: str = "127.0.0.1"
    scheme: str = "http"

    @property
    def client_url(self) -> str:
        return f"{self.scheme}://{self.host}:{self.client_port}"

    @property
    def peer_url(self) -> str:
        return f"http://{self.host}:{self.peer_port}"


@dataclass
class EtcdCluster:
    base: Path
    size: int = 3
    members: list[Member] = field(default_factory=list)
    #: Where the members listen (and, with ``netns``, in which network namespace).
    host: str = "127.0.0.1"
    netns: str = ""
    #: More etcd flags for every member (e.g. TLS); ``scheme`` of the client URLs.
    extra_args: tuple[str, ...] = ()
    scheme: str = "http"
    #: An SSL context for the status requests (TLS members), else None.
    ssl_context: Any = None

    def __post_init__(self) -> None:
        token = f"sw-{uuid.uuid4().hex[:8]}"
        self.token = token
        for i in range(self.size):
            # In a namespace of its own every port is free: fixed ones.
            ports = (2379 + 2 * i, 2380 + 2 * i) if self.netns else (free_port(), free_port())
            self.members.append(Member(f"m{i}", *ports, self.base / f"m{i}.etcd",
                                       host=self.host, scheme=self.scheme))

    @property
    def endpoints(self) -> list[str]:
        return [m.client_url for m in self.members]

    def _argv(self, m: Member, state: str) -> list[str]:
        initial = ",".join(f"{x.name}={x.peer_url}" for x in self.members)
        return [
            ETCD, "--name", m.name, "--data-dir", str(m.data_dir),
            "--listen-client-urls", m.client_url, "--advertise-client-urls", m.client_url,
            "--listen-peer-urls", m.peer_url, "--initial-advertise-peer-urls", m.peer_url,
            "--initial-cluster", initial, "--initial-cluster-state", state,
            "--initial-cluster-token", self.token,
            "--heartbeat-interval", "50", "--election-timeout", "500",
            "--logger", "zap", "--log-level", "error", *self.extra_args,
        ]

    def start(self, timeout: float = 30.0, attempts: int = 3) -> EtcdCluster:
        """Start every member; ports another process took between `free_port` and etcd's
        bind are picked again (fresh data dirs), up to ``attempts`` times."""
        self.base.mkdir(parents=True, exist_ok=True)
        for attempt in range(attempts):
            try:
                for m in self.members:
                    self._spawn(m, "new")
                self.wait_leader(timeout)
                return self
            except RuntimeError as e:
                self.stop()
                if "address already in use" not in str(e) or attempt == attempts - 1:
                    raise
                self._new_ports()
            except BaseException:
                self.stop()
                raise
        return self

    def _new_ports(self) -> None:
        self.token = f"sw-{uuid.uuid4().hex[:8]}"
        for m in self.members:
            shutil.rmtree(m.data_dir, ignore_errors=True)
            m.client_port, m.peer_port = free_port(), free_port()

    def _spawn(self, m: Member, state: str) -> None:
        log = open(self.base / f"{m.name}.log", "ab")  # noqa: SIM115 - the child holds it
        # `ip netns exec` execs etcd itself: the PID is etcd's.
        prefix = ["ip", "netns", "exec", self.netns] if self.netns else []
        try:
            m.proc = subprocess.Popen(
                prefix + self._argv(m, state), stdout=log, stderr=log, stdin=subprocess.DEVNULL
            )
        finally:
            log.close()

    def stop_member(self, m: Member) -> None:
        """SIGKILL one member (a crash) and reap it."""
        if m.proc is not None and m.proc.poll() is None:
            os.kill(m.proc.pid, signal.SIGKILL)
            m.proc.wait(10)
        m.proc = None

    def start_member(self, m: Member) -> None:
        """Restart a stopped member with its data."""
        self._spawn(m, "existing")

    def stop(self) -> None:
        """Stop every member (SIGTERM, then SIGKILL after a timeout), one after the other:
        members stopped all at once take 6 s to exit (the last ones wait for peers that
        are leaving), one at a time each exits in milliseconds."""
        for m in self.members:
            if m.proc is not None:
                if m.proc.poll() is None:
                    m.proc.terminate()
                try:
                    m.proc.wait(10)
                except subprocess.TimeoutExpired:
                    os.kill(m.proc.pid, signal.SIGKILL)
                    m.proc.wait(10)
                m.proc = None

    # ----- status -----------------------------------------------------------------------------
    def status(self, m: Member) -> dict[str, Any] | None:
        """The member's maintenance status (JSON gateway), None when it does not answer."""
        req = urllib.request.Request(m.client_url + "/v3/maintenance/status", data=b"{}",
                                     method="POST")

        def get() -> dict[str, Any] | None:
            try:
                with urllib.request.urlopen(req, timeout=1.0, context=self.ssl_context) as resp:
                    return json.loads(resp.read())
            except OSError:
                return None

        return in_netns(self.netns, get) if self.netns else get()

    def leader(self) -> Member | None:
        """The member that is leader now, as the running members agree."""
        for m in self.members:
            if m.proc is None:
                continue
            st = self.status(m)
            if st and st.get("leader") and st["leader"] == st.get("header", {}).get("member_id"):
                return m
        return None

    def wait_leader(self, timeout: float = 30.0) -> Member:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for m in self.members:
                if m.proc is not None and m.proc.poll() is not None:
                    log = (self.base / f"{m.name}.log").read_text(errors="replace")[-2000:]
                    raise RuntimeError(f"etcd member {m.name} exited: {log}")
            leader = self.leader()
            if leader is not None:
                return leader
            time.sleep(0.1)
        raise TimeoutError(f"etcd cluster under {self.base}: no leader in {timeout}s")


class TCPProxy:
    """A loopback TCP forwarder to ``target`` that a test can cut and heal."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self._srv = socket.socket()
        self._srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._srv.bind(("127.0.0.1", 0))
        self._srv.listen(64)
        self.port = int(self._srv.getsockname()[1])
        self._lock = threading.Lock()
        self._conns: list[socket.socket] = []
        self._cut = False
        self._frozen = False
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._srv.accept()
            except OSError:
                return
            with self._lock:
                if self._cut:
                    client.close()
                    continue
                try:
                    upstream = socket.create_connection(("127.0.0.1", self.target_port), 2)
                except OSError:
                    client.close()
                    continue
                self._conns += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                while self._frozen and not self._closed:
                    time.sleep(0.05)  # a silent partition: bytes go nowhere
                if self._frozen:
                    break
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def cut(self) -> None:
        """Drop every connection and refuse new ones (a partition)."""
        with self._lock:
            self._cut = True
            conns, self._conns = self._conns, []
        for s in conns:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    def freeze(self) -> None:
        """Stop forwarding without closing anything (packets dropped, no reset)."""
        self._frozen = True

    def heal(self) -> None:
        with self._lock:
            self._cut = False
        self._frozen = False

    def close(self) -> None:
        self._closed = True
        self.cut()
        self._srv.close()
