"""The Kubernetes source: four reflectors feeding the LB tables through the converter.

`K8sSource` runs one `sources.k8s_reflector.Reflector` per resource the agent
reads — Services and EndpointSlices in every namespace, the Pods on this node
(``fieldSelector=spec.nodeName=NODE``, for hostPort frontends) and this Node
(``fieldSelector=metadata.name=NODE``, whose labels go to
`LBWriter.set_node_labels`) — and one applier task that writes what they
deliver into the tables:

* deliveries queue up, bounded in events (`SourceConfig.queue_events`; a decoded
  watch event is a few kilobytes of Python objects: a queue bounded only in deliveries
  held ~90 MB under a backlog): a reflector whose delivery does not fit waits, so it
  stops reading its watch and the socket's buffers hold the rest (the API server keeps
  it, nothing is lost); deliveries are admitted in arrival order, and one larger than the
  bound goes in alone once the queue is empty. The applier writes them in batches, one
  write transaction per batch of at
  most ``batch_size`` changes (a larger delivery is split), started at the latest
  ``batch_delay`` seconds after the first change arrived, yielding to the event
  loop between batches;
* a batch is coalesced per object (`coalesce`), as upstream's reflector buffers
  events per object key: of the changes to one object only the last is written,
  in the place of the first. A delete and an add of the same name in one batch
  are one upsert, so a Pod recreated under its name with a new UID arrives as an
  upsert whose HostPort service takes over the frontend of the previous Pod's
  service in the same transaction (frontend and backend ids stay, nothing is
  renumbered in the maps). `K8sSource.holding` makes the changes a caller writes
  one batch (a test runner delivering a script's ``k8s/delete`` and ``k8s/add``
  together);
* every object goes through the same `sources.k8s_convert.K8sConverter` as the
  manifest source. An object the converter refuses (`ConversionError`, or a
  `FrontendConflictError`: its frontend belongs to another service) gets its own
  error in `K8sSource.errors` and is left out, and the others apply: a Service
  or EndpointSlice is refused before anything of it is written, so the batch
  goes on; a Pod may be refused half-written, so then the batch is written
  again without it (transaction aborted, converter rolled back; see
  `K8sSource.apply_batch`);
* the source registers an initializer on the LB tables (`register_initializer`)
  and completes it in the transaction that applies the last of the four initial
  lists: pruning of the BPF maps starts only once the tables hold the whole
  cluster state, so an agent restarted against a changed cluster removes
  exactly the stale entries.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.abc
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from sources.apply_latency import LatencyHistogram
from sources.k8s_client import K8sClient
from sources.k8s_convert import (
    KIND_ENDPOINT_SLICE,
    KIND_SERVICE,
    ConversionError,
    K8sConverter,
)
from sources.k8s_reflector import (
    BACKING_OFF,
    LISTING,
    STOPPED,
    WATCHING,
    Delta,
    Reflector,
    ReflectorConfig,
    ResourceSpec,
    object_key,
)
from statedb import WriteTxn
from statedb.errors import InputError, StatewrightError
from tables import slice_addresses
from tables.endpoints import NamedPort, parse_named_ports
from tables.lb_writer import FrontendConflictError, LBWriter
from tables.origins import SOURCE_K8S, OriginRecorder

log = logging.getLogger(__name__)

#: What the applier catches per object: bad input (`statedb.errors.InputError`: the
#: converter's `ConversionError`, the writer's `FrontendConflictError`...). Anything else
#: is a bug and ends the source (the component reports it).
INPUT_ERRORS: tuple[type[Exception], ...] = (InputError,)
#: Input errors raised before anything of the object is written: the conversion (a pure
#: function, run first) and the writer's frontend-conflict check (done before writing).
CLEAN_ERRORS: tuple[type[Exception], ...] = (ConversionError, FrontendConflictError)

KIND_NODE = "Node"
KIND_POD = "Pod"
#: Kinds whose `CLEAN_ERRORS` leave nothing written (see `apply_batch`); a Pod's host
#: ports are several services, one may be written before the next is refused.
_REFUSED_BEFORE_WRITING = frozenset({"Service", "EndpointSlice", KIND_NODE})


def resource_specs(node_name: str) -> list[ResourceSpec]:
    """The four resources the agent reads (pods and node restricted to ``node_name``)."""
    return [
        ResourceSpec("services", "Service", "v1", "services"),
        ResourceSpec("endpointslices", "EndpointSlice", "discovery.k8s.io/v1", "endpointslices"),
        ResourceSpec("pods", "Pod", "v1", "pods", field_selector=f"spec.nodeName={node_name}"),
        ResourceSpec(
            "nodes", KIND_NODE, "v1", "nodes", field_selector=f"metadata.name={node_name}"
        ),
    ]


def policy_resource_specs() -> list[ResourceSpec]:
    """The policy resources (every namespace): NetworkPolicies and CiliumNetworkPolicies,
    reflected by the policy component (policy/k8s.py) into its own table."""
    return [
        ResourceSpec(
            "networkpolicies", "NetworkPolicy", "networking.k8s.io/v1", "networkpolicies"
        ),
        ResourceSpec(
            "ciliumnetworkpolicies", "CiliumNetworkPolicy", "cilium.io/v2", "ciliumnetworkpolicies"
        ),
    ]


class SourceError(StatewrightError, RuntimeError):
    """The source cannot go on (an object refused in a way it cannot undo)."""


@dataclass(frozen=True, slots=True)
class SourceConfig:
    """Batching of the applier and the reflectors' timing."""

    #: Changes per write transaction, at most (a larger delivery is split across
    #: batches): a batch holds the event loop while it is written, ~0.2 ms per object,
    #: and the applier yields to the other tasks (the reconciler) between batches, so
    #: this bounds how long a backlog holds the loop at a time. A loop turn under a
    #: backlog runs one batch and one reconciler chunk, and a stall the churn measures
    #: spans one or two turns: at 8 the longest stall's loop CPU was 22 ms against
    #: 32 ms at 16 (60,000 services, 1,000 events/s), for ~10 % more of the applier's CPU
    #: per change while a backlog lasts (the usual batch at that rate holds 3-7).
    batch_size: int = 8
    #: The bound until every initial list has been applied: list pages of 500 objects,
    #: with no event waiting behind them, go in fewer, larger transactions.
    sync_batch_size: int = 500
    #: How long the applier waits for more changes after the first one (under load the
    #: changes that arrive while a batch is written make the next batch anyway).
    batch_delay: float = 0.001
    #: Deliveries that may wait for the applier before reflectors are held back.
    queue_depth: int = 64
    #: Changes (events, list items) that may wait for the applier before reflectors are
    #: held back (`EventBudget`): about 10 MB of decoded EndpointSlices, two list pages
    #: of 500 plus change, enough to keep the applier busy while the next one is read.
    queue_events: int = 1024
    reflector: ReflectorConfig = field(default_factory=ReflectorConfig)


