"""The corpus' system under test: the product `LoadBalancer` fed from a fake Kubernetes API server.

`LBSystem` is what the conformance runner starts and stops (``hive start``,
``hive/recreate``):

* a `statewright.loadbalancer.LoadBalancer` built from the ``#!`` flags on top of the
  Cilium test harness' own defaults (`HARNESS_DEFAULTS`: node name ``testnode``, a 10%
  fault probability on map writes, short retry backoffs), set here explicitly because
  they are the harness' settings, not the product's;
* a `FakeKubernetes`: the wire-level fake API server of tests/k8s (HTTPS on loopback)
  holding the Services, EndpointSlices and Pods (and Nodes) of the script, read by the
  product's `sources.k8s_source.K8sSource` — its reflectors list and watch the server,
  its applier writes what they deliver through the load balancer's converter — exactly
  as the agent reads a cluster. The source's ``k8s`` initializer is registered before
  the reconciler starts and completed with its initial lists (so pruning waits for
  them); ``start`` returns once they are applied, and `LBSystem.wait_caught_up` waits
  until the source has processed every change written to the server;
* the LB maps pinned under a directory the caller owns, behind the fault-injecting
  wrapper when the fault probability is above zero.

`recreate` builds a new system that keeps the API server and the pinned maps but
starts statedb from scratch, which is how an agent restart looks (ids must be restored
from the maps).
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import tempfile
import weakref
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.abc

from sources.k8s_client import ClientSettings, K8sClient
from sources.k8s_reflector import ReflectorConfig
from sources.k8s_source import K8sSource, SourceConfig
from sources.state_file import STATE_FILE_FLAGS
from statewright.loadbalancer import LoadBalancer, MapsPlacement
from tables.lb_config import LBConfig
from tests.conformance.health_table import health_rows, new_health_table
from tests.k8s.fake_apiserver import FakeAPIServer

#: Resource names as the Kubernetes client (and ``k8s/resync``) spells them.
SERVICES = "v1.services"
ENDPOINTSLICES = "discovery.k8s.io.v1.endpointslices"
PODS = "v1.pods"
NODES = "v1.nodes"

#: Map operations the fault injection (--lb-test-fault-probability) may fail: the writes.
#: Reads (dumps, restore of ids at start) are never faulted, as in Cilium's test maps.
FAULTY_OPS = frozenset({"update", "delete", "update_batch", "delete_batch", "set_inner"})


#: What Cilium's LB script-test harness presets before the ``#!`` flags.
HARNESS_DEFAULTS: tuple[str, ...] = (
    "--node-name=testnode",
    "--lb-retry-backoff-min=10ms",
    "--lb-retry-backoff-max=10ms",
    "--bpf-lb-maglev-table-size=1021",
    "--lb-test-fault-probability=0.1",
    "--kube-proxy-replacement=true",
)


def harness_config(flags: Iterable[str] = ()) -> LBConfig:
    """The LB configuration of a corpus file: `HARNESS_DEFAULTS`, then ``flags``."""
    return LBConfig.from_flags([*HARNESS_DEFAULTS, *flags])


#: The reflectors' timing against the loopback fake server: quick backoffs, so a relist
#: (``k8s/resync``) or a lost connection costs the corpus little time. The server sends a
#: bookmark every 0.2 s; a watch is judged stalled after 5 s without one (a loaded machine
#: may delay the server's thread; a false stall would only cost a reconnect).
REFLECTOR = ReflectorConfig(
    watch_timeout=30.0,
    stall_timeout=5.0,
    connect_timeout=2.0,
    list_timeout=5.0,
    backoff_initial=0.02,
    backoff_max=0.2,
)
#: The source's batching: a change is written 1 ms after it arrived at the latest.
SOURCE = SourceConfig(batch_delay=0.001, reflector=REFLECTOR)
#: The client's rate limit: high, a corpus file relists and rewatches often.
CLIENT_QPS = 1000.0
#: How often the fake server's thread checks for a stop: every corpus file stops one.
SERVER_POLL = 0.005
#: How long `LBSystem.start` and `LBSystem.wait_caught_up` wait for the source before
#: they fail (a bound against a hang, not a timed assertion: on the loopback server the
#: source follows within milliseconds).
SOURCE_TIMEOUT = 20.0


class LBSystemError(RuntimeError):
    """The system cannot do what was asked (not started, already running, bad flags...)."""


def resource_of(obj: Mapping[str, Any]) -> str:
    """The resource name of a Kubernetes object (``v1.services``, ...) from apiVersion/kind."""
    api = str(obj.get("apiVersion", ""))
    kind = str(obj.get("kind", ""))
    if not api or not kind:
        raise ValueError("object has no apiVersion or kind")
    plural = kind.lower() + ("es" if kind.lower().endswith("s") else "s")
    return f"{api.replace('/', '.')}.{plural}"


def key_of(obj: Mapping[str, Any]) -> str:
    """``namespace/name`` of a Kubernetes object."""
    meta = obj.get("metadata") or {}
    if not isinstance(meta, Mapping) or not meta.get("name"):
        raise ValueError("object has no metadata.name")
    ns = meta.get("namespace") or ""
    return f"{ns}/{meta['name']}"


#: Corpus resource name (as ``k8s/resync`` spells it) -> (kind, K8sSource resource name).
RESOURCES: dict[str, tuple[str, str]] = {
    SERVICES: ("Service", "services"),
    ENDPOINTSLICES: ("EndpointSlice", "endpointslices"),
    PODS: ("Pod", "pods"),
    NODES: ("Node", "nodes"),
}


def source_resource(obj: Mapping[str, Any]) -> str:
    """The `K8sSource` resource name ("services", ...) an object is delivered under."""
    resource = resource_of(obj)
    if resource not in RESOURCES:
        raise ValueError(f"unsupported resource {resource} (kind {obj.get('kind')})")
    return RESOURCES[resource][1]


class FakeKubernetes:
    """The corpus' Kubernetes: a wire-level `FakeAPIServer` (HTTPS on loopback) and a
    kubeconfig for it, plus the revision of the last change written per resource.

    The running system reads it through the product's `K8sSource` (reflectors, applier,
    converter), so the corpus exercises the real path. The server outlives a system, so
    a recreated system lists the same objects. It starts on construction and stops with
    `close` (or when the object is garbage collected).

    As client-go's fake clientset (which Cilium's harness uses), the server ignores the
    Pods' ``spec.nodeName`` field selector: corpus files add Pods of other nodes and
    expect their host ports.
    """

    def __init__(self) -> None:
        self._dir = tempfile.mkdtemp(prefix="statewright-k8s-")
        self.server = FakeAPIServer(
            ignored_field_labels=("spec.nodeName",), poll_interval=SERVER_POLL
        ).start()
        self.kubeconfig = self.server.write_kubeconfig(os.path.join(self._dir, "kubeconfig"))
        #: Source resource name ("services", or "nodes/NAME" for Nodes) -> revision of the
        #: last change written to it (what a caught-up source has applied).
        self.written: dict[str, int] = {}
        self._finalizer = weakref.finalize(self, _close_server, self.server, self._dir)

    @property
    def version(self) -> int:
        """The server's current revision (changes with every write)."""
        return self.server.resource_version

    def close(self) -> None:
        """Stop the server and remove the kubeconfig."""
        self._finalizer()

    def __enter__(self) -> FakeKubernetes:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _note(self, obj: Mapping[str, Any], rv: int) -> None:
        resource = source_resource(obj)
        if resource == "nodes":
            resource = f"nodes/{key_of(obj).lstrip('/')}"
        self.written[resource] = max(rv, self.written.get(resource, 0))

    def upsert(self, obj: Mapping[str, Any]) -> int:
        """Create or update an object (``k8s/add`` and ``k8s/update``); its revision."""
        source_resource(obj)
        key_of(obj)
        stored = self.server.upsert(obj)
        rv = int(stored["metadata"]["resourceVersion"])
        self._note(obj, rv)
        return rv

    def delete(self, obj: Mapping[str, Any]) -> int:
        """Delete an object: the revision of the deletion, 0 when it did not exist."""
        source_resource(obj)
        ns, _, name = key_of(obj).partition("/")
        rv = self.server.delete(str(obj["kind"]), ns or "default", name)
        if rv:
            self._note(obj, rv)
        return rv

    def replace(self, resource: str, objs: Iterable[dict[str, Any]]) -> int:
        """Atomically replace every object of ``resource`` (``v1.services``...) and end its
        watches with 410 Gone, so the reflector sees the new set only by relisting; the
        revision after the replacement."""
        if resource not in RESOURCES:
            raise ValueError(f"unsupported resource {resource}")
        kind, name = RESOURCES[resource]
        objs = list(objs)
        for obj in objs:
            if resource_of(obj) != resource:
                raise ValueError(f"{key_of(obj)} is not a {resource} object")
        rv = self.server.replace(kind, objs)
        if name != "nodes":
            self.written[name] = rv
        return rv


