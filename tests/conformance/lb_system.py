"""The corpus' system under test: the product `LoadBalancer` fed from a fake Kubernetes store.

`LBSystem` is what the conformance runner starts and stops (``hive start``,
``hive/recreate``):

* a `statewright.loadbalancer.LoadBalancer` built from the ``#!`` flags on top of the
  Cilium test harness' own defaults (`HARNESS_DEFAULTS`: node name ``testnode``, a 10%
  fault probability on map writes, short retry backoffs), set here explicitly because
  they are the harness' settings, not the product's;
* a `FakeKubernetes` object store (Services, EndpointSlices, Pods) whose changes are fed
  through the load balancer's Kubernetes converter, as a reflector would: the initial
  listing happens at start, then the ``k8s`` initializer is done (so pruning may run),
  then every add/update/delete is applied as it happens, and ``resync`` re-lists;
* the LB maps pinned under a directory the caller owns, behind the fault-injecting
  wrapper when the fault probability is above zero.

`recreate` builds a new system that keeps the Kubernetes store and the pinned maps but
starts statedb from scratch, which is how an agent restart looks (ids must be restored
from the maps).
"""

from __future__ import annotations

import builtins
import contextlib
import copy
import errno
import logging
import os
import shutil
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.abc

from sources.state_file import STATE_FILE_FLAGS
from statedb.errors import InputError
from statewright.loadbalancer import LoadBalancer, MapsPlacement
from tables.lb_config import LBConfig
from tests.conformance.health_table import health_rows, new_health_table

log = logging.getLogger("statewright.lb")

#: Resource names as the Kubernetes client (and ``k8s/resync``) spells them.
SERVICES = "v1.services"
ENDPOINTSLICES = "discovery.k8s.io.v1.endpointslices"
PODS = "v1.pods"

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


Listener = Callable[[str, str, dict[str, Any] | None, dict[str, Any] | None], None]


