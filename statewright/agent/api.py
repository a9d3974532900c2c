"""The agent's HTTP API over a unix socket: serves the routes its components declare.

Each component lists its routes (`statewright.component.Route`); this module only speaks
HTTP/1.1 on the socket and dispatches. Routes of the agent as shipped (GET, JSON unless
said otherwise):

``/health``                 overall state (OK/Degraded) and every component's state and reason
``/agent``                  pid, node, maps backend, datapath cgroup, demo namespace, configuration
``/tables``                 every table: rows, revision, initialized, pending initializers
``/tables/<name>``          the rows (``?format=table|yaml`` for statedb.show's text forms)
``/tables/<name>/changes``  change feed, newline-delimited JSON (``?follow=0`` stops after
                            the current rows)
``/lb/services``            frontends with their backends, as ``statewright lb list -o json``
``/bpf/maps``               every component's BPF maps and their entry counts
``/bpf/maps/<name>``        one map's entries, decoded

Requests may carry a body (``Content-Length``) for routes that take one. The unix socket
(mode 0660 by default) is the access control: whoever may open it may use the agent.
Errors are JSON ``{"error": ...}`` with 4xx/5xx; a failing handler never stops the server.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import urllib.parse
from collections.abc import Callable, Sequence
from typing import Any

import anyio
import anyio.abc
from anyio.abc import SocketStream

from statewright.component import ApiError, NdjsonStream, Request, Route, TextBody

log = logging.getLogger("statewright.agent.api")

MAX_HEADER = 16384
MAX_BODY = 1 << 20
REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
           409: "Conflict", 413: "Payload Too Large", 422: "Unprocessable Entity",
           500: "Internal Server Error", 503: "Service Unavailable"}


def _head(status: int, content_type: str, length: int | None) -> bytes:
    lines = [f"HTTP/1.1 {status} {REASONS.get(status, 'Error')}",
             f"Content-Type: {content_type}", "Connection: close"]
    if length is not None:
        lines.append(f"Content-Length: {length}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


class ApiServer:
    """Serves ``routes()`` (called per request, so routes follow the component list) on the
    unix socket ``path``."""

    def __init__(self, path: str, mode: int, routes: Callable[[], Sequence[Route]]) -> None:
        self.path = path
        self.mode = mode
        self.routes = routes
        self.listener: anyio.abc.SocketListener | None = None

    async def bind(self) -> None:
        """Create the socket (and its directory); refuse when another agent answers on it,
        replace a stale socket file left by an agent that was killed."""
        os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
        if os.path.exists(self.path):
            probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                probe.connect(self.path)
            except OSError:
                os.unlink(self.path)  # stale: nobody listens
            else:
                raise OSError(f"another agent is already listening on {self.path}")
            finally:
                probe.close()
        self.listener = await anyio.create_unix_listener(self.path)
        os.chmod(self.path, self.mode)

    async def serve(self, *, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
        """Accept connections until cancelled."""
        if self.listener is None:
            await self.bind()
        assert self.listener is not None
        task_status.started()
        await self.listener.serve(self._handle)

    async def aclose(self) -> None:
        """Close the listener and remove the socket file (after `serve` was cancelled)."""
        if self.listener is not None:
            with contextlib.suppress(Exception):
                await self.listener.aclose()
            self.listener = None
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)

    # ----- one connection ---------------------------------------------------------------
    async def _handle(self, stream: SocketStream) -> None:
        async with stream:
            try:
                method, target, body = await self._read_request(stream)
                await self._dispatch(stream, method, target, body)
            except ApiError as e:
                await self._send_json(stream, {"error": str(e)}, e.status)
            except (anyio.BrokenResourceError, anyio.ClosedResourceError, anyio.EndOfStream):
                pass
            except Exception as e:  # a handler bug must not stop the server
                log.exception("api: request failed")
                with contextlib.suppress(Exception):
                    await self._send_json(stream, {"error": f"{type(e).__name__}: {e}"}, 500)

    async def _read_request(self, stream: SocketStream) -> tuple[str, str, bytes]:
        data = b""
        while b"\r\n\r\n" not in data and b"\n\n" not in data:
            if len(data) > MAX_HEADER:
                raise ApiError(400, "request header too large")
            data += await stream.receive()
        sep = b"\r\n\r\n" if b"\r\n\r\n" in data else b"\n\n"
        head, rest = data.split(sep, 1)
        lines = head.decode("latin-1").splitlines()
        parts = lines[0].strip().split() if lines else []
        if len(parts) != 3 or not parts[2].startswith("HTTP/"):
            raise ApiError(400, f"bad request line {lines[0] if lines else ''!r}")
        length = 0
        for line in lines[1:]:
            name, _, value = line.partition(":")
            if name.strip().lower() == "content-length":
                try:
                    length = int(value.strip())
                except ValueError:
                    raise ApiError(400, f"bad Content-Length {value.strip()!r}") from None
        if length < 0 or length > MAX_BODY:
            raise ApiError(413, f"request body of {length} bytes (at most {MAX_BODY})")
        while len(rest) < length:
            rest += await stream.receive()
        return parts[0].upper(), parts[1], rest[:length]

    async def _send_json(self, stream: SocketStream, doc: Any, status: int = 200) -> None:
        body = (json.dumps(doc, indent=2) + "\n").encode()
        await stream.send(_head(status, "application/json", len(body)) + body)

    async def _dispatch(self, stream: SocketStream, method: str, target: str, body: bytes) -> None:
        url = urllib.parse.urlsplit(target)
        query = dict(urllib.parse.parse_qsl(url.query))
        path = "/" + "/".join(
            urllib.parse.quote(urllib.parse.unquote(p), safe="")
            for p in url.path.split("/") if p
        )
        allowed: list[str] = []
        for route in self.routes():
            params = route.match(path)
            if params is None:
                continue
            if method not in route.methods:
                allowed += route.methods
                continue
            params = {k: urllib.parse.unquote(v) for k, v in params.items()}
            result = await route.handler(Request(params, query, method, body))
            await self._respond(stream, result)
            return
        if allowed:
            raise ApiError(405, f"{method} not allowed on {url.path} (allowed: "
                           f"{', '.join(sorted(set(allowed)))})")
        raise ApiError(404, f"no such endpoint {url.path!r}")

    async def _respond(self, stream: SocketStream, result: Any) -> None:
        if isinstance(result, TextBody):
            data = result.text.encode()
            await stream.send(_head(200, "text/plain; charset=utf-8", len(data)) + data)
        elif isinstance(result, NdjsonStream):
            await self._stream(stream, result)
        else:
            await self._send_json(stream, result)

    async def _stream(self, stream: SocketStream, result: NdjsonStream) -> None:
        await stream.send(_head(200, "application/x-ndjson", None))
        async with anyio.create_task_group() as tg:

            async def watch_close() -> None:
                # The client hanging up ends the stream (it sends nothing else).
                with contextlib.suppress(Exception):
                    while await stream.receive():
                        pass
                tg.cancel_scope.cancel()

            tg.start_soon(watch_close)
            async for line in result.lines():
                await stream.send(line.encode())
            tg.cancel_scope.cancel()
