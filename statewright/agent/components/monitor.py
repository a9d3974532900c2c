"""The ``monitor`` component: the datapath's events (bpf/include/events.h), read, enriched
and kept for `statewright monitor`.

On kernel maps it pins the event maps under the pin directory before the programs load
(bpf/events.py; the endpoint and socket programs reuse them from there), turns events on
with a per-CPU rate limit, and runs a reader thread: it polls the ring buffer, decodes
and enriches each event from statedb (endpoint, pod, namespace, labels, service:
statewright/observe/flows.py) and hands the flows to the event loop in batches, where
`FlowLog` keeps the last ``keep`` and publishes them to the subscribers. Nothing of it
runs on the loop but the hand-over, so a flood costs the loop one short call per poll.

Routes: ``GET /monitor`` (newline-delimited flows: the kept ones that match, then live
ones; filters ``pod``, ``namespace``, ``identity``, ``verdict``, ``type``; ``follow=0``
stops after the kept ones) and ``GET /monitor/stats`` (the counters, lost events
included). With the ``metrics`` component the counters are Prometheus metrics too.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.from_thread
import anyio.to_thread

from bpf import events as bpf_events
from bpf.errors import MapError
from bpf.factory import BackendConfig, MapFactory
from statewright.agent.components.endpoints import ENDPOINTS
from statewright.agent.components.lb import LB
from statewright.agent.components.statedb import DATABASE
from statewright.agent.config import AgentConfig
from statewright.api_types import NDJSON, ApiError, NdjsonStream, QueryParam, Request, Route
from statewright.component import DEGRADED, DISABLED, OK, Component, Health, Hive, Provided
from statewright.observe.flows import Enricher, EnrichTables, FlowFilter
from statewright.observe.monitor import DEFAULT_KEEP, FlowLog

log = logging.getLogger(__name__)

POLL_MS = 100
#: Per-CPU events per second, and the burst above it.
DEFAULT_RATE = 1000
DEFAULT_BURST = 200


@dataclass(frozen=True, slots=True)
class MonitorConfig:
    """Where the maps live, this node's name, how many flows to keep, the rate limit."""

    backend: str = "auto"
    pin_dir: str = ""
    node_name: str = ""
    keep: int = DEFAULT_KEEP
    rate: int = DEFAULT_RATE
    burst: int = DEFAULT_BURST

    @classmethod
    def from_agent_config(cls, cfg: AgentConfig) -> MonitorConfig:
        return cls(cfg.backend, cfg.pin_dir, cfg.node_name)


_STR = {"type": "string", "maxLength": 1024}
_QUERY = (
    QueryParam("pod", _STR, "pods (name or namespace/name, comma-separated), either side"),
    QueryParam("namespace", _STR, "namespaces, comma-separated, either side"),
    QueryParam("identity", {"type": "string", "pattern": "^[0-9]+(,[0-9]+)*$"},
               "identities, comma-separated, either side"),
    QueryParam("verdict", {"type": "string", "pattern": "^[A-Za-z]+(,[A-Za-z]+)*$"},
               "FORWARDED, DROPPED, TRANSLATED"),
    QueryParam("type", {"type": "string",
                        "pattern": "^(drop|policy|trace)(,(drop|policy|trace))*$"},
               "drop, policy, trace"),
    QueryParam("follow", {"type": "string", "enum": ["0", "1", "false", "true"]},
               "1 (default): the kept flows, then live ones; 0: only the kept ones"),
)
_STATS_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["events", "drops", "forwarded", "policy_verdicts", "lost_events"],
    "properties": {
        "events": {"type": "integer"},
        "drops": {"type": "array", "items": {"type": "object"}},
        "forwarded": {"type": "object"},
        "policy_verdicts": {"type": "array", "items": {"type": "object"}},
        "translations": {"type": "integer"},
        "lost_events": {"type": "object"},
        "decode_errors": {"type": "integer"},
        "kept": {"type": "integer"},
        "subscribers": {"type": "integer"},
    },
}


#: The monitor component, for the metrics component's collector.
MONITOR: Provided[MonitorComponent] = Provided("monitor")


