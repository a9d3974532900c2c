"""The API component: the agent's unix socket, serving every component's routes.

It is first in the component list so that a second agent on the same socket fails before
touching maps, cgroups or namespaces; it starts serving only once every component has
started (`ApiComponent.ready`), so no request sees a half-started agent. It also serves
the routes derived from the whole component list: ``/health``, ``/agent``, ``/bpf/maps``.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Sequence
from typing import Any

from statewright.agent import openapi
from statewright.agent.api import ApiServer
from statewright.agent.config import DEFAULT_SOCKET, AgentConfig
from statewright.component import (
    OK,
    ApiError,
    Component,
    ComponentError,
    Health,
    Hive,
    Request,
    Route,
)

#: The ``info`` of the OpenAPI document.
API_INFO = {
    "title": "Statewright agent API",
    "version": "1",
    "description": "The node agent's API on its unix socket (see statewright/agent/api.py).",
}

_HEALTH_LINE = {
    "type": "object",
    "required": ["name", "state", "message"],
    "properties": {
        "name": {"type": "string"},
        "state": {"type": "string", "enum": ["OK", "Degraded", "Disabled", "Stopped"]},
        "message": {"type": "string"},
    },
}
HEALTH_SCHEMA = {
    "type": "object",
    "required": ["state", "pid", "components"],
    "properties": {
        "state": {"type": "string", "enum": ["OK", "Degraded"]},
        "pid": {"type": "integer"},
        "components": {"type": "array", "items": _HEALTH_LINE},
    },
}
AGENT_SCHEMA = {
    "type": "object",
    "description": "pid, node, maps backend, datapath cgroup, demo namespace, configuration",
}
MAPS_SCHEMA = {
    "type": "array",
    "items": {
        "type": "object",
        "required": ["name", "entries", "kind", "id", "pinned"],
        "properties": {
            "name": {"type": "string"},
            "entries": {"type": "integer", "minimum": 0},
            "kind": {"type": "string"},
            "id": {"type": "integer", "minimum": 0},
            "pinned": {"type": "string"},
        },
    },
}
MAP_SCHEMA = {
    "type": "object",
    "required": ["name", "kind", "entries"],
    "properties": {
        "name": {"type": "string"},
        "kind": {"type": "string"},
        "entries": {
            "type": "array",
            "items": {"type": "object", "required": ["key", "value"]},
        },
    },
}

log = logging.getLogger("statewright.agent.api")


class ApiComponent(Component):
    """The HTTP API on ``api-socket``; ``info`` gives the ``/agent`` document."""

    name = "api"

    def __init__(self, config: AgentConfig, info: Callable[[], dict[str, Any]]) -> None:
        self.config = config
        self.info = info
        self.hive: Hive | None = None
        self.server: ApiServer | None = None

    async def start(self, hive: Hive) -> None:
        """Bind the socket (refused when another agent listens on it)."""
        self.hive = hive
        server = ApiServer(self.config.api_socket, self.config.api_socket_mode, hive.routes())
        try:
            server.bind()
        except OSError as e:
            raise ComponentError(f"API socket {self.config.api_socket}: {e}") from e
        self.server = server

    async def ready(self, hive: Hive) -> None:
        """Serve, now that every component has started."""
        assert self.server is not None
        await hive.spawn(self, self.server.serve)
        log.info("agent: API on unix socket %s", self.config.api_socket)

    async def stop(self) -> None:
        """Close the listener and remove the socket file."""
        if self.server is not None:
            await self.server.aclose()
            self.server = None

    def health(self) -> list[Health]:
        """Serving or not (a request answered proves more than this line)."""
        if self.server is None:
            return []
        return [Health(self.name, OK, f"unix socket {self.config.api_socket}")]

    def routes(self) -> Sequence[Route]:
        """``/health``, ``/agent``, ``/openapi.json``, ``/bpf/maps``, ``/bpf/maps/{name}``."""
        not_started = {503: "the agent is not started"}
        return (
            Route("/health", self._health, summary="overall state and every component's",
                  response=HEALTH_SCHEMA, errors=not_started),
            Route("/agent", self._agent, summary="the agent: pid, node, maps, configuration",
                  response=AGENT_SCHEMA),
            Route("/openapi.json", self._openapi, summary="this API's OpenAPI document",
                  response={"type": "object", "required": ["openapi", "info", "paths"]},
                  errors=not_started),
            Route("/bpf/maps", self._maps, summary="every BPF map and its entry count",
                  response=MAPS_SCHEMA, errors=not_started),
            Route("/bpf/maps/{name}", self._map, summary="one BPF map's entries, decoded",
                  response=MAP_SCHEMA, params={"name": "the map's name"},
                  errors={**not_started, 404: "no such map"}),
        )

    def _hive(self) -> Hive:
        if self.hive is None:
            raise ApiError(503, "the agent is not started")
        return self.hive

    async def _health(self, req: Request) -> Any:
        hive = self._hive()
        lines = hive.health()
        return {"state": hive.overall(), "pid": os.getpid(),
                "components": [h.to_json() for h in lines]}

    async def _agent(self, req: Request) -> Any:
        return self.info()

    async def _openapi(self, req: Request) -> Any:
        return openapi.document(self._hive().routes(), API_INFO)

    async def _maps(self, req: Request) -> Any:
        return [{"name": v.name, "entries": v.count(), "kind": v.kind, "id": v.map_id(),
                 "pinned": v.pinned} for _, v in sorted(self._hive().bpf_maps().items())]

    async def _map(self, req: Request) -> Any:
        maps = self._hive().bpf_maps()
        name = req.params["name"]
        view = maps.get(name)
        if view is None:
            raise ApiError(404, f"no map {name!r} (maps: {', '.join(sorted(maps))})")
        return {"name": name, "kind": view.kind, "entries": view.entries()}

    def cleanup(self) -> list[str]:
        """Remove a socket left by a killed agent, and the default socket directory
        (``/run/statewright``, which the agent creates) when it is empty."""
        removed: list[str] = []
        path = self.config.api_socket
        if os.path.exists(path):
            os.unlink(path)
            removed.append(path)
        parent = os.path.dirname(os.path.abspath(path))
        if parent != os.path.dirname(DEFAULT_SOCKET):
            return removed
        with contextlib.suppress(OSError):  # not empty: leave it
            if os.path.isdir(parent) and not os.listdir(parent):
                os.rmdir(parent)
                removed.append(parent)
        return removed
