"""What the agent's clients say when something is wrong on the socket's side: no agent
(missing or stale socket), an agent that does not answer, a broken or non-JSON answer, and
the end of a followed change feed. A fake agent on a unix socket plays each part; every
socket and thread a test creates is closed and joined, also on failure."""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from statewright.agent.client import AgentClient, AgentRequestError, AgentUnavailable
from tests.agent.conftest import run_cli

#: What the fake agent does with one accepted connection.
Behaviour = Callable[[socket.socket], None]


@pytest.fixture
def sockdir() -> Iterator[Path]:
    """A short directory for unix sockets (their paths are limited to 108 bytes)."""
    path = Path(tempfile.mkdtemp(prefix=f"swcli-{os.getpid()}-"))
    try:
        yield path
    finally:
        shutil.rmtree(path)


@pytest.fixture
def fake_agent(sockdir: Path) -> Iterator[Callable[[Behaviour], str]]:
    """Start a fake agent that answers one connection with ``behaviour``; returns its path."""
    servers: list[tuple[socket.socket, threading.Thread, threading.Event]] = []

    def start(behaviour: Behaviour) -> str:
        path = str(sockdir / f"fake{len(servers)}.sock")
        srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        srv.bind(path)
        srv.listen(1)
        done = threading.Event()

        def serve() -> None:
            conn, _ = srv.accept()
            with conn:
                try:
                    conn.recv(65536)  # the request
                    behaviour(conn)
                except OSError:  # the client gave up first: nothing to answer
                    return
                done.wait(30)  # keep the connection until the test is over

        thread = threading.Thread(target=serve, daemon=True)
        thread.start()
        servers.append((srv, thread, done))
        return path

    try:
        yield start
    finally:
        for srv, thread, done in servers:
            done.set()
            if thread.is_alive():  # never connected: unblock accept()
                with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as c:
                    c.connect(srv.getsockname())
            thread.join(10)
            srv.close()


def _answer(head: bytes, body: bytes, close: bool = True) -> Behaviour:
    def behaviour(conn: socket.socket) -> None:
        conn.sendall(head + body)
        if close:
            conn.shutdown(socket.SHUT_WR)
    return behaviour


OK_NDJSON = b"HTTP/1.1 200 OK\r\nContent-Type: application/x-ndjson\r\nConnection: close\r\n\r\n"


def test_no_socket_says_no_agent_runs_and_where_it_looked(
    sockdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = str(sockdir / "none.sock")
    with pytest.raises(AgentUnavailable, match="no agent is running") as exc:
        AgentClient(missing).get("/health")
    assert missing in str(exc.value) and "No such file or directory" in str(exc.value)
    for argv in (["status"], ["db", "list"], ["db", "show", "frontends"],
                 ["db", "watch", "frontends"]):
        code, out, err = run_cli(capsys, *argv, "--socket", missing)
        assert code == 2 and out == "", (argv, err)
        assert "no agent is running" in err and missing in err, (argv, err)
        assert "Traceback" not in err


def test_a_stale_socket_file_says_no_agent_runs(sockdir: Path) -> None:
    stale = str(sockdir / "stale.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.bind(stale)  # bound, never listening: what a killed agent leaves
        with pytest.raises(AgentUnavailable, match="no agent is running") as exc:
            AgentClient(stale).get("/health")
    assert stale in str(exc.value) and "Connection refused" in str(exc.value)


def test_an_agent_that_does_not_answer(fake_agent: Callable[[Behaviour], str]) -> None:
    path = fake_agent(lambda conn: None)
    with pytest.raises(AgentUnavailable, match=r"did not answer /health within 0\.2 s") as exc:
        AgentClient(path, timeout=0.2).get("/health")
    assert path in str(exc.value)


def test_an_answer_that_is_not_json(fake_agent: Callable[[Behaviour], str]) -> None:
    path = fake_agent(_answer(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n", b"oops!"))
    with pytest.raises(AgentRequestError, match=r"/health: the agent's answer is not JSON"):
        AgentClient(path).get("/health")


def test_a_connection_that_breaks_before_the_answer(
    fake_agent: Callable[[Behaviour], str]
) -> None:
    path = fake_agent(lambda conn: conn.shutdown(socket.SHUT_WR))
    with pytest.raises(AgentUnavailable) as exc:
        AgentClient(path).get("/health")
    assert path in str(exc.value) and "Remote end closed connection" in str(exc.value)


def test_a_body_cut_short(fake_agent: Callable[[Behaviour], str]) -> None:
    path = fake_agent(_answer(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n", b"{\"a\""))
    with pytest.raises(AgentUnavailable, match="broke while reading /health") as exc:
        AgentClient(path).get("/health")
    assert path in str(exc.value)


def test_db_watch_says_when_the_agent_ends_the_feed(
    fake_agent: Callable[[Behaviour], str], capsys: pytest.CaptureFixture[str]
) -> None:
    doc = b'{"revision": 1, "deleted": false, "object": {}}\n'
    path = fake_agent(_answer(OK_NDJSON, doc))
    code, out, err = run_cli(capsys, "db", "watch", "frontends", "--socket", path)
    assert out == '{"revision": 1, "deleted": false, "object": {}}\n'
    assert code == 1
    assert f"the agent on {path} ended the change feed" in err