class FakeKubernetes:
    """An in-memory Kubernetes API: objects by resource and ``namespace/name``.

    One listener (the running system's source) is told about every change as
    ``(resource, op, new, old)`` with op ``upsert``, ``delete`` or ``resync`` (for
    ``resync`` new/old are None: the listener re-lists the resource). The store
    outlives a system, so a recreated system sees the same objects.
    """

    def __init__(self) -> None:
        self.objects: dict[str, dict[str, dict[str, Any]]] = {}
        self.version = 0
        self.listener: Listener | None = None

    def list(self, resource: str) -> builtins.list[dict[str, Any]]:
        """Every object of ``resource``, in key order."""
        objs = self.objects.get(resource, {})
        return [objs[k] for k in sorted(objs)]

    def resources(self) -> builtins.list[str]:
        """Resources that have (or had) objects."""
        return sorted(self.objects)

    def _notify(self, resource: str, op: str, new: Any, old: Any) -> None:
        self.version += 1
        if self.listener is not None:
            self.listener(resource, op, new, old)

    def upsert(self, obj: dict[str, Any]) -> None:
        """Create or update an object (``k8s/add`` and ``k8s/update``)."""
        resource, key = resource_of(obj), key_of(obj)
        obj = copy.deepcopy(obj)
        old = self.objects.setdefault(resource, {}).get(key)
        self.objects[resource][key] = obj
        self._notify(resource, "upsert", obj, old)

    def delete(self, obj: Mapping[str, Any]) -> bool:
        """Delete an object; False when it did not exist."""
        resource, key = resource_of(obj), key_of(obj)
        old = self.objects.get(resource, {}).pop(key, None)
        if old is None:
            return False
        self._notify(resource, "delete", None, old)
        return True

    def replace(self, resource: str, objs: Iterable[dict[str, Any]]) -> None:
        """Atomically replace every object of ``resource`` and make watchers re-list it."""
        fresh: dict[str, dict[str, Any]] = {}
        for obj in objs:
            if resource_of(obj) != resource:
                raise ValueError(f"{key_of(obj)} is not a {resource} object")
            fresh[key_of(obj)] = copy.deepcopy(obj)
        self.objects[resource] = fresh
        self._notify(resource, "resync", None, None)


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
    """One load balancer fed from a `FakeKubernetes`; see the module docstring."""

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
        self._source_errors: list[str] = []
        self._applied: dict[str, dict[str, dict[str, Any]]] = {}
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
        """Objects that could not be applied, with the reason (newest last): Kubernetes
        objects, then the state file's current error if any."""
        errors = list(self._source_errors)
        if self.lb.state_file is not None and self.lb.state_file.error:
            errors.append(self.lb.state_file.error)
        return errors

    @staticmethod
    def unsupported_flags(flags: Iterable[str]) -> list[str]:
        """The flags among ``flags`` that Statewright does not implement (or does not know)."""
        return LBConfig.unsupported_flags(flags, also_supported=HARNESS_FLAGS)

    # ----- lifecycle ------------------------------------------------------------------
    async def start(self, tg: anyio.abc.TaskGroup) -> None:
        """Open the maps, start the load balancer in ``tg`` and sync the Kubernetes objects."""
        if self.running:
            raise LBSystemError("the load balancer is already running")
        if self.started_once:
            raise LBSystemError("a stopped load balancer cannot be restarted; recreate it")
        self.started_once = True
        self._stopped = anyio.Event()
        with self.writer.write_txn() as txn:
            init_done = self.writer.register_initializer(txn, "k8s")
        self.lb.open_maps(wrap=self._fault_wrapper())
        try:
            self.lb.build_reconciler()
            await tg.start(self._run)
        except BaseException:
            self.lb.close_maps()
            raise
        self.running = True
        # The reflector: list everything, then follow changes.
        self.k8s.listener = self._on_k8s_event
        for resource in (SERVICES, ENDPOINTSLICES, PODS, *self.k8s.resources()):
            if resource not in self._applied:
                self._resync(resource)
        with self.writer.write_txn() as txn:
            init_done(txn)

    def _fault_wrapper(self) -> Callable[[Any], Any] | None:
        probability = self.config.test_fault_probability
        if probability <= 0:
            return None
        from bpf.faulty_map import FaultyMap

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
        if self.k8s.listener == self._on_k8s_event:
            self.k8s.listener = None
        if self._cancel is not None and self._stopped is not None:
            self._cancel.cancel()
            await self._stopped.wait()
        self.lb.close_maps()

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
        """True when every change of the frontends table has been applied without error."""
        return self.lb.idle()

    def maps_dump(self) -> str:
        """The LB maps in the corpus line format."""
        return self.lb.maps_dump()

    def maps_leftovers(self) -> list[str]:
        """Map entries that remain (empty when the maps are empty)."""
        return self.lb.maps_leftovers()

    # ----- the Kubernetes feed ------------------------------------------------------------
    def _on_k8s_event(
        self, resource: str, op: str, new: dict[str, Any] | None, old: dict[str, Any] | None
    ) -> None:
        if op == "resync":
            self._resync(resource)
        elif op == "upsert" and new is not None:
            self._apply(resource, key_of(new), new)
        elif op == "delete" and old is not None:
            self._apply(resource, key_of(old), None)

    def _resync(self, resource: str) -> None:
        """Re-list ``resource``: apply every object, delete those that disappeared."""
        current = {key_of(o): o for o in self.k8s.list(resource)}
        applied = self._applied.setdefault(resource, {})
        for key in sorted(set(applied) - set(current)):
            self._apply(resource, key, None)
        for key in sorted(current):
            if applied.get(key) != current[key]:
                self._apply(resource, key, current[key])

    def _apply(self, resource: str, key: str, obj: dict[str, Any] | None) -> None:
        """Convert one object change into writer calls, in one write transaction."""
        applied = self._applied.setdefault(resource, {})
        old = applied.get(key)
        try:
            self._convert(obj, old)
        except InputError as e:  # bad input is reported and leaves everything else alone
            msg = f"{resource} {key}: {e}"
            log.warning("lb: %s", msg)
            self._source_errors.append(msg)
            return
        if obj is None:
            applied.pop(key, None)
        else:
            applied[key] = obj

    def _convert(self, obj: dict[str, Any] | None, old: dict[str, Any] | None) -> None:
        conv = self.converter
        checkpoint = conv.checkpoint()
        try:
            with self.writer.write_txn() as txn:
                if obj is not None:
                    conv.upsert(txn, obj)
                elif old is not None:
                    conv.delete(txn, old)
        except BaseException:
            conv.rollback(checkpoint)
            raise

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
