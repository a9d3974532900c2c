"""The Kubernetes source in the agent: list and watch the API server into the LB tables.

`KubernetesComponent` (``k8s``) runs `sources.k8s_source.K8sSource` with the load
balancer's writer and converter (the same converter as the manifest source, so both
sources can run together). It is enabled when the configuration says where the API
server is — ``k8s-kubeconfig``, ``k8s-api-server`` or ``k8s-in-cluster: true`` — and
Disabled otherwise (manifests stay the default for ``make run``).

It comes after ``lb`` and before ``maps`` in the component list: it registers the ``k8s``
initializer on the LB tables while it starts, so the reconciler prunes nothing from the
maps before all four initial lists (services, endpoint slices, this node's pods, this
node) are in the tables. The agent does not wait for the API server at start: an
unreachable server leaves the agent running and the component Degraded, with the reason,
until it answers.

The Node object's labels replace the configured ``node-labels`` once it has been read
(the Node is the truth in a cluster).

Garbage collector: in a process that tuned its collector for bulk loads
(`statedb.gc_tuning.tune_gc`, as ``statewright agent`` does), the component holds the
young collections off while the initial lists are applied (`statedb.gc_tuning.initial_load_gc`),
switches to the steady-state thresholds (`statedb.gc_tuning.steady_gc`: one freeze of
what was loaded first) once the initial lists are in the maps, and from then on runs a
young collection every
`statedb.gc_tuning.YOUNG_COLLECT_INTERVAL` seconds (`collect_young_periodically`); the
reasons and the measured costs are in `statedb.gc_tuning`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import anyio

from sources.k8s_client import ClientSettings
from statedb.gc_tuning import (
    STEADY_GC_THRESHOLDS,
    collect_young_periodically,
    initial_load_gc,
    steady_gc,
)
from statewright.agent.components.lb import LB
from statewright.agent.config import AgentConfig
from statewright.api_types import Request, Route
from statewright.component import (
    DEGRADED,
    DISABLED,
    OK,
    Component,
    ComponentError,
    Health,
    Hive,
    Provided,
)
from statewright.loadbalancer import LoadBalancer

if TYPE_CHECKING:
    # Imported when the component starts: the source's modules (the converter, the
    # reflectors, urllib3) are what an agent without an API server never needs.
    from sources.k8s_client import K8sClient
    from sources.k8s_source import K8sSource, SourceConfig

log = logging.getLogger("statewright.agent.kubernetes")

#: How long the switch to the steady collector thresholds waits for the initial
#: reconciliation of the maps.
STEADY_GC_TIMEOUT = 120.0


def client_settings(config: AgentConfig) -> ClientSettings:
    """The client settings the agent configuration asks for."""
    return ClientSettings(
        kubeconfig=config.k8s_kubeconfig,
        api_server=config.k8s_api_server,
        in_cluster=config.k8s_in_cluster,
        qps=config.k8s_qps,
        burst=config.k8s_burst,
    )


@dataclass(frozen=True, slots=True)
class KubernetesConfig:
    """What the Kubernetes component needs from the agent's configuration: where the API
    server is (no server configured: the component does nothing) and this node's name."""

    client: ClientSettings = field(default_factory=ClientSettings)
    node_name: str = ""

    @classmethod
    def from_agent_config(cls, cfg: AgentConfig) -> KubernetesConfig:
        """The agent's ``k8s-*`` settings (`client_settings`) and ``node-name``."""
        return cls(client_settings(cfg), cfg.node_name)


K8S_SCHEMA = {
    "type": "object",
    "required": ["enabled", "resources", "errors"],
    "properties": {
        "enabled": {"type": "boolean"},
        "server": {"type": "string"},
        "synced": {"type": "boolean"},
        "resources": {"type": "array", "items": {"type": "object", "required": ["name"]}},
        "errors": {"type": "object"},
    },
}


#: The Kubernetes source (Services, EndpointSlices, this node's Pods and Node), and its
#: API client, for the components that read more kinds (types for the checker only:
#: their modules are imported once the component starts).
K8S_SOURCE: Provided[K8sSource] = Provided("k8s")
K8S_CLIENT: Provided[K8sClient] = Provided("k8s-client")