class EventBudget:
    """How many changes wait in the applier's queue, and admission to it: `acquire`
    waits until ``n`` more fit within ``limit`` (or the queue is empty: a delivery larger
    than the limit goes in alone rather than never), in the order the callers came;
    `release` when the applier takes them. Used in the event loop's thread only."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        #: Changes admitted and not taken by the applier yet.
        self.queued = 0
        #: The most that were queued at once.
        self.peak = 0
        self._waiters: deque[tuple[int, anyio.Event]] = deque()

    async def acquire(self, n: int) -> None:
        """Admit ``n`` changes, waiting for room (see the class doc)."""
        if not self._waiters and self._fits(n):
            self._admit(n)
            return
        entry = (n, anyio.Event())
        self._waiters.append(entry)
        try:
            await entry[1].wait()
        except BaseException:
            if entry in self._waiters:
                self._waiters.remove(entry)
            else:  # admitted, but cancelled before it could use the room
                self.queued -= n
            self._wake()
            raise

    def release(self, n: int) -> None:
        """``n`` admitted changes left the queue."""
        self.queued -= n
        self._wake()

    def _fits(self, n: int) -> bool:
        return self.queued == 0 or self.queued + n <= self.limit

    def _admit(self, n: int) -> None:
        self.queued += n
        self.peak = max(self.peak, self.queued)

    def _wake(self) -> None:
        while self._waiters and self._fits(self._waiters[0][0]):
            n, event = self._waiters.popleft()
            self._admit(n)
            event.set()


@dataclass(slots=True)
class _Item:
    reflector: Reflector
    deltas: list[Delta]
    synced: bool
    received: float
    #: The resourceVersion of the list a ``synced`` delivery completes (0 otherwise).
    list_rv: int = 0


class K8sSource:
    """Keeps the LB tables equal to what the API server holds (see the module docstring)."""

    def __init__(
        self,
        writer: LBWriter,
        client: K8sClient,
        *,
        node_name: str,
        converter: K8sConverter | None = None,
        config: SourceConfig | None = None,
        on_applied: Callable[[list[Delta], float], None] | None = None,
    ) -> None:
        self.writer = writer
        self.client = client
        self.node_name = node_name
        self.converter = converter if converter is not None else K8sConverter(writer)
        self.config = config or SourceConfig()
        #: Called after each committed batch with its deltas and the time the oldest of
        #: them arrived (benchmarks measure event-to-table latency with it).
        self.on_applied = on_applied
        #: From delivery to commit, per applied change (`sources.apply_latency`).
        self.apply_latency = LatencyHistogram()
        self.reflectors = [
            Reflector(client, spec, self._deliver, self.config.reflector)
            for spec in resource_specs(node_name)
        ]
        # The initial Services after the EndpointSlices: each frontend is then written
        # (and reconciled) once, with its backends (`Reflector.lists_after`).
        by_kind = {r.spec.kind: r for r in self.reflectors}
        by_kind["Service"].lists_after = by_kind["EndpointSlice"]
        #: Current error per object (``Kind namespace/name`` -> message).
        self.errors: dict[str, str] = {}
        # Objects refused for a frontend conflict, as last received (tried again later).
        self._conflicts: dict[str, tuple[Reflector, Delta]] = {}
        self._send: MemoryObjectSendStream[_Item]
        self._recv: MemoryObjectReceiveStream[_Item]
        self._send, self._recv = anyio.create_memory_object_stream[_Item](self.config.queue_depth)
        #: The changes waiting in the applier's queue (module doc).
        self.queue = EventBudget(self.config.queue_events)
        self._init_done: Callable[[WriteTxn], None] | None = None
        self._synced: set[str] = set()
        #: True once every initial list has been applied.
        self.synced = False
        self.batches = 0
        self.applied = 0
        #: Per resource: the highest resourceVersion among the objects processed (committed
        #: or refused).
        self.applied_rv: dict[str, int] = {}
        # Set (and dropped) after each batch; created by a waiter (an anyio Event needs
        # the running event loop, the source may be built before it).
        self._applied_event: anyio.Event | None = None
        #: This node's Node object as last applied (None: not listed yet, or no such Node).
        self.node: Mapping[str, Any] | None = None
        #: Counts applied changes of the Node (and completed lists of it): `wait_node`.
        self.node_generation = 0
        self._node_event: anyio.Event | None = None
        #: The labels of this node's Pods (``namespace/name`` -> labels), as last delivered
        #: (refused or not: a Pod's labels do not depend on its host ports).
        self.pod_labels: dict[str, dict[str, str]] = {}
        #: The named container ports of this node's Pods (``namespace/name`` -> ports),
        #: what NetworkPolicies' named ports resolve to (changes count in
        #: `pod_labels_generation` too).
        self.pod_ports: dict[str, tuple[NamedPort, ...]] = {}
        #: The uids of this node's Pods (``namespace/name`` -> uid): the owners of their
        #: CiliumEndpoints (sources/k8s_endpoints.py).
        self.pod_uids: dict[str, str] = {}
        #: Counts batches that changed `pod_labels` (and completed lists of Pods).
        self.pod_labels_generation = 0
        self._pods_event: anyio.Event | None = None
        #: Per resource: the highest resourceVersion delivered to the applier so far (of
        #: watch events, and of completed lists).
        self.received_rv: dict[str, int] = {}
        self._received_event: anyio.Event | None = None
        # Set while `holding`: the applier waits for it before writing its batch.
        self._release: anyio.Event | None = None
        self._holds = 0

    # ----- initialization -----------------------------------------------------------------
    def register_initializer(self, txn: WriteTxn) -> None:
        """Keep the LB tables uninitialized until every initial list has been applied."""
        self._init_done = self.writer.register_initializer(txn, "k8s")

    # ----- running ------------------------------------------------------------------------
    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Run the reflectors and the applier until cancelled."""
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._apply_loop)
            for r in self.reflectors:
                tg.start_soon(r.run, name=f"k8s reflector {r.name}")
            task_status.started()

    async def wait_synced(self) -> None:
        """Wait until every initial list has been applied (tests, start-up)."""
        while not self.synced:
            await anyio.sleep(0.01)

    async def wait_applied(self, resource: str, resource_version: int | str) -> None:
        """Wait until a change of ``resource`` ("services", "endpointslices", "pods",
        "nodes") at ``resource_version`` (or later) has been processed: committed to the
        tables, or refused with its error in `errors`. What a caller that changed the API
        server and wants to look at the result waits for (e.g. a conformance runner after
        ``k8s/add``)."""
        want = int(resource_version)
        while self.applied_rv.get(resource, 0) < want:
            if self._applied_event is None:
                self._applied_event = anyio.Event()
            await self._applied_event.wait()

    @property
    def node_synced(self) -> bool:
        """True once the initial list of this node's Node has been applied."""
        return any(r.spec.kind == KIND_NODE and r.name in self._synced for r in self.reflectors)

    async def wait_node(self, after: int = 0) -> tuple[int, Mapping[str, Any] | None]:
        """Wait until the Node's initial list has been applied and the Node changed since
        ``node_generation`` ``after`` (0: any); returns the generation and the Node (None
        when the API server has no Node of this name). What IPAM follows for the Node's
        ``spec.podCIDRs`` (sources/k8s_node_cidrs.py)."""
        while not (self.node_synced and self.node_generation > after):
            if self._node_event is None:
                self._node_event = anyio.Event()
            await self._node_event.wait()
        return self.node_generation, self.node

    def pod_labels_of(self, namespace: str, name: str) -> dict[str, str] | None:
        """The labels of this node's Pod ``namespace/name``, None when the source does not
        hold it (not listed yet, deleted, or on another node). Safe from a worker thread:
        one dictionary lookup (atomic in CPython), and the applier replaces a Pod's labels
        with a new dictionary, never changes one in place."""
        return self.pod_labels.get(f"{namespace}/{name}")

    def pod_ports_of(self, namespace: str, name: str) -> tuple[NamedPort, ...] | None:
        """The named container ports of this node's Pod (see `pod_labels_of`)."""
        return self.pod_ports.get(f"{namespace}/{name}")

    def pod_uid_of(self, namespace: str, name: str) -> str | None:
        """The uid of this node's Pod ``namespace/name`` (see `pod_labels_of`)."""
        return self.pod_uids.get(f"{namespace}/{name}")

    async def wait_pod_labels(self, after: int = 0) -> int:
        """Wait until `pod_labels` changed since ``pod_labels_generation`` ``after``;
        returns the new generation. What the endpoints follow for their identities."""
        while self.pod_labels_generation <= after:
            if self._pods_event is None:
                self._pods_event = anyio.Event()
            await self._pods_event.wait()
        return self.pod_labels_generation

    async def _deliver(self, reflector: Reflector, deltas: list[Delta], synced: bool) -> None:
        """A reflector's delivery: queued for the applier (waits when the queue is full)."""
        # A delivery that completes a list carries the list's version (the reflector sets
        # it before delivering): once applied, everything up to it has been processed.
        rv = reflector.health.resource_version if synced else ""
        list_rv = int(rv) if rv.isdigit() else 0
        size = _size(deltas)
        await self.queue.acquire(size)
        try:
            await self._send.send(_Item(reflector, deltas, synced, time.monotonic(), list_rv))
        except BaseException:
            self.queue.release(size)
            raise
        # A watch delivers in the server's order, so its last change has the highest
        # version; a list's pages do not, but its last delivery carries the list's version.
        top = max(list_rv, deltas[-1].version) if deltas else list_rv
        if top > self.received_rv.get(reflector.name, 0):
            self.received_rv[reflector.name] = top
            if self._received_event is not None:
                self._received_event.set()
                self._received_event = None

    async def wait_received(self, resource: str, resource_version: int | str) -> None:
        """Wait until a change of ``resource`` at ``resource_version`` (or later) has been
        delivered to the applier (queued, not necessarily applied yet): with `holding`,
        what a caller waits for before letting its changes go as one batch."""
        want = int(resource_version)
        while self.received_rv.get(resource, 0) < want:
            if self._received_event is None:
                self._received_event = anyio.Event()
            await self._received_event.wait()

    @contextlib.contextmanager
    def holding(self) -> Iterator[None]:
        """Hold the applier: what is delivered until the block ends is written as one
        batch (up to the batch size) after it, coalesced per object. Upstream's reflector
        buffer takes events that arrive together as one; a caller that writes several
        changes to the API server and wants them to reach the tables together (a test
        runner's ``k8s/delete`` then ``k8s/add``) writes them inside the block and waits
        for them with `wait_received`. Call it in the event loop's thread."""
        if self._release is None:
            self._release = anyio.Event()
        self._holds += 1
        try:
            yield
        finally:
            self._holds -= 1
            if self._holds == 0 and self._release is not None:
                release, self._release = self._release, None
                release.set()

    async def _apply_loop(self) -> None:
        """Take deliveries as they come and write them in batches: after the first, what
        arrives within ``batch_delay`` joins it, up to ``batch_size`` changes (and while
        the applier is held, what arrives until it is released); yield to the event loop
        after each batch."""
        cfg = self.config
        # The rest of a delivery larger than a batch, written first in the next batch.
        carry: _Item | None = None
        while True:
            limit = cfg.batch_size if self.synced else cfg.sync_batch_size
            first = carry if carry is not None else self._taken(await self._recv.receive())
            batch: list[_Item] = []
            carry = await self._gather(batch, first, limit, anyio.current_time() + cfg.batch_delay)
            while carry is None and self._release is not None:
                await self._release.wait()
                carry = await self._gather(batch, self._take_nowait(), limit, 0.0)
            self.apply_batch(batch)
            # Receiving does not yield while deliveries are queued: let the reconciler and
            # the reflectors run between two batches.
            await anyio.lowlevel.checkpoint()

    def _take_nowait(self) -> _Item | None:
        try:
            return self._taken(self._recv.receive_nowait())
        except anyio.WouldBlock:
            return None

    def _taken(self, item: _Item) -> _Item:
        """``item`` left the queue: its changes no longer count against the bound."""
        self.queue.release(_size(item.deltas))
        return item

    async def _gather(
        self, batch: list[_Item], item: _Item | None, limit: int, deadline: float
    ) -> _Item | None:
        """Add ``item`` and what arrives until ``deadline`` to ``batch``, up to ``limit``
        changes in all; returns the part of a delivery that did not fit (None if all did)."""
        size = sum(len(b.deltas) for b in batch)
        while item is not None:
            room = limit - size
            if room <= 0:
                return item
            if len(item.deltas) > room:
                head, rest = _split(item, room)
                batch.append(head)
                return rest
            batch.append(item)
            size += len(item.deltas)
            if size >= limit:
                return None
            item = self._take_nowait()
            if item is None:
                remaining = deadline - anyio.current_time()
                if remaining <= 0:
                    return None
                with anyio.move_on_after(remaining):
                    item = self._taken(await self._recv.receive())
        return None

    def apply_batch(self, batch: list[_Item], *, retrying: bool = False) -> None:
        """Write a batch in one transaction, one change per object (`coalesce`); objects
        the converter refuses are left out.

        Services and EndpointSlices are refused before anything is written (the converter
        converts first, and `LBWriter.upsert_service_and_frontends` checks for conflicts
        before writing), so a refused one is skipped and the transaction goes on. A Pod
        may be refused after some of its host-port services were written: then the
        transaction is aborted, the converter rolled back to a checkpoint taken before
        the batch, and the batch written again without it. The checkpoint copies the
        converter's whole memory (tens of milliseconds at 10,000 services), so it is taken
        only for batches with Pods, which are rare (this node's Pods only). A refused
        upsert that replaced a deletion of the same object in the batch is written as
        that deletion (its error stays): the old object is gone from the API server.

        An object refused for a frontend conflict may apply once the other service lets
        go of the address: after a batch that wrote a Service or Pod, the conflicting
        objects are tried again (``retrying``: that second pass does not retry again)."""
        newly_synced = {item.reflector.name for item in batch if item.synced}
        all_synced = (self._synced | newly_synced) >= {r.name for r in self.reflectors}
        kinds = {item.reflector.spec.kind for item in batch}
        written: list[tuple[Reflector, Delta]] | None = None
        wanted: list[tuple[Reflector, Delta]] = []
        one_each = _one_change_each(batch)
        if one_each and KIND_POD not in kinds and KIND_NODE not in kinds:
            # The usual batch, written as received: `written` (its changes in order) is
            # made below only when needed.
            with slice_addresses.holding():  # the converter's parsed addresses, to origins
                skip = refused = self._write_usual(batch, all_synced)
            count = sum(len(item.deltas) for item in batch)
        else:
            received = [(item.reflector, d) for item in batch for d in item.deltas]
            deleted: dict[int, Delta] = {}
            if one_each:
                wanted = received  # what `coalesce` gives back for it
            else:
                wanted, deleted = coalesce(received)
            with slice_addresses.holding():
                written, skip, refused = self._write_batch(
                    wanted, deleted, all_synced, KIND_POD in kinds
                )
            count = len(written)
        if all_synced:
            self._init_done = None
            self.synced = True
        self._synced |= newly_synced
        if written is None and (self.errors or self._conflicts):
            written = [(item.reflector, d) for item in batch for d in item.deltas]
        if self.errors or self._conflicts:
            assert written is not None
            for i, (r, d) in enumerate(written):
                if i not in refused:
                    self.errors.pop(f"{r.spec.kind} {d.key}", None)
                    self._conflicts.pop(f"{r.spec.kind} {d.key}", None)
        self.batches += 1
        self.applied += count - len(skip)
        committed = time.monotonic()
        for item in batch:
            self.apply_latency.add((committed - item.received) * 1000, len(item.deltas))
        self._note_applied_versions(batch)
        if KIND_NODE in kinds:
            self._note_node(batch, wanted)
        if KIND_POD in kinds:
            self._note_pod_labels(batch, wanted)
        if self.on_applied is not None and batch:
            self.on_applied(
                [d for item in batch for d in item.deltas], min(item.received for item in batch)
            )
        # Only a Service or Pod written (changed or deleted) can free an address.
        if (
            not retrying
            and self._conflicts
            and written is not None
            and any(
                r.spec.kind != "EndpointSlice" and r.spec.kind != KIND_NODE
                for i, (r, _) in enumerate(written)
                if i not in skip
            )
        ):
            now = time.monotonic()
            again = [_Item(r, [d], False, now) for r, d in self._conflicts.values()]
            self.apply_batch(again, retrying=True)

    def _write_usual(self, batch: list[_Item], all_synced: bool) -> set[int]:
        """`_write_batch` of a batch without Pods or Nodes, one change per object: what
        `coalesce` gives back as it is, and what needs no checkpoint (a Service or
        EndpointSlice is refused before anything of it is written). Writes the changes in
        order, item by item, without a pair per change; returns the positions (in the
        batch's order) refused and left out."""
        refused: set[int] = set()
        conv = self.converter
        origins = self.writer.origins
        recorder = OriginRecorder(origins) if origins is not None else None
        upsert = _kind_upserts(conv)
        # The objects upserted, their origins recorded together before the commit.
        upserted: list[Mapping[str, Any]] = []
        add_upserted = upserted.append
        txn = self.writer.write_txn()
        try:
            start = 0  # the position of the item's first change in the batch
            for item in batch:
                r = item.reflector
                changes = iter(item.deltas)
                while True:
                    try:
                        for d in changes:
                            # An upsert the converter writes, by the object's kind (as
                            # `K8sConverter.upsert` dispatches), inline.
                            obj = d.obj
                            kind = obj.get("kind") if d.op == "upsert" else None
                            if type(kind) is str and kind in upsert:
                                upsert[kind](txn, obj)
                                add_upserted(obj)
                            else:
                                self._apply_one(txn, r, d, upserted, recorder)
                        break
                    except INPUT_ERRORS as e:
                        # Refused: left out (`_write_batch` does the same), and the
                        # item's next changes written.
                        refused.add(start + _position(item.deltas, d))
                        self._refused(r, d, e)
                start += len(item.deltas)
            if recorder is not None and upserted:
                recorder.record_many(txn, upserted, SOURCE_K8S)
            if all_synced and self._init_done is not None:
                # The last initial list is in this transaction: pruning may start.
                self._init_done(txn)
        except BaseException:
            txn.abort()
            raise
        txn.commit()
        return refused

    def _refused(self, r: Reflector, d: Delta, e: Exception) -> None:
        """A change of a batch without Pods refused with ``e`` (`_write_usual`): its error
        recorded; `SourceError` when it may be half-written, as `_write_batch` raises
        without a checkpoint."""
        self._record_error(r, d, str(e))
        if isinstance(e, FrontendConflictError):
            self._conflicts[f"{r.spec.kind} {d.key}"] = (r, d)
        if r.spec.kind not in _REFUSED_BEFORE_WRITING or not isinstance(e, CLEAN_ERRORS):
            raise SourceError(
                f"{r.spec.kind} {d.key} refused after a partial write "
                f"({type(e).__name__}: {e}); the source must be restarted"
            ) from e

    def _write_batch(
        self,
        wanted: list[tuple[Reflector, Delta]],
        deleted: dict[int, Delta],
        all_synced: bool,
        pods: bool,
    ) -> tuple[list[tuple[Reflector, Delta]], set[int], set[int]]:
        """The transaction of `apply_batch`: what was written (``wanted`` with refused
        upserts replaced by their batch's deletion), the positions left out, and the
        positions refused (left out, or written as the deletion). ``pods``: whether
        ``wanted`` holds changes of Pods."""
        deltas = list(wanted)
        deleted = dict(deleted)
        skip: set[int] = set()
        refused: set[int] = set()
        conv = self.converter
        origins = self.writer.origins
        recorder = OriginRecorder(origins) if origins is not None else None
        upsert = _kind_upserts(conv)
        n = len(deltas)
        while True:
            with_pods = pods and any(
                r.spec.kind == KIND_POD for i, (r, _) in enumerate(deltas) if i not in skip
            )
            cp = conv.checkpoint() if with_pods else None
            txn = self.writer.write_txn()
            redo = False
            # The objects upserted, their origins recorded together before the commit.
            upserted: list[Mapping[str, Any]] = []
            add_upserted = upserted.append
            try:
                i = 0
                while i < n and not redo:
                    r, d = deltas[i]
                    if skip and i in skip:
                        i += 1
                        continue
                    try:
                        # The usual change, inline: an upsert the converter writes, by
                        # the object's kind (as `K8sConverter.upsert` dispatches).
                        obj = d.obj
                        kind = obj.get("kind") if d.op == "upsert" else None
                        if type(kind) is str and kind in upsert and r.spec.kind != KIND_NODE:
                            upsert[kind](txn, obj)
                            add_upserted(obj)
                        else:
                            self._apply_one(txn, r, d, upserted, recorder)
                    except INPUT_ERRORS as e:
                        refused.add(i)
                        self._record_error(r, d, str(e))
                        if isinstance(e, FrontendConflictError):
                            self._conflicts[f"{r.spec.kind} {d.key}"] = (r, d)
                        gone = deleted.pop(i, None)
                        if gone is not None:
                            deltas[i] = (r, gone)  # written instead, now or in the redo
                        else:
                            skip.add(i)
                        clean = r.spec.kind in _REFUSED_BEFORE_WRITING and isinstance(
                            e, CLEAN_ERRORS
                        )
                        if clean:
                            if gone is None:
                                i += 1
                            continue  # else the deletion in its place is written next
                        if cp is None:
                            # Possibly half-written, and no checkpoint to undo the batch's
                            # earlier objects in the converter: stop rather than diverge.
                            raise SourceError(
                                f"{r.spec.kind} {d.key} refused after a partial write "
                                f"({type(e).__name__}: {e}); the source must be restarted"
                            ) from e
                        redo = True
                        continue
                    i += 1
                if not redo and recorder is not None and upserted:
                    recorder.record_many(txn, upserted, SOURCE_K8S)
                if not redo and all_synced and self._init_done is not None:
                    # The last initial list is in this transaction: pruning may start.
                    self._init_done(txn)
            except BaseException:
                txn.abort()
                if cp is not None:
                    conv.rollback(cp)
                raise
            if redo:
                txn.abort()
                assert cp is not None
                conv.rollback(cp)
                continue
            txn.commit()
            return deltas, skip, refused

    def _note_applied_versions(self, batch: list[_Item]) -> None:
        """After a committed batch: the versions it processed (coalesced changes included)
        into `applied_rv`; wake `wait_applied` waiters."""
        for item in batch:
            top = max([d.version for d in item.deltas], default=0)
            name = item.reflector.name
            if top > self.applied_rv.get(name, 0):
                self.applied_rv[name] = top
        # A completed list covers every change up to its version, including deletions it
        # found (delivered as stubs without a resourceVersion) and changes it found none
        # for: without this a waiter for such a change's version would wait forever.
        for item in batch:
            name = item.reflector.name
            if item.list_rv > self.applied_rv.get(name, 0):
                self.applied_rv[name] = item.list_rv
        if self._applied_event is not None:
            self._applied_event.set()
            self._applied_event = None

    def _note_node(self, batch: list[_Item], deltas: list[tuple[Reflector, Delta]]) -> None:
        """After a committed batch: remember the Node it changed (refused or not: its pod
        CIDRs do not depend on its labels) and wake `wait_node` waiters."""
        changed = False
        for r, d in deltas:
            if r.spec.kind == KIND_NODE:
                self.node = d.obj if d.op == "upsert" else None
                changed = True
        for item in batch:
            if item.synced and item.reflector.spec.kind == KIND_NODE:
                changed = True
        if changed:
            self.node_generation += 1
            if self._node_event is not None:
                self._node_event.set()
                self._node_event = None

    def _note_pod_labels(self, batch: list[_Item], deltas: list[tuple[Reflector, Delta]]) -> None:
        """After a committed batch: the Pods' labels it delivered (refused or not) into
        `pod_labels`; wake `wait_pod_labels` waiters when they changed."""
        changed = False
        for r, d in deltas:
            if r.spec.kind != KIND_POD:
                continue
            if d.op == "upsert":
                uid = (d.obj.get("metadata") or {}).get("uid")
                if isinstance(uid, str) and uid:
                    self.pod_uids[d.key] = uid
                raw = (d.obj.get("metadata") or {}).get("labels") or {}
                labels = (
                    {str(k): str(v) for k, v in raw.items()} if isinstance(raw, Mapping) else {}
                )
                if self.pod_labels.get(d.key) != labels:
                    self.pod_labels[d.key] = labels
                    changed = True
                ports = pod_named_ports(d.obj)
                if self.pod_ports.get(d.key) != ports:
                    self.pod_ports[d.key] = ports
                    changed = True
            else:
                if self.pod_ports.pop(d.key, None) is not None:
                    changed = True
                self.pod_uids.pop(d.key, None)
                if self.pod_labels.pop(d.key, None) is not None:
                    changed = True
        for item in batch:
            if item.synced and item.reflector.spec.kind == KIND_POD:
                changed = True
        if changed:
            self.pod_labels_generation += 1
            if self._pods_event is not None:
                self._pods_event.set()
                self._pods_event = None

    def _apply_one(
        self,
        txn: WriteTxn,
        r: Reflector,
        d: Delta,
        upserted: list[Mapping[str, Any]],
        recorder: OriginRecorder | None,
    ) -> None:
        """Write one change: a Node's labels, or an object through the converter. The
        object of an upsert is appended to ``upserted`` once written (its origin is
        recorded with the batch's others); a deletion forgets its origin at once."""
        if d.op == "upsert" and r.spec.kind != KIND_NODE:
            obj = d.obj
            self.converter.upsert(txn, obj)
            upserted.append(obj)
            return
        if r.spec.kind == KIND_NODE:
            labels: Mapping[str, Any] = {}
            if d.op == "upsert":
                raw = (d.obj.get("metadata") or {}).get("labels") or {}
                labels = (
                    {str(k): str(v) for k, v in raw.items()} if isinstance(raw, Mapping) else {}
                )
            self.writer.set_node_labels(txn, labels)
            return
        self.converter.delete(txn, d.obj)
        if recorder is not None:
            recorder.forget(txn, d.obj)

    def _record_error(self, r: Reflector, d: Delta, message: str) -> None:
        key = f"{r.spec.kind} {d.key}"
        if self.errors.get(key) != message:
            log.error("k8s source: %s", message)
        self.errors[key] = message

    # ----- health ---------------------------------------------------------------------------
    def health(self) -> list[tuple[str, bool, str]]:
        """(resource, ok, message) per reflector, then one line for refused objects."""
        out: list[tuple[str, bool, str]] = []
        now = time.time()
        for r in self.reflectors:
            h = r.health
            synced = "synced" if h.synced else "not synced"
            if h.state == BACKING_OFF:
                ago = _ago(now - h.error_since)
                out.append((r.name, False, f"backing off ({synced}); since {ago}: {h.last_error}"))
            elif h.state == LISTING:
                out.append((r.name, True, f"listing ({synced})"))
            elif h.state == WATCHING:
                out.append(
                    (r.name, True, f"watching ({synced}, resourceVersion {h.resource_version})")
                )
            elif h.state == STOPPED:
                out.append((r.name, False, "stopped"))
        if self.errors:
            first = sorted(self.errors)[0]
            out.append(
                (
                    "objects",
                    False,
                    f"{len(self.errors)} object(s) refused, e.g. {self.errors[first]}",
                )
            )
        return out


