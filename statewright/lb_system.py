"""The assembled load balancer (the "hive"): tables, Kubernetes source, LB maps and reconciler.

`LBSystem` wires together what the other LB modules provide:

* a statedb `DB` with the LB tables (services, frontends, backends,
  node-addresses) and the `LBWriter` that keeps them consistent
  (tables/*);
* an `LBConfig` parsed from Cilium-style agent flags (``--bpf-lb-algorithm=maglev``),
  on top of the Cilium test-harness defaults when asked to;
* a `FakeKubernetes` object store (Services, EndpointSlices, Pods) whose changes
  are fed through sources/k8s_convert into the writer, as a Kubernetes reflector
  would: the initial listing happens at start, after which the frontends table is
  marked initialized (so pruning may run), then every add/update/delete is
  applied as it happens, and ``resync`` replaces a resource's whole content;
* the LB BPF maps (bpfops/lb_maps, kernel or memory, pinned under a directory)
  optionally behind the fault-injecting wrapper, and the FrontendOps reconciler
  (bpfops/frontend_ops) running as an anyio task.

``start``/``stop`` run and stop the reconciler; `recreate` builds a new system that
keeps the Kubernetes store and the pinned maps but starts statedb from scratch,
which is how an agent restart looks (ids must be restored from the maps).

The same class backs the conformance runner (tests/conformance) and, later, the
agent.
"""

from __future__ import annotations

import builtins
import contextlib
import copy
import errno
import logging
import os
import shutil
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.abc

from sources.state_file import STATE_FILE_FLAGS, StateFileSource
from statedb import DB

log = logging.getLogger("statewright.lb")

#: Resource names as the Kubernetes client (and ``k8s/resync``) spells them.
SERVICES = "v1.services"
ENDPOINTSLICES = "discovery.k8s.io.v1.endpointslices"
PODS = "v1.pods"


#: Periodic full reconciliation of the maps; the first prune runs as soon as the frontends
#: table is initialized (after the initial Kubernetes listing).
PRUNE_INTERVAL = 3600.0

#: Map operations the fault injection (--lb-test-fault-probability) may fail: the writes.
#: Reads (dumps, restore of ids at start) are never faulted, as in Cilium's test maps.
FAULTY_OPS = frozenset({"update", "delete", "update_batch", "delete_batch", "set_inner"})


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
    """How to build an `LBSystem` besides the agent flags."""

    maps: MapsLocation = field(default_factory=MapsLocation)
    #: Apply Cilium's script-test harness defaults before the flags.
    harness_defaults: bool = False
    #: Seed of the fault-injecting map wrapper (when --lb-test-fault-probability > 0).
    fault_seed: int = 1


#: Flags the system itself acts on rather than the LB configuration.
#: ``--metrics-sampling-interval``: metrics are read when asked (`LBSystem.metric_samples`),
#: so every read is a fresh sample and any interval is honoured.
#: ``--lb-state-file`` / ``--lb-state-file-interval``: a `sources.state_file.StateFileSource`
#: runs beside the reconciler.
SYSTEM_FLAGS = ("metrics-sampling-interval", *STATE_FILE_FLAGS)