def _close_server(server: FakeAPIServer, tmpdir: str) -> None:
    server.stop()
    shutil.rmtree(tmpdir, ignore_errors=True)


@dataclass
class MapsLocation:
    """Where an LB system's maps live: backend kind and a pin directory owned by the caller."""

    backend: str = "memory"  # "memory" or "kernel"
    pin_dir: str = ""

    def cleanup(self) -> None:
        """Remove every pin under ``pin_dir`` (memory registry or bpffs) and the directory."""
        if not self.pin_dir:
            return
        from bpf.memory_map import MemoryMap

        prefix = self.pin_dir.rstrip("/") + "/"
        for path in MemoryMap.pinned_paths():
            if path.startswith(prefix):
                with contextlib.suppress(FileNotFoundError):
                    MemoryMap.remove_pin(path)
        if self.backend == "kernel" and os.path.isdir(self.pin_dir):
            shutil.rmtree(self.pin_dir, ignore_errors=True)


@dataclass
class SystemOptions:
    """How to build an `LBSystem` besides the flags."""

    maps: MapsLocation = field(default_factory=MapsLocation)
    #: Apply `HARNESS_DEFAULTS` before the flags.
    harness_defaults: bool = False
    #: Seed of the fault-injecting map wrapper (when --lb-test-fault-probability > 0).
    fault_seed: int = 1
    #: Address the health-check server's listeners bind (a loopback address in tests).
    health_address: str = ""


