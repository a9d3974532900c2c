"""The agent: its components, in order, and the process around them.

`agent_components` is the whole agent as one readable list (statewright/component.py
says how a list runs). Each component starts after the ones it needs and stops in
reverse order:

1. ``api``: binds the unix socket first, so a second agent on the same socket fails
   before touching anything; serves only once everything has started;
2. ``statedb``: the database (and the ``/tables`` routes);
3. ``lb``: the LB tables and writer, with this node's name and labels;
4. the sources, each registering its initializer on the tables it fills: ``manifests``,
   ``k8s`` (the API server, when configured), ``netlink``; ``nodes``: every node of the
   cluster from the Node objects and, with auto-direct-node-routes, the routes to the
   other nodes' pod CIDRs (docs/cluster.md);
5. ``maps``: the LB maps (pinned kernel maps of an earlier run are adopted, ids restored)
   and the reconciler, which prunes stale entries only once every source is initialized;
6. ``endpoints``: IPAM, the endpoint API (statewright-cni calls it), the endpoint and
   ipcache maps; endpoints restored from ``state-dir`` before anything is pruned;
7. ``policy``: NetworkPolicy/CiliumNetworkPolicy from the manifests and the API server,
   computed per endpoint into ``policy-entries``; ``policy-maps``: those entries in the
   per-endpoint policy maps the socket program enforces egress with;
8. ``demo`` (demo mode only), ``datapath`` (socket LB on the agent's cgroup, kernel maps
   only), ``metrics`` (opt-in);
9. ``sysctl``: the kernel settings the pods need (forwarding, rp_filter, the pods'
   interfaces) as a table reconciled into /proc/sys; the originals are recorded in
   ``state-dir`` and put back by ``--cleanup``.

Stopping (SIGTERM/SIGINT or `Agent.request_stop`) never unpins anything: the maps keep
their entries and the pinned datapath links keep load balancing while the agent is down;
``statewright agent --cleanup`` calls every component's cleanup instead. A component that
fails after start-up does not bring the agent down: it shows in the health report
(Degraded with the reason). Only what the agent cannot run without (maps, API socket)
makes start-up fail, with an error naming the component.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import sys
import time
from typing import Any

import anyio
import anyio.abc

from bpf.pinning import PinDirLockedError, PinDirLockError, lock_pin_dir
from sources import native
from statedb import rowbuild
from statewright.agent.components.api import ApiComponent, ApiConfig
from statewright.agent.components.conntrack import CTComponent, CTConfig
from statewright.agent.components.debug import DebugComponent
from statewright.agent.components.endpoint_datapath import (
    EndpointDatapathComponent,
    EndpointDatapathConfig,
)
from statewright.agent.components.endpoints import EndpointsComponent, EndpointsConfig
from statewright.agent.components.explain import ExplainComponent
from statewright.agent.components.kubernetes import KubernetesComponent, KubernetesConfig
from statewright.agent.components.kvstore import KVStoreComponent, KVStoreComponentConfig
from statewright.agent.components.lb import (
    LBComponentConfig,
    LBMapsComponent,
    LoadBalancerComponent,
    maps_placement,
)
from statewright.agent.components.monitor import MonitorComponent, MonitorConfig
from statewright.agent.components.node import (
    DatapathComponent,
    DatapathComponentConfig,
    DemoComponent,
    DemoConfig,
    MetricsComponent,
    MetricsConfig,
)
from statewright.agent.components.nodeport import NodePortComponent, NodePortComponentConfig
from statewright.agent.components.nodes import NodesComponent, NodesConfig
from statewright.agent.components.policy import PolicyComponent
from statewright.agent.components.policy_maps import PolicyMapsComponent, PolicyMapsConfig
from statewright.agent.components.sources import (
    ManifestsComponent,
    ManifestsConfig,
    NetlinkComponent,
    NetlinkConfig,
)
from statewright.agent.components.statedb import StateDBComponent
from statewright.agent.components.sysctl import SysctlComponent, SysctlConfig
from statewright.agent.config import AgentConfig
from statewright.component import Component, ComponentError, Health, Hive
from tables.state_dir import StateDirError, lock_state_dir

log = logging.getLogger("statewright.agent")


class AgentError(ComponentError):
    """The agent cannot start; the message names the component and the reason."""


def agent_components(config: AgentConfig, agent: Agent | None = None) -> list[Component]:
    """The agent, component by component, in start order. Each component takes its own
    configuration, derived here from the agent's (``XConfig.from_agent_config``)."""
    info = agent.info if agent is not None else dict
    return [
        ApiComponent(ApiConfig.from_agent_config(config), info),
        StateDBComponent(),
        LoadBalancerComponent(LBComponentConfig.from_agent_config(config)),
        ManifestsComponent(ManifestsConfig.from_agent_config(config)),
        KubernetesComponent(KubernetesConfig.from_agent_config(config)),
        NetlinkComponent(NetlinkConfig.from_agent_config(config)),
        KVStoreComponent(KVStoreComponentConfig.from_agent_config(config)),
        NodesComponent(NodesConfig.from_agent_config(config)),
        LBMapsComponent(maps_placement(config)),
        EndpointsComponent(EndpointsConfig.from_agent_config(config)),
        PolicyComponent(),
        PolicyMapsComponent(PolicyMapsConfig.from_agent_config(config)),
        CTComponent(CTConfig.from_agent_config(config)),
        MonitorComponent(MonitorConfig.from_agent_config(config)),
        EndpointDatapathComponent(EndpointDatapathConfig.from_agent_config(config)),
        NodePortComponent(NodePortComponentConfig.from_agent_config(config)),
        DemoComponent(DemoConfig.from_agent_config(config)),
        DatapathComponent(DatapathComponentConfig.from_agent_config(config)),
        MetricsComponent(MetricsConfig.from_agent_config(config)),
        SysctlComponent(SysctlConfig.from_agent_config(config)),
        DebugComponent(),
        ExplainComponent(),
    ]


