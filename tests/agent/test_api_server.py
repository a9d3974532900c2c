"""The API server in-process (statewright/agent/api.py): the socket (mode, stale file
replaced, live agent refused, removed at stop), routing (404, 405 with Allow, encoded '/'
in a segment), schema checks before the handler (400 naming the field, the handler not
called), the body limit, handler failures, feeds ended by a stop, and the CLI client."""

from __future__ import annotations

import http.client
import json
import os
import socket
import stat
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import pytest

from statewright.agent.api import MAX_BODY, ApiServer
from statewright.agent.client import AgentClient
from statewright.api_types import (
    NDJSON,
    ApiError,
    NdjsonStream,
    QueryParam,
    Request,
    Route,
    TextBody,
)

BODY = {
    "type": "object",
    "additionalProperties": False,
    "required": ["name"],
    "properties": {"name": {"type": "string", "maxLength": 8},
                   "size": {"type": "integer", "minimum": 1}},
}


class Store:
    """A tiny resource the routes change, so tests can see that a bad request did not."""

    def __init__(self) -> None:
        self.items: dict[str, Any] = {}
        self.calls = 0
        self.feed_closed = anyio.Event()

    def routes(self) -> list[Route]:
        return [
            Route("/items", self.list_items, response={"type": "object"}),
            Route("/items/{key}", self.put, ("PUT",), body=BODY),
            Route("/items/{key}", self.get),
            Route("/echo/{key}", self.echo,
                  query=(QueryParam("mode", {"type": "string", "enum": ["a", "b"]}),)),
            Route("/text", self.text, media_types=("text/plain",)),
            Route("/boom", self.boom),
            Route("/feed", self.feed, media_types=(NDJSON,)),
        ]

    async def list_items(self, req: Request) -> Any:
        return dict(self.items)

    async def put(self, req: Request) -> Any:
        self.calls += 1
        self.items[req.params["key"]] = req.json()
        return {"stored": req.params["key"]}

    async def get(self, req: Request) -> Any:
        if req.params["key"] not in self.items:
            raise ApiError(404, f"no item {req.params['key']!r}")
        return self.items[req.params["key"]]

    async def echo(self, req: Request) -> Any:
        return {"key": req.params["key"], "query": dict(req.query)}

    async def text(self, req: Request) -> Any:
        return TextBody("plain words\n")

    async def boom(self, req: Request) -> Any:
        raise RuntimeError("handler bug")

    async def feed(self, req: Request) -> Any:
        store = self

        async def lines() -> AsyncIterator[str]:
            try:
                yield json.dumps({"n": 1}) + "\n"
                await anyio.sleep_forever()
            finally:
                store.feed_closed.set()

        return NdjsonStream(lines)


