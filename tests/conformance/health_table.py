"""The ``health`` table of the corpus' hive: module health under Cilium's job names.

Upstream every hive job reports its health into a statedb table, one row per
(module, component); ``healthserver.txtar`` compares the load balancer's rows
(``db/cmp --grep=^loadbalancer health ...``). `HealthRow` is that row and
`health_rows` derives the rows from the running `LBSystem`'s real state: the Kubernetes
feed, the node-address and zone handling of the writer, the reconciler's own health
report and refresh interval, and the health server's listeners. The names are Cilium's
so the corpus files compare; the levels and messages come from Statewright's parts.

The primary key is ``<module>.<component>``, compared as a string as upstream, which is
why ``loadbalancer-reflectors`` sorts before ``loadbalancer.healthserver`` before
``loadbalancer``'s own jobs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from statedb import Index, Table
from statedb import keys as keycodec
from tables.services import format_duration

if TYPE_CHECKING:
    from tests.conformance.lb_system import LBSystem

HEALTH_TABLE = "health"


@dataclass(frozen=True, slots=True)
class HealthRow:
    """One job's health."""

    module: str
    component: str
    level: str
    message: str
    error: str = ""

    @property
    def key(self) -> str:
        """``module.component`` (the primary key)."""
        return f"{self.module}.{self.component}"

    @staticmethod
    def table_header() -> list[str]:
        """Columns of ``db/show health``."""
        return ["Module", "Component", "Level", "Message", "Error"]

    def table_row(self) -> list[str]:
        """Cells of ``db/show health``."""
        return [self.module, self.component, self.level, self.message, self.error]

    def to_json(self) -> dict[str, Any]:
        """JSON form."""
        return {
            "ID": {"Module": self.module, "Component": [self.component]},
            "Level": self.level,
            "Message": self.message,
            "Error": self.error,
        }


def new_health_table() -> Table[HealthRow]:
    """An unregistered ``health`` table keyed by `HealthRow.key`."""
    return Table(
        HEALTH_TABLE, Index("id", key=lambda r: r.key, encode=keycodec.string),
        row_type=HealthRow,
    )


def health_rows(system: LBSystem) -> list[HealthRow]:
    """The rows the running ``system`` reports (none while it is stopped)."""
    if not system.running:
        return []
    ok = "OK"
    rows = [
        HealthRow("loadbalancer-reflectors", "job-reflect-pods", ok, "Running"),
        HealthRow("loadbalancer-reflectors", "job-reflect-services-endpoints", ok, "Running"),
        HealthRow("loadbalancer", "job-node-addr-reconciler", ok, "Running"),
        HealthRow("loadbalancer", "job-zone-watcher", ok, "Running"),
    ]
    hs = system.lb.health_server
    if hs is not None and hs.running:
        for job, good, message in hs.status():
            rows.append(
                HealthRow(
                    "loadbalancer.healthserver",
                    job,
                    ok if good else "Degraded",
                    message if good else "",
                    "" if good else message,
                )
            )
    rec = system.lb.reconciler
    if rec is not None and system.lb.running:
        health = rec.health
        level = str(health.level)
        good = level == ok
        rows.append(
            HealthRow(
                "loadbalancer.reconciler",
                "job-reconcile",
                level,
                health.message if good else "",
                "" if good else health.message,
            )
        )
        interval = rec.config.refresh_interval
        if interval is not None:
            rows.append(
                HealthRow(
                    "loadbalancer.reconciler",
                    "job-refresh",
                    ok,
                    f"Next refresh in {format_duration(interval)}",
                )
            )
        # The one-shot job that started the reconciler has finished.
        rows.append(
            HealthRow("loadbalancer.reconciler", "job-start-reconciler", "Stopped", "Started")
        )
    return rows
