"""The agent's HTTP API over a unix socket (standard library and anyio only).

Endpoints (GET only; JSON unless said otherwise):

``/health``                 overall state (OK/Degraded) and every component's state and reason
``/agent``                  pid, maps backend, datapath cgroup, demo namespace, configuration
``/tables``                 every table: rows, revision, initialized, pending initializers
``/tables/<name>``          the rows (``?format=table|yaml`` for statedb.show's text forms)
``/tables/<name>/changes``  change feed, newline-delimited JSON: every current row as an
                            upsert, then each committed upsert/deletion as it happens
                            (``?follow=0`` stops after the current rows)
``/lb/services``            frontends with their backends, as ``statewright lb list -o json``
``/bpf/maps``               the LB maps and their entry counts
``/bpf/maps/<name>``        one LB map's entries (key, value) decoded

Why a hand-written HTTP/1.1 server: the API is tiny and read-only, the agent must not
grow a web framework dependency, and a unix socket (mode 0660 by default) is the
access control: whoever may open it may look at the agent. Errors are JSON
``{"error": ...}`` with 400/404/405/500; a failing handler never stops the server.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import urllib.parse
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc
from anyio.abc import SocketStream

from statedb.show import FORMATS, show_table, to_plain

if TYPE_CHECKING:
    from statewright.agent.runtime import Agent

log = logging.getLogger("statewright.agent.api")

MAX_REQUEST = 16384
REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
           500: "Internal Server Error"}


class HttpError(Exception):
    """An error response: status and message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def row_document(row: Any) -> Any:
    """A row as JSON-ready data (its ``to_json()`` when it has one), as ``db show -o json``."""
    fn = getattr(row, "to_json", None)
    return to_plain(fn() if fn is not None else row)


