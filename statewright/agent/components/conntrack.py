"""The ct component: the connection-tracking maps, their periodic garbage collection and
the drop counters (bpf/include/ct.h, bpfops/conntrack.py).

Opens (or adopts, pinned under the pin directory) ``ct4_global`` and ``ct6_global``
(``bpf-ct-global-max`` entries each) and ``metrics``; the tc programs (the ``tc``
component) reuse them from their pins, so connections tracked before an agent restart
are still known after it. Every ``conntrack-gc-interval`` seconds a worker thread removes
the expired entries (Cilium's ctmap GC); the health line and ``GET /ct/stats`` report
entries, GC runs, entries removed and the drop counters; Prometheus metrics with the
``metrics`` component.

Routes: ``GET /ct`` (entries, ``?limit=N``), ``DELETE /ct`` (flush), ``GET /ct/stats``.
"""

from __future__ import annotations

import errno
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import anyio

from bpf import ct
from bpf.catalog import ct_specs, metrics_spec
from bpf.factory import BackendConfig, BackendKind, MapFactory
from bpf.memory_map import MemoryMap
from bpfops.conntrack import CTMaps
from statewright.agent.components.periodic_gc import gc_every
from statewright.agent.config import AgentConfig
from statewright.api_types import ApiError, QueryParam, Request, Route
from statewright.component import (
    DEGRADED,
    OK,
    Component,
    Health,
    Hive,
    MapView,
    Provided,
    typed_map_view,
)

log = logging.getLogger("statewright.agent.ct")

OWN_MAPS = (ct.CT4_MAP, ct.CT6_MAP, ct.METRICS_MAP)
_LIMIT = QueryParam("limit", {"type": "string", "pattern": "^[0-9]+$"},
                    "list at most this many entries (0: all)")
_ENTRY_SCHEMA = {"type": "object", "properties": {
    "family": {"type": "integer"}, "protocol": {"type": "string"},
    "source": {"type": "string"}, "destination": {"type": "string"},
    "direction": {"type": "string"}, "expires_in": {"type": "integer"},
    "packets": {"type": "integer"}, "bytes": {"type": "integer"},
    "flags": {"type": "array", "items": {"type": "string"}},
    "source_identity": {"type": "integer"}}}
_LIST_SCHEMA = {"type": "object", "required": ["entries"],
                "properties": {"entries": {"type": "array", "items": _ENTRY_SCHEMA}}}
_FLUSH_SCHEMA = {"type": "object", "required": ["removed"],
                 "properties": {"removed": {"type": "integer"}}}
_STATS_SCHEMA = {"type": "object", "required": ["gc", "drops"], "properties": {
    "gc": {"type": "object"}, "drops": {"type": "array", "items": {"type": "object"}}}}
_OFF = {503: "the ct component has not started"}


#: The connection-tracking maps, for the metrics component.
CT: Provided[CTMaps] = Provided("ct", CTMaps)


@dataclass(frozen=True, slots=True)
class CTConfig:
    """What the component needs from the agent's configuration."""

    backend: BackendKind = "auto"
    pin_dir: str = "/sys/fs/bpf/statewright"
    max_entries: int = ct.CT_MAP_MAX_ENTRIES
    gc_interval: float = 60.0

    @classmethod
    def from_agent_config(cls, cfg: AgentConfig) -> CTConfig:
        """The agent's backend, pin directory, ``bpf-ct-global-max`` and GC interval."""
        maps = cfg.map_backend()
        return cls(maps.backend, maps.pin_dir, cfg.bpf_ct_global_max, cfg.conntrack_gc_interval)