def lock_pins(config: AgentConfig) -> int | None:
    """Take the pin directory's lock (`lock_pin_dir`) and return its descriptor, or None
    when nothing is pinned there to protect: the memory backend keeps its maps in the
    process, and ``auto`` falls back to it when the directory cannot be created (no
    bpffs). AgentError naming the directory (and the holder) otherwise."""
    if config.backend == "memory":
        return None
    try:
        return lock_pin_dir(config.pin_dir)
    except PinDirLockedError as e:
        raise AgentError(str(e)) from None
    except PinDirLockError as e:
        if config.backend == "auto":
            log.debug("agent: %s; not locked (the maps fall back to memory)", e)
            return None
        raise AgentError(str(e)) from None


class Agent:
    """The running agent; ``await agent.run()`` until stopped."""

    def __init__(self, config: AgentConfig) -> None:
        self.config = config
        try:
            self.hive = Hive(agent_components(config, self))
        except ComponentError as e:
            raise AgentError(str(e)) from None
        self.started_at = 0.0
        self.ready = False
        self._stop_requested: anyio.Event | None = None

    # ----- lifecycle ----------------------------------------------------------------------
    def request_stop(self) -> None:
        """Ask the running agent to stop (from the event loop)."""
        if self._stop_requested is not None:
            self._stop_requested.set()

    async def run(
        self,
        *,
        handle_signals: bool = True,
        task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        """Start every component, run until SIGTERM/SIGINT (or `request_stop`), then stop
        them in reverse order. ``task_status.started()`` once the API answers."""
        self._stop_requested = anyio.Event()
        self.started_at = time.time()
        try:
            # One agent per state directory, checked before any component touches a map,
            # a socket or a state file: two would hand out the same pod addresses.
            lock_fd = lock_state_dir(self.config.state_dir)
        except StateDirError as e:
            raise AgentError(str(e)) from None
        try:
            # ... and one per pin directory: two would overwrite each other's maps.
            pin_fd = lock_pins(self.config)
        except BaseException:
            os.close(lock_fd)
            raise
        try:
            await self._run(self._stop_requested, handle_signals, task_status)
        finally:
            if pin_fd is not None:
                os.close(pin_fd)
            os.close(lock_fd)

    async def _run(
        self,
        stop_requested: anyio.Event,
        handle_signals: bool,
        task_status: anyio.abc.TaskStatus[None],
    ) -> None:
        """`run` once the state directory is locked."""
        async with anyio.create_task_group() as tg:
            if handle_signals:
                tg.start_soon(self._signals)
            try:
                try:
                    await self.hive.start(tg)
                except ComponentError as e:
                    raise AgentError(str(e)) from e
                self.ready = True
                log.info("agent: started; health %s", self.hive.overall())
                log.info("agent: Kubernetes converter %s", native.describe())
                log.info("agent: row builder %s", rowbuild.WHY)
                task_status.started()
                await stop_requested.wait()
                log.info("agent: stopping")
            finally:
                self.ready = False
                with anyio.CancelScope(shield=True):
                    await self.hive.stop()
                tg.cancel_scope.cancel()
        log.info("agent: stopped (pinned maps and datapath links left in place)")

    async def _signals(self) -> None:
        with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async for signum in signals:
                log.info("agent: received %s", signal.Signals(signum).name)
                self.request_stop()
                return

    # ----- views ------------------------------------------------------------------------------
    def health(self) -> list[Health]:
        """Every component's health lines."""
        return self.hive.health()

    def overall_state(self) -> str:
        """OK when no component is Degraded or Stopped, else Degraded."""
        return self.hive.overall()

    def info(self) -> dict[str, Any]:
        """What clients need to know about this agent (``statewright exec`` uses it)."""
        lb = self.hive.component("maps")
        dp = self.hive.component("datapath")
        demo = self.hive.component("demo")
        assert isinstance(lb, LBMapsComponent) and isinstance(dp, DatapathComponent)
        assert isinstance(demo, DemoComponent)
        balancer = lb.lb
        return {
            "pid": os.getpid(),
            "node": self.config.node_name,
            "node_labels": dict(self.config.node_labels),
            "started_at": self.started_at,
            "uptime_s": round(time.time() - self.started_at, 1),
            "components": [c.name for c in self.hive.components],
            "maps": {"kind": balancer.maps_kind if balancer else "none",
                     "reason": balancer.maps_reason if balancer else "not opened",
                     "pin_dir": self.config.pin_dir},
            "datapath": {"state": dp.state, "reason": dp.reason, "cgroup": dp.cgroup},
            "netns": self.config.demo_netns if demo.demo is not None else "",
            "config": self.config.to_json(),
        }

    def status_line(self) -> str:
        """A compact one-line status (``make run`` shows it live)."""
        lbc = self.hive.component("maps")
        dp = self.hive.component("datapath")
        assert isinstance(lbc, LBMapsComponent) and isinstance(dp, DatapathComponent)
        lb = lbc.lb
        state = self.overall_state()
        degraded = [h.name for h in self.health() if h.state in ("Degraded", "Stopped")]
        head = f"[{time.strftime('%H:%M:%S')}] {state}" + (
            f" ({', '.join(degraded)})" if degraded else "")
        if lb is None:
            return head + " | starting"
        txn = lb.db.read_txn()
        rev = lb.frontends.revision(txn)
        done = lb.reconciler.reconciled_revision if lb.reconciler is not None else -1
        return (
            head
            + f" | svc {lb.services.count(txn)} fe {lb.frontends.count(txn)}"
            f" be {lb.backends.count(txn)}"
            f" | maps {lb.maps_kind}"
            f" | datapath {'on' if dp.datapath is not None else 'off'}"
            f" | {'synced' if done >= rev else 'syncing'} rev {rev}"
        )


def cleanup(config: AgentConfig) -> tuple[list[str], list[str]]:
    """Remove what the agent left on the machine (``statewright agent --cleanup``): every
    component's cleanup, in reverse order; (removed, errors)."""
    return Hive(agent_components(config)).cleanup()


async def status_printer(agent: Agent, interval: float = 1.0) -> None:
    """Print `Agent.status_line` every ``interval`` seconds: rewritten in place on a
    terminal, one line every 10 intervals otherwise."""
    tty = sys.stdout.isatty()
    n = 0
    while True:
        await anyio.sleep(interval)
        if not agent.ready:
            continue
        with contextlib.suppress(Exception):
            line = agent.status_line()
            if tty:
                sys.stdout.write("\r\033[K" + line)
                sys.stdout.flush()
            elif n % 10 == 0:
                print(line, flush=True)
        n += 1


class JsonLogFormatter(logging.Formatter):
    """Structured logs: one JSON object per record (time, level, logger, message)."""

    def format(self, record: logging.LogRecord) -> str:
        """The record as JSON."""
        doc = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S"),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return json.dumps(doc)
