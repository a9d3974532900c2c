"""The component model: the agent as an explicit, ordered list of components.

In the spirit of Cilium's hive cells, but with nothing a reader cannot follow:

* a `Component` declares by typed key (`Provided`) what it ``needs``, what it ``uses``
  when the agent has it, and what it ``provides``; the `Hive` starts components in list
  order and refuses a list in which a component needs something no earlier component
  provides (checked before anything starts);
* ``start`` gets the `Hive`: it looks up what it needs (`Hive.get`) and uses
  (`Hive.find`), publishes what it provides (`Hive.provide`) - each refused for a key the
  component did not declare, so `Hive.check` sees every dependency -, registers its
  table initializers in the write transactions it opens, and runs background work with
  `Hive.spawn` (a task that fails is recorded as the component's health, it does not
  bring the agent down);
* components stop in reverse order of start; a failing stop is logged and the rest
  still stop;
* each component reports its own health (`Component.health`), may serve API routes
  (`Component.routes`), exposes the BPF maps it owns (`Component.bpf_maps`) and removes
  what it leaves on the machine when asked to clean up (`Component.cleanup`, called on
  components that were built but never started, by ``statewright agent --cleanup``).

The agent's health report, its ``/bpf/maps`` listing, ``--cleanup`` and the API's
routing are all derived from the component list (statewright/agent/runtime.py).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar, cast

import anyio
import anyio.abc

from statedb.errors import StatewrightError
from statewright.api_types import Route

log = logging.getLogger("statewright.component")

OK = "OK"
DEGRADED = "Degraded"
DISABLED = "Disabled"
STOPPED = "Stopped"

T = TypeVar("T")


class ComponentError(StatewrightError, RuntimeError):
    """A component list that cannot run (a missing provider, a duplicate name) or a
    component that cannot start; the message names the component."""


@dataclass(frozen=True, slots=True)
class Health:
    """One line of a health report: component (or sub-part), state and reason."""

    name: str
    state: str
    message: str

    def to_json(self) -> dict[str, str]:
        """Plain data for the API."""
        return {"name": self.name, "state": self.state, "message": self.message}


@dataclass(frozen=True, slots=True)
class Provided(Generic[T]):
    """What a component provides under ``name`` for later ones, with the type of its value:
    ``hive.get(self, DATABASE)`` is a `DB` for the type checker, and checked against
    ``kind`` at run time (None: a type only the checker knows, e.g. one imported lazily).
    The provider's module defines it; its users import it from there and declare it in
    their ``needs`` or ``uses``."""

    name: str
    kind: type[T] | None = None


@dataclass(frozen=True, slots=True)
class MapView:
    """A BPF map as the API lists it: name, backend kind, entry count, decoded entries."""

    name: str
    kind: str
    count: Callable[[], int]
    entries: Callable[[], list[dict[str, Any]]]
    pinned: str = ""
    map_id: Callable[[], int] = lambda: 0


def typed_map_view(m: Any, kind: str) -> MapView:
    """The view of a `bpf.typed_map.TypedMap`: entries decoded by its spec's codecs (as
    ``statewright bpf dump -o json``), the kernel's map id when it has one."""
    spec = m.spec

    def entries() -> list[dict[str, Any]]:
        return [{"key": spec.key.to_json(k), "value": spec.value.to_json(v)} for k, v in m.dump()]

    def map_id() -> int:
        try:
            return int(m.backend.info().id)
        except Exception:  # memory maps have no kernel id
            return 0

    return MapView(spec.name, kind, m.count, entries, m.backend.pinned_path or "", map_id)


class Component:
    """One part of the agent. Subclasses override what they use; every hook has a
    harmless default. Building a component must have no side effect (``--cleanup`` builds
    the whole list without starting it)."""

    #: Unique name: health lines, logs and failures are keyed by it.
    name: str = "component"
    #: What earlier components provide that this one needs (`Hive.get`).
    needs: tuple[Provided[Any], ...] = ()
    #: What this component provides (`Hive.provide` in ``start``).
    provides: tuple[Provided[Any], ...] = ()
    #: What it uses when an earlier component provides it, and does without otherwise
    #: (`Hive.find`): the optional needs, visible to `Hive.check`.
    uses: tuple[Provided[Any], ...] = ()

    async def start(self, hive: Hive) -> None:
        """Start: take what it needs, provide what it provides, spawn its tasks."""

    async def ready(self, hive: Hive) -> None:
        """Called in list order once every component has started (the API starts serving
        here, so no request sees a half-started agent)."""

    async def stop(self) -> None:
        """Stop what ``start`` started (the tasks it spawned with `Hive.spawn` are already
        cancelled and finished when this runs)."""

    def health(self) -> list[Health]:
        """This component's health lines (usually one, named after the component)."""
        return [Health(self.name, OK, "")]

    def routes(self) -> Sequence[Route]:
        """API routes this component serves."""
        return ()

    def bpf_maps(self) -> Sequence[MapView]:
        """The open BPF maps this component owns."""
        return ()

    def cleanup(self) -> list[str]:
        """Remove what this component leaves on the machine after it stopped (pins, links,
        cgroups, namespaces); returns what was removed. Raises OSError on failure."""
        return []


