"""Shared test helpers: an agent of two components (db + endpoints) run in a task group,
handlers called with Request objects, pin directories per backend."""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio

from statedb import DB
from statewright.agent.components.endpoints import EndpointsComponent, EndpointsConfig
from statewright.agent.components.statedb import DATABASE
from statewright.api_types import ApiError, Request
from statewright.component import Component, Hive
from tables.endpoints import Endpoint
from tests.pins import BPFFS, remove_memory_pins, remove_pin_dir


class DBComponent(Component):
    """Provides ``db`` (what the lead's statedb component does)."""

    name = "statedb"
    provides = (DATABASE,)

    def __init__(self, db: DB | None = None) -> None:
        self.db = db or DB()

    async def start(self, hive: Hive) -> None:
        hive.provide(self, DATABASE, self.db)


def new_pin_dir(backend: str) -> str:
    """A unique pin directory (bpffs for the kernel, a memory prefix otherwise)."""
    tag = f"statewright-eptest-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    return os.path.join(BPFFS, tag) if backend == "kernel" else f"/memory/{tag}"


def remove_pins(backend: str, pin_dir: str) -> None:
    """Remove everything pinned under ``pin_dir``."""
    if backend == "kernel":
        remove_pin_dir(pin_dir)
    else:
        remove_memory_pins(pin_dir)


@asynccontextmanager
async def running_agent(
    config: EndpointsConfig,
    link_exists: Callable[[Endpoint], bool] = lambda ep: True,
    db: DB | None = None,
    before: list[Component] | None = None,
) -> AsyncIterator[tuple[Hive, EndpointsComponent]]:
    """Start db + endpoints components (plus ``before``) and stop them afterwards."""
    comp = EndpointsComponent(config, link_exists=link_exists)
    hive = Hive([DBComponent(db), *(before or []), comp])
    async with anyio.create_task_group() as tg:
        await hive.start(tg)
        try:
            yield hive, comp
        finally:
            await hive.stop()
            tg.cancel_scope.cancel()


async def call(
    comp: Component,
    method: str,
    path: str,
    body: Any = None,
    query: dict[str, str] | None = None,
) -> Any:
    """Call the component's route for ``method path`` as the API would."""
    for route in comp.routes():
        params = route.match(path)
        if params is not None and method in route.methods:
            if isinstance(body, bytes):
                raw = body
            else:
                raw = b"" if body is None else json.dumps(body).encode()
            return await route.handler(Request(params, query or {}, method, raw))
    raise ApiError(404, f"no route {method} {path}")


async def wait_for(check: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
    """Poll ``check`` until true (a bound on waiting, not a timing assertion); the
    TimeoutError names ``what`` was awaited."""
    try:
        with anyio.fail_after(timeout):
            while not check():
                await anyio.sleep(0.01)
    except TimeoutError:
        raise TimeoutError(f"still waiting for: {what}") from None