def _head(status: int, content_type: str, length: int | None) -> bytes:
    lines = [f"HTTP/1.1 {status} {REASONS.get(status, 'Error')}",
             f"Content-Type: {content_type}", "Connection: close"]
    if length is not None:
        lines.append(f"Content-Length: {length}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


class ApiServer:
    """Serves the API of one `Agent` on its configured unix socket."""

    def __init__(self, agent: Agent) -> None:
        self.agent = agent
        self.path = agent.config.api_socket
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
        os.chmod(self.path, self.agent.config.api_socket_mode)

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
                method, target = await self._read_request(stream)
                await self._dispatch(stream, method, target)
            except HttpError as e:
                await self._send_json(stream, {"error": str(e)}, e.status)
            except (anyio.BrokenResourceError, anyio.ClosedResourceError, anyio.EndOfStream):
                pass
            except Exception as e:  # a handler bug must not stop the server
                log.exception("api: request failed")
                with contextlib.suppress(Exception):
                    await self._send_json(stream, {"error": f"{type(e).__name__}: {e}"}, 500)

    async def _read_request(self, stream: SocketStream) -> tuple[str, str]:
        data = b""
        while b"\r\n\r\n" not in data and b"\n\n" not in data:
            if len(data) > MAX_REQUEST:
                raise HttpError(400, "request header too large")
            data += await stream.receive()
        first = data.split(b"\n", 1)[0].decode("latin-1").strip()
        parts = first.split()
        if len(parts) != 3 or not parts[2].startswith("HTTP/"):
            raise HttpError(400, f"bad request line {first!r}")
        return parts[0], parts[1]

    async def _send_json(self, stream: SocketStream, doc: Any, status: int = 200) -> None:
        body = (json.dumps(doc, indent=2) + "\n").encode()
        await stream.send(_head(status, "application/json", len(body)) + body)

    async def _send_text(self, stream: SocketStream, text: str) -> None:
        body = text.encode()
        await stream.send(_head(200, "text/plain; charset=utf-8", len(body)) + body)

    async def _dispatch(self, stream: SocketStream, method: str, target: str) -> None:
        if method != "GET":
            raise HttpError(405, f"{method} not allowed (the API is read-only)")
        url = urllib.parse.urlsplit(target)
        query = dict(urllib.parse.parse_qsl(url.query))
        parts = [urllib.parse.unquote(p) for p in url.path.strip("/").split("/") if p]
        agent = self.agent
        if parts == ["health"]:
            comps = agent.health()
            state = "Degraded" if any(c.state in ("Degraded", "Stopped") for c in comps) else "OK"
            await self._send_json(stream, {"state": state, "pid": os.getpid(),
                                           "components": [c.to_json() for c in comps]})
        elif parts == ["agent"]:
            await self._send_json(stream, agent.info())
        elif parts == ["tables"]:
            await self._send_json(stream, self._tables())
        elif len(parts) == 2 and parts[0] == "tables":
            await self._table(stream, parts[1], query.get("format", "json"))
        elif len(parts) == 3 and parts[0] == "tables" and parts[2] == "changes":
            await self._changes(stream, parts[1], query.get("follow", "1") not in ("0", "false"))
        elif parts == ["lb", "services"]:
            from statewright.cli_lb import list_frontends

            await self._send_json(stream, list_frontends(self._maps()))
        elif parts == ["bpf", "maps"]:
            maps = self._maps()
            await self._send_json(
                stream,
                [{"name": n, "entries": c, "kind": agent.maps_kind,
                  "id": _map_id(maps.maps[n]), "pinned": maps.maps[n].backend.pinned_path}
                 for n, c in sorted(maps.counts().items())],
            )
        elif len(parts) == 3 and parts[:2] == ["bpf", "maps"]:
            await self._send_json(stream, self._map_entries(parts[2]))
        else:
            raise HttpError(404, f"no such endpoint {url.path!r}")

    # ----- handlers -----------------------------------------------------------------------
    def _maps(self) -> Any:
        if self.agent.maps is None:
            raise HttpError(500, "the LB maps are not open")
        return self.agent.maps

    def _tables(self) -> list[dict[str, Any]]:
        db = self.agent.db
        txn = db.read_txn()
        out = []
        for t in db.tables:
            init, _ = t.initialized(txn)
            out.append({"name": t.name, "rows": t.count(txn), "revision": t.revision(txn),
                        "initialized": init, "pending": t.pending_initializers(txn)})
        return out

    def _lookup(self, name: str) -> Any:
        try:
            return self.agent.db.table(name)
        except Exception:
            names = ", ".join(t.name for t in self.agent.db.tables)
            raise HttpError(404, f"no table {name!r} (tables: {names})") from None

    async def _table(self, stream: SocketStream, name: str, fmt: str) -> None:
        table = self._lookup(name)
        if fmt not in FORMATS:
            raise HttpError(400, f"unknown format {fmt!r}; use one of: {', '.join(FORMATS)}")
        if fmt == "json":
            rows = [row_document(r) for r in table.all(self.agent.db.read_txn())]
            await self._send_json(stream, rows)
        else:
            await self._send_text(stream, show_table(self.agent.db, name, fmt))

    async def _changes(self, stream: SocketStream, name: str, follow: bool) -> None:
        table = self._lookup(name)
        db = self.agent.db
        with db.write_txn(table) as wtxn:
            it = table.changes(wtxn)
        try:
            await stream.send(_head(200, "application/x-ndjson", None))
            async with anyio.create_task_group() as tg:

                async def watch_close() -> None:
                    # The client hanging up ends the feed (it sends nothing else).
                    with contextlib.suppress(Exception):
                        while await stream.receive():
                            pass
                    tg.cancel_scope.cancel()

                tg.start_soon(watch_close)
                while True:
                    changes, watch = it.next(db.read_txn())
                    lines = [
                        json.dumps({"revision": c.revision, "deleted": c.deleted,
                                    "object": row_document(c.obj)}) + "\n"
                        for c in changes
                    ]
                    if lines:
                        await stream.send("".join(lines).encode())
                    if not follow:
                        break
                    await watch.wait_async()
                tg.cancel_scope.cancel()
        finally:
            it.close()

    def _map_entries(self, name: str) -> dict[str, Any]:
        maps = self._maps()
        m = maps.maps.get(name)
        if m is None:
            raise HttpError(404, f"no LB map {name!r} (maps: {', '.join(sorted(maps.maps))})")
        entries: list[dict[str, Any]] = []
        if m.spec.inner is not None:
            v6 = name.endswith("6")
            for rev_nat_id, table in maps.maglev_tables(v6):
                entries.append({"key": rev_nat_id, "value": {"size": len(table),
                                                             "backends": sorted(set(table))}})
        else:
            spec = m.spec
            for key, value in m.dump():  # decoded as `statewright bpf dump -o json` does
                entries.append({"key": spec.key.to_json(key), "value": spec.value.to_json(value)})
        return {"name": name, "kind": self.agent.maps_kind, "entries": entries}


def _map_id(m: Any) -> int:
    """The kernel's id of a map (0 for in-memory maps or when it cannot be read)."""
    try:
        return int(m.backend.info().id)
    except Exception:
        return 0
