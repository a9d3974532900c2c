"""The monitor's memory: the last N flows, the live subscribers, and the counters.

`FlowLog.add` is called on the event loop with flows already enriched (by the reader
thread, statewright/agent/components/monitor.py); it appends to a bounded deque, counts
and hands each flow to every subscriber's bounded queue without waiting: a subscriber
that cannot keep up loses flows (counted in ``subscriber_overflow``), never the agent.
`MonitorCollector` exposes the counters to Prometheus under Cilium-like names.
"""

from __future__ import annotations

import collections
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from statewright.observe.flows import FlowFilter

DEFAULT_KEEP = 1000
SUBSCRIBER_BUFFER = 1000


@dataclass(slots=True)
class Counters:
    """What the monitor counted since the agent started."""

    events: int = 0
    drops: collections.Counter[tuple[str, str]] = field(default_factory=collections.Counter)
    forwarded: collections.Counter[str] = field(default_factory=collections.Counter)
    verdicts: collections.Counter[tuple[str, str]] = field(default_factory=collections.Counter)
    translations: int = 0
    decode_errors: int = 0
    subscriber_overflow: int = 0

    def add(self, flow: dict[str, Any]) -> None:
        self.events += 1
        direction = flow.get("traffic_direction", "").lower()
        kind = flow.get("statewright", {}).get("type")
        if flow["verdict"] == "DROPPED":
            self.drops[(flow.get("drop_reason_desc", "?"), direction)] += 1
        elif kind == "trace":
            self.translations += 1
        else:
            self.forwarded[direction] += 1
        if kind == "policy" or (kind == "drop" and "policy_lpm_prefix_length" in flow) or (
                kind == "drop" and str(flow.get("drop_reason_desc", "")).startswith("POLICY")):
            action = "allowed" if flow["verdict"] == "FORWARDED" else "denied"
            self.verdicts[(direction, action)] += 1

    def to_json(self, lost: dict[str, int]) -> dict[str, Any]:
        return {
            "events": self.events,
            "drops": [{"reason": r, "direction": d, "count": n}
                      for (r, d), n in sorted(self.drops.items())],
            "forwarded": dict(sorted(self.forwarded.items())),
            "policy_verdicts": [{"direction": d, "action": a, "count": n}
                                for (d, a), n in sorted(self.verdicts.items())],
            "translations": self.translations,
            "lost_events": {**lost, "subscriber_overflow": self.subscriber_overflow},
            "decode_errors": self.decode_errors,
        }


class FlowLog:
    """The last ``keep`` flows, the counters, and the live subscribers."""

    def __init__(self, keep: int = DEFAULT_KEEP) -> None:
        self.recent: collections.deque[dict[str, Any]] = collections.deque(maxlen=keep)
        self.counters = Counters()
        self._subscribers: list[tuple[FlowFilter, MemoryObjectSendStream[dict[str, Any]]]] = []

    def add(self, flows: list[dict[str, Any]]) -> None:
        """Keep, count and publish flows (on the event loop; never blocks)."""
        for flow in flows:
            self.recent.append(flow)
            self.counters.add(flow)
            for filt, send in list(self._subscribers):
                if not filt.matches(flow):
                    continue
                try:
                    send.send_nowait(flow)
                except anyio.WouldBlock:
                    self.counters.subscriber_overflow += 1
                except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                    self._drop(send)

    def _drop(self, send: MemoryObjectSendStream[dict[str, Any]]) -> None:
        self._subscribers = [(f, s) for f, s in self._subscribers if s is not send]

    def subscribe(self, filt: FlowFilter
                  ) -> tuple[list[dict[str, Any]], MemoryObjectReceiveStream[dict[str, Any]],
                             MemoryObjectSendStream[dict[str, Any]]]:
        """(the kept flows that match, a stream of the following ones, its sender to pass
        to `unsubscribe`)."""
        send, recv = anyio.create_memory_object_stream[dict[str, Any]](SUBSCRIBER_BUFFER)
        self._subscribers.append((filt, send))
        return [f for f in self.recent if filt.matches(f)], recv, send

    def unsubscribe(self, send: MemoryObjectSendStream[dict[str, Any]]) -> None:
        """Stop publishing to ``send`` and close it."""
        self._drop(send)
        send.close()

    @property
    def subscribers(self) -> int:
        return len(self._subscribers)


class MonitorCollector:
    """Prometheus view of the counters (``collect`` is called by the metrics server)."""

    def __init__(self, log: FlowLog, lost: Any) -> None:
        self.log = log
        self.lost = lost  # () -> {"rate_limit": n, "ring_full": n}

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily

        c = self.log.counters
        drops = CounterMetricFamily("statewright_drop_count", "Drops the datapath reported, "
                                    "by reason and direction", labels=["reason", "direction"])
        for (reason, direction), n in sorted(c.drops.items()):
            drops.add_metric([reason, direction], n)
        yield drops
        fwd = CounterMetricFamily("statewright_forward_count", "New flows the datapath "
                                  "reported forwarded, by direction", labels=["direction"])
        for direction, n in sorted(c.forwarded.items()):
            fwd.add_metric([direction], n)
        yield fwd
        verdicts = CounterMetricFamily("statewright_policy_verdicts", "Policy verdicts of "
                                       "new flows", labels=["direction", "action"])
        for (direction, action), n in sorted(c.verdicts.items()):
            verdicts.add_metric([direction, action], n)
        yield verdicts
        lost = CounterMetricFamily("statewright_monitor_lost_events", "Events lost to the "
                                   "rate limit, a full ring or a slow subscriber",
                                   labels=["cause"])
        for cause, n in sorted({**self.lost(), "subscriber_overflow":
                                c.subscriber_overflow}.items()):
            lost.add_metric([cause], n)
        yield lost
