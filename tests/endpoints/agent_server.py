"""A test agent on a unix socket: the db + endpoints components run on an anyio loop in a
thread, and a small HTTP/1.1 server dispatches requests to the component's routes (what
the agent's runtime does once it serves component routes). Errors answer
``{"error": msg}`` with the ApiError's status."""

from __future__ import annotations

import json
import os
import shutil
import socketserver
import subprocess
import sys
import tempfile
import threading
import urllib.parse
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler
from typing import Any, TypeVar

import anyio
import anyio.from_thread

from statewright.agent.components.endpoints import EndpointsComponent, EndpointsConfig
from statewright.api_types import ApiError, Request
from statewright.component import Hive
from tables.endpoints import Endpoint

from .helpers import DBComponent, new_pin_dir, remove_pins


class _Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


class AgentUnderTest:
    """Start with `start()`, stop with `stop()`; ``socket`` is the path to talk to."""

    def __init__(
        self,
        config: EndpointsConfig,
        socket_path: str,
        link_exists: Callable[[Endpoint], bool] | None = None,
    ) -> None:
        self.config = config
        self.socket = socket_path
        self.comp = (
            EndpointsComponent(config, link_exists=link_exists)
            if link_exists is not None
            else EndpointsComponent(config)
        )
        self._portal_cm: Any = None
        self._portal: Any = None
        self._hive = Hive([DBComponent(), self.comp])
        self._server: _Server | None = None

    def start(self) -> None:
        """Run the components, then serve the socket."""
        self._portal_cm = anyio.from_thread.start_blocking_portal()
        self._portal = self._portal_cm.__enter__()
        self._stop_event = self._portal.call(anyio.Event)
        started = threading.Event()
        errors: list[BaseException] = []

        async def run_hive() -> None:
            try:
                async with anyio.create_task_group() as tg:
                    await self._hive.start(tg)
                    started.set()
                    await self._stop_event.wait()
                    await self._hive.stop()
                    tg.cancel_scope.cancel()
            except BaseException as e:
                errors.append(e)
                started.set()
                raise

        self._hive_future = self._portal.start_task_soon(run_hive)
        started.wait(60)
        if errors:
            raise errors[0]
        agent = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _serve(self) -> None:
                url = urllib.parse.urlsplit(self.path)
                query = dict(urllib.parse.parse_qsl(url.query))
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                status, doc = agent.dispatch(self.command, url.path, query, body)
                data = json.dumps(doc).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_PUT = do_POST = do_PATCH = do_DELETE = _serve

        if os.path.exists(self.socket):
            os.unlink(self.socket)
        self._server = _Server(self.socket, Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def dispatch(self, method: str, path: str, query: dict[str, str], body: bytes) -> Any:
        """(status, document) of one request."""
        for route in self.comp.routes():
            params = route.match(path)
            if params is None or method not in route.methods:
                continue
            req = Request(params, query, method, body)
            try:
                return route.status, self._portal.call(route.handler, req)
            except ApiError as e:
                return e.status, {"error": str(e)}
        return 404, {"error": f"no route {method} {path}"}

    def stop(self) -> None:
        """Stop serving and stop the components."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._portal is not None:
            self._portal.call(self._stop_event.set)
            try:
                self._hive_future.result(30)
            except BaseException:
                pass
            self._portal_cm.__exit__(None, None, None)
        if os.path.exists(self.socket):
            os.unlink(self.socket)


A = TypeVar("A", bound=AgentUnderTest)


@contextmanager
def memory_agent(cls: type[A], pod_cidr: str, prefix: str) -> Iterator[A]:
    """``cls`` serving on a socket in a fresh state directory, on memory maps with a pin
    directory of its own; everything removed afterwards."""
    state = tempfile.mkdtemp(prefix=f"{prefix}-{os.getpid()}-")
    pin_dir = new_pin_dir("memory")
    agent = cls(EndpointsConfig((pod_cidr,), state, "memory", pin_dir),
                os.path.join(state, "agent.sock"))
    agent.start()
    try:
        yield agent
    finally:
        agent.stop()
        remove_pins("memory", pin_dir)
        shutil.rmtree(state, ignore_errors=True)


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    """``python -m statewright ARGS``, output captured."""
    return subprocess.run([sys.executable, "-m", "statewright", *args],
                          capture_output=True, text=True, timeout=60)