def coalesce(
    deltas: Iterable[tuple[Reflector, Delta]],
) -> tuple[list[tuple[Reflector, Delta]], dict[int, Delta]]:
    """A batch's changes with one change per object (resource and ``namespace/name``):
    the last one, in the place of the first (an insertion-ordered map, as upstream's
    reflector buffer). Changes to different objects keep their order, so a Service
    deleted before another takes over its address is still deleted first.

    Also returns, by position in the result, the deletion that preceded an upsert of the
    same object in the batch: when that upsert is refused the object is gone all the
    same (the API server deleted it), so the applier applies the deletion instead."""
    pairs = list(deltas)
    if len({(r.name, d.key) for r, d in pairs}) == len(pairs):
        return pairs, {}  # the usual batch: one change per object already
    slots: dict[tuple[str, str], int] = {}
    out: list[tuple[Reflector, Delta]] = []
    deleted: dict[int, Delta] = {}
    for r, d in pairs:
        key = (r.name, d.key)
        i = slots.get(key)
        if i is None:
            slots[key] = len(out)
            out.append((r, d))
            continue
        prev = out[i][1]
        if d.op == "upsert" and prev.op == "delete":
            deleted[i] = prev
        elif d.op == "delete":
            deleted.pop(i, None)
        out[i] = (r, d)
    return out, deleted


