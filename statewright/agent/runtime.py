"""The agent runtime: every component started in dependency order, stopped in reverse.

Order (``Agent.run``):

1. statedb, the LB tables and their writer (tables/), with an ``agent`` initializer on
   the frontends table so the reconciler prunes nothing before the sources are in;
2. the LB maps (bpfops/lb_maps), pinned under ``pin-dir``: kernel maps when the machine
   allows (or when asked), the in-memory twin otherwise. Pinned kernel maps of an
   earlier run are adopted as they are (same map ids, same entries);
3. the FrontendOps reconciler (bpfops/adapter): it restores service and backend ids from
   the maps, so a restarted agent gives every frontend the id it had;
4. the sources: manifests (sources/manifests.py; first poll done before it counts as
   started) and netlink (sources/netlink.py; node addresses and devices). Once both
   are initialized (netlink given at most ``NETLINK_INIT_TIMEOUT``) the ``agent``
   initializer is marked done, and only then may the reconciler prune stale map
   entries (objects deleted while the agent was down);
5. the demo network namespace with the example backends (only when ``demo-netns`` is
   configured; statewright/agent/demo_netns.py);
6. the socket load-balancing datapath (bpf/datapath.py) attached to the agent's cgroup
   (created by the agent under the cgroup2 mount unless configured), only on kernel maps;
7. the metrics server (opt-in) and the HTTP API (statewright/agent/api.py). Its socket is
   bound first of all (so a second agent on the same socket fails before touching the
   maps, the cgroup or the demo namespace) and served last.

Stopping (SIGTERM/SIGINT or ``request_stop``) runs the stop steps in reverse. Stopping
never unpins anything: the maps keep their entries and the pinned datapath links keep
load balancing while the agent is down; ``statewright agent --cleanup`` removes them.

A component that fails after start-up does not bring the agent down: its failure
is logged and shown in the health report (Degraded with the reason). Only what the
agent cannot run without (maps, API socket) makes start-up fail, with an error
naming the component.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.abc

from sources.state_file import STATE_FILE_FLAGS, StateFileSource
from statewright.agent.config import DEFAULT_CGROUP_NAME, AgentConfig

log = logging.getLogger("statewright.agent")

#: How long start-up waits for the netlink source's first dump before going on (Degraded).
NETLINK_INIT_TIMEOUT = 10.0
#: Initializer the agent holds on the frontends table until every source is initialized.
AGENT_INITIALIZER = "agent"
#: LB flags the agent acts on itself although tables.lb_config only stores them:
#: the LB state file runs as a source; metrics are sampled whenever they are read.
AGENT_LB_FLAGS = (*STATE_FILE_FLAGS, "metrics-sampling-interval")
#: How long the agent waits for the initial reconciliation before freezing the heap.
INITIAL_FREEZE_TIMEOUT = 60.0

OK = "OK"
DEGRADED = "Degraded"
DISABLED = "Disabled"
STOPPED = "Stopped"


class AgentError(RuntimeError):
    """The agent cannot start; the message names the component and the reason."""


@dataclass(frozen=True, slots=True)
class ComponentHealth:
    """One line of the health report: component, state (OK/Degraded/Disabled/Stopped), why."""

    name: str
    state: str
    message: str

    def to_json(self) -> dict[str, str]:
        """Plain data for the API."""
        return {"name": self.name, "state": self.state, "message": self.message}


StopFn = Callable[[], Awaitable[None]]


class Agent:
    """The running agent; see the module docstring. ``await agent.run()`` until stopped."""

    def __init__(self, config: AgentConfig) -> None:
        from statedb import DB
        from tables.lb_config import LBConfig
        from tables.lb_writer import LBWriter

        self.config = config
        try:
            self.lb_config = LBConfig.from_flags(list(config.lb_flags), LBConfig())
        except ValueError as e:
            raise AgentError(f"lb-flags: {e}") from None
        unimplemented = LBConfig.unsupported_flags(config.lb_flags, also_supported=AGENT_LB_FLAGS)
        if unimplemented:
            raise AgentError(f"lb-flags: not implemented by this agent: {' '.join(unimplemented)}")
        self.db = DB()
        self.writer = LBWriter.create(self.db, self.lb_config)
        self.maps: Any = None
        self.maps_kind = "none"
        self.maps_reason = ""
        self.ops: Any = None
        self.reconciler: Any = None
        self.manifests: Any = None
        self.netlink: Any = None
        self.state_file: StateFileSource | None = None  # with --lb-state-file
        self.demo: Any = None
        self.datapath: Any = None
        self.cgroup = ""
        self.datapath_state = DISABLED
        self.datapath_reason = "not started"
        self.api: Any = None
        self.metrics_server: Any = None
        self.failures: dict[str, str] = {}
        self.started_at = 0.0
        self.ready = False
        self._stops: list[tuple[str, StopFn]] = []
        self._stop_requested: anyio.Event | None = None
        self._init_done: Callable[[Any], None] | None = None

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
        async with anyio.create_task_group() as tg:
            if handle_signals:
                tg.start_soon(self._signals)
            try:
                await self._start_all(tg)
                self.ready = True
                log.info("agent: started; health %s", self.overall_state())
                task_status.started()
                await self._stop_requested.wait()
                log.info("agent: stopping")
            finally:
                self.ready = False
                with anyio.CancelScope(shield=True):
                    await self._stop_all()
                tg.cancel_scope.cancel()
        log.info("agent: stopped (pinned maps and datapath links left in place)")

    async def _signals(self) -> None:
        with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async for signum in signals:
                log.info("agent: received %s", signal.Signals(signum).name)
                self.request_stop()
                return

    async def _stop_all(self) -> None:
        while self._stops:
            name, stop = self._stops.pop()
            try:
                await stop()
                log.info("agent: stopped %s", name)
            except Exception as e:  # keep stopping the rest
                log.error("agent: stopping %s failed: %s", name, e)

    def _on_stop(self, name: str, stop: StopFn) -> None:
        self._stops.append((name, stop))

    async def _spawn(
        self,
        tg: anyio.abc.TaskGroup,
        name: str,
        func: Callable[..., Awaitable[None]],
        wait_started: bool = True,
    ) -> None:
        """Run ``func(task_status=...)`` as a task of its own; a failure is recorded as the
        component's health instead of ending the agent. Its stop step cancels it."""
        scope = anyio.CancelScope()
        done = anyio.Event()

        async def runner(*, task_status: anyio.abc.TaskStatus[None]) -> None:
            started = [False]

            class _Status:
                def started(self, value: Any = None) -> None:
                    if not started[0]:
                        started[0] = True
                        task_status.started()

            status = _Status()
            if not wait_started:
                status.started()
            try:
                with scope:
                    await func(task_status=status)
            except Exception as e:
                msg = f"{type(e).__name__}: {e}"
                log.error("agent: component %s failed: %s", name, msg)
                self.failures[name] = msg
            finally:
                done.set()
                if not started[0]:
                    started[0] = True
                    task_status.started()

        await tg.start(runner)

        async def stop() -> None:
            scope.cancel()
            await done.wait()

        self._on_stop(name, stop)

    async def _start_all(self, tg: anyio.abc.TaskGroup) -> None:
        await self._bind_api()  # first: a second agent must fail before touching anything
        self._start_tables()
        self._start_maps()
        await self._start_reconciler(tg)
        await self._start_sources(tg)
        await self._start_demo(tg)
        self._start_datapath()
        self._start_metrics()
        await self._start_api(tg)

    # ----- 1. tables ------------------------------------------------------------------------
    def _start_tables(self) -> None:
        with self.db.write_txn(self.writer.frontends) as txn:
            self._init_done = self.writer.frontends.register_initializer(txn, AGENT_INITIALIZER)
        log.info("agent: statedb with tables %s", ", ".join(t.name for t in self.db.tables))

    # ----- 2. maps --------------------------------------------------------------------------
    def _start_maps(self) -> None:
        from bpf.factory import BackendConfig, MapFactory
        from bpfops.lb_maps import LBMaps, LBMapsConfig

        cfg = self.config
        factory = MapFactory(BackendConfig(backend=cfg.backend, pin_dir=cfg.pin_dir, pin=True))  # type: ignore[arg-type]
        self.maps_kind, self.maps_reason = factory.kind, factory.reason
        maps_cfg = LBMapsConfig(
            backend="kernel" if factory.kind == "kernel" else "memory",
            pin_dir=cfg.pin_dir,
            pin=True,
            max_entries=self.lb_config.lb_map_max,
            maglev_table_size=self.lb_config.maglev_table_size,
        )
        try:
            self.maps = LBMaps.open(maps_cfg, factory=factory)
        except Exception as e:
            raise AgentError(
                f"LB maps ({factory.kind}, pinned under {cfg.pin_dir}): {e}"
            ) from e
        log.info(
            "agent: LB maps: %s (%s), pinned under %s; %d entries adopted",
            factory.kind,
            factory.reason,
            cfg.pin_dir,
            sum(self.maps.counts().values()),
        )

        async def stop() -> None:
            self.maps.close()  # pinned: entries stay for the datapath and the next run

        self._on_stop("maps", stop)

    # ----- 3. reconciler --------------------------------------------------------------------
    async def _start_reconciler(self, tg: anyio.abc.TaskGroup) -> None:
        from bpfops.adapter import frontend_ops_for, reconciler_config
        from reconciler import Reconciler

        cfg = self.lb_config
        try:
            self.ops = frontend_ops_for(self.writer, self.maps, cfg)
        except Exception as e:
            raise AgentError(f"FrontendOps: restoring ids from the maps: {e}") from e
        self.reconciler = Reconciler(
            self.db,
            reconciler_config(
                self.writer,
                self.ops,
                cfg,
                name="bpf-lb",
                retry_min_backoff=max(cfg.retry_backoff_min, 0.001),
                retry_max_backoff=max(cfg.retry_backoff_max, cfg.retry_backoff_min, 0.001),
            ),
        )
        await self._spawn(tg, "reconciler", self.reconciler.run)

    # ----- 4. sources -----------------------------------------------------------------------
    async def _start_sources(self, tg: anyio.abc.TaskGroup) -> None:
        from sources.manifests import ManifestSource

        cfg = self.config
        self.manifests = ManifestSource(
            self.writer, cfg.manifests, interval=cfg.manifests_interval
        )
        with self.writer.write_txn() as txn:
            self.manifests.register_initializer(txn)
        if cfg.netlink:
            try:
                from sources.netlink import NetlinkSource

                self.netlink = NetlinkSource.create(
                    self.db, self.writer, cfg.node_addresses
                )
            except Exception as e:
                self.failures["netlink"] = f"cannot create the netlink source: {e}"
                log.error("agent: %s", self.failures["netlink"])
        await self._spawn(tg, "manifests", self.manifests.run)
        self.state_file = StateFileSource.from_config(self.writer, self.lb_config)
        if self.state_file is not None:
            await self._spawn(tg, "state-file", self.state_file.run)
            log.info("agent: LB state file source on %s", self.lb_config.state_file)
        log.info(
            "agent: manifest source on %s: %d file(s), %d error(s)",
            ", ".join(cfg.manifests),
            len(self.manifests._files),
            len(self.manifests.errors),
        )
        if self.netlink is not None:
            await self._spawn(tg, "netlink", self.netlink.run, wait_started=False)
            with anyio.move_on_after(NETLINK_INIT_TIMEOUT):
                while not self.netlink.initialized and "netlink" not in self.failures:
                    await anyio.sleep(0.02)
            if not self.netlink.initialized:
                log.warning("agent: netlink not initialized yet; going on (health Degraded)")
        with self.writer.write_txn() as txn:
            assert self._init_done is not None
            self._init_done(txn)
        log.info("agent: sources initialized; stale map entries may now be pruned")
        tg.start_soon(self._freeze_initial_state)

    async def _freeze_initial_state(self) -> None:
        """Once the initial state is in the maps, move it out of the garbage collector's
        reach (statedb.gc_tuning.freeze_loaded): later collections skip the loaded rows."""
        from statedb.gc_tuning import freeze_loaded

        if self.reconciler is None:
            return
        revision = self.writer.frontends.revision(self.db.read_txn())
        try:
            await self.reconciler.wait_until_reconciled(revision, INITIAL_FREEZE_TIMEOUT)
        except Exception as e:  # not reconciled in time: freeze anyway, it is only tuning
            log.info("agent: initial reconciliation not done (%s); freezing the heap now", e)
        start = time.perf_counter()
        frozen = freeze_loaded()
        log.info(
            "agent: %d objects moved out of the garbage collector's reach in %.0f ms",
            frozen, (time.perf_counter() - start) * 1000,
        )

    # ----- 5. demo namespace ----------------------------------------------------------------
    async def _start_demo(self, tg: anyio.abc.TaskGroup) -> None:
        if not self.config.demo_netns:
            return
        from statewright.agent.demo_netns import DemoNetns

        demo = DemoNetns(self.config.demo_netns)
        try:
            demo.start()
            demo.sync(self._backend_addresses())
        except Exception as e:
            self.failures["demo"] = f"demo namespace {self.config.demo_netns}: {e}"
            log.error("agent: %s", self.failures["demo"])
            demo.stop()
            return
        self.demo = demo

        async def stop() -> None:
            demo.stop()

        self._on_stop("demo", stop)
        await self._spawn(tg, "demo-backends", self._demo_loop)

    async def _demo_loop(self, *, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
        """Start demo backends for every backend that appears in the tables."""
        task_status.started()
        while True:
            _, watch = self.writer.backends.all_watch(self.db.read_txn())
            self.refresh_demo()
            await watch.wait_async()

    def _backend_addresses(self) -> list[tuple[str, int, str]]:
        """(ip, port, protocol) of every backend in the tables."""
        out = set()
        for be in self.writer.backends.all(self.db.read_txn()):
            addr = be.address
            out.add((str(addr.address), int(addr.port), str(addr.protocol)))
        return sorted(out)

    def refresh_demo(self) -> None:
        """Start demo backends for backends that appeared since (failures are logged)."""
        if self.demo is not None:
            try:
                self.demo.sync(self._backend_addresses())
            except Exception as e:
                log.warning("agent: demo backends: %s", e)

    # ----- 6. datapath ----------------------------------------------------------------------
    def _start_datapath(self) -> None:
        cfg = self.config
        if not cfg.datapath:
            self.datapath_reason = "disabled by configuration"
            return
        if self.maps_kind != "kernel":
            self.datapath_reason = f"needs kernel maps; using {self.maps_kind} ({self.maps_reason})"
            log.warning("agent: datapath not attached: %s", self.datapath_reason)
            return
        from bpf.datapath import DatapathConfig, SockLB, cgroup2_mount

        try:
            self.cgroup = cfg.cgroup or os.path.join(cgroup2_mount(), DEFAULT_CGROUP_NAME)
            if not cfg.cgroup:
                os.makedirs(self.cgroup, exist_ok=True)
            dp = SockLB(
                DatapathConfig(
                    cgroup=self.cgroup,
                    pin_dir=cfg.pin_dir,
                    allow_root_cgroup=cfg.allow_root_cgroup,
                    maglev_table_size=self.lb_config.maglev_table_size,
                )
            )
            attached = dp.attach()
        except Exception as e:
            self.datapath_state = DEGRADED
            self.datapath_reason = f"attach to cgroup {self.cgroup or cfg.cgroup}: {e}"
            log.error("agent: datapath: %s", self.datapath_reason)
            return
        self.datapath = dp
        adopted = sum(1 for a in attached if a.adopted)
        self.datapath_state = OK
        self.datapath_reason = (
            f"{len(attached)} programs on cgroup {self.cgroup} ({adopted} adopted links)"
        )
        log.info("agent: datapath: %s", self.datapath_reason)

        async def stop() -> None:
            dp.close()  # the pinned links keep load balancing

        self._on_stop("datapath", stop)

    # ----- 7. metrics and API ----------------------------------------------------------------
    def _start_metrics(self) -> None:
        cfg = self.config
        if not cfg.metrics_port:
            return
        from prometheus_client import CollectorRegistry, start_http_server

        from reconciler.metrics import PrometheusCollector

        registry = CollectorRegistry()
        registry.register(PrometheusCollector([self.reconciler.metrics]))
        try:
            server, thread = start_http_server(
                cfg.metrics_port, addr=cfg.metrics_address, registry=registry
            )
        except OSError as e:
            self.failures["metrics"] = (
                f"metrics server on {cfg.metrics_address}:{cfg.metrics_port}: {e}"
            )
            log.error("agent: %s", self.failures["metrics"])
            return
        self.metrics_server = server
        log.info("agent: metrics on http://%s:%d/metrics", cfg.metrics_address, cfg.metrics_port)

        async def stop() -> None:
            server.shutdown()
            server.server_close()
            await anyio.to_thread.run_sync(thread.join, 5)

        self._on_stop("metrics", stop)

    async def _bind_api(self) -> None:
        from statewright.agent.api import ApiServer

        self.api = ApiServer(self)
        try:
            await self.api.bind()
        except OSError as e:
            raise AgentError(f"API socket {self.config.api_socket}: {e}") from e

        async def unlink() -> None:
            await self.api.aclose()

        self._on_stop("api-socket", unlink)  # runs after everything else stopped

    async def _start_api(self, tg: anyio.abc.TaskGroup) -> None:
        await self._spawn(tg, "api", self.api.serve)
        log.info("agent: API on unix socket %s", self.config.api_socket)

    # ----- health ---------------------------------------------------------------------------
    def health(self) -> list[ComponentHealth]:
        """The health of every component (see the module docstring for what counts)."""
        out: list[ComponentHealth] = []
        txn = self.db.read_txn()
        pending = {
            t.name: t.pending_initializers(txn)
            for t in self.db.tables
            if t.pending_initializers(txn)
        }
        out.append(
            ComponentHealth(
                "statedb",
                DEGRADED if pending else OK,
                "tables waiting for " + json.dumps(pending)
                if pending
                else f"{len(self.db.tables)} tables initialized",
            )
        )
        out.append(
            ComponentHealth(
                "maps",
                OK if self.maps is not None else STOPPED,
                f"{self.maps_kind} maps under {self.config.pin_dir} ({self.maps_reason})",
            )
        )
        if self.reconciler is not None:
            h = self.reconciler.health
            state = {"OK": OK, "Degraded": DEGRADED}.get(str(h.level), STOPPED)
            out.append(ComponentHealth("reconciler", state, h.message))
        if self.manifests is not None:
            errs = self.manifests.errors
            out.append(
                ComponentHealth(
                    "manifests",
                    DEGRADED if errs else OK,
                    "; ".join(errs.values())
                    if errs
                    else f"{len(self.manifests._files)} file(s) from "
                    + ", ".join(self.config.manifests),
                )
            )
        if self.state_file is not None:
            err = self.state_file.error
            out.append(
                ComponentHealth(
                    "state-file",
                    DEGRADED if err else OK,
                    err or f"LB state from {self.state_file.path}",
                )
            )
        if self.netlink is not None:
            ok, why = self.netlink.health()
            out.append(ComponentHealth("netlink", OK if ok else DEGRADED, why))
        elif not self.config.netlink:
            out.append(ComponentHealth("netlink", DISABLED, "disabled by configuration"))
        if self.config.demo_netns:
            out.append(
                ComponentHealth(
                    "demo",
                    OK if self.demo is not None else DEGRADED,
                    self.demo.describe() if self.demo is not None else "not running",
                )
            )
        out.append(ComponentHealth("datapath", self.datapath_state, self.datapath_reason))
        if self.config.metrics_port:
            out.append(
                ComponentHealth(
                    "metrics",
                    OK if self.metrics_server is not None else DEGRADED,
                    f"http://{self.config.metrics_address}:{self.config.metrics_port}/metrics",
                )
            )
        # A failed component overrides whatever it reported.
        out = [
            ComponentHealth(c.name, DEGRADED, self.failures[c.name])
            if c.name in self.failures
            else c
            for c in out
        ]
        known = {c.name for c in out}
        out += [ComponentHealth(n, DEGRADED, m) for n, m in self.failures.items() if n not in known]
        return out

    def overall_state(self) -> str:
        """OK when no component is Degraded or Stopped, else Degraded."""
        return DEGRADED if any(c.state in (DEGRADED, STOPPED) for c in self.health()) else OK

    def info(self) -> dict[str, Any]:
        """What clients need to know about this agent (``statewright exec`` uses it)."""
        return {
            "pid": os.getpid(),
            "node": self.config.node_name,
            "started_at": self.started_at,
            "uptime_s": round(time.time() - self.started_at, 1),
            "maps": {"kind": self.maps_kind, "reason": self.maps_reason,
                     "pin_dir": self.config.pin_dir},
            "datapath": {"state": self.datapath_state, "reason": self.datapath_reason,
                         "cgroup": self.cgroup},
            "netns": self.config.demo_netns if self.demo is not None else "",
            "config": self.config.to_json(),
        }

    def status_line(self) -> str:
        """A compact one-line status (``make run`` shows it live)."""
        txn = self.db.read_txn()
        w = self.writer
        rec = self.reconciler
        rev = w.frontends.revision(txn)
        done = rec.reconciled_revision if rec is not None else -1
        state = self.overall_state()
        degraded = [c.name for c in self.health() if c.state in (DEGRADED, STOPPED)]
        return (
            f"[{time.strftime('%H:%M:%S')}] {state}"
            + (f" ({', '.join(degraded)})" if degraded else "")
            + f" | svc {w.services.count(txn)} fe {w.frontends.count(txn)}"
            f" be {w.backends.count(txn)}"
            f" | maps {self.maps_kind}"
            f" | datapath {'on' if self.datapath is not None else 'off'}"
            f" | {'synced' if done >= rev else 'syncing'} rev {rev}"
        )


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
