"""FrontendOps: the reconciler Operations that write frontends into Cilium's LB maps.

For each frontend (``bpfops.model.FrontendSpec``) the ops keep these entries right:

* services map: slots ``1..N`` hold the backend ids in a stable order (healthy before
  unhealthy, then by state - active, terminating (serving before not serving),
  quarantined - then address and port; maintenance backends get no slot); the master
  slot 0, written *last*, holds the active count, the inactive count (``qcount``), the
  flags, the algorithm and the affinity timeout. Serving terminating backends count as
  active only when no active backend is left; terminating backends that no longer serve
  stay in the inactive tail.
  Slots beyond a shrunk backend list are deleted after the new master is in place.
* backends map: one entry per backend address, shared by every frontend that uses it
  (reference counted) and deleted with its id released when the last reference goes.
* rev-NAT map: service id -> frontend address (rev-NAT id = service id).
* affinity match entries for active backends of session-affinity services.
* source-range LPM entries (and the flags) for LoadBalancer/ExternalIPs frontends, or all
  types with ``source_range_all_types``.
* maglev inner tables for frontends whose algorithm is maglev.
* wildcard entries ``<vip>:0/ANY`` (id 0) for ClusterIP/LoadBalancer VIPs, shared by the
  VIP's frontends, unless disabled or the VIP is a local node address.
* NodePort (and HostPort without host IP) frontends are expanded over the node addresses
  that have the NodePort flag, in addition to the ``0.0.0.0``/``::`` surrogate entry.

Every operation is idempotent and records state only after the map writes it depends on
succeeded, so a failure part-way (E2BIG, injected faults) is repaired by the retry.
Errors are raised as ``LBOpsError`` naming the frontend and the step.

As the reconciler's ``BatchOperations``, ``update_batch`` writes a whole round map by map
(every backend entry, every slot, every rev-NAT entry, every master: one batch call each)
and gives each frontend its own result; see docs/bpf.md for the order and what a batch
stopping part way fails.

``prune`` removes whatever the state does not explain: unknown service keys and slots,
backends, rev-NAT, affinity, source-range and maglev entries, and wildcard entries without
a parent; it also releases restored ids nobody claimed.

A restart restores ids from the maps, and takes a backend in a frontend's inactive tail
whose backends-map entry says active for quarantined (unhealthy before the restart): it
stays in the tail until a health check reports on it, as long as the frontend lists it
as active. Listed in another state (terminating, not serving, maintenance) it was in the
tail for that reason, not quarantined, and the restored quarantine no longer applies:
once ready it is active and load-balanced.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from dataclasses import replace
from typing import Generic, Protocol, TypeVar

from bpf import lb
from bpf.backend import MapBackend
from bpf.errors import BatchError, MapError
from bpfops import flags as svcflags
from bpfops.backend_states import (
    BELOW_WRITTEN,
    FIELD_MASK,
    ID_MASK,
    NEW_ENTRY,
    NONE,
    NOT_WANT,
    REF_MASK,
    REF_ONE,
    REF_SHIFT,
    WANT_SHIFT,
    WRITTEN_SHIFT,
    BackendStates,
)
from bpfops.frontend_restore import prune_maps, restore_ids
from bpfops.frontend_state import (
    ABSENT,
    EMPTY,
    WANTS,
    CollectedWrites,
    FrontendState,
    PendingFrontend,
    backend_bytes,
    delete_counted,
    swap16,
    want_of,
    write_counted,
    write_entries,
)
from bpfops.ids import (
    BACKEND_ID_LIMIT,
    FIRST_BACKEND_ID,
    FIRST_SERVICE_ID,
    SERVICE_ID_LIMIT,
    IDAllocator,
    IDExhaustedError,
)
from bpfops.lb_maps import LBMaps, delete_quiet
from bpfops.maglev import Maglev, MaglevBackend, hash_string
from bpfops.maps_dump import AFFINITY_TIMEOUT_MASK, LB_ALG_NUMBERS, LB_ALG_SHIFT, dump_lines
from bpfops.model import (
    CLUSTER_IP,
    EXTERNAL_IPS,
    HOST_PORT,
    LOAD_BALANCER,
    NODE_PORT,
    PROTO_NUMBERS,
    SCOPE_INTERNAL,
    Addr,
    BackendSpec,
    FrontendSpec,
    IPAddress,
    LBOpsConfig,
    proto_number,
)
from bpfops.wildcards import WildcardEntries
from reconciler.operations import BatchEntry
from statedb import ReadTxn
from statedb.errors import StatewrightError

log = logging.getLogger("statewright.bpfops")

R = TypeVar("R")

BACKEND_ACTIVE = lb.BACKEND_ACTIVE
BACKEND_TERMINATING = lb.BACKEND_TERMINATING
BACKEND_QUARANTINED = lb.BACKEND_QUARANTINED
BACKEND_MAINTENANCE = lb.BACKEND_MAINTENANCE


class LBOpsError(StatewrightError, RuntimeError):
    """A frontend could not be written; the message names the frontend and the step."""


class NodeView(Protocol):
    """What the ops need to know about the node (from the node-addresses/frontends tables)."""

    def nodeport_addresses(self, txn: ReadTxn, v6: bool) -> list[IPAddress]:
        """Node addresses NodePort/HostPort frontends of family ``v6`` are expanded over."""
        ...

    def is_local_address(self, txn: ReadTxn, ip: IPAddress) -> bool:
        """Whether ``ip`` is one of the node's addresses (no wildcard entry for it)."""
        ...

    def is_primary_frontend(self, txn: ReadTxn, addr: Addr) -> bool:
        """Whether a non-expansion frontend (LB, ExternalIP...) owns ``addr``."""
        ...

    # Optional: ``backend_referenced(txn, be_addr, other_than) -> bool``, whether another
    # frontend of the snapshot selects the backend (keeps its entry and id alive while
    # that frontend is still to be written).
    # Optional: ``frontend_type(txn, addr) -> str | None``, the type of the frontend the
    # snapshot has at ``addr`` (None: none). A deletion of a frontend whose address the
    # snapshot holds again (replaced by another service's frontend in the same batch)
    # then keeps the address's entries and ids for the update that follows.


class StaticNodeView:
    """A NodeView over a fixed list of NodePort addresses (tests, tools)."""

    def __init__(self, nodeport: Iterable[IPAddress] = (), local: Iterable[IPAddress] = ()):
        self.nodeport = list(nodeport)
        self.local = set(local) | set(self.nodeport)
        self.primary: set[Addr] = set()
        self.referenced: set[Addr] = set()
        #: Frontends "in the snapshot" (address -> type), for `frontend_type`.
        self.present: dict[Addr, str] = {}

    def nodeport_addresses(self, txn: ReadTxn, v6: bool) -> list[IPAddress]:
        """The configured addresses of the family."""
        return [ip for ip in self.nodeport if (ip.version == 6) == v6]

    def is_local_address(self, txn: ReadTxn, ip: IPAddress) -> bool:
        """Membership in the configured local addresses."""
        return ip in self.local

    def is_primary_frontend(self, txn: ReadTxn, addr: Addr) -> bool:
        """Membership in ``primary``."""
        return addr in self.primary

    def backend_referenced(self, txn: ReadTxn, be_addr: Addr, other_than: Addr) -> bool:
        """Membership in ``referenced``."""
        return be_addr in self.referenced

    def frontend_type(self, txn: ReadTxn, addr: Addr) -> str | None:
        """The type recorded in ``present``."""
        return self.present.get(addr)