def _request(path: str, method: str, target: str, body: bytes | None = None,
             headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("agent", timeout=10)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(10)
    sock.connect(path)
    conn.sock = sock
    try:
        conn.request(method, target, body=body, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def serve(tmp: Path, client: Callable[[str, Store], Any], mode: int = 0o660,
          **server_args: float) -> Any:
    """Run an ApiServer of a `Store` on a socket in ``tmp``; ``client(socket, store)`` runs
    in a thread while it serves; returns what it returned. The socket is gone after."""
    path = str(tmp / "api.sock")
    store = Store()

    async def main() -> Any:
        server = ApiServer(path, mode, store.routes(), **server_args)
        server.bind()
        try:
            async with anyio.create_task_group() as tg:
                await tg.start(server.serve)
                try:
                    return await anyio.to_thread.run_sync(client, path, store)
                finally:
                    tg.cancel_scope.cancel()
        finally:
            await server.aclose()

    out = anyio.run(main)
    assert not os.path.exists(path)
    return out


def test_socket_mode_is_set_and_the_socket_removed_at_stop(tmp_path: Path) -> None:
    def client(path: str, store: Store) -> int:
        return stat.S_IMODE(os.stat(path).st_mode)

    assert serve(tmp_path, client) == 0o660
    assert serve(tmp_path, client, mode=0o600) == 0o600


def test_a_stale_socket_is_replaced_and_a_live_one_refused(tmp_path: Path) -> None:
    path = str(tmp_path / "api.sock")
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(path)  # bound, never listening: what a SIGKILLed agent leaves
    stale.close()
    assert serve(tmp_path, lambda p, s: AgentClient(p).get("/items")) == {}

    live = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    live.bind(path)
    live.listen(1)
    try:
        with pytest.raises(OSError, match="another agent is already listening"):
            ApiServer(path, 0o660, []).bind()
        assert os.path.exists(path)
    finally:
        live.close()
        os.unlink(path)
    Path(path).write_text("not a socket")
    with pytest.raises(OSError, match="not a socket"):
        ApiServer(path, 0o660, []).bind()
    assert Path(path).read_text() == "not a socket"


def test_routing_errors_are_json_with_the_reason(tmp_path: Path) -> None:
    def client(path: str, store: Store) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out["404"] = _request(path, "GET", "/nope")
        out["405"] = _request(path, "POST", "/items")
        out["missing"] = _request(path, "GET", "/items/x")
        out["head"] = _request(path, "HEAD", "/items")
        return out

    out = serve(tmp_path, client)
    status, headers, body = out["404"]
    assert status == 404 and headers["content-type"] == "application/json"
    assert json.loads(body) == {
        "error": "no such route '/nope' (GET /openapi.json lists the routes)"}
    status, headers, body = out["405"]
    assert status == 405 and headers["allow"] == "GET, HEAD"
    assert "POST not allowed on /items" in json.loads(body)["error"]
    assert out["missing"][0] == 404 and json.loads(out["missing"][2]) == {"error": "no item 'x'"}
    assert out["head"][0] == 200 and out["head"][2] == b""


def test_bad_requests_get_400_with_the_field_and_reach_no_handler(tmp_path: Path) -> None:
    cases = [
        (b'{"name": 5}', "field 'name': expected a string, got 5"),
        (b'{"name": "x", "size": 0}', "field 'size': 0 is less than 1"),
        (b'{"name": "x", "size": true}', "field 'size': expected an integer"),
        (b'{"name": "x", "colour": "red"}', "field 'colour': unknown field"),
        (b'{"size": 2}', "field 'name': missing (required)"),
        (b'{"name": "far too long"}', "is longer than 8"),
        (b'[1]', "expected an object"),
        (b'{"name": ', "request body is not JSON"),
        (b'', "missing (a JSON document is required)"),
    ]

    def client(path: str, store: Store) -> list[tuple[int, Any]]:
        out = []
        for body, _ in cases:
            status, _, data = _request(path, "PUT", "/items/a", body,
                                       {"Content-Type": "application/json"})
            out.append((status, json.loads(data)))
        out.append(_request(path, "GET", "/echo/k?mode=c")[::2])
        out.append(_request(path, "GET", "/items", b'{"x": 1}')[::2])
        assert AgentClient(path).get("/items") == {} and store.calls == 0
        return out

    out = serve(tmp_path, client)
    for (status, doc), (_, reason) in zip(out, cases):
        assert status == 400 and reason in doc["error"], (doc, reason)
    status, body = out[len(cases)]
    assert status == 400 and "query parameter 'mode'" in json.loads(body)["error"]
    status, body = out[len(cases) + 1]
    assert status == 400 and "takes no request body" in json.loads(body)["error"]


def test_good_requests_reach_the_handler(tmp_path: Path) -> None:
    def client(path: str, store: Store) -> dict[str, Any]:
        put = _request(path, "PUT", "/items/a", b'{"name": "x", "size": 3}')
        return {
            "put": (put[0], json.loads(put[2])),
            "items": AgentClient(path).get("/items"),
            "slash": AgentClient(path).get("/echo/pod-name:ns%2Fweb?mode=a"),
            "text": AgentClient(path).get_text("/text"),
        }

    out = serve(tmp_path, client)
    assert out["put"] == (200, {"stored": "a"})
    assert out["items"] == {"a": {"name": "x", "size": 3}}
    assert out["slash"] == {"key": "pod-name:ns/web", "query": {"mode": "a"}}
    assert out["text"] == "plain words\n"


def test_too_large_bodies_and_handler_bugs(tmp_path: Path) -> None:
    def client(path: str, store: Store) -> list[tuple[int, Any]]:
        big = b'{"name": "' + b"x" * (MAX_BODY + 10) + b'"}'
        out = []
        for method, target, body in (("PUT", "/items/a", big), ("GET", "/boom", None)):
            status, _, data = _request(path, method, target, body)
            out.append((status, json.loads(data)))
        out.append((200, AgentClient(path).get("/items")))  # still serving
        return out

    (s1, d1), (s2, d2), (_, items) = serve(tmp_path, client)
    assert s1 == 413 and "larger than" in d1["error"]
    assert s2 == 500 and d2 == {"error": "RuntimeError: handler bug"}
    assert items == {}


def test_stopping_ends_an_open_feed(tmp_path: Path) -> None:
    path = str(tmp_path / "api.sock")
    store = Store()
    got: list[Any] = []

    def read_feed() -> None:
        for doc in AgentClient(path).stream("/feed"):
            got.append(doc)

    async def main() -> None:
        server = ApiServer(path, 0o660, store.routes())
        server.bind()
        try:
            async with anyio.create_task_group() as outer:
                async with anyio.create_task_group() as tg:
                    await tg.start(server.serve)
                    outer.start_soon(anyio.to_thread.run_sync, read_feed)
                    with anyio.fail_after(10):
                        while not got:
                            await anyio.sleep(0.02)
                    tg.cancel_scope.cancel()  # the agent stops
                with anyio.fail_after(5):
                    await store.feed_closed.wait()
        finally:
            await server.aclose()

    anyio.run(main)
    assert got == [{"n": 1}]
    assert not os.path.exists(path)


def _raw(path: str, data: bytes, read_until_closed: bool = True, timeout: float = 10) -> bytes:
    """Send ``data`` on a new connection and read until the server closes it."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    sock.connect(path)
    try:
        sock.sendall(data)
        out = b""
        while chunk := sock.recv(65536):
            out += chunk
            if not read_until_closed and b"\r\n\r\n" in out:
                break
        return out
    finally:
        sock.close()


def test_deeply_nested_json_is_refused_with_400(tmp_path: Path) -> None:
    def client(path: str, store: Store) -> Any:
        json_type = {"Content-Type": "application/json"}
        deep = _request(path, "PUT", "/items/a", b"[" * 1000, json_type)
        deep_obj = _request(path, "PUT", "/items/a",
                            b'{"name": ' + b'{"a": ' * 100 + b"1" + b"}" * 101, json_type)
        # Brackets inside strings do not count.
        fine = _request(path, "PUT", "/items/a", json.dumps({"name": "[[[[["}).encode(),
                        json_type)
        return deep, deep_obj, fine, store.calls

    deep, deep_obj, fine, calls = serve(tmp_path, client)
    assert deep[0] == 400 and b"nested deeper than 64" in deep[2]
    assert deep_obj[0] == 400 and b"nested deeper" in deep_obj[2]
    assert fine[0] == 200 and calls == 1


def test_a_non_json_body_gets_415(tmp_path: Path) -> None:
    def client(path: str, store: Store) -> Any:
        body = json.dumps({"name": "a"}).encode()
        return (_request(path, "PUT", "/items/a", body, {"Content-Type": "text/plain"}),
                _request(path, "PUT", "/items/b", body,
                         {"Content-Type": "application/json; charset=utf-8"}),
                _request(path, "PUT", "/items/c", body), store.calls)

    plain, typed, untyped, calls = serve(tmp_path, client)
    assert plain[0] == 415 and b"application/json" in plain[2]
    assert typed[0] == 200 and untyped[0] == 200 and calls == 2


def test_a_404_does_not_echo_a_long_path(tmp_path: Path) -> None:
    long = "/" + "x" * 10_000
    status, _, body = serve(tmp_path, lambda p, s: _request(p, "GET", long))
    assert status == 404 and len(body) < 400
    assert b"(10001 characters)" in body


def test_the_http2_preface_gets_a_clear_answer(tmp_path: Path) -> None:
    answer = serve(tmp_path, lambda p, s: _raw(p, b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"))
    assert answer.startswith(b"HTTP/1.1 505"), answer
    assert b"HTTP/2 is not supported" in answer and b"None" not in answer


def test_incomplete_requests_are_timed_out(tmp_path: Path) -> None:
    """Half-open connections (headers never finished, or a body that never comes) are
    closed after the header and body timeouts; a whole request is still answered."""

    def client(path: str, store: Store) -> Any:
        socks = []
        for _ in range(20):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(10)
            sock.connect(path)
            sock.sendall(b"GET /items HTTP/1.1\r\nHost: agent\r\n")  # no blank line
            socks.append(sock)
        closed = sum(1 for sock in socks if sock.recv(100) == b"")  # waits for the close
        for sock in socks:
            sock.close()
        # A kept-alive connection whose next request stalls is closed too.
        kept = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        kept.settimeout(10)
        kept.connect(path)
        kept.sendall(b"GET /items HTTP/1.1\r\nHost: agent\r\n\r\n")
        first = b""
        while not first.endswith(b"{}\n"):
            first += kept.recv(65536)
        kept.sendall(b"GET /items HTTP/1.1\r\n")
        rest = kept.recv(65536)
        kept.close()
        body = _raw(path, b"PUT /items/a HTTP/1.1\r\nHost: agent\r\n"
                          b"Content-Length: 40\r\n\r\n{\"name\":")
        return closed, first, rest, body, store.calls

    closed, first, rest, body, calls = serve(tmp_path, client, header_timeout=0.3,
                                             body_timeout=0.3)
    assert closed == 20
    assert first.startswith(b"HTTP/1.1 200") and rest == b""
    assert body.startswith(b"HTTP/1.1 408") and b"not received within 0.3 s" in body
    assert calls == 0


def test_a_client_gone_mid_body_is_one_debug_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    def client(path: str, store: Store) -> Any:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(path)
        sock.sendall(b"PUT /items/a HTTP/1.1\r\nHost: agent\r\nContent-Length: 100\r\n"
                     b"\r\n{\"na")
        import time
        time.sleep(0.2)
        sock.close()
        time.sleep(0.3)
        return AgentClient(path).get("/items")  # still serving

    import logging
    with caplog.at_level(logging.DEBUG, logger="statewright.agent.api"):
        assert serve(tmp_path, client) == {}
    api_lines = [r for r in caplog.records if r.name == "statewright.agent.api"]
    assert not [r for r in api_lines if r.levelno >= logging.WARNING], api_lines
    assert any("client disconnected" in r.getMessage() for r in api_lines)
