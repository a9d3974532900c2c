"""The component model: order, needs, stop in reverse, failures as health, routes, cleanup."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from statewright.api_types import Request, Route
from statewright.component import (
    DEGRADED,
    OK,
    Component,
    ComponentError,
    Health,
    Hive,
    Provided,
)


class Recorder(Component):
    """A component that records its calls in a shared log."""

    def __init__(self, name: str, log: list[str], needs: tuple[Provided[Any], ...] = (),
                 provides: tuple[Provided[Any], ...] = (), fail_start: bool = False) -> None:
        self.name = name
        self.needs = needs
        self.provides = provides
        self.log = log
        self.fail_start = fail_start
        self.seen: dict[str, Any] = {}

    async def start(self, hive: Hive) -> None:
        for n in self.needs:
            self.seen[n.name] = hive.get(self, n)
        if self.fail_start:
            raise OSError("no such device")
        for p in self.provides:
            hive.provide(self, p, f"{self.name}:{p.name}")
        self.log.append(f"start {self.name}")

    async def ready(self, hive: Hive) -> None:
        self.log.append(f"ready {self.name}")

    async def stop(self) -> None:
        self.log.append(f"stop {self.name}")

    def cleanup(self) -> list[str]:
        self.log.append(f"cleanup {self.name}")
        return [self.name]


def test_needs_must_be_provided_by_an_earlier_component() -> None:
    log: list[str] = []
    with pytest.raises(ComponentError, match="'b' needs x, which no earlier component"):
        Hive([Recorder("b", log, needs=(X,)), Recorder("a", log, provides=(X,))])
    with pytest.raises(ComponentError, match="listed twice"):
        Hive([Recorder("a", log), Recorder("a", log)])
    assert log == []  # nothing started


X: Provided[str] = Provided("x", str)


class User(Component):
    """Uses ``x`` when an earlier component provides it."""

    name = "user"
    uses = (X,)

    def __init__(self) -> None:
        self.found: str | None = "not started"

    async def start(self, hive: Hive) -> None:
        self.found = hive.find(self, X)


def test_optional_needs_are_declared_and_checked() -> None:
    log: list[str] = []
    # Provided only later: it would never be found, so the list is refused.
    with pytest.raises(ComponentError, match="'user' uses x, which only a later component"):
        Hive([User(), Recorder("a", log, provides=(X,))])
    with_x, without_x = User(), User()

    async def run(hive: Hive) -> None:
        async with anyio.create_task_group() as tg:
            await hive.start(tg)
            await hive.stop()

    anyio.run(run, Hive([Recorder("a", log, provides=(X,)), with_x]))
    anyio.run(run, Hive([without_x]))
    assert (with_x.found, without_x.found) == ("a:x", None)

    # A lookup the component did not declare is refused; a typed key checks the value.
    class Undeclared(User):
        uses = ()

    hive = Hive([])
    provider = Recorder("p", log, provides=(Provided("x"),))
    hive.provide(provider, Provided("x"), 1)
    with pytest.raises(ComponentError, match="without declaring it in uses"):
        hive.find(Undeclared(), X)
    with pytest.raises(ComponentError, match="'x' is a int, not str"):
        hive.lookup(X)


def test_needs_and_provides_are_declared_and_checked() -> None:
    """`Hive.get` and `Hive.provide` refuse a key the component did not declare, so the
    list `Hive.check` sees is every dependency; a provided value is checked against the
    key's type."""
    hive = Hive([])
    quiet = Recorder("quiet", [])
    with pytest.raises(ComponentError, match="'quiet' provides 'x' without declaring it"):
        hive.provide(quiet, X, "value")
    provider = Recorder("p", [], provides=(X,))
    with pytest.raises(ComponentError, match="'x' is a int, not str"):
        hive.provide(provider, X, 1)  # type: ignore[arg-type]
    hive.provide(provider, X, "value")
    with pytest.raises(ComponentError, match="'quiet' looks up 'x' without declaring it in needs"):
        hive.get(quiet, X)
    assert hive.get(Recorder("user", [], needs=(X,)), X) == "value"
    with pytest.raises(ComponentError, match="nothing provides 'y'"):
        hive.get(Recorder("user", [], needs=(Provided("y"),)), Provided("y"))


def test_start_in_order_ready_after_all_stop_in_reverse() -> None:
    log: list[str] = []
    a = Recorder("a", log, provides=(X,))
    b = Recorder("b", log, needs=(X,))
    hive = Hive([a, b])

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            await hive.start(tg)
            await hive.stop()

    anyio.run(main)
    assert log == ["start a", "start b", "ready a", "ready b", "stop b", "stop a"]
    assert b.seen == {"x": "a:x"}


def test_a_failing_start_stops_what_started_and_names_the_component() -> None:
    log: list[str] = []
    hive = Hive([Recorder("a", log), Recorder("b", log, fail_start=True), Recorder("c", log)])

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            with pytest.raises(ComponentError, match="b: no such device"):
                await hive.start(tg)

    anyio.run(main)
    # b's stop runs too: it undoes whatever b started before failing.
    assert log == ["start a", "stop b", "stop a"]


class Worker(Component):
    """A component with a task that fails after start."""

    name = "worker"

    async def start(self, hive: Hive) -> None:
        async def work(*, task_status: Any) -> None:
            task_status.started()
            await anyio.sleep(0)
            raise ValueError("lost the connection")

        await hive.spawn(self, work)

    def health(self) -> list[Health]:
        return [Health(self.name, OK, "working")]


def test_a_failed_task_degrades_its_component_not_the_agent() -> None:
    hive = Hive([Worker()])

    async def main() -> list[Health]:
        async with anyio.create_task_group() as tg:
            await hive.start(tg)
            await anyio.sleep(0.01)
            health = hive.health()
            await hive.stop()
            return health

    health = anyio.run(main)
    assert health == [Health("worker", DEGRADED, "ValueError: lost the connection")]


def test_routes_match_path_parameters_and_cleanup_runs_in_reverse() -> None:
    async def handler(req: Request) -> Any:
        return dict(req.params)

    route = Route("/tables/{name}/changes", handler)
    assert route.match("/tables/frontends/changes") == {"name": "frontends"}
    assert route.match("/tables/frontends") is None
    log: list[str] = []
    removed, errors = Hive([Recorder("a", log), Recorder("b", log)]).cleanup()
    assert log == ["cleanup b", "cleanup a"] and removed == ["b", "a"] and errors == []
