"""The agent's HTTP API over a unix socket: Starlette on uvicorn, serving the routes its
components declare.

Each component lists its routes (`statewright.component.Route`: path, methods, handler,
and the JSON Schemas of the request body, query parameters and answer). This module turns
them into a Starlette application and serves it with uvicorn as a task of the agent's own
event loop (no second process, no signal handlers of uvicorn's: the agent keeps its own).
Starlette routes (404, and 405 with ``Allow``), uvicorn speaks HTTP/1.1 (h11), and before a
handler runs the request is checked against the route's schemas
(statewright/agent/json_schema.py): a bad request gets 400 with the field and the reason,
and reaches no handler, so it changes nothing. The OpenAPI 3.0 document of every route is
generated from the same declarations (statewright/agent/openapi.py) and served at
``GET /openapi.json``.

Routes of the agent as shipped (JSON unless said otherwise):

``/health``                 overall state (OK/Degraded) and every component's state and reason
``/agent``                  pid, node, maps backend, datapath cgroup, demo namespace, configuration
``/openapi.json``           the OpenAPI document of this API
``/tables``                 every table: rows, revision, initialized, pending initializers
``/tables/<name>``          the rows (``?format=table|yaml`` for statedb.show's text forms)
``/tables/<name>/changes``  change feed, newline-delimited JSON (``?follow=0`` stops after
                            the current rows)
``/lb/services``            frontends with their backends, as ``statewright lb list -o json``
``/bpf/maps``               every component's BPF maps and their entry counts
``/bpf/maps/<name>``        one map's entries, decoded
``/k8s``                    the Kubernetes source's reflectors and refused objects
``/endpoint``, ``/endpoint/<id>``  endpoints (GET, PUT, PATCH, DELETE; Cilium's model)
``/ipam``, ``/ipam/<ip>``   address allocation (GET, POST, DELETE)

The unix socket (mode 0660 by default, set before anyone can connect) is the access
control: whoever may open it may use the agent. A request body must be JSON (415 for
another Content-Type), at most `MAX_BODY` bytes and `MAX_JSON_DEPTH` levels deep (400); a
client has `HEADER_TIMEOUT_S` to send the headers and `BODY_TIMEOUT_S` for the body
(then the connection is closed, or 408); ``PRI * HTTP/2.0`` gets 505 (HTTP/1.1 only); a
client hanging up mid-body is one debug line. Errors are JSON ``{"error": ...}`` with
4xx/5xx; a failing handler is logged and answered 500, it never stops the server. A path
segment may carry an encoded ``/`` (``/endpoint/pod-name:ns%2Fpod``): routing sees the
segment as one and the handler gets it decoded.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import socket
import stat
import urllib.parse
from collections.abc import AsyncIterator, Sequence
from typing import Any

import anyio
import h11
import uvicorn
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect
from starlette.requests import Request as HttpRequest
from starlette.responses import PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route as StarletteRoute
from starlette.types import ASGIApp, Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol

from statewright.agent.json_schema import SchemaViolation, validate
from statewright.api_types import JSON, NDJSON, ApiError, NdjsonStream, Request, Route, TextBody

log = logging.getLogger("statewright.agent.api")

MAX_BODY = 1 << 20
#: Deepest nesting of arrays and objects a JSON body may have (Python's parser would hit
#: its recursion limit near 1000; no request of the API needs more than a handful).
MAX_JSON_DEPTH = 64
#: Seconds a client has to send a request's headers (from the connection, or from the end
#: of the previous answer on a kept-alive one), and then its body.
HEADER_TIMEOUT_S = 10.0
BODY_TIMEOUT_S = 10.0
#: How much of a request path an error message repeats.
MAX_PATH_ECHO = 200
#: How long a stopping server waits for answers in flight before cancelling them.
GRACEFUL_STOP_S = 2
_JSON_TYPES = ("application/json",)
_STRING_OR_BRACKET = re.compile(rb'"(?:[^"\\]|\\.)*"|[\[\]{}]')


def json_response(doc: Any, status: int = 200, headers: dict[str, str] | None = None
                  ) -> Response:
    """``doc`` as compact JSON, newline-terminated. (Compact: the C encoder; ``indent``
    takes the pure-Python one, five times slower on a table of 200 frontends, time the
    event loop would not serve /health. ``statewright ... -o json`` and ``jq`` indent.)"""
    body = (json.dumps(doc) + "\n").encode()
    return Response(body, status, headers=headers, media_type=JSON)


def error_response(status: int, message: str, headers: dict[str, str] | None = None
                   ) -> Response:
    """The API's error answer: ``{"error": message}``."""
    return json_response({"error": message}, status, headers)