class KubernetesComponent(Component):
    """Services, EndpointSlices, this node's Pods and this Node from the API server."""

    name = "k8s"
    needs = (LB,)
    provides = (K8S_SOURCE, K8S_CLIENT)

    def __init__(
        self, config: KubernetesConfig, source_config: SourceConfig | None = None
    ) -> None:
        self.config = config
        #: Batching and reflector timing (None: the defaults, made for a real cluster).
        self.source_config = source_config
        self.settings = config.client
        self.source: K8sSource | None = None
        self.client: K8sClient | None = None

    @property
    def enabled(self) -> bool:
        """True when the configuration points at an API server."""
        return self.settings.enabled

    async def start(self, hive: Hive) -> None:
        """Connect the client, register the ``k8s`` initializer and start the reflectors.
        A configuration that cannot work (no such kubeconfig, no service-account token in
        cluster mode) stops the agent's start with the reason."""
        if not self.enabled:
            return
        from sources.k8s_client import K8sClient, K8sConfigError
        from sources.k8s_source import K8sSource

        lb = hive.get(self, LB)
        try:
            client = K8sClient(self.settings)
        except K8sConfigError as e:
            raise ComponentError(f"{self.name}: {e}") from None
        self.client = client
        source = K8sSource(
            lb.writer,
            client,
            node_name=self.config.node_name,
            converter=lb.converter,
            config=self.source_config,
        )
        with lb.writer.write_txn() as txn:
            source.register_initializer(txn)
        self.source = source
        hive.provide(self, K8S_SOURCE, source)
        hive.provide(self, K8S_CLIENT, client)
        # Until the switch below: what the initial lists load stays, so young passes over
        # it would free nothing (see statedb.gc_tuning.INITIAL_LOAD_GEN0_THRESHOLD).
        initial_load_gc()
        await hive.spawn(self, source.run)
        await hive.spawn(self, self._steady_gc_after_sync(lb, source), label="k8s-steady-gc")
        log.info(
            "agent: kubernetes source on %s for node %s", client.description, self.config.node_name
        )

    @staticmethod
    def _steady_gc_after_sync(lb: LoadBalancer, source: K8sSource) -> Any:
        async def switch(*, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
            """Once the initial lists are applied and reconciled into the maps (or after
            `STEADY_GC_TIMEOUT`): `steady_gc` (which freezes what was loaded), then timed
            young collections until cancelled."""
            task_status.started()
            with anyio.move_on_after(STEADY_GC_TIMEOUT):
                await source.wait_synced()
                if lb.reconciler is not None:
                    revision = lb.frontends.revision(lb.db.read_txn())
                    await lb.reconciler.wait_until_reconciled(revision)
            if steady_gc():
                log.info("agent: garbage collector thresholds %s for the steady state",
                         STEADY_GC_THRESHOLDS)
                # The young threshold alone does not bound the young generation under
                # churn (see statedb.gc_tuning.YOUNG_COLLECT_INTERVAL): timed passes do.
                await collect_young_periodically()

        return switch

    async def stop(self) -> None:
        """Close the client's connections (the reflector tasks are cancelled by the hive)."""
        if self.client is not None:
            self.client.close()

    def health(self) -> list[Health]:
        """One line for the source, one per resource (``k8s/services``...), one for refused
        objects when there are any."""
        if not self.enabled:
            return [
                Health(self.name, DISABLED, "no k8s-kubeconfig, k8s-api-server or k8s-in-cluster")
            ]
        src = self.source
        if src is None:
            return [Health(self.name, DEGRADED, "not started")]
        lines = [
            Health(f"{self.name}/{res}", OK if ok else DEGRADED, msg)
            for res, ok, msg in src.health()
        ]
        bad = [h for h in lines if h.state != OK]
        where = self.client.description if self.client is not None else ""
        if bad:
            summary = Health(self.name, DEGRADED, "; ".join(f"{h.name}: {h.message}" for h in bad))
        elif src.synced:
            summary = Health(self.name, OK, f"synced with {where}")
        else:
            summary = Health(self.name, OK, f"initial sync with {where}")
        return [summary, *lines]

    def routes(self) -> Sequence[Route]:
        """``/k8s``: each reflector's state and the refused objects."""
        return (Route("/k8s", self._status, response=K8S_SCHEMA,
                      summary="the Kubernetes source: reflectors and refused objects"),)

    async def _status(self, _req: Request) -> Any:
        src = self.source
        if src is None:
            return {"enabled": self.enabled, "resources": [], "errors": {}}
        now = time.time()
        return {
            "enabled": True,
            "server": self.client.description if self.client is not None else "",
            "synced": src.synced,
            "resources": [
                {
                    "name": r.name,
                    "state": r.health.state,
                    "for_s": round(now - r.health.since, 3),
                    "synced": r.health.synced,
                    "resource_version": r.health.resource_version,
                    "last_error": r.health.last_error,
                    "lists": r.health.lists,
                    "watches": r.health.watches,
                    "events": r.health.events,
                }
                for r in src.reflectors
            ],
            "errors": dict(src.errors),
        }