class MonitorComponent(Component):
    """See the module doc."""

    name = "monitor"
    needs = (DATABASE,)
    provides = (MONITOR,)
    uses = (LB, ENDPOINTS)

    def __init__(self, config: MonitorConfig) -> None:
        self.config = config
        self.log = FlowLog(config.keep)
        self.maps: bpf_events.EventMaps | None = None
        self.enricher: Enricher | None = None
        self.reason = "not started"
        self.error = ""
        self._stop = threading.Event()

    async def start(self, hive: Hive) -> None:
        db = hive.get(self, DATABASE)
        tables = EnrichTables()
        lb = hive.find(self, LB)
        if lb is not None:
            tables.frontends = lb.frontends
        manager = hive.find(self, ENDPOINTS)
        if manager is not None:
            tables.endpoints = manager.endpoints
            tables.identities = manager.identities.table
        self.enricher = Enricher(db, tables, self.config.node_name)
        hive.provide(self, MONITOR, self)
        cfg = self.config
        factory = MapFactory(BackendConfig(backend=cfg.backend,  # type: ignore[arg-type]
                                           pin_dir=cfg.pin_dir))
        if factory.kind != "kernel":
            self.reason = "needs kernel maps (the datapath reports events only there)"
            return
        self.maps = bpf_events.EventMaps.open(cfg.pin_dir)
        self.maps.configure(True, cfg.rate, cfg.burst)
        self.reason = ""
        await hive.spawn(self, self.run_reader)

    async def run_reader(self, *, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
        """The reader thread until cancelled (it stops within one poll)."""
        self._stop.clear()
        done = threading.Event()
        task_status.started()
        try:
            await anyio.to_thread.run_sync(self._read_loop, done, abandon_on_cancel=True)
        finally:
            self._stop.set()
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(done.wait, 2 * POLL_MS / 1000 + 1)

    def _read_loop(self, done: threading.Event) -> None:
        assert self.maps is not None and self.enricher is not None
        pending: list[bytes] = []
        reader = bpf_events.RingReader(self.maps.fds[bpf_events.RING_MAP], pending.append)
        try:
            while not self._stop.is_set():
                n = reader.poll(POLL_MS)
                if n < 0 and n != -4:  # EINTR: poll again
                    raise MapError(bpf_events.RING_MAP, "ring_buffer__poll", -n)
                if pending:
                    flows = self._enrich(pending)
                    pending.clear()
                    if flows and not self._stop.is_set():
                        anyio.from_thread.run_sync(self.log.add, flows)
        finally:
            reader.close()
            done.set()

    def _enrich(self, records: list[bytes]) -> list[dict[str, Any]]:
        assert self.enricher is not None
        flows = []
        for data in records:
            try:
                flows.append(self.enricher.flow(bpf_events.decode(data)))
            except ValueError:
                self.log.counters.decode_errors += 1
        return flows

    async def stop(self) -> None:
        self._stop.set()
        if self.maps is not None:
            try:
                self.maps.configure(False, self.config.rate, self.config.burst)
            except MapError as e:
                log.warning("monitor: turning events off: %s", e)
            self.maps.close()
            self.maps = None

    def lost(self) -> dict[str, int]:
        """Events the datapath could not report (rate limit, full ring)."""
        if self.maps is None:
            return {"rate_limit": 0, "ring_full": 0}
        return self.maps.lost()

    def health(self) -> list[Health]:
        if self.reason:
            return [Health(self.name, DISABLED, self.reason)]
        if self.error:
            return [Health(self.name, DEGRADED, self.error)]
        lost = self.lost()
        return [Health(self.name, OK, f"{self.log.counters.events} events, "
                                      f"{sum(lost.values())} lost, "
                                      f"{self.log.subscribers} subscriber(s)")]

    def cleanup(self) -> list[str]:
        if not self.config.pin_dir:
            return []
        return bpf_events.EventMaps.unpin(self.config.pin_dir)

    def routes(self) -> Sequence[Route]:
        return (
            Route("/monitor", self._stream, query=_QUERY, media_types=(NDJSON,),
                  errors={400: "a filter not understood"},
                  summary="the datapath's flows, newline-delimited JSON with Hubble's field "
                          "names: the last ones kept, then live ones"),
            Route("/monitor/stats", self._stats, response=_STATS_SCHEMA,
                  summary="drops by reason and direction, forwarded flows, policy "
                          "verdicts, lost events"),
        )

    async def _stats(self, req: Request) -> Any:
        return {**self.log.counters.to_json(self.lost()), "kept": len(self.log.recent),
                "subscribers": self.log.subscribers}

    async def _stream(self, req: Request) -> Any:
        try:
            filt = FlowFilter.from_query(req.query)
        except ValueError as e:
            raise ApiError(400, f"filter: {e}") from None
        follow = req.query.get("follow", "1") not in ("0", "false")
        flog = self.log

        async def lines() -> AsyncIterator[str]:
            kept, recv, send = flog.subscribe(filt)
            try:
                for flow in kept:
                    yield json.dumps({"flow": flow, "node_name": flow["node_name"],
                                      "time": flow["time"]}) + "\n"
                if not follow:
                    return
                async for flow in recv:
                    yield json.dumps({"flow": flow, "node_name": flow["node_name"],
                                      "time": flow["time"]}) + "\n"
            finally:
                flog.unsubscribe(send)
                recv.close()

        return NdjsonStream(lines)