class LBSystem:
    """One instance of the load balancer; see the module docstring."""

    def __init__(
        self,
        flags: Iterable[str] = (),
        options: SystemOptions | None = None,
        k8s: FakeKubernetes | None = None,
    ) -> None:
        from tables.lb_config import LBConfig
        from tables.lb_writer import LBWriter

        self.flags = list(flags)
        self.options = options or SystemOptions()
        self.k8s = k8s if k8s is not None else FakeKubernetes()
        base = LBConfig.for_tests() if self.options.harness_defaults else LBConfig()
        self.config = LBConfig.from_flags(self.flags, base)
        self.db = DB()
        self.writer = LBWriter.create(self.db, self.config)
        self.services, self.frontends, self.backends, self.node_addresses = self.writer.tables
        from sources.k8s_convert import K8sConverter

        self.converter = K8sConverter(self.writer, self.config)
        self.maps: Any = None  # bpfops.lb_maps.LBMaps as the reconciler sees it (maybe faulty)
        self.plain_maps: Any = None  # the same maps without fault injection
        self.ops: Any = None
        self.reconciler: Any = None
        self._cancel: anyio.CancelScope | None = None
        self._stopped: anyio.Event | None = None
        self._source_errors: list[str] = []
        self._applied: dict[str, dict[str, dict[str, Any]]] = {}
        self._init_done: Callable[[Any], None] | None = None
        self.state_file: StateFileSource | None = None  # with --lb-state-file
        self.running = False
        self.started_once = False

    @property
    def source_errors(self) -> list[str]:
        """Objects that could not be applied, with the reason (newest last): Kubernetes
        objects, then the state file's current error if any."""
        errors = list(self._source_errors)
        if self.state_file is not None and self.state_file.error:
            errors.append(self.state_file.error)
        return errors

    # ----- flags ---------------------------------------------------------------------
    @staticmethod
    def unsupported_flags(flags: Iterable[str]) -> list[str]:
        """The flags among ``flags`` that Statewright does not implement (or does not know)."""
        from tables.lb_config import LBConfig

        return LBConfig.unsupported_flags(flags, also_supported=SYSTEM_FLAGS)

    # ----- lifecycle ------------------------------------------------------------------
    async def start(self, tg: anyio.abc.TaskGroup) -> None:
        """Open the maps, start the reconciler in ``tg`` and sync the Kubernetes objects."""
        if self.running:
            raise LBSystemError("the load balancer is already running")
        if self.started_once:
            raise LBSystemError("a stopped load balancer cannot be restarted; recreate it")
        self.started_once = True
        self._stopped = anyio.Event()
        self._open_maps()
        try:
            self._build_reconciler()
            with self.db.write_txn(self.frontends) as txn:
                self._init_done = self.frontends.register_initializer(txn, "k8s")
            self.state_file = StateFileSource.from_config(self.writer, self.config)
            await tg.start(self._run_reconciler)
        except BaseException:
            self._close_maps()
            raise
        self.running = True
        # The reflector: list everything, then follow changes.
        self.k8s.listener = self._on_k8s_event
        for resource in (SERVICES, ENDPOINTSLICES, PODS, *self.k8s.resources()):
            if resource in self._applied:
                continue
            self._resync(resource)
        with self.writer.write_txn() as txn:
            assert self._init_done is not None
            self._init_done(txn)

    async def _run_reconciler(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        with anyio.CancelScope() as scope:
            self._cancel = scope
            try:
                async with anyio.create_task_group() as tg:
                    await tg.start(self.reconciler.run)
                    if self.state_file is not None:
                        await tg.start(self.state_file.run)
                    task_status.started()
            finally:
                assert self._stopped is not None
                self._stopped.set()

    async def stop(self) -> None:
        """Stop the reconciler and close the maps (pinned maps keep their contents)."""
        if not self.running:
            return
        self.running = False
        if self.k8s.listener == self._on_k8s_event:
            self.k8s.listener = None
        if self._cancel is not None and self._stopped is not None:
            self._cancel.cancel()
            await self._stopped.wait()
        self._close_maps()

    def recreate(self, extra_flags: Iterable[str] = ()) -> LBSystem:
        """A new system with this one's flags then ``extra_flags``, the same Kubernetes store
        and the same pinned maps, and a fresh database. This system must be stopped."""
        if self.running:
            raise LBSystemError("stop the load balancer before recreating it")
        return LBSystem([*self.flags, *extra_flags], self.options, self.k8s)

    # ----- maps ---------------------------------------------------------------------------
    def _open_maps(self) -> None:
        from bpf.faulty_map import FaultyMap
        from bpfops.lb_maps import LBMaps

        cfg = self._maps_config()
        probability = self.config.test_fault_probability
        wrap = None
        if probability > 0:
            seed = self.options.fault_seed

            def wrap(backend: Any) -> Any:
                return FaultyMap(backend, probability, errno=errno.EIO, seed=seed, ops=FAULTY_OPS)

        self.maps = LBMaps.open(cfg, wrap=wrap)
        self.plain_maps = self.maps if wrap is None else self.maps.unwrapped()

    def _maps_config(self) -> Any:
        from bpfops.lb_maps import LBMapsConfig

        loc = self.options.maps
        return LBMapsConfig(
            backend="kernel" if loc.backend == "kernel" else "memory",
            pin_dir=loc.pin_dir,
            pin=bool(loc.pin_dir),
            max_entries=self.config.lb_map_max,
            maglev_table_size=self.config.maglev_table_size,
        )

    def _close_maps(self) -> None:
        if self.maps is not None:
            self.maps.close()
        self.maps = self.plain_maps = None

    # ----- the reconciler -------------------------------------------------------------------
    def _build_reconciler(self) -> None:
        """FrontendOps on the (possibly faulty) maps and the frontends reconciler, both from
        bpfops.adapter. The ops restore service and backend ids from the maps."""
        from bpfops.adapter import frontend_ops_for, reconciler_config
        from reconciler import Reconciler

        self.ops = frontend_ops_for(self.writer, self.maps, self.config)
        self.reconciler = Reconciler(
            self.db,
            reconciler_config(
                self.writer,
                self.ops,
                self.config,
                name="lb-frontends",
                retry_min_backoff=max(self.config.retry_backoff_min, 0.001),
                retry_max_backoff=max(
                    self.config.retry_backoff_max, self.config.retry_backoff_min, 0.001
                ),
                prune_interval=PRUNE_INTERVAL,
            ),
        )

    def request_prune(self) -> None:
        """Ask the reconciler for a prune of the maps."""
        if self.reconciler is None or not self.running:
            raise LBSystemError("the load balancer is not running")
        self.reconciler.prune()

    def prune_count(self) -> int:
        """How many prunes have run."""
        return int(self.reconciler.metrics.prunes.count) if self.reconciler is not None else 0

    def metric_samples(self) -> list[tuple[str, dict[str, str], float]]:
        """The current metric samples of the system (its reconciler's, Cilium-style names)."""
        if self.reconciler is None:
            return []
        samples: list[tuple[str, dict[str, str], float]] = self.reconciler.metrics.samples()
        return samples

    def idle(self) -> bool:
        """True when every change of the frontends table has been applied without error."""
        if not self.running or self.reconciler is None:
            return True
        rev = self.frontends.revision(self.db.read_txn())
        return bool(
            self.reconciler.reconciled_revision >= rev and len(self.reconciler.retries) == 0
        )

    # ----- the Kubernetes source ------------------------------------------------------------
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
            self._convert(resource, key, obj, old)
        except Exception as e:  # bad objects are reported and leave everything else alone
            msg = f"{resource} {key}: {e}"
            log.warning("lb: %s", msg)
            self._source_errors.append(msg)
            return
        if obj is None:
            applied.pop(key, None)
        else:
            applied[key] = obj

    def _convert(
        self, resource: str, key: str, obj: dict[str, Any] | None, old: dict[str, Any] | None
    ) -> None:
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

    # ----- maps views -------------------------------------------------------------------------
    def maps_dump(self) -> str:
        """The LB maps in the corpus line format (sorted, newline-terminated)."""
        from bpfops.maps_dump import dump_text

        with self._dump_view() as maps:
            return str(dump_text(maps))

    def maps_leftovers(self) -> list[str]:
        """Map entries that remain (empty when the maps are empty)."""
        from bpfops.maps_dump import maps_empty

        with self._dump_view() as maps:
            return list(maps_empty(maps))

    @contextlib.contextmanager
    def _dump_view(self) -> Iterator[Any]:
        """The maps without fault injection: the open ones, or (while stopped) the pinned
        ones opened just for reading."""
        if self.plain_maps is not None:
            yield self.plain_maps
            return
        if not self.options.maps.pin_dir:
            raise LBSystemError("the LB maps are not open and not pinned")
        from bpfops.lb_maps import LBMaps

        maps = LBMaps.open(self._maps_config())
        try:
            yield maps
        finally:
            maps.close()