def _one_change_each(batch: list[_Item]) -> bool:
    """Whether no object has two changes in ``batch`` (the usual batch: `coalesce` would
    give its changes back as they are), told without a pair per change."""
    if len(batch) == 1:  # one delivery (a list page): its keys, one resource
        deltas = batch[0].deltas
        return len({d.key for d in deltas}) == len(deltas)
    keys: dict[str, set[str]] = {}
    n = 0
    for item in batch:
        seen = keys.get(item.reflector.name)
        if seen is None:
            seen = keys[item.reflector.name] = set()
        seen.update([d.key for d in item.deltas])
        n += len(item.deltas)
    return sum(map(len, keys.values())) == n


def _position(deltas: list[Delta], d: Delta) -> int:
    """The position of ``d`` (that very object) in ``deltas``."""
    return next(i for i, x in enumerate(deltas) if x is d)


def _kind_upserts(conv: K8sConverter) -> dict[str, Callable[[WriteTxn, Any], None]]:
    """Kind -> the converter's upsert of that kind, for the kinds `K8sConverter.upsert`
    hands on as they are (Services and EndpointSlices): the applier calls them directly.
    Empty for a converter with an ``upsert`` of its own."""
    if getattr(type(conv), "upsert", None) is not K8sConverter.upsert:
        return {}
    return {KIND_SERVICE: conv.upsert_service, KIND_ENDPOINT_SLICE: conv.upsert_endpoint_slice}


