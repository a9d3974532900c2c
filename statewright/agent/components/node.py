"""What the agent sets up on the node: the demo namespace, the socket-LB datapath, metrics."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any

import anyio

from bpf.probe import DEFAULT_PIN_DIR
from statedb import WatchSet
from statewright.agent.components.conntrack import CT
from statewright.agent.components.lb import LB, LB_MAPS
from statewright.agent.components.monitor import MONITOR
from statewright.agent.config import (
    DEFAULT_CGROUP_NAME,
    DEFAULT_STATE_DIR,
    DEMO_NETNS,
    AgentConfig,
)
from statewright.component import DEGRADED, DISABLED, OK, Component, Health, Hive

log = logging.getLogger("statewright.agent.node")

#: Seconds between two checks that the demo namespace is still there.
DEMO_NETNS_CHECK_S = 1.0


def is_default_instance(config: AgentConfig) -> bool:
    """Whether ``config`` is the machine-wide default agent's (`make run`): default pin and
    state directories. Only that agent's cleanup may remove the default cgroup and demo
    namespace when its command line does not name them (another agent's cleanup must not
    remove what a running default agent uses)."""
    return config.pin_dir == DEFAULT_PIN_DIR and config.state_dir == DEFAULT_STATE_DIR


@dataclass(frozen=True, slots=True)
class DemoConfig:
    """What the demo component needs from the agent's configuration: the demo namespace
    ("": no demo), and whether this is the default agent (`is_default_instance`), whose
    cleanup removes the default namespace."""

    netns: str = ""
    default_instance: bool = False

    @classmethod
    def from_agent_config(cls, cfg: AgentConfig) -> DemoConfig:
        """The agent's ``demo-netns``; pin and state directories (`is_default_instance`)."""
        return cls(cfg.demo_netns, is_default_instance(cfg))


@dataclass(frozen=True, slots=True)
class DatapathComponentConfig:
    """What the socket-LB datapath component needs from the agent's configuration."""

    enabled: bool = True
    #: The cgroup to attach to ("": <cgroup2 mount>/statewright, created by the agent).
    cgroup: str = ""
    pin_dir: str = DEFAULT_PIN_DIR
    allow_root_cgroup: bool = False
    #: The default agent's (`is_default_instance`) cleanup removes the default cgroup.
    default_instance: bool = False

    @classmethod
    def from_agent_config(cls, cfg: AgentConfig) -> DatapathComponentConfig:
        """The agent's ``datapath``, ``cgroup``, ``pin-dir``, ``allow-root-cgroup``."""
        return cls(cfg.datapath, cfg.cgroup, cfg.pin_dir, cfg.allow_root_cgroup,
                   is_default_instance(cfg))


@dataclass(frozen=True, slots=True)
class MetricsConfig:
    """What the metrics component needs from the agent's configuration (port 0: off)."""

    port: int = 0
    address: str = "127.0.0.1"

    @classmethod
    def from_agent_config(cls, cfg: AgentConfig) -> MetricsConfig:
        """The agent's ``metrics-port`` and ``metrics-address``."""
        return cls(cfg.metrics_port, cfg.metrics_address)


