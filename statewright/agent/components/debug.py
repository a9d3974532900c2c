"""The ``debug`` component: an opt-in probe for long runs (benchmarks/soak.py).

Off unless the agent's environment has ``STATEWRIGHT_DEBUG_PROBE=1`` (an environment
variable rather than a configuration key: it is for whoever measures an agent, not part of
a node's configuration). When on, it measures how late the event loop wakes, samples the
loop's stack during each stall (statewright/agent/loop_probe.py) and serves:

- ``GET /debug/probe``: the loop's lateness histogram and its latest stalls with their
  stacks, resident memory, the collector's counters and, per statedb table, what it keeps
  beyond its rows (`statedb.table.Table.retention`: a held snapshot shows there) and,
  with a Kubernetes source, how long its changes waited from delivery to commit
  (``k8s.apply_latency``, `sources.apply_latency`);
- ``POST /debug/tracemalloc``: ``{"action": "start", "frames": N}`` starts tracemalloc,
  ``{"action": "snapshot", "top": N}`` takes the baseline (first) or answers the N source
  lines whose memory grew most since it, ``{"action": "stop"}``.

Off, both answer 404 saying how to switch the probe on, and nothing runs.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import anyio

from statedb import DB
from statewright.agent.components.kubernetes import K8S_SOURCE
from statewright.agent.components.statedb import DATABASE
from statewright.agent.loop_probe import CollectorProbe, LoopProbe, MemoryTracer, rss_mb
from statewright.api_types import ApiError, QueryParam, Request, Route
from statewright.component import DISABLED, OK, Component, Health, Hive

if TYPE_CHECKING:
    from sources.k8s_source import K8sSource  # imports kubernetes: the k8s component's

#: The environment variable that switches the probe on (value ``1``).
PROBE_ENV = "STATEWRIGHT_DEBUG_PROBE"

_OFF = {404: f"the debug probe is off (start the agent with {PROBE_ENV}=1)"}
_PROBE_SCHEMA = {
    "type": "object",
    "required": ["pid", "rss_mb", "loop", "gc"],
    "properties": {
        "pid": {"type": "integer"},
        "rss_mb": {"type": "number"},
        "loop": {"type": "object"},
        "gc": {"type": "object"},
        "tracemalloc": {"type": "object"},
        "statedb": {"type": "object"},
        "k8s": {"type": "object"},
    },
}
_TRACE_BODY = {
    "type": "object",
    "required": ["action"],
    "properties": {
        "action": {"type": "string", "enum": ["start", "snapshot", "stop"]},
        "frames": {"type": "integer", "minimum": 1, "maximum": 100},
        "top": {"type": "integer", "minimum": 1, "maximum": 1000},
    },
}
_TRACE_SCHEMA = {
    "type": "object",
    "required": ["tracing"],
    "properties": {"tracing": {"type": "boolean"}, "top": {"type": "array"}},
}
_SINCE = QueryParam(
    "since_ms",
    {"type": "string", "pattern": "^[0-9]+$"},
    "only the stalls that ended after this time (ms of the agent's time.monotonic; each "
    "stall's ``at`` is in seconds)",
)


def probe_enabled() -> bool:
    """Whether the environment switches the probe on."""
    return os.environ.get(PROBE_ENV, "") == "1"


class DebugComponent(Component):
    """The loop probe and memory tracer, when `probe_enabled`."""

    name = "debug"
    uses = (DATABASE, K8S_SOURCE)

    def __init__(self, enabled: bool | None = None) -> None:
        self.enabled = probe_enabled() if enabled is None else enabled
        self.loop: LoopProbe | None = None
        self.collector = CollectorProbe()
        self.memory = MemoryTracer()
        self.db: DB | None = None
        self.source: K8sSource | None = None

    async def start(self, hive: Hive) -> None:
        """Start the loop probe (when enabled)."""
        if self.enabled:
            self.db = hive.find(self, DATABASE)
            self.source = hive.find(self, K8S_SOURCE)
            self.loop = LoopProbe()
            self.collector.install()
            await hive.spawn(self, self.loop.run)

    async def stop(self) -> None:
        """Stop a running memory trace (the probe's task is already cancelled)."""
        self.collector.remove()
        if self.memory.state()["tracing"]:
            self.memory.stop()

    def health(self) -> list[Health]:
        """Disabled unless switched on."""
        if not self.enabled:
            return [Health(self.name, DISABLED, f"{PROBE_ENV} not set")]
        return [Health(self.name, OK, "loop probe running")]

    def routes(self) -> Sequence[Route]:
        """``/debug/probe`` and ``/debug/tracemalloc``."""
        return (
            Route("/debug/probe", self._probe, query=(_SINCE,), response=_PROBE_SCHEMA,
                  errors=_OFF, summary="event-loop lateness, stalls with stacks, memory"),
            Route("/debug/tracemalloc", self._trace, methods=("POST",), body=_TRACE_BODY,
                  response=_TRACE_SCHEMA, errors={**_OFF, 409: "tracemalloc is not tracing"},
                  summary="start, snapshot (growth since the first) or stop tracemalloc"),
        )

    def _started(self) -> LoopProbe:
        if not self.enabled or self.loop is None:
            raise ApiError(404, _OFF[404])
        return self.loop

    async def _probe(self, req: Request) -> Any:
        # Nothing here walks the heap: gc.get_freeze_count() counts the frozen objects one
        # by one (60-70 ms on the loop for an agent with 10,000 services).
        loop = self._started()
        since = int(req.query.get("since_ms", "0") or 0) / 1000
        return {
            "pid": os.getpid(),
            "rss_mb": round(rss_mb(), 1),
            "loop": loop.to_json(since),
            "gc": {
                "counts": list(gc.get_count()),
                "thresholds": list(gc.get_threshold()),
                "collections": [s["collections"] for s in gc.get_stats()],
                **self.collector.to_json(since),
            },
            "tracemalloc": self.memory.state(),
            "statedb": self._retention(),
            "k8s": {} if self.source is None else {
                "apply_latency": self.source.apply_latency.to_json(),
            },
        }

    def _retention(self) -> dict[str, Any]:
        """Per table, what statedb keeps beyond the rows (`statedb.table.Table.retention`)."""
        if self.db is None:
            return {}
        txn = self.db.read_txn()
        return {t.name: t.retention(txn) for t in self.db.tables}

    async def _trace(self, req: Request) -> Any:
        self._started()
        body = req.json()
        action = body["action"]
        if action == "start":
            return self.memory.start(int(body.get("frames", 1)))
        if action == "stop":
            return self.memory.stop()
        if not self.memory.state()["tracing"]:
            raise ApiError(409, "tracemalloc is not tracing: start it first")
        top = int(body.get("top", 10))
        return await anyio.to_thread.run_sync(self.memory.snapshot, top)