class FrontendOps(Generic[R]):
    """reconciler Operations (update/delete/prune) for frontend rows of type ``R``.

    ``to_spec(txn, row)`` turns a row into a FrontendSpec (see bpfops.adapter for the
    tables' rows); rows that are already FrontendSpec pass through when it is omitted.
    ``key_of(row)`` gives a row's frontend address cheaply for prune (else ``to_spec``).
    """

    def __init__(
        self,
        maps: LBMaps,
        config: LBOpsConfig | None = None,
        node: NodeView | None = None,
        to_spec: Callable[[ReadTxn, R], FrontendSpec] | None = None,
        key_of: Callable[[R], Addr] | None = None,
        maglev: Maglev | None = None,
        restore: bool = True,
    ) -> None:
        self.maps = maps
        self.config = config or LBOpsConfig()
        self.node: NodeView = node or StaticNodeView()
        self._to_spec = to_spec
        self._key_of = key_of
        self.maglev = maglev or Maglev(maps.maglev_table_size, self.config.maglev_hash_seed)
        if self.maglev.table_size != maps.maglev_table_size:
            raise ValueError(
                f"maglev table size {self.maglev.table_size} differs from the maps' "
                f"{maps.maglev_table_size}"
            )
        self.service_ids: IDAllocator[Addr] = IDAllocator(
            "service", FIRST_SERVICE_ID, SERVICE_ID_LIMIT
        )
        self.frontends: dict[Addr, FrontendState] = {}
        self.backend_states = BackendStates()
        # The backend states are the allocator's record of which address holds which id.
        self.backend_ids: IDAllocator[Addr] = IDAllocator(
            "backend", FIRST_BACKEND_ID, BACKEND_ID_LIMIT, self.backend_states
        )
        self.wildcards = WildcardEntries(maps, self.config)
        # Wildcard entry -> the ids of the frontends using it (the same dict, for callers).
        self.wildcard_refs = self.wildcards.refs
        self.expansions: dict[Addr, list[Addr]] = {}
        self.restored_quarantined: dict[Addr, set[Addr]] = {}
        self.prune_count = 0
        if restore:
            self.reset_and_restore()

    # -- restore ---------------------------------------------------------------------

    def reset_and_restore(self, attempts: int = 10) -> None:
        """Forget all state, then reserve the ids found in the maps (restart model).

        Reading the maps is retried (``attempts`` times) when it fails transiently.
        """
        for attempt in range(attempts):
            try:
                restore_ids(self)
                return
            except MapError:
                if attempt == attempts - 1:
                    raise
                log.warning("bpfops: restoring ids from the maps failed, retrying", exc_info=True)

    # -- reconciler Operations ---------------------------------------------------------

    def spec_of(self, txn: ReadTxn, obj: R) -> FrontendSpec:
        """The FrontendSpec of a row."""
        if self._to_spec is None:
            if isinstance(obj, FrontendSpec):
                return obj
            raise TypeError(f"FrontendOps got {type(obj).__name__} and has no to_spec")
        return self._to_spec(txn, obj)

    def update(self, txn: ReadTxn, revision: int, obj: R) -> None:
        """Write the frontend (and its NodePort expansion) into the maps."""
        fe = self.spec_of(txn, obj)
        self.update_spec(txn, fe)

    def delete(self, txn: ReadTxn, revision: int, obj: R) -> None:
        """Remove the frontend (and its expansion) from the maps, unless the snapshot holds
        a frontend at the same address again (see `delete_replaced`)."""
        fe = self.spec_of(txn, obj)
        lookup = getattr(self.node, "frontend_type", None)
        new_type = lookup(txn, fe.addr) if lookup is not None else None
        if new_type is None:
            self.delete_spec(txn, fe)
        else:
            self.delete_replaced(txn, fe, new_type)

    def delete_replaced(self, txn: ReadTxn, fe: FrontendSpec, new_type: str) -> None:
        """``fe`` was deleted and its address inserted again (another service took it over,
        e.g. a pod recreated under a new UID, in one batch). The address stays programmed
        with its service id: the update of the new frontend, which follows in the change
        stream, rewrites its entries in place. Only what the new frontend will not rewrite
        goes now: the node-address expansion when the new type has none, the wildcard
        entry when the new type has none."""
        if not self._enabled(fe.addr):
            return
        if self._is_expansion(fe) and not self._is_expansion(
            FrontendSpec(fe.addr, new_type, fe.service)
        ):
            for addr in list(self.expansions.get(fe.addr, ())):
                if self.node.is_primary_frontend(txn, addr):
                    continue
                try:
                    self._delete_frontend(txn, addr)
                except MapError as exc:
                    raise LBOpsError(
                        f"frontend {addr} (expansion of replaced {fe.addr}): delete: {exc}"
                    ) from exc
            self.expansions.pop(fe.addr, None)
        state = self.frontends.get(fe.addr)
        if state is not None and new_type not in (CLUSTER_IP, LOAD_BALANCER):
            try:
                self.wildcards.delete(fe.addr, state)
            except MapError as exc:
                raise LBOpsError(f"frontend {fe.addr} (replaced): wildcard: {exc}") from exc

    # -- reconciler BatchOperations -------------------------------------------------

    def update_batch(self, txn: ReadTxn, batch: list[BatchEntry[R]]) -> None:
        """Write a round's frontends with one batch call per map: the backend entries of
        every frontend, then their slots, then (per frontend) maglev and source ranges,
        then every rev-NAT entry, then every master, so that no master points at a slot or
        backend not yet written. Each entry's ``result`` is its LBOpsError, if any.

        A batch that stops part way fails the frontends whose entries were not written
        (a backend entry shared by several frontends fails all of them); their recorded
        state is put back so that the retry writes those entries again.

        Frontends a round cannot batch go through `update_spec`, in their place in the
        batch (the frontends collected before them are written first, so ids are
        allocated in the batch's order, as per-object updates allocate them): NodePort
        expansions, frontends that are disabled or not in the datapath, frontends that
        drop a shared backend (dropping it may rewrite its entry, which must come after
        the round's write of it), frontends that drop backends while the backends map
        may lack room for the round's new entries, and a second entry for an address in
        the round.

        A backend a frontend of the round drops that no other frontend references is
        deleted after that frontend's master (`_write_round`): a backend entry never
        goes while a slot the master counts points at it.
        """
        round_: list[tuple[BatchEntry[R], PendingFrontend]] = []
        seen: set[Addr] = set()
        # Backend entries the round may add before its orphans go (every backend of each
        # frontend counted: an upper bound), against the room left in the maps.
        adding = 0
        room = self._backend_room()
        for entry in batch:
            try:
                fe = self.spec_of(txn, entry.obj)
            except Exception as exc:
                entry.result = exc
                continue
            drops = self._drops(fe)
            adding += len(fe.backends)
            if (
                drops is None
                or (drops and adding > room)
                or fe.addr in seen
            ):
                if round_:
                    self._write_round(txn, round_)
                    round_ = []
                    seen.clear()
                try:
                    self.update_spec(txn, fe)
                except Exception as exc:
                    entry.result = exc
                adding = 0
                room = self._backend_room()
                continue
            seen.add(fe.addr)
            orphans: list[tuple[Addr, int]] | None = [] if drops else None
            try:
                pending = self._prepare_frontend(
                    txn, fe, lambda ip: self.node.is_local_address(txn, ip), orphans
                )
            except Exception as exc:
                entry.result = (
                    _fe_error(fe, exc)
                    if isinstance(exc, (MapError, ValueError, IDExhaustedError))
                    else exc
                )
                if orphans:
                    # As `update_spec` would have: gone before the frontend's writes.
                    self._delete_orphans(txn, [(fe.addr, a, i) for a, i in orphans])
                continue
            round_.append((entry, pending))
        if round_:
            self._write_round(txn, round_)

    def delete_batch(self, txn: ReadTxn, batch: list[BatchEntry[R]]) -> None:
        """Delete each entry's frontend as `delete` does, one after the other (deletions are
        not batched); each entry's ``result`` is its error, if any."""
        for entry in batch:
            try:
                self.delete(txn, entry.revision, entry.obj)
            except Exception as exc:
                entry.result = exc

    def _batchable(self, fe: FrontendSpec) -> bool:
        """Whether `update_batch` may write ``fe`` in its round (room in the maps aside)."""
        return self._drops(fe) is not None

    def _drops(self, fe: FrontendSpec) -> bool | None:
        """None when `update_batch` writes ``fe`` on its own (see there); else whether the
        frontend drops backends (each then referenced by this frontend alone)."""
        if not self._enabled(fe.addr) or not self._is_candidate(fe) or self._is_expansion(fe):
            return None
        state = self.frontends.get(fe.addr)
        if state is None or not state.backends:
            return False
        have = state.backends
        if len(have) == len(fe.backends) and all(be.addr in have for be in fe.backends):
            return False
        wanted = {be.addr for be in fe.backends}
        states = self.backend_states
        drops = False
        for a in have:
            if a in wanted:
                continue
            drops = True
            if a in states and (states.refcount(a) > 1 or states.is_shared(a)):
                return None
        return drops

    def _backend_room(self) -> int:
        """Free backend entries in the fuller of the two backends maps, at least (entries
        the state holds counted against each)."""
        maps = self.maps
        capacity = min(
            maps.backends(False).backend.spec.max_entries,
            maps.backends(True).backend.spec.max_entries,
        )
        return capacity - len(self.backend_states)

    def _write_round(
        self, txn: ReadTxn, round_: list[tuple[BatchEntry[R], PendingFrontend]]
    ) -> None:
        """Write prepared frontends map by map (see `update_batch`), then delete the backends
        they orphaned; failures go to the entries' ``result``."""
        maps = self.maps
        for v6 in (False, True):
            live = [(e, p) for e, p in round_ if p.state.v6 == v6 and e.result is None]
            if not live:
                continue
            # Backend entries of every frontend.
            keys: list[bytes] = []
            values: list[bytes] = []
            be_undo: list[tuple[Addr, int | None]] = []
            for _, p in live:
                keys += p.writes.be_keys
                values += p.writes.be_values
                be_undo += p.writes.be_undo
            done, exc = write_counted(maps.backends(v6).backend, keys, values)
            if exc is not None:
                lost: set[Addr] = set()
                states = self.backend_states
                for be_addr, previous in reversed(be_undo[done:]):
                    if be_addr in states:
                        states.set_written(be_addr, previous)
                    lost.add(be_addr)
                for e, p in live:
                    if not lost.isdisjoint(p.state.backends):
                        p.writes.undo(len(p.writes.be_undo), 0)
                        e.result = _fe_error(p.fe, exc)
                live = [(e, p) for e, p in live if e.result is None]
            # Their slots.
            keys, values = [], []
            for _, p in live:
                keys += p.writes.svc_keys
                values += p.writes.svc_values
            svc_raw = maps.services(v6).backend
            done, exc = write_counted(svc_raw, keys, values)
            if exc is not None:
                offset = 0
                for e, p in live:
                    n = len(p.writes.svc_keys)
                    if offset + n > done:
                        p.writes.undo(len(p.writes.be_undo), max(0, done - offset))
                        e.result = _fe_error(p.fe, exc)
                    offset += n
                live = [(e, p) for e, p in live if e.result is None]
            # Maglev tables and source ranges, per frontend.
            for e, p in live:
                try:
                    self._write_side_entries(p)
                except (MapError, ValueError) as exc2:
                    e.result = _fe_error(p.fe, exc2)
            live = [(e, p) for e, p in live if e.result is None]
            # Rev-NAT entries.
            entries = [self._revnat_entry(p) for _, p in live]
            done, exc = write_counted(
                maps.revnat(v6).backend, [k for k, _ in entries], [v for _, v in entries]
            )
            for i, (e, p) in enumerate(live):
                if i < done:
                    p.state.revnat = True
                else:
                    e.result = _fe_error(p.fe, exc or MapError("revnat", "update", 0))
            live = live[:done]
            # Masters (a frontend without a master yet first loses stale slots), each
            # followed by the wildcard entry of a VIP that has none yet.
            keys, values = [], []
            owners: list[int] = []  # keys[j] belongs to ready[owners[j]]
            ready: list[tuple[BatchEntry[R], PendingFrontend]] = []
            ready_masters: list[bytes] = []
            new_wildcard: list[bool] = []
            queued: set[tuple[IPAddress, int]] = set()
            for e, p in live:
                try:
                    key, master = self._master_entry(p)
                except MapError as exc2:
                    e.result = _fe_error(p.fe, exc2)
                    continue
                keys.append(key)
                values.append(master)
                owners.append(len(ready))
                wildcard = self.wildcards.new_entry(p)
                if wildcard is not None and wildcard[0] not in queued:
                    queued.add(wildcard[0])
                    keys.append(wildcard[1])
                    values.append(wildcard[2])
                    owners.append(len(ready))
                    new_wildcard.append(True)
                else:
                    new_wildcard.append(False)
                ready.append((e, p))
                ready_masters.append(master)
            done, exc = write_counted(svc_raw, keys, values)
            complete = owners[done] if done < len(owners) else len(ready)
            for j in range(done):
                if j == 0 or owners[j] != owners[j - 1]:  # the owner's master
                    ready[owners[j]][1].state.master = values[j]
            for i, (e, p) in enumerate(ready):
                if i >= complete:
                    e.result = _fe_error(p.fe, exc or MapError("services", "update", 0))
                    continue
                try:
                    self._after_master(p, ready_masters[i], new_wildcard[i])
                except MapError as exc2:
                    e.result = _fe_error(p.fe, exc2)
            # After the masters: a written master counts only its new slots (written before
            # it), so no slot it counts points at its frontend's orphans. Orphans of
            # frontends that failed go too, as `update_spec` deletes them before writing.
            orphans = [
                (p.fe.addr, a, i) for _, p in round_ if p.state.v6 == v6 for a, i in p.orphans
            ]
            if orphans:
                self._delete_orphans(txn, orphans)

    def _delete_orphans(self, txn: ReadTxn, orphans: list[tuple[Addr, Addr, int]]) -> None:
        """Delete the entries of backends the round's frontends dropped (after their masters)
        that still have no reference, with one batch call per map, and release their ids.
        One a frontend of the round took up again stays; one another frontend of the
        snapshot selects stays unreferenced (see `_drop_reference`). Orphans of frontends
        whose master was not written stay unreferenced too: prune drops them.

        A failed delete leaves the backend unreferenced (prune deletes it) and is logged:
        the frontends it served are written, so their rows are Done.

        Each orphan is (frontend address, backend address, the backend's id when it was
        orphaned): an entry deleted and made again since, with another id, is not it."""
        states = self.backend_states
        referenced = getattr(self.node, "backend_referenced", None)
        gone: dict[bool, list[tuple[Addr, int]]] = {}
        for fe_addr, be_addr, be_id in orphans:
            if (
                states.get(be_addr) != be_id
                or states.refcount(be_addr) > 0
                or states.has_wants(be_addr)
            ):
                continue
            if referenced is not None and referenced(txn, be_addr, fe_addr):
                continue
            gone.setdefault(be_addr.is_v6, []).append((be_addr, be_id))
        pack = lb.U32_STRUCT.pack
        for v6, entries in gone.items():
            done, exc = delete_counted(
                self.maps.backends(v6).backend, [pack(i) for _, i in entries]
            )
            for be_addr, _ in entries[:done]:
                self.backend_ids.release(be_addr)
                states.remove(be_addr)
            if exc is not None:
                log.warning(
                    "bpfops: %d orphaned backend(s) left for prune: %s", len(entries) - done, exc
                )

    def prune(self, txn: ReadTxn, objects: Iterator[R]) -> None:
        """Remove everything the given rows (all desired frontends) do not explain."""
        wanted: set[Addr] = set()
        for obj in objects:
            try:
                key = self._key_of(obj) if self._key_of else self.spec_of(txn, obj).addr
            except Exception:  # a malformed row keeps no entries; its update reports it
                log.debug("prune: cannot read a row", exc_info=True)
                continue
            wanted.add(key)
            wanted.update(self.expansions.get(key, ()))
        errors: list[str] = []
        for addr in [a for a in self.frontends if a not in wanted]:
            try:
                self._delete_frontend(txn, addr)
            except Exception as exc:
                errors.append(f"{addr}: {exc}")
        for parent in [p for p in self.expansions if p not in wanted]:
            del self.expansions[parent]
        self.prune_maps(errors)
        self.prune_count += 1
        if errors:
            raise LBOpsError("prune: " + "; ".join(errors[:5]))

    # -- update ------------------------------------------------------------------------

    def _enabled(self, addr: Addr) -> bool:
        return self.config.enable_ipv6 if addr.is_v6 else self.config.enable_ipv4

    def _is_candidate(self, fe: FrontendSpec) -> bool:
        """Whether the frontend belongs in the datapath (everything with kube-proxy
        replacement; only ClusterIP, ExternalIPs and LocalRedirect without)."""
        if self.config.kube_proxy_replacement:
            return True
        return fe.type in (CLUSTER_IP, EXTERNAL_IPS, "LocalRedirect")

    @staticmethod
    def _is_expansion(fe: FrontendSpec) -> bool:
        return fe.type == NODE_PORT or (fe.type == HOST_PORT and fe.addr.is_unspecified)

    def update_spec(self, txn: ReadTxn, fe: FrontendSpec) -> None:
        """Write ``fe`` and its expansion; raises LBOpsError naming the frontend."""
        if not self._enabled(fe.addr):
            return
        candidate = self._is_candidate(fe)
        try:
            if candidate:
                self._update_frontend(txn, fe, lambda ip: self.node.is_local_address(txn, ip))
            else:
                self._delete_frontend(txn, fe.addr)
        except LBOpsError:
            raise
        except (MapError, ValueError, IDExhaustedError) as exc:
            raise LBOpsError(f"frontend {fe.addr} ({fe.service.name}): {exc}") from exc
        if not self._is_expansion(fe):
            return
        old = list(self.expansions.get(fe.addr, ()))
        new: list[Addr] = []
        if candidate:
            for ip in self.node.nodeport_addresses(txn, fe.addr.is_v6):
                addr = fe.addr.with_ip(ip)
                if self.node.is_primary_frontend(txn, addr):
                    continue
                new.append(addr)
        done: list[Addr] = []
        for addr in new:
            try:
                self._update_frontend(txn, _with_addr(fe, addr), None)
            except (MapError, ValueError, IDExhaustedError) as exc:
                self.expansions[fe.addr] = _merge(old, done)
                raise LBOpsError(
                    f"frontend {addr} (node address expansion of {fe.addr}, "
                    f"{fe.service.name}): {exc}"
                ) from exc
            done.append(addr)
        for addr in old:
            if addr in new or self.node.is_primary_frontend(txn, addr):
                continue
            try:
                self._delete_frontend(txn, addr)
            except MapError as exc:
                self.expansions[fe.addr] = _merge(old, done)
                raise LBOpsError(f"frontend {addr} (stale expansion of {fe.addr}): {exc}") from exc
        if new:
            self.expansions[fe.addr] = new
        else:
            self.expansions.pop(fe.addr, None)

    def _lb_algorithm(self, fe: FrontendSpec) -> int:
        if not self.config.algorithm_annotation:
            return 0
        return LB_ALG_NUMBERS.get(fe.service.lb_algorithm, 0)

    def _use_maglev(self, fe: FrontendSpec) -> bool:
        if fe.addr.is_unspecified:
            return False
        alg = self._lb_algorithm(fe)
        if alg != 0:
            return alg == LB_ALG_NUMBERS["maglev"]
        if self.config.algorithm != "maglev":
            return False
        if fe.type == CLUSTER_IP and not self.config.external_clusterip:
            return False
        return fe.type in (CLUSTER_IP, NODE_PORT, LOAD_BALANCER, HOST_PORT, EXTERNAL_IPS)

    def _dsr(self, fe: FrontendSpec) -> bool:
        mode = self.config.lb_mode
        if mode == "hybrid":
            mode = "dsr" if fe.addr.proto == "TCP" else "snat"
        if self.config.mode_annotation and fe.service.forwarding_mode in ("dsr", "snat"):
            mode = fe.service.forwarding_mode
        return mode == "dsr"

    def _sorted_backends(self, fe: FrontendSpec) -> list[BackendSpec]:
        quarantined = self.restored_quarantined.get(fe.addr)
        bes = list(fe.backends)
        if quarantined:
            # A restored quarantine stands in for the health of an active backend until a
            # health check reports. A backend listed in another state (terminating, not
            # serving, maintenance: the tail slot is explained by that, e.g. an entry
            # several frontends share holds another frontend's "active") was not
            # quarantined, and turning ready later makes it active, not quarantined.
            for be in bes:
                if be.health_known or be.state != BACKEND_ACTIVE or be.not_serving:
                    quarantined.discard(be.addr)
            if not quarantined:
                del self.restored_quarantined[fe.addr]
            bes = [
                _unhealthy(be) if be.addr in quarantined and not be.unhealthy else be for be in bes
            ]
        # Then Addr.sort_key's order (family, address bytes, port). Serving terminating
        # backends before those no longer serving: when no active backend is left the
        # first ones are used.
        bes.sort(key=lambda b: (b.unhealthy, b.state, b.not_serving, b.addr.sort_key()))
        return bes

    def _svc_key(self, addr: Addr, slot: int) -> bytes:
        """The encoded services-map key of ``addr``'s slot ``slot``."""
        st = lb.SERVICE6_KEY_STRUCT if addr.is_v6 else lb.SERVICE4_KEY_STRUCT
        return st.pack(
            addr.packed, lb.swap16(addr.port), slot, proto_number(addr.proto), addr.scope
        )

    def _update_frontend(
        self, txn: ReadTxn, fe: FrontendSpec, is_local: Callable[[IPAddress], bool] | None
    ) -> None:
        """Write one frontend: its backend entries and slots (one batch call per map), maglev
        and source ranges, rev-NAT, then the master, then what follows the master."""
        p = self._prepare_frontend(txn, fe, is_local)
        state, maps = p.state, self.maps
        v6 = state.v6
        svc_raw = maps.services(v6).backend
        self._write_collected(maps.backends(v6).backend, svc_raw, p.writes)
        self._write_side_entries(p)
        maps.revnat(v6).backend.update(*self._revnat_entry(p))
        state.revnat = True
        key, master = self._master_entry(p)
        svc_raw.update(key, master)
        self._after_master(p, master)

    def _master_flags(self, fe: FrontendSpec) -> int:
        """The service flags of the frontend's master entry."""
        svc, cfg = fe.service, self.config
        routable = not fe.addr.ip.is_unspecified and (
            fe.type != CLUSTER_IP or cfg.external_clusterip
        )
        check_sr = bool(svc.source_ranges) and (
            cfg.source_range_all_types or fe.type in (LOAD_BALANCER, EXTERNAL_IPS)
        )
        return svcflags.service_flags(
            svcflags.FlagParams(
                svc_type=fe.type,
                ext_local=svc.ext_local,
                int_local=svc.int_local,
                session_affinity=svc.session_affinity,
                routable=routable,
                check_source_range=check_sr,
                source_range_deny=check_sr and svc.source_ranges_deny,
                dsr=self._dsr(fe),
                l7_load_balancer=bool(svc.l7_proxy_port),
                loopback=svc.loopback_hostport or svc.proxy_delegation,
            )
        )

    def _prepare_frontend(
        self,
        txn: ReadTxn,
        fe: FrontendSpec,
        is_local: Callable[[IPAddress], bool] | None,
        orphans: list[tuple[Addr, int]] | None = None,
    ) -> PendingFrontend:
        """Everything of a frontend before its collected backend entries and slots are
        written: ids, orphaned backends, affinity entries, and the collected writes (the
        state updated as if written; the caller writes them and puts back what was not).

        Orphaned backends (no longer wanted by the frontend) are deleted here, first, which
        makes room in a full backends map; given an ``orphans`` list, those no other
        frontend references are left in the map, unreferenced, and appended to it (it
        becomes the result's ``orphans``) for the caller to delete once the frontend's
        master no longer counts their slots, or at once when this raises."""
        addr, svc = fe.addr, fe.service
        if svc.session_affinity and svc.l7_proxy_port:
            raise ValueError("session affinity with an L7 proxy redirect is not supported")
        if addr.port == 0 and addr.proto != "ANY":
            raise ValueError("port 0")
        key_proto = proto_number(addr.proto)
        state = self.frontends.get(addr)
        if state is None:
            state = FrontendState(self.service_ids.acquire(addr), addr.ip.version == 6)
            self.frontends[addr] = state
        master_flags = self._master_flags(fe)
        # Source-range bits live on the master only (the deny bit doubles as the slots'
        # quarantine bit); quarantined slots carry the same flags as the others.
        slot_flags = master_flags & ~(svcflags.SOURCE_RANGE | svcflags.SOURCE_RANGE_DENY)
        slots = state.slots
        if state.slot_flags != slot_flags:
            # Every written slot carries the old flags: rewrite them all (0 never matches).
            for i in range(len(slots)):
                slots[i] = 0
            state.slot_flags = slot_flags
        ordered = self._sorted_backends(fe)
        self._drop_orphans(txn, addr, state, ordered, orphans)
        # The backend entries and the slots are collected here and written with one batch
        # call per map right after (backends first, so no slot points to a backend not
        # yet written); the state is updated as if written, and `_write_collected` puts
        # back what was not written.
        writes = CollectedWrites(self.backend_states, slots)
        try:
            slot_backends, active, inactive = self._collect_backends(
                fe, state, ordered, key_proto, writes
            )
        except BaseException:
            writes.undo(0, 0)
            raise
        p = PendingFrontend(
            fe, state, is_local, writes, slot_backends, active, inactive, master_flags
        )
        if orphans:
            p.orphans = orphans
        return p

    def _drop_orphans(
        self,
        txn: ReadTxn,
        addr: Addr,
        state: FrontendState,
        ordered: list[BackendSpec],
        orphans: list[tuple[Addr, int]] | None,
    ) -> None:
        """Drop the frontend's references to the backends it no longer lists (``ordered``
        is its new list), first: that makes room in a full backends map. Given
        ``orphans``, those no other frontend references stay in the map, unreferenced, and
        are appended to it (see `_prepare_frontend`)."""
        fe_backends = state.backends
        if not fe_backends or (
            len(fe_backends) <= len(ordered) and all(be.addr in fe_backends for be in ordered)
        ):
            return
        wanted = {be.addr for be in ordered}
        states = self.backend_states
        for be_addr in sorted(fe_backends.keys() - wanted):
            dropped_id = states.get(be_addr)
            if dropped_id is None:
                continue
            if dropped_id in state.affinity:
                self._set_affinity(state, dropped_id, False)
            if (
                orphans is not None
                and states.refcount(be_addr) <= 1
                and not states.is_shared(be_addr)
            ):
                # Unreferenced from here on, as `_drop_reference` leaves a backend
                # that another frontend of the snapshot selects.
                states.pop_want(be_addr, fe_backends[be_addr])
                fe_backends[be_addr] = None
                states.set_refcount(be_addr, 0)
                orphans.append((be_addr, dropped_id))
            else:
                self._drop_reference(txn, addr, fe_backends, be_addr)
            fe_backends.pop(be_addr, None)

    def _set_affinity(self, state: FrontendState, be_id: int, on: bool) -> None:
        """Write (``on``) or delete the affinity match entry of backend ``be_id``."""
        key = lb.AffinityMatchKey(be_id, state.id)
        if on:
            self.maps.aff_match.update(key, 0)
            if state.affinity is EMPTY:
                state.affinity = set()
            state.affinity.add(be_id)
        else:
            delete_quiet(self.maps.aff_match, key)
            state.affinity.discard(be_id)

    def _shared_want(
        self, be: BackendSpec, prev: int | None, fe_backends: dict[Addr, int | None]
    ) -> tuple[int, int, int]:
        """(want, own want, packed state) of a backend that is not the usual one (a
        cluster id, a zone, or wanted by several frontends): through the backend states."""
        be_addr = be.addr
        states = self.backend_states
        want = own = want_of(be.state, be.cluster_id, be.zone)
        if want and not want & 0xFFFFFF:
            want = own = WANTS.setdefault(want, want)
        states.set_want(be_addr, prev, want)
        fe_backends[be_addr] = own
        v = states.packed[be_addr]
        if states.shared and be_addr in states.shared:
            # Wanted by several frontends: the entry holds the smallest want.
            want = states.effective(be_addr)
        return want, own, v

    def _collect_backends(
        self,
        fe: FrontendSpec,
        state: FrontendState,
        ordered: list[BackendSpec],
        key_proto: int,
        writes: CollectedWrites,
    ) -> tuple[list[BackendSpec], int, int]:
        """Reference every backend of ``ordered``, collect its entry (when it changed) and
        its slot into ``writes``, and keep its affinity entry; return the backends that
        got a slot and the master's active and inactive counts."""
        addr, fe_id, v6, slots = fe.addr, state.id, state.v6, state.slots
        fe_backends = state.backends
        # Entries are encoded straight to bytes for the byte-level backends (bpf.lb's
        # *_STRUCT layouts, identical to the codecs').
        key_pack, be_pack = _PACKS[v6]
        value_pack, u32_pack = lb.SERVICE_VALUE_STRUCT.pack, lb.U32_STRUCT.pack
        key_ip, key_port, key_scope = addr.ip.packed, lb.swap16(addr.port), addr.scope
        rev_be = lb.swap16(fe_id)
        sf1, sf2 = svcflags.split(state.slot_flags)
        active = terminating = inactive = 0
        slot, nslots = 1, len(slots)
        slot_backends: list[BackendSpec] = []
        packed_states, shared_wants = self.backend_states.packed, self.backend_states.shared
        affinity, proto_numbers = fe.service.session_affinity, PROTO_NUMBERS
        be_keys, be_values, be_undo = writes.be_keys, writes.be_values, writes.be_undo
        svc_keys, svc_values, slot_undo = writes.svc_keys, writes.svc_values, writes.slot_undo
        for be in ordered:
            be_addr = be.addr
            v = packed_states.get(be_addr)
            prev = fe_backends.get(be_addr, ABSENT)
            if v is None:
                v = self.backend_ids.acquire(be_addr) | NEW_ENTRY
                packed_states[be_addr] = v
                # A new entry: this frontend's reference and want are new too, even if
                # it listed the address before.
                prev = ABSENT
            if prev is ABSENT:
                # Referenced before written: a failure below leaves it for delete to drop.
                if (v >> REF_SHIFT) & REF_MASK == REF_MASK:
                    raise ValueError(f"backend {be_addr}: too many references")
                v += REF_ONE
                packed_states[be_addr] = v
                fe_backends[be_addr] = prev = None
            be_id = v & ID_MASK
            be_state = be.state
            be_port = be_addr.port
            if be_port == 0:
                raise ValueError(f"backend {be_addr}: port 0")
            # The usual backend (no cluster id, no zone, wanted by this frontend alone)
            # takes want_of/set_want/effective inline, its want stored with what is
            # written below (a failure in between stores neither); anything else calls
            # them (`_shared_want`).
            if (
                not be.cluster_id
                and not be.zone
                and 0 <= be_state <= 0xFF
                and (
                    prev is not None
                    if (v >> WANT_SHIFT) & FIELD_MASK != NONE
                    else not shared_wants or be_addr not in shared_wants
                )
            ):
                want = own = be_state << 24
                if want:
                    want = own = WANTS.setdefault(want, want)
                v = (v & NOT_WANT) | (want << WANT_SHIFT)
            else:
                want, own, v = self._shared_want(be, prev, fe_backends)
            written = v >> WRITTEN_SHIFT
            if written != want:
                be_proto = proto_numbers.get(be_addr.proto)
                if be_proto is None:
                    be_proto = proto_number(be_addr.proto)
                be_keys.append(u32_pack(be_id))
                be_values.append(be_pack(
                    be_addr.packed, ((be_port & 0xFF) << 8) | (be_port >> 8),  # lb.swap16
                    be_proto, want >> 24, (want >> 8) & 0xFFFF, want & 0xFF,
                ))
                be_undo.append((be_addr, None if written == NONE else written))
                v = (v & BELOW_WRITTEN) | (want << WRITTEN_SHIFT)
            packed_states[be_addr] = v
            fe_backends[be_addr] = own
            if be_state == BACKEND_MAINTENANCE:
                # Out of the slots, and out of session affinity: a client pinned to it
                # must be balanced again.
                if be_id in state.affinity:
                    self._set_affinity(state, be_id, False)
                continue
            idx = slot - 1
            if idx >= nslots or slots[idx] != be_id:
                svc_keys.append(key_pack(key_ip, key_port, slot, key_proto, key_scope))
                svc_values.append(value_pack(be_id, 0, rev_be, sf1, sf2, 0))
                if idx < nslots:
                    slot_undo.append((idx, slots[idx]))
                    slots[idx] = be_id
                else:
                    slot_undo.append((idx, 0))
                    slots.append(be_id)
                    nslots += 1
            want_aff = affinity and be_state == BACKEND_ACTIVE
            if want_aff != (be_id in state.affinity):
                self._set_affinity(state, be_id, want_aff)
            if be.unhealthy or be.not_serving:
                # Not serving (unhealthy, or terminating and no longer serving): only in
                # the inactive tail, never a fallback for missing active backends.
                inactive += 1
            elif be_state == BACKEND_ACTIVE:
                active += 1
            elif be_state == BACKEND_TERMINATING:
                terminating += 1
            else:
                inactive += 1
            slot_backends.append(be)
            slot += 1
        if active == 0:
            return slot_backends, terminating, inactive
        return slot_backends, active, inactive + terminating

    def _write_side_entries(self, p: PendingFrontend) -> None:
        """The frontend's maglev table and source ranges (after its slots, before rev-NAT
        and the master)."""
        fe, state, maps = p.fe, p.state, self.maps
        svc, v6, fe_id = fe.service, state.v6, state.id
        active, slot_backends = p.active, p.slot_backends
        if self._use_maglev(fe):
            chosen = slot_backends[:active]
            if chosen:
                table = self.maglev.lookup_table(
                    MaglevBackend(
                        self.backend_states.id(b.addr),
                        hash_string(
                            str(b.addr.ip),
                            b.addr.port,
                            b.addr.proto,
                            b.addr.scope == SCOPE_INTERNAL,
                        ),
                        b.weight,
                    )
                    for b in chosen
                )
                maps.set_maglev(fe_id, table, v6)
                state.maglev = True
            elif state.maglev:
                maps.delete_maglev(fe_id, v6)
                state.maglev = False
        elif state.maglev:
            maps.delete_maglev(fe_id, v6)
            state.maglev = False

        # The ranges are written for every frontend of the service; only the flags decide
        # whether the datapath checks them.
        if svc.source_ranges or state.source_ranges:
            wanted_ranges = {n for n in svc.source_ranges if (n.version == 6) == v6}
            src_map = maps.source_ranges(v6)
            src_cls = lb.SourceRange6Key if v6 else lb.SourceRange4Key
            for net in sorted(wanted_ranges - state.source_ranges, key=str):
                src_map.update(
                    src_cls.for_cidr(fe_id, net.network_address.packed, net.prefixlen), 0
                )
                if state.source_ranges is EMPTY:
                    state.source_ranges = set()
                state.source_ranges.add(net)
            for net in sorted(state.source_ranges - wanted_ranges, key=str):
                delete_quiet(
                    src_map, src_cls.for_cidr(fe_id, net.network_address.packed, net.prefixlen)
                )
                state.source_ranges.discard(net)

    @staticmethod
    def _revnat_entry(p: PendingFrontend) -> tuple[bytes, bytes]:
        """The encoded rev-NAT entry of the frontend (key, value)."""
        addr, v6 = p.fe.addr, p.state.v6
        rev_pack = (lb.REVNAT6_STRUCT if v6 else lb.REVNAT4_STRUCT).pack
        return lb.BE16_STRUCT.pack(p.state.id), rev_pack(addr.packed, lb.swap16(addr.port))

    def _master_entry(self, p: PendingFrontend) -> tuple[bytes, bytes]:
        """The encoded master entry (slot 0) of the frontend (key, value). A frontend with
        no master in the map yet has its stale slots trimmed first."""
        fe, state = p.fe, p.state
        svc, addr = fe.service, fe.addr
        affinity = svc.session_affinity
        if svc.l7_proxy_port:
            head = swap16(svc.l7_proxy_port)
        else:
            timeout = svc.affinity_timeout & AFFINITY_TIMEOUT_MASK if affinity else 0
            head = (self._lb_algorithm(fe) << LB_ALG_SHIFT) | timeout
        f1, f2 = svcflags.split(p.master_flags)
        master = lb.SERVICE_VALUE_STRUCT.pack(
            head, p.active, lb.swap16(state.id), f1, f2, p.inactive
        )
        if state.master is None:
            # No master in the map yet, so no reader of the slots: stale slots of a failed
            # earlier attempt can go first, which frees room in a full services map.
            self._trim_slots(addr, state, len(p.slot_backends))
        return self._svc_key(addr, 0), master

    def _after_master(
        self, p: PendingFrontend, master: bytes, wildcard_written: bool = False
    ) -> None:
        """Record the master written, then scale-to-zero, the wildcard entry (already in
        the map when ``wildcard_written``) and the slots beyond the backend list (which
        the master no longer counts)."""
        fe, state, cfg, is_local = p.fe, p.state, self.config, p.is_local
        addr, svc = fe.addr, fe.service
        state.master = master

        self._sync_scale_to_zero(state, cfg.scale_to_zero and svc.scale_to_zero)

        self.wildcards.sync(fe, state, is_local, wildcard_written)

        self._trim_slots(addr, state, len(p.slot_backends))

    @staticmethod
    def _write_collected(be_raw: MapBackend, svc_raw: MapBackend, w: CollectedWrites) -> None:
        """Write a frontend's collected backend entries, then its slots (one batch call per
        map, a single update for one entry). On a failure, the state of every entry not
        written is put back, so the next attempt writes it again, and the error is raised."""
        try:
            write_entries(be_raw, w.be_keys, w.be_values)
        except MapError as exc:
            w.undo(exc.done if isinstance(exc, BatchError) else 0, 0)
            raise
        try:
            write_entries(svc_raw, w.svc_keys, w.svc_values)
        except MapError as exc:
            w.undo(len(w.be_undo), exc.done if isinstance(exc, BatchError) else 0)
            raise

    def _sync_scale_to_zero(self, state: FrontendState, want: bool) -> None:
        """Track (or stop tracking) the frontend's id in the scale-to-zero map. An existing
        entry is left as it is: its value is the datapath's last demand signal."""
        m = self.maps.scale_to_zero
        if m is None or want == state.scale_to_zero:
            return
        key = lb.ScaleToZeroKey(state.id)
        if want:
            if m.lookup(key) is None:
                m.update(key, lb.ScaleToZeroValue(0))
        else:
            delete_quiet(m, key)
        state.scale_to_zero = want

    def _trim_slots(self, addr: Addr, state: FrontendState, count: int) -> None:
        """Delete the slots above ``count`` (after the master no longer counts them)."""
        svc_raw = self.maps.services(state.v6).backend
        while len(state.slots) > count:
            delete_quiet(svc_raw, self._svc_key(addr, len(state.slots)))
            state.slots.pop()

    def _drop_reference(
        self, txn: ReadTxn, fe_addr: Addr, fe_backends: dict[Addr, int | None], be_addr: Addr
    ) -> None:
        """The frontend at ``fe_addr`` no longer uses the backend: delete the entry with its
        last reference, else rewrite it if the remaining frontends want another value.

        A last reference is kept (entry and id, with no reference) when another frontend
        of the snapshot selects the backend but has not been written yet, e.g. a HostPort
        moved to a new port: the reconciler applies the deletion first and the new
        frontend right after, and the backend keeps its id. Prune drops such an entry if
        no frontend takes it up."""
        states = self.backend_states
        be_map = self.maps.backends(be_addr.is_v6)
        refcount = states.refcount(be_addr)
        # The want goes first, and is recorded as gone: a map write below that fails
        # leaves the reference for the retry, which must not take the want away twice.
        states.pop_want(be_addr, fe_backends.get(be_addr))
        if be_addr in fe_backends:
            fe_backends[be_addr] = None
        if refcount <= 1:
            referenced = getattr(self.node, "backend_referenced", None)
            if referenced is not None and referenced(txn, be_addr, fe_addr):
                states.set_refcount(be_addr, 0)
                return
            delete_quiet(be_map, states.id(be_addr))
            self.backend_ids.release(be_addr)
            states.remove(be_addr)
            return
        if states.has_wants(be_addr):
            want = states.effective(be_addr)
            if want != states.written(be_addr):
                be_map.backend.update(
                    lb.U32_STRUCT.pack(states.id(be_addr)), backend_bytes(be_addr, want)
                )
                states.set_written(be_addr, want)
        states.set_refcount(be_addr, refcount - 1)

    # -- delete ------------------------------------------------------------------------

    def delete_spec(self, txn: ReadTxn, fe: FrontendSpec) -> None:
        """Remove ``fe`` and its expansion; raises LBOpsError naming the frontend."""
        if not self._enabled(fe.addr):
            return
        try:
            self._delete_frontend(txn, fe.addr)
        except MapError as exc:
            raise LBOpsError(f"frontend {fe.addr} ({fe.service.name}): delete: {exc}") from exc
        if not self._is_expansion(fe):
            return
        remaining = list(self.expansions.get(fe.addr, ()))
        for addr in list(remaining):
            if self.node.is_primary_frontend(txn, addr):
                remaining.remove(addr)
                continue
            try:
                self._delete_frontend(txn, addr)
            except MapError as exc:
                self.expansions[fe.addr] = remaining
                raise LBOpsError(
                    f"frontend {addr} (expansion of {fe.addr}): delete: {exc}"
                ) from exc
            remaining.remove(addr)
        self.expansions.pop(fe.addr, None)

    def _delete_frontend(self, txn: ReadTxn, addr: Addr) -> None:
        """Remove every entry of the frontend at ``addr``; state goes as entries go."""
        state = self.frontends.get(addr)
        if state is None:
            return
        maps, fe_id, v6 = self.maps, state.id, state.v6
        if state.maglev:
            maps.delete_maglev(fe_id, v6)
            state.maglev = False
        for be_id in sorted(state.affinity):
            delete_quiet(maps.aff_match, lb.AffinityMatchKey(be_id, fe_id))
            state.affinity.discard(be_id)
        for be_addr in sorted(state.backends):
            if be_addr in self.backend_states:
                self._drop_reference(txn, addr, state.backends, be_addr)
            state.backends.pop(be_addr, None)
        svc_raw = maps.services(v6).backend
        while state.slots:
            delete_quiet(svc_raw, self._svc_key(addr, len(state.slots)))
            state.slots.pop()
        delete_quiet(svc_raw, self._svc_key(addr, 0))
        state.master = None
        self._sync_scale_to_zero(state, False)
        if state.revnat:
            delete_quiet(maps.revnat(v6), fe_id)
            state.revnat = False
        src_cls = lb.SourceRange6Key if v6 else lb.SourceRange4Key
        for net in sorted(state.source_ranges, key=str):
            delete_quiet(
                maps.source_ranges(v6),
                src_cls.for_cidr(fe_id, net.network_address.packed, net.prefixlen),
            )
            state.source_ranges.discard(net)
        self.wildcards.delete(addr, state)
        self.restored_quarantined.pop(addr, None)
        del self.frontends[addr]
        self.service_ids.release(addr)

    # -- prune -------------------------------------------------------------------------

    def prune_maps(self, errors: list[str] | None = None) -> None:
        """Delete map entries the state does not explain; release unclaimed restored ids
        (``errors`` collects the failed deletes)."""
        prune_maps(self, errors if errors is not None else [])

    # -- introspection -----------------------------------------------------------------

    def service_id(self, addr: Addr) -> int | None:
        """The service id of the frontend at ``addr`` (None when not in the maps)."""
        st = self.frontends.get(addr)
        return st.id if st is not None else None

    def backend_id(self, addr: Addr) -> int | None:
        """The backend id of ``addr`` (None when not in the maps)."""
        return self.backend_states.get(addr)

    def state_is_empty(self) -> bool:
        """Whether the ops hold no state (everything deleted)."""
        return not (
            self.frontends
            or self.backend_states
            or self.expansions
            or len(self.service_ids)
            or len(self.backend_ids)
            or self.wildcard_refs
        )

    def state_summary(self) -> str:
        """A multi-line summary of the state (the corpus's ``test/bpfops-summary``)."""
        lines = [
            f"serviceIDs: {len(self.service_ids)}",
            f"restoredServiceIDs: {len(self.service_ids.restored)}",
            f"backendIDs: {len(self.backend_ids)}",
            f"restoredBackendIDs: {len(self.backend_ids.restored)}",
            f"backendStates: {len(self.backend_states)}",
            f"backendReferences: {len(self.frontends)}",
            f"nodePortAddrByPort: {len(self.expansions)}",
            f"prevSourceRanges: {sum(1 for st in self.frontends.values() if st.source_ranges)}",
            f"restoredQuarantines: {len(self.restored_quarantined)}",
            f"wildcardReferences: {len(self.wildcard_refs)}",
        ]
        return "\n".join(lines) + "\n"

    def dump_lines(self) -> list[str]:
        """The maps in the corpus dump format (see bpfops.maps_dump)."""
        return dump_lines(self.maps)


#: The key and backend encoders of each family (v6 False/True), bpf.lb's byte layouts.
_PACKS = {
    False: (lb.SERVICE4_KEY_STRUCT.pack, lb.BACKEND4_STRUCT.pack),
    True: (lb.SERVICE6_KEY_STRUCT.pack, lb.BACKEND6_STRUCT.pack),
}


def _fe_error(fe: FrontendSpec, exc: BaseException) -> LBOpsError:
    """The LBOpsError of a frontend whose write failed with ``exc`` (its cause)."""
    if isinstance(exc, LBOpsError):
        return exc
    err = LBOpsError(f"frontend {fe.addr} ({fe.service.name}): {exc}")
    err.__cause__ = exc
    return err


def _with_addr(fe: FrontendSpec, addr: Addr) -> FrontendSpec:
    return FrontendSpec(addr, fe.type, fe.service, fe.backends, fe.service_port)


def _unhealthy(be: BackendSpec) -> BackendSpec:
    return replace(be, unhealthy=True)


def _merge(a: list[Addr], b: list[Addr]) -> list[Addr]:
    out = list(a)
    for x in b:
        if x not in out:
            out.append(x)
    return out