class _RawPathSegments:
    """ASGI middleware: route on the request path as sent, one segment per ``/`` the
    client wrote, so an encoded ``%2F`` stays inside its segment (uvicorn's ``path`` is
    fully decoded). Each segment is re-encoded canonically; handlers decode parameters."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and (
            scope["method"] == "PRI" or not scope.get("http_version", "1.1").startswith("1.")
        ):
            # The HTTP/2 connection preface ("PRI * HTTP/2.0"), or another version.
            response = error_response(
                505, "HTTP/2 is not supported: the API speaks HTTP/1.1 (curl: --http1.1)",
                {"Connection": "close"})
            await response(scope, receive, send)
            return
        if scope["type"] == "http":
            raw = scope.get("raw_path") or scope["path"].encode()
            raw_path = raw.decode("latin-1").split("?", 1)[0]
            segments = [urllib.parse.quote(urllib.parse.unquote(seg), safe="")
                        for seg in raw_path.split("/")]
            scope = dict(scope, path="/".join(segments))
        await self.app(scope, receive, send)


def _query(route: Route, request: HttpRequest) -> dict[str, str]:
    """The query parameters (the last value of a repeated one), the declared ones checked
    against their schemas."""
    query = dict(request.query_params)
    for param in route.query:
        if param.name not in query:
            if param.required:
                raise ApiError(400, f"query parameter {param.name!r}: missing (required)")
            continue
        try:
            validate(query[param.name], param.schema, obj=f"query parameter {param.name!r}")
        except SchemaViolation as e:
            raise ApiError(400, str(e)) from None
    return query


async def _read_body(request: HttpRequest, timeout: float) -> bytes:
    """The whole request body, at most `MAX_BODY` bytes, within ``timeout`` seconds."""
    length = request.headers.get("content-length", "0")
    if not length.isdigit():
        raise ApiError(400, f"bad Content-Length {length!r}")
    if int(length) > MAX_BODY:
        raise ApiError(413, f"request body of {length} bytes is larger than {MAX_BODY}")
    chunks: list[bytes] = []
    size = 0
    with anyio.move_on_after(timeout) as scope:
        async for chunk in request.stream():
            chunks.append(chunk)
            size += len(chunk)
            if size > MAX_BODY:
                raise ApiError(413, f"request body larger than {MAX_BODY} bytes")
    if scope.cancelled_caught:
        raise ApiError(408, f"request body not received within {timeout:g} s")
    return b"".join(chunks)


def json_depth(body: bytes) -> int:
    """The deepest nesting of arrays and objects in the JSON text ``body`` (strings
    skipped), without parsing it."""
    depth = deepest = 0
    for m in _STRING_OR_BRACKET.finditer(body):
        c = m.group()
        if c in (b"[", b"{"):
            depth += 1
            deepest = max(deepest, depth)
        elif c in (b"]", b"}"):
            depth -= 1
    return deepest


def _check_content_type(request: HttpRequest) -> None:
    """A body must be JSON: no Content-Type, or application/json (or ``*/*+json``)."""
    ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if ctype and ctype not in _JSON_TYPES and not ctype.endswith("+json"):
        raise ApiError(415, f"request body of type {ctype!r}: the API takes application/json "
                            "(curl: -H 'Content-Type: application/json')")


async def _body(route: Route, request: HttpRequest, timeout: float = BODY_TIMEOUT_S) -> bytes:
    """The request body, checked against the route's schema; a route without a body schema
    takes no body."""
    body = await _read_body(request, timeout)
    if route.body is None:
        if body.strip():
            raise ApiError(400, f"{request.method} {route.pattern} takes no request body")
        return body
    if body.strip():
        _check_content_type(request)
        if json_depth(body) > MAX_JSON_DEPTH:
            raise ApiError(400, f"request body nested deeper than {MAX_JSON_DEPTH} levels")
    try:
        doc = json.loads(body) if body.strip() else None
    except (ValueError, RecursionError) as e:
        raise ApiError(400, f"request body is not JSON: {e}") from None
    if doc is None:
        raise ApiError(400, "request body: missing (a JSON document is required)")
    try:
        validate(doc, route.body)
    except SchemaViolation as e:
        raise ApiError(400, str(e)) from None
    return body


class ApiApp:
    """The Starlette application of ``routes``. `close_feeds` ends the open change feeds
    (the server calls it when it stops, so a followed feed does not hold up the stop)."""

    def __init__(self, routes: Sequence[Route], body_timeout: float = BODY_TIMEOUT_S) -> None:
        self.routes = list(routes)
        self.body_timeout = body_timeout
        self.closing = anyio.Event()
        self._feeds: set[anyio.CancelScope] = set()
        by_path: dict[str, list[Route]] = {}
        for route in self.routes:
            by_path.setdefault(route.pattern, []).append(route)
        starlette_routes = [
            StarletteRoute(pattern, self._endpoint(group),
                           methods=[m for r in group for m in r.methods],
                           include_in_schema=False)
            for pattern, group in by_path.items()
        ]
        self.starlette = Starlette(
            routes=starlette_routes,
            exception_handlers={HTTPException: self._http_error},
        )
        self.asgi: ASGIApp = _RawPathSegments(self.starlette)

    async def _http_error(self, request: HttpRequest, exc: Exception) -> Response:
        """Starlette's own errors (no route, method not allowed) as JSON."""
        assert isinstance(exc, HTTPException)
        path = urllib.parse.unquote(request.url.path)
        if len(path) > MAX_PATH_ECHO:
            path = f"{path[:MAX_PATH_ECHO]}... ({len(path)} characters)"
        headers = dict(exc.headers or {})
        if exc.status_code == 404:
            # "route", not "endpoint": /endpoint/{id} names the agent's pod endpoints
            message = f"no such route {path!r} (GET /openapi.json lists the routes)"
        elif exc.status_code == 405:
            allowed = ", ".join(sorted(m.strip() for m in headers.get("Allow", "").split(",")))
            headers["Allow"] = allowed
            message = f"{request.method} not allowed on {path} (allowed: {allowed})"
        else:
            message = str(exc.detail)
        return error_response(exc.status_code, message, headers)

    def _endpoint(self, group: list[Route]) -> Any:
        by_method = {m: r for r in group for m in r.methods}

        async def endpoint(request: HttpRequest) -> Response:
            method = "GET" if request.method == "HEAD" else request.method
            route = by_method[method]
            try:
                params = {k: urllib.parse.unquote(v) for k, v in request.path_params.items()}
                query = _query(route, request)
                body = await _body(route, request, self.body_timeout)
                result = await route.handler(Request(params, query, request.method, body))
                return self._respond(result, route.status)
            except ApiError as e:
                return error_response(e.status, str(e))
            except ClientDisconnect:  # the client hung up mid-body: nobody to answer
                log.debug("api: %s %s: client disconnected before the whole body",
                          request.method, request.url.path)
                return Response(status_code=400)
            except Exception as e:  # a handler bug is answered and logged, never fatal
                log.exception("api: %s %s failed", request.method, request.url.path)
                return error_response(500, f"{type(e).__name__}: {e}")

        return endpoint

    def _respond(self, result: Any, status: int = 200) -> Response:
        if isinstance(result, TextBody):
            return PlainTextResponse(result.text, status)
        if isinstance(result, NdjsonStream):
            return StreamingResponse(self._until_closing(result), status, media_type=NDJSON)
        return json_response(result, status)

    async def _until_closing(self, stream: NdjsonStream) -> AsyncIterator[str]:
        """The feed's lines until it ends or the server stops (`close_feeds`); a client
        hanging up cancels it through Starlette's disconnect watch."""
        lines = stream.lines()
        try:
            while not self.closing.is_set():
                with anyio.CancelScope() as scope:
                    self._feeds.add(scope)
                    try:
                        line = await lines.__anext__()
                    except StopAsyncIteration:
                        return
                    finally:
                        self._feeds.discard(scope)
                if scope.cancelled_caught:
                    return
                yield line
        finally:
            with anyio.CancelScope(shield=True), contextlib.suppress(Exception):
                await lines.aclose()

    def close_feeds(self) -> None:
        """End every open change feed (its response ends cleanly, after its last line)."""
        self.closing.set()
        for scope in list(self._feeds):
            scope.cancel()


def _protocol_with_header_timeout(timeout: float) -> type[H11Protocol]:
    """uvicorn's HTTP/1.1 protocol closing a connection whose request headers are not in
    within ``timeout`` seconds (of the connection, or of the previous answer): uvicorn
    itself waits for them for ever, so half-open connections piled up."""

    class Protocol(H11Protocol):
        _header_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            super().connection_made(transport)  # type: ignore[arg-type]
            self._arm()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
            super().connection_lost(exc)

        def _arm(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
            self._header_timer = self.loop.call_later(timeout, self._headers_late)

        def _headers_late(self) -> None:
            self._header_timer = None
            if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
                log.debug("api: request headers not received within %g s; closing", timeout)
                self.transport.close()

    return Protocol


class _Server(uvicorn.Server):
    """uvicorn's server without its signal handlers: the agent has its own, and stops
    the server by cancelling its task."""

    @contextlib.contextmanager
    def capture_signals(self) -> Any:
        yield


class ApiServer:
    """Serves ``routes`` on the unix socket ``path`` (created with ``mode``)."""

    def __init__(self, path: str, mode: int, routes: Sequence[Route], *,
                 header_timeout: float = HEADER_TIMEOUT_S,
                 body_timeout: float = BODY_TIMEOUT_S) -> None:
        self.path = path
        self.mode = mode
        self.header_timeout = header_timeout
        self.app = ApiApp(routes, body_timeout)
        self.sock: socket.socket | None = None
        self.server: _Server | None = None

    def bind(self) -> None:
        """Create the socket (and its directory) with its mode set before it listens;
        refuse when another agent answers on it, replace a stale socket file left by an
        agent that was killed."""
        os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
        if os.path.lexists(self.path):
            if not stat.S_ISSOCK(os.lstat(self.path).st_mode):
                raise OSError(f"{self.path} exists and is not a socket")
            probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                probe.connect(self.path)
            except OSError:
                os.unlink(self.path)  # stale: nobody listens
            else:
                raise OSError(f"another agent is already listening on {self.path}")
            finally:
                probe.close()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind(self.path)
            os.chmod(self.path, self.mode)
            sock.listen(128)
        except BaseException:
            sock.close()
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)
            raise
        sock.setblocking(False)
        self.sock = sock

    async def serve(self, *, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
        """Serve until cancelled; then stop accepting, end the change feeds, let answers
        in flight finish (at most `GRACEFUL_STOP_S`) and close the connections."""
        if self.sock is None:
            self.bind()
        assert self.sock is not None
        config = uvicorn.Config(
            self.app.asgi, lifespan="off", log_config=None, log_level="warning",
            access_log=False, http=_protocol_with_header_timeout(self.header_timeout),
            ws="none", server_header=False,
            timeout_graceful_shutdown=GRACEFUL_STOP_S, proxy_headers=False,
        )
        server = self.server = _Server(config)
        sock = self.sock
        done = anyio.Event()

        async def run() -> None:
            try:
                # Shielded: on cancellation the server shuts down by `should_exit`.
                with anyio.CancelScope(shield=True):
                    await server.serve(sockets=[sock])
            finally:
                done.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(run)
            while not server.started and not done.is_set():
                await anyio.sleep(0.01)
            if not server.started:
                raise OSError(f"the API server on {self.path} did not start")
            task_status.started()
            try:
                await done.wait()
                raise OSError(f"the API server on {self.path} stopped")
            finally:
                self.app.close_feeds()
                server.should_exit = True

    async def aclose(self) -> None:
        """Remove the socket file (after `serve` ended) and close a socket never served."""
        if self.sock is not None:
            with contextlib.suppress(OSError):
                self.sock.close()
            self.sock = None
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