#: Flags the harness acts on besides the load balancer's own: metrics are read when asked
#: (every read is a fresh sample, so any sampling interval is honoured); the fault
#: probability is the harness' map wrapper.
HARNESS_FLAGS = ("metrics-sampling-interval", "lb-test-fault-probability", *STATE_FILE_FLAGS)


class LBSystem:
    """One load balancer fed from a `FakeKubernetes` through a `K8sSource`; see the module
    docstring. Without ``k8s`` the system starts its own server (stopped when the
    `FakeKubernetes` is garbage collected)."""

    def __init__(
        self,
        flags: Iterable[str] = (),
        options: SystemOptions | None = None,
        k8s: FakeKubernetes | None = None,
    ) -> None:
        self.flags = list(flags)
        self.options = options or SystemOptions()
        self.k8s = k8s if k8s is not None else FakeKubernetes()
        base = [*HARNESS_DEFAULTS] if self.options.harness_defaults else []
        self.config = LBConfig.from_flags([*base, *self.flags])
        loc = self.options.maps
        self.lb = LoadBalancer(
            self.config, MapsPlacement(backend=loc.backend, pin_dir=loc.pin_dir),
            name="lb-frontends",
            health_bind_address=self.options.health_address,
        )
        self.db = self.lb.db
        self.writer = self.lb.writer
        self.services, self.frontends, self.backends, self.node_addresses = self.writer.tables
        self.converter = self.lb.converter
        self.health = new_health_table()
        self.db.register(self.health)
        self._cancel: anyio.CancelScope | None = None
        self._stopped: anyio.Event | None = None
        self.client: K8sClient | None = None
        self.source: K8sSource | None = None
        self.running = False
        self.started_once = False

    @property
    def ops(self) -> Any:
        """The load balancer's FrontendOps (after start)."""
        return self.lb.ops

    @property
    def plain_maps(self) -> Any:
        """The open maps without fault injection (None while stopped)."""
        return self.lb.plain_maps

    @property
    def state_file(self) -> Any:
        """The LB state file source (with --lb-state-file)."""
        return self.lb.state_file

    @property
    def source_errors(self) -> list[str]:
        """Objects that cannot be applied, with the reason: the Kubernetes source's current
        errors (``Kind namespace/name: message``), then the state file's current error."""
        errors = []
        if self.source is not None:
            errors = [f"{key}: {msg}" for key, msg in self.source.errors.items()]
        if self.lb.state_file is not None and self.lb.state_file.error:
            errors.append(self.lb.state_file.error)
        return errors

    @staticmethod
    def unsupported_flags(flags: Iterable[str]) -> list[str]:
        """The flags among ``flags`` that Statewright does not implement (or does not know)."""
        return LBConfig.unsupported_flags(flags, also_supported=HARNESS_FLAGS)

    # ----- lifecycle ------------------------------------------------------------------
    async def start(self, tg: anyio.abc.TaskGroup) -> None:
        """Open the maps, start the load balancer and the Kubernetes source in ``tg``, and
        wait until the source has applied its initial lists (`SOURCE_TIMEOUT` at most)."""
        if self.running:
            raise LBSystemError("the load balancer is already running")
        if self.started_once:
            raise LBSystemError("a stopped load balancer cannot be restarted; recreate it")
        self.started_once = True
        self._stopped = anyio.Event()
        self.client = K8sClient(
            ClientSettings(kubeconfig=self.k8s.kubeconfig, qps=CLIENT_QPS, burst=int(CLIENT_QPS))
        )
        self.source = K8sSource(
            self.writer,
            self.client,
            node_name=self.config.node_name,
            converter=self.converter,
            config=SOURCE,
        )
        # Before the reconciler starts: pruning waits for the source's initial lists.
        with self.writer.write_txn() as txn:
            self.source.register_initializer(txn)
        self.lb.open_maps(wrap=self._fault_wrapper())
        try:
            self.lb.build_reconciler()
            await tg.start(self._run)
        except BaseException:
            self.lb.close_maps()
            self.client.close()
            raise
        self.running = True
        source = self.source
        try:
            with anyio.fail_after(SOURCE_TIMEOUT):
                await source.wait_synced()
        except TimeoutError:
            health = "; ".join(f"{name}: {msg}" for name, _, msg in source.health())
            raise LBSystemError(f"the Kubernetes source did not sync: {health}") from None

    def _fault_wrapper(self) -> Callable[[Any], Any] | None:
        probability = self.config.test_fault_probability
        if probability <= 0:
            return None
        from bpf.testing import FaultyMap

        seed = self.options.fault_seed

        def wrap(backend: Any) -> Any:
            return FaultyMap(backend, probability, errno=errno.EIO, seed=seed, ops=FAULTY_OPS)

        return wrap

    async def _run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        with anyio.CancelScope() as scope:
            self._cancel = scope
            try:
                async with anyio.create_task_group() as tg:
                    await tg.start(self.lb.run)
                    assert self.source is not None
                    await tg.start(self.source.run)
                    tg.start_soon(self._report_health)
                    task_status.started()
            finally:
                assert self._stopped is not None
                self._stopped.set()

    #: How often the health table is brought up to date.
    HEALTH_INTERVAL = 0.05

    async def _report_health(self) -> None:
        """Keep the ``health`` table equal to `health_rows` while the system runs."""
        while True:
            self._write_health()
            await anyio.sleep(self.HEALTH_INTERVAL)

    def _write_health(self) -> None:
        rows = {r.key: r for r in health_rows(self)}
        txn = self.db.read_txn()
        current = {r.key: r for r in self.health.all(txn)}
        if current == rows:
            return
        with self.db.write_txn(self.health) as wtxn:
            for key, row in current.items():
                if key not in rows:
                    self.health.delete(wtxn, row)
            for key, row in rows.items():
                if current.get(key) != row:
                    self.health.insert(wtxn, row)

    async def stop(self) -> None:
        """Stop the load balancer and close the maps (pinned maps keep their contents)."""
        if not self.running:
            return
        self.running = False
        if self._cancel is not None and self._stopped is not None:
            self._cancel.cancel()
            await self._stopped.wait()
        self.lb.close_maps()
        if self.client is not None:
            self.client.close()

    def recreate(self, extra_flags: Iterable[str] = ()) -> LBSystem:
        """A new system with this one's flags then ``extra_flags``, the same Kubernetes store
        and the same pinned maps, and a fresh database. This system must be stopped."""
        if self.running:
            raise LBSystemError("stop the load balancer before recreating it")
        return LBSystem([*self.flags, *extra_flags], self.options, self.k8s)

    # ----- what the runner asks -----------------------------------------------------------
    def request_prune(self) -> None:
        """Ask the reconciler for a prune of the maps."""
        self.lb.request_prune()

    def prune_count(self) -> int:
        """How many prunes have run."""
        return self.lb.prune_count()

    def metric_samples(self) -> list[tuple[str, dict[str, str], float]]:
        """The reconciler's metric samples (Cilium-style names)."""
        return self.lb.metric_samples()

    def idle(self) -> bool:
        """True when every change written to the fake API server has been applied to the
        tables (while running) and every change of the frontends table to the maps,
        without error."""
        return (not self.running or self.caught_up()) and self.lb.idle()

    def caught_up(self) -> bool:
        """True when the source has processed (applied or refused) every change written to
        the fake API server; Nodes count only when named as this node (the source reads
        no other)."""
        source = self.source
        if source is None:
            return False
        for resource, rv in self.k8s.written.items():
            name = resource
            if resource.startswith("nodes/"):
                if resource != f"nodes/{self.config.node_name}":
                    continue
                name = "nodes"
            if source.applied_rv.get(name, 0) < rv:
                return False
        return True

    async def wait_caught_up(self) -> None:
        """Wait until `caught_up` (at most `SOURCE_TIMEOUT`, then `LBSystemError`)."""
        source = self.source
        if not self.running or source is None:
            return
        try:
            with anyio.fail_after(SOURCE_TIMEOUT):
                for resource, rv in list(self.k8s.written.items()):
                    if resource.startswith("nodes/"):
                        if resource != f"nodes/{self.config.node_name}":
                            continue
                        resource = "nodes"
                    await source.wait_applied(resource, rv)
        except TimeoutError:
            health = "; ".join(f"{name}: {msg}" for name, _, msg in source.health())
            raise LBSystemError(f"the Kubernetes source did not catch up: {health}") from None

    def holding(self) -> contextlib.AbstractContextManager[None]:
        """While running: the source's `K8sSource.holding` (what is delivered inside the
        block is applied as one batch after it); otherwise a block that does nothing."""
        if not self.running or self.source is None:
            return contextlib.nullcontext()
        return self.source.holding()

    async def wait_received(self, obj: Mapping[str, Any], resource_version: int) -> None:
        """Wait until the source has received the change of ``obj`` at ``resource_version``
        (at most `SOURCE_TIMEOUT`, then `LBSystemError`); nothing to wait for while
        stopped, nor for a Node other than this node's (the source reads no other)."""
        source = self.source
        if not self.running or source is None or not resource_version:
            return
        resource = source_resource(obj)
        if resource == "nodes" and key_of(obj).lstrip("/") != self.config.node_name:
            return
        try:
            with anyio.fail_after(SOURCE_TIMEOUT):
                await source.wait_received(resource, resource_version)
        except TimeoutError:
            health = "; ".join(f"{name}: {msg}" for name, _, msg in source.health())
            raise LBSystemError(
                f"the Kubernetes source did not receive a change: {health}"
            ) from None

    def maps_dump(self) -> str:
        """The LB maps in the corpus line format."""
        return self.lb.maps_dump()

    def maps_leftovers(self) -> list[str]:
        """Map entries that remain (empty when the maps are empty)."""
        return self.lb.maps_leftovers()

    # ----- node state ---------------------------------------------------------------------
    def upsert_node_addresses(self, rows: Iterable[Any], insert: bool = True) -> None:
        """Insert (or delete) node-address rows through the writer."""
        with self.writer.write_txn() as txn:
            for row in rows:
                if insert:
                    self.writer.upsert_node_address(txn, row)
                else:
                    self.writer.delete_node_address(txn, row)

    def set_node_labels(self, labels: Mapping[str, str]) -> None:
        """Set the local node's labels (zone, node exposure)."""
        with self.writer.write_txn() as txn:
            self.writer.set_node_labels(txn, labels)

    def set_node_ip(self, ip: Any) -> None:
        """Set the local node's IP (backends at it count as local with proxy delegation)."""
        with self.writer.write_txn() as txn:
            self.writer.set_node_ip(txn, ip)