class DemoComponent(Component):
    """A network namespace with an echo server for every backend in the tables (demo mode:
    ``demo-netns`` configured). Syncs run in a worker thread, never on the event loop."""

    name = "demo"
    needs = (LB,)

    def __init__(self, config: DemoConfig) -> None:
        self.config = config
        self.demo: Any = None
        self.error = ""
        self.failing = False
        self.recreated = 0

    async def start(self, hive: Hive) -> None:
        """Create the namespace and follow the backends table."""
        if not self.config.netns:
            return
        from statewright.agent.demo_netns import DemoNetns

        lb = hive.get(self, LB)
        demo = DemoNetns(self.config.netns)
        try:
            await anyio.to_thread.run_sync(demo.start)
        except Exception as e:
            self.error = f"demo namespace {self.config.netns}: {e}"
            log.error("agent: %s", self.error)
            await anyio.to_thread.run_sync(demo.stop)
            return
        self.demo = demo

        async def follow(*, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
            task_status.started()
            while True:
                rows, watch = lb.backends.all_watch(lb.db.read_txn())
                addresses = sorted({(str(b.address.address), int(b.address.port),
                                     str(b.address.protocol)) for b in rows})
                try:
                    await anyio.to_thread.run_sync(demo.sync, addresses)
                except Exception as e:
                    log.warning("agent: demo backends: %s", e)
                # Woken by the backends, and every few seconds to see that the namespace
                # is still there (someone may delete it behind the agent's back).
                while not await WatchSet([watch]).wait_async(timeout=DEMO_NETNS_CHECK_S):
                    if await self._recreated_if_gone(demo):
                        break

        await hive.spawn(self, follow, label="demo-backends")

    async def _recreated_if_gone(self, demo: Any) -> bool:
        """Create the demo namespace again if it vanished: Degraded until it is back."""
        from statewright.agent.demo_netns import netns_exists

        if netns_exists(demo.name):
            return False
        self.error = f"demo namespace {demo.name} vanished; creating it again"
        self.demo = None  # Degraded meanwhile
        try:
            recreated = await anyio.to_thread.run_sync(demo.recreate_if_gone)
        except Exception as e:
            self.error = f"demo namespace {demo.name} vanished; creating it again: {e}"
            log.error("agent: %s", self.error)
            self.demo = demo  # keeps trying at the next check
            self.failing = True
            return True
        self.failing = False
        self.recreated += int(recreated)
        self.demo = demo
        return True

    async def stop(self) -> None:
        """Remove the namespace and its servers."""
        if self.demo is not None:
            await anyio.to_thread.run_sync(self.demo.stop)
            self.demo = None

    def health(self) -> list[Health]:
        """Only in demo mode: the namespace and its servers."""
        if not self.config.netns:
            return []
        if self.demo is None or self.failing:
            return [Health(self.name, DEGRADED, self.error or "not running")]
        text = self.demo.describe()
        if self.recreated:
            text += f" (created again {self.recreated} time(s) after it vanished)"
        return [Health(self.name, OK, text)]

    def cleanup(self) -> list[str]:
        """Delete this configuration's demo namespace if it is left: the one named by
        ``demo-netns``, or the default one for the default agent only."""
        from statewright.agent.demo_netns import delete_netns

        name = self.config.netns or (DEMO_NETNS if self.config.default_instance else "")
        return [f"netns {name}"] if name and delete_netns(name) else []


class DatapathComponent(Component):
    """The socket load balancer (bpf/sock_lb.c) attached to the agent's cgroup; only on
    kernel maps. Its pinned links keep load balancing while the agent is down."""

    name = "datapath"
    needs = (LB_MAPS,)

    def __init__(self, config: DatapathComponentConfig) -> None:
        self.config = config
        self.datapath: Any = None
        self.cgroup = ""
        self.state = DISABLED
        self.reason = "not started"

    async def start(self, hive: Hive) -> None:
        """Attach (or adopt the pinned links); a failure leaves the agent Degraded."""
        cfg = self.config
        if not cfg.enabled:
            self.reason = "disabled by configuration"
            return
        lb = hive.get(self, LB_MAPS)
        if lb.maps_kind != "kernel":
            self.reason = f"needs kernel maps; using {lb.maps_kind} ({lb.maps_reason})"
            log.warning("agent: datapath not attached: %s", self.reason)
            return
        from bpf.datapath import DatapathConfig, SockLB, cgroup2_mount

        try:
            self.cgroup = cfg.cgroup or os.path.join(cgroup2_mount(), DEFAULT_CGROUP_NAME)
            if not cfg.cgroup:
                os.makedirs(self.cgroup, exist_ok=True)
            dp = SockLB(DatapathConfig(cgroup=self.cgroup, pin_dir=cfg.pin_dir,
                                       allow_root_cgroup=cfg.allow_root_cgroup,
                                       maglev_table_size=lb.config.maglev_table_size))
            attached = dp.attach()
        except OSError as e:
            self.state = DEGRADED
            self.reason = f"attach to cgroup {self.cgroup or cfg.cgroup}: {e}"
            log.error("agent: datapath: %s", self.reason)
            return
        self.datapath = dp
        adopted = sum(1 for a in attached if a.adopted)
        self.state = OK
        self.reason = f"{len(attached)} programs on cgroup {self.cgroup} ({adopted} adopted links)"
        log.info("agent: datapath: %s", self.reason)

    async def stop(self) -> None:
        """Close the handles; the pinned links keep load balancing."""
        if self.datapath is not None:
            self.datapath.close()
            self.datapath = None

    def health(self) -> list[Health]:
        """Attached (OK), not attached and why (Disabled), or failed (Degraded)."""
        return [Health(self.name, self.state, self.reason)]

    def cleanup(self) -> list[str]:
        """Detach the pinned links and programs; remove the default cgroup when this is the
        default agent's configuration (`is_default_instance`; an agent on a pin directory
        of its own leaves it to the agent that uses it)."""
        from bpf.datapath import SockLB, cgroup2_mount

        removed = list(SockLB.cleanup(self.config.pin_dir))
        if not self.config.cgroup and self.config.default_instance:
            try:
                cg = os.path.join(cgroup2_mount(), DEFAULT_CGROUP_NAME)
            except OSError:
                return removed
            if os.path.isdir(cg):
                try:
                    os.rmdir(cg)
                except OSError as e:
                    raise OSError(f"remove cgroup {cg}: {e.strerror} (processes still in it?)"
                                  ) from e
                removed.append(cg)
        return removed


class MetricsComponent(Component):
    """Prometheus metrics of the reconciler (and of connection tracking, with the ``ct``
    component) on ``metrics-address:metrics-port`` (opt-in)."""

    name = "metrics"
    needs = (LB_MAPS,)
    uses = (CT, MONITOR)

    def __init__(self, config: MetricsConfig) -> None:
        self.config = config
        self.server: Any = None
        self.thread: Any = None
        self.error = ""

    @property
    def url(self) -> str:
        """Where the metrics are served."""
        return f"http://{self.config.address}:{self.config.port}/metrics"

    async def start(self, hive: Hive) -> None:
        """Serve the metrics (a busy port leaves the agent running, Degraded)."""
        cfg = self.config
        if not cfg.port:
            return
        from prometheus_client import CollectorRegistry, start_http_server

        from reconciler.metrics import PrometheusCollector

        lb = hive.get(self, LB_MAPS)
        assert lb.reconciler is not None
        registry = CollectorRegistry()
        registry.register(PrometheusCollector([lb.reconciler.metrics]))
        from statewright.agent.components.conntrack import CTCollector
        from statewright.observe.monitor import MonitorCollector

        ct = hive.find(self, CT)
        if ct is not None:
            registry.register(CTCollector(ct))
        monitor = hive.find(self, MONITOR)
        if monitor is not None:
            registry.register(MonitorCollector(monitor.log, monitor.lost))
        try:
            self.server, self.thread = start_http_server(
                cfg.port, addr=cfg.address, registry=registry
            )
        except OSError as e:
            self.error = f"metrics server on {cfg.address}:{cfg.port}: {e}"
            log.error("agent: %s", self.error)
            return
        log.info("agent: metrics on %s", self.url)

    async def stop(self) -> None:
        """Shut the HTTP server down."""
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            await anyio.to_thread.run_sync(self.thread.join, 5)
            self.server = None

    def health(self) -> list[Health]:
        """Only when enabled: serving or why not."""
        if not self.config.port:
            return []
        if self.server is None:
            return [Health(self.name, DEGRADED, self.error or "not serving")]
        return [Health(self.name, OK, self.url)]