def pod_named_ports(pod: Mapping[str, Any]) -> tuple[NamedPort, ...]:
    """The named ports of a Pod's containers (``spec.containers[*].ports``); a malformed
    port list is logged and gives none (the Pod's other uses are unaffected)."""
    spec = pod.get("spec")
    containers = spec.get("containers") if isinstance(spec, Mapping) else None
    ports: list[Any] = []
    for c in containers if isinstance(containers, list) else []:
        if isinstance(c, Mapping) and isinstance(c.get("ports"), list):
            ports.extend(c["ports"])
    try:
        return parse_named_ports(ports, "spec.containers[*].ports")
    except ValueError as e:
        log.warning("Pod %s: named ports not used: %s", object_key(pod), e)
        return ()


def _size(deltas: list[Delta]) -> int:
    """What a delivery counts against the queue's bound (an empty one still takes a place)."""
    return max(len(deltas), 1)


def _split(item: _Item, n: int) -> tuple[_Item, _Item]:
    """The first ``n`` (at least one) deltas of a delivery, and the rest: the rest carries
    the delivery's ``synced`` and list version, which hold once all of it is applied."""
    n = max(n, 1)
    head = _Item(item.reflector, item.deltas[:n], False, item.received)
    tail = _Item(item.reflector, item.deltas[n:], item.synced, item.received, item.list_rv)
    return head, tail


def _ago(seconds: float) -> str:
    if seconds < 60:
        return f"{math.floor(seconds)}s ago"
    return f"{math.floor(seconds / 60)}m ago"