def _declared(key: Provided[Any], keys: tuple[Provided[Any], ...]) -> bool:
    return any(k.name == key.name for k in keys)


def _check_kind(key: Provided[Any], value: object) -> None:
    if key.kind is not None and not isinstance(value, key.kind):
        raise ComponentError(f"{key.name!r} is a {type(value).__name__}, not {key.kind.__name__}")


@dataclass
class _Running:
    component: Component
    tasks: list[tuple[anyio.CancelScope, anyio.Event]] = field(default_factory=list)


class Hive:
    """Runs a list of components: start in order, stop in reverse, health of all."""

    def __init__(self, components: Iterable[Component]) -> None:
        self.components: list[Component] = list(components)
        self._provided: dict[str, Any] = {}
        self._running: list[_Running] = []
        self._tg: anyio.abc.TaskGroup | None = None
        #: Component name -> why its task failed (overrides its own health report).
        self.failures: dict[str, str] = {}
        self.check()

    def check(self) -> None:
        """Refuse duplicate names, needs that no earlier component provides, and uses of
        something only a later component provides (it would never be found)."""
        names: set[str] = set()
        available: set[str] = set()
        provider = {k.name: c.name for c in self.components for k in c.provides}
        for comp in self.components:
            late = [k.name for k in comp.uses if k.name in provider and k.name not in available]
            if late:
                raise ComponentError(
                    f"component {comp.name!r} uses {', '.join(late)}, which only a later "
                    f"component ({', '.join(provider[n] for n in late)}) provides"
                )
            if comp.name in names:
                raise ComponentError(f"component {comp.name!r} is listed twice")
            names.add(comp.name)
            missing = [k.name for k in comp.needs if k.name not in available]
            if missing:
                raise ComponentError(
                    f"component {comp.name!r} needs {', '.join(missing)}, which no earlier "
                    "component provides"
                )
            available.update(k.name for k in comp.provides)

    def component(self, name: str) -> Component:
        """The component called ``name``."""
        for comp in self.components:
            if comp.name == name:
                return comp
        raise ComponentError(f"no component {name!r}")

    # ----- what components share ------------------------------------------------------------
    def provide(self, user: Component, key: Provided[T], value: T) -> None:
        """Publish ``value`` under ``key`` for later components; ``user`` must declare the
        key in ``provides`` (so `check` knows who provides it)."""
        if not _declared(key, user.provides):
            raise ComponentError(
                f"component {user.name!r} provides {key.name!r} without declaring it in provides"
            )
        _check_kind(key, value)
        self._provided[key.name] = value

    def get(self, user: Component, key: Provided[T]) -> T:
        """A need of ``user``: what an earlier component provided under the key, checked
        against its type. ``user`` must declare it in ``needs``; ComponentError when it did
        not or when nothing was provided."""
        if not _declared(key, user.needs):
            raise ComponentError(
                f"component {user.name!r} looks up {key.name!r} without declaring it in needs"
            )
        return self.lookup(key)

    def find(self, user: Component, key: Provided[T]) -> T | None:
        """An optional need of ``user``: what an earlier component provided under the key,
        or None when the agent runs without it. ``user`` must declare it in ``uses``."""
        if not _declared(key, user.uses):
            raise ComponentError(
                f"component {user.name!r} looks up {key.name!r} without declaring it in uses"
            )
        if key.name not in self._provided:
            return None
        return self.lookup(key)

    def lookup(self, key: Provided[T]) -> T:
        """What was provided under the key, for code around the component list (the
        runtime, tools, tests); components use `get` and `find`, which `check` sees.
        ComponentError when nothing was provided (yet) or the value is of another type."""
        try:
            value = self._provided[key.name]
        except KeyError:
            raise ComponentError(f"nothing provides {key.name!r} (yet)") from None
        _check_kind(key, value)
        return cast(T, value)

    # ----- lifecycle ----------------------------------------------------------------------
    async def start(self, tg: anyio.abc.TaskGroup) -> None:
        """Start every component in order, its tasks in ``tg``. A component whose start
        raises stops the start-up: it and the ones started before it are stopped (so its
        stop must undo a partial start), and the error (a `ComponentError` naming it) is
        raised."""
        self._tg = tg
        for comp in self.components:
            running = _Running(comp)
            self._running.append(running)
            try:
                await comp.start(self)
            except ComponentError:
                await self.stop()
                raise
            except Exception as e:
                await self.stop()
                raise ComponentError(f"{comp.name}: {e}") from e
            log.debug("hive: started %s", comp.name)
        for running in list(self._running):
            try:
                await running.component.ready(self)
            except Exception as e:
                await self.stop()
                raise ComponentError(f"{running.component.name}: {e}") from e

    async def spawn(
        self,
        component: Component,
        func: Callable[..., Awaitable[None]],
        *,
        wait_started: bool = True,
        label: str = "",
    ) -> None:
        """Run ``func(task_status=...)`` as a task of ``component``; with ``wait_started``
        wait for its ``task_status.started()``. A failure is recorded as the component's
        health instead of ending the agent. The task is cancelled when the component stops."""
        running = next((r for r in self._running if r.component is component), None)
        if self._tg is None or running is None:
            raise ComponentError(f"{component.name}: spawn only while it is started")
        scope = anyio.CancelScope()
        done = anyio.Event()
        name = label or component.name

        async def runner(*, task_status: anyio.abc.TaskStatus[None]) -> None:
            started = False

            class _Status:
                def started(self, value: Any = None) -> None:
                    nonlocal started
                    if not started:
                        started = True
                        task_status.started()

            status = _Status()
            if not wait_started:
                status.started()
            try:
                with scope:
                    await func(task_status=status)
            except Exception as e:
                msg = f"{type(e).__name__}: {e}"
                log.error("%s failed: %s", name, msg)
                self.failures[name] = msg
            finally:
                done.set()
                if not started:
                    started = True
                    task_status.started()

        await self._tg.start(runner)
        running.tasks.append((scope, done))

    async def stop(self) -> None:
        """Stop the started components in reverse order (each one's tasks, then its stop)."""
        while self._running:
            running = self._running.pop()
            comp = running.component
            for scope, done in reversed(running.tasks):
                scope.cancel()
                await done.wait()
            try:
                await comp.stop()
            except Exception as e:  # keep stopping the rest
                log.error("hive: stopping %s failed: %s", comp.name, e)
            log.debug("hive: stopped %s", comp.name)

    # ----- derived views --------------------------------------------------------------------
    def health(self) -> list[Health]:
        """Every component's health; a task failure overrides what its component reports."""
        out: list[Health] = []
        for comp in self.components:
            try:
                lines = comp.health()
            except Exception as e:  # a health bug is itself a health problem
                lines = [Health(comp.name, DEGRADED, f"health check failed: {e}")]
            out += [
                Health(h.name, DEGRADED, self.failures[h.name]) if h.name in self.failures else h
                for h in lines
            ]
        known = {h.name for h in out}
        out += [Health(n, DEGRADED, m) for n, m in self.failures.items() if n not in known]
        return out

    def overall(self) -> str:
        """OK when no line is Degraded or Stopped, else Degraded."""
        return DEGRADED if any(h.state in (DEGRADED, STOPPED) for h in self.health()) else OK

    def routes(self) -> list[Route]:
        """Every component's routes, in component order."""
        return [r for comp in self.components for r in comp.routes()]

    def bpf_maps(self) -> dict[str, MapView]:
        """Every open BPF map of every component, by name."""
        return {v.name: v for comp in self.components for v in comp.bpf_maps()}

    def cleanup(self) -> tuple[list[str], list[str]]:
        """Call every component's `cleanup` in reverse order; (removed, errors)."""
        removed: list[str] = []
        errors: list[str] = []
        for comp in reversed(self.components):
            try:
                removed += comp.cleanup()
            except OSError as e:
                errors.append(f"{comp.name}: {e}")
        return removed, errors
