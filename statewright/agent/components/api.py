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
        server = ApiServer(self.config.api_socket, self.config.api_socket_mode, hive.routes)
        try:
            await server.bind()
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
        """``/health``, ``/agent``, ``/bpf/maps``, ``/bpf/maps/{name}``."""
        return (
            Route("/health", self._health),
            Route("/agent", self._agent),
            Route("/bpf/maps", self._maps),
            Route("/bpf/maps/{name}", self._map),
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