class CTComponent(Component):
    """See the module doc."""

    name = "ct"
    provides = (CT,)

    def __init__(self, config: CTConfig) -> None:
        self.config = config
        self.maps: CTMaps | None = None
        self.maps_kind = ""

    async def start(self, hive: Hive) -> None:
        """Open the maps and start the GC loop."""
        cfg = self.config
        factory = MapFactory(BackendConfig(backend=cfg.backend, pin_dir=cfg.pin_dir))
        self.maps_kind = factory.kind
        opened: list[Any] = []
        try:
            for spec in (*ct_specs(cfg.max_entries), metrics_spec()):
                opened.append(factory.open_typed(spec))
        except BaseException:
            for m in opened:
                m.close()
            raise
        self.maps = CTMaps(*opened)
        await hive.spawn(self, self._gc_loop, label="ct-gc")
        hive.provide(self, CT, self.maps)

    async def _gc_loop(self, *, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
        await gc_every(self.config.gc_interval, lambda: self.maps, "ct:", log,
                       task_status=task_status)

    async def stop(self) -> None:
        """Close the maps (their pins stay: the next start adopts them)."""
        if self.maps is not None:
            for m in (self.maps.ct4, self.maps.ct6, self.maps.metrics_map):
                if m is not None:
                    m.close()
            self.maps = None

    def health(self) -> list[Health]:
        """Map kind and size, GC runs and entries removed; the last GC error."""
        if self.maps is None:
            return [Health(self.name, DEGRADED, "not started")]
        m = self.maps.metrics
        text = (f"{self.maps_kind} maps of {self.config.max_entries} entries, "
                f"{m.gc_runs} GC runs, {m.removed_total} expired entries removed")
        if m.last_error:
            return [Health(self.name, DEGRADED, f"{text}; last GC failed: {m.last_error}")]
        return [Health(self.name, OK, text)]

    def bpf_maps(self) -> Sequence[MapView]:
        """The two CT maps and the drop counters."""
        if self.maps is None:
            return []
        ms = (self.maps.ct4, self.maps.ct6, self.maps.metrics_map)
        return [typed_map_view(m, self.maps_kind) for m in ms if m is not None]

    def cleanup(self) -> list[str]:
        """Unpin the CT maps and the drop counters."""
        removed = []
        for name in OWN_MAPS:
            path = os.path.join(self.config.pin_dir, name)
            try:
                os.unlink(path)
                removed.append(f"pin {path}")
            except OSError as e:
                if e.errno != errno.ENOENT:
                    raise
            if path in MemoryMap.pinned_paths():
                MemoryMap.remove_pin(path)
        return removed

    # ----- API ------------------------------------------------------------------------------
    def routes(self) -> Sequence[Route]:
        """``/ct`` (list, flush) and ``/ct/stats``."""
        return (
            Route("/ct", self._list, query=(_LIMIT,), response=_LIST_SCHEMA, errors=_OFF,
                  summary="the connection-tracking entries"),
            Route("/ct", self._flush, methods=("DELETE",), response=_FLUSH_SCHEMA,
                  errors=_OFF, summary="remove every connection-tracking entry"),
            Route("/ct/stats", self._stats, response=_STATS_SCHEMA, errors=_OFF,
                  summary="CT garbage collection figures and drop counters by reason"),
        )

    def _started(self) -> CTMaps:
        if self.maps is None:
            raise ApiError(503, "the ct component has not started")
        return self.maps

    async def _list(self, req: Request) -> Any:
        maps = self._started()
        limit = int(req.query.get("limit", "0") or 0)
        entries = await anyio.to_thread.run_sync(lambda: list(maps.entries(limit=limit)))
        return {"entries": entries}

    async def _flush(self, req: Request) -> Any:
        maps = self._started()
        removed = await anyio.to_thread.run_sync(maps.flush)
        log.info("ct: flushed %d entries", removed)
        return {"removed": removed}

    async def _stats(self, req: Request) -> Any:
        maps = self._started()
        drops = await anyio.to_thread.run_sync(maps.drops)
        return {"gc": maps.metrics.to_json(), "drops": drops}


class CTCollector:
    """Prometheus collector of the CT figures (registered by the ``metrics`` component):
    ``statewright_ct_entries{map}``, ``statewright_ct_gc_runs_total``,
    ``statewright_ct_gc_removed_total``, ``statewright_drop_count_total{reason,direction}``."""

    def __init__(self, maps: CTMaps) -> None:
        self.maps = maps

    def collect(self) -> Any:
        """The current figures (the drop counters read from their map)."""
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        m = self.maps.metrics
        entries = GaugeMetricFamily("statewright_ct_entries",
                                    "CT entries after the last GC", labels=["map"])
        for name, n in sorted(m.entries.items()):
            entries.add_metric([name], n)
        yield entries
        yield CounterMetricFamily("statewright_ct_gc_runs", "CT garbage collections",
                                  value=m.gc_runs)
        yield CounterMetricFamily("statewright_ct_gc_removed",
                                  "expired CT entries removed by the GC", value=m.removed_total)
        drops = CounterMetricFamily("statewright_drop_count", "packets dropped by the tc "
                                    "programs", labels=["reason", "direction"])
        try:
            rows = self.maps.drops()
        except OSError:
            rows = []
        for d in rows:
            drops.add_metric([d["description"], d["direction"]], d["packets"])
        yield drops
