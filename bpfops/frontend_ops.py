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

The parts, by file:

* this module: the reconciler (Batch)Operations face - ``update``/``delete``/``prune``,
  ``update_batch``/``delete_batch`` - with the NodePort expansion, restore and
  introspection;
* ``bpfops.frontend_plan``: what entries a frontend needs (flags, slot order, encodings);
* ``bpfops.frontend_writer``: ``FrontendWriter``, one frontend's writes and deletes and the
  record of what the maps hold (ids, frontend and backend states);
* ``bpfops.frontend_round``: ``RoundWriter``, a round written map by map;
* ``bpfops.frontend_state``: the per-frontend records and the byte-level write helpers;
* ``bpfops.wildcards``: the VIPs' wildcard entries;
* ``bpfops.frontend_restore``: restore at start and prune;
* ``bpfops.node_view``: what the ops ask about the node (``NodeView``).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterator, Sized
from typing import Generic, TypeVar

from bpf.errors import MapError
from bpfops.errors import LBOpsError, frontend_error
from bpfops.frontend_plan import (
    enabled,
    is_candidate,
    is_expansion,
    merge,
    with_addr,
)
from bpfops.frontend_restore import (
    audit_maps,
    maps_are_empty,
    prune_maps,
    prune_recorded,
    release_unclaimed,
    restore_ids,
)
from bpfops.frontend_round import RoundWriter
from bpfops.frontend_state import IsLocal, PendingFrontend
from bpfops.frontend_writer import FrontendWriter
from bpfops.ids import IDExhaustedError
from bpfops.lb_maps import LBMaps
from bpfops.maglev import Maglev
from bpfops.maps_dump import dump_lines
from bpfops.model import CLUSTER_IP, LOAD_BALANCER, Addr, FrontendSpec, LBOpsConfig
from bpfops.node_view import NodeView, StaticNodeView
from reconciler.operations import BatchEntry
from reconciler.waiting import exhausted_resource
from statedb import ReadTxn

__all__ = ["FrontendOps", "LBOpsError", "NodeView", "StaticNodeView"]

log = logging.getLogger("statewright.bpfops")

R = TypeVar("R")


class FrontendOps(Generic[R]):
    """reconciler Operations (update/delete/prune) for frontend rows of type ``R``.

    ``to_spec(txn, row)`` turns a row into a FrontendSpec (see bpfops.adapter for the
    tables' rows); rows that are already FrontendSpec pass through when it is omitted.
    ``key_of(row)`` gives a row's frontend address cheaply for prune (else ``to_spec``).

    The record of what the maps hold is the writer's (``writer``); the attributes
    ``frontends``, ``backend_states``, ``service_ids``, ``backend_ids``, ``wildcards``,
    ``wildcard_refs``, ``expansions`` and ``restored_quarantined`` are its objects.
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
        w = self.writer = FrontendWriter(maps, self.config, self.node, maglev)
        self.rounds = RoundWriter(w)
        self.maglev = w.maglev
        self.service_ids = w.service_ids
        self.frontends = w.frontends
        self.backend_states = w.backend_states
        self.backend_ids = w.backend_ids
        self.wildcards = w.wildcards
        # Wildcard entry -> the ids of the frontends using it.
        self.wildcard_refs = w.wildcards.refs
        self.expansions = w.expansions
        self.restored_quarantined = w.restored_quarantined
        self.prune_count = 0
        #: True while the maps hold only entries this Ops wrote and recorded: they were
        #: empty at the restore and no update, delete or prune has failed since (a failure
        #: may leave an entry the record does not explain). The first prune then has
        #: nothing to look for in the maps and skips dumping them (`prune`).
        self.maps_explained = False
        #: When True, `prune` leaves the dump of the maps to an awaitable it returns
        #: (`audit_maps`: steps of a few milliseconds), for a reconciler that runs it beside
        #: its rounds (``Config.prune_beside_rounds``); when False the dump is done in the
        #: call (about 0.18 ms per service, on the loop).
        self.audit_in_steps = False
        if restore:
            self.reset_and_restore()

    # -- restore ---------------------------------------------------------------------

    def reset_and_restore(self, attempts: int = 10) -> None:
        """Forget all state, then reserve the ids found in the maps (restart model).

        Reading the maps is retried (``attempts`` times) when it fails transiently.
        """
        for attempt in range(attempts):
            try:
                restore_ids(self.writer)
                self.maps_explained = maps_are_empty(self.maps)
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
        try:
            self.update_spec(txn, fe)
        except Exception as exc:
            self._failed(exc)
            raise

    def _failed(self, exc: BaseException) -> None:
        """An update or delete failed: the maps may now hold an entry the record does not
        explain (unless it failed for want of an id, before writing anything)."""
        if exhausted_resource(exc) is None:
            self.maps_explained = False

    def delete(self, txn: ReadTxn, revision: int, obj: R) -> None:
        """Remove the frontend (and its expansion) from the maps, unless the snapshot holds
        a frontend at the same address again (see `delete_replaced`)."""
        fe = self.spec_of(txn, obj)
        lookup = getattr(self.node, "frontend_type", None)
        new_type = lookup(txn, fe.addr) if lookup is not None else None
        try:
            if new_type is None:
                self.delete_spec(txn, fe)
            else:
                self.delete_replaced(txn, fe, new_type)
        except Exception as exc:
            self._failed(exc)
            raise

    def delete_replaced(self, txn: ReadTxn, fe: FrontendSpec, new_type: str) -> None:
        """``fe`` was deleted and its address inserted again (another service took it over,
        e.g. a pod recreated under a new UID, in one batch). The address stays programmed
        with its service id: the update of the new frontend, which follows in the change
        stream, rewrites its entries in place. Only what the new frontend will not rewrite
        goes now: the node-address expansion when the new type has none, the wildcard
        entry when the new type has none."""
        if not enabled(self.config, fe.addr):
            return
        if is_expansion(fe) and not is_expansion(FrontendSpec(fe.addr, new_type, fe.service)):
            for addr in list(self.expansions.get(fe.addr, ())):
                if self.node.is_primary_frontend(txn, addr):
                    continue
                try:
                    self.writer.delete_frontend(txn, addr)
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
        deleted after that frontend's master (``RoundWriter.write``): a backend entry
        never goes while a slot the master counts points at it.
        """
        rounds = self.rounds
        is_local = self.local_check(txn)
        round_: list[tuple[BatchEntry[R], PendingFrontend]] = []
        seen: set[Addr] = set()
        # Backend entries the round may add before its orphans go (every backend of each
        # frontend counted: an upper bound), against the room left in the maps.
        adding = 0
        # The backends of the frontends since, not counted in ``adding`` yet: counted
        # only when a frontend drops backends (the one test that needs the count).
        uncounted: list[Sized] = []
        room = rounds.backend_room()
        for entry in batch:
            try:
                fe = self.spec_of(txn, entry.obj)
            except Exception as exc:
                entry.result = exc
                continue
            drops = rounds.drops(fe)
            uncounted.append(fe.backends)
            if drops:
                adding += sum(map(len, uncounted))
                uncounted.clear()
            if drops is None or (drops and adding > room) or fe.addr in seen:
                if round_:
                    rounds.write(txn, round_)
                    round_ = []
                    seen.clear()
                try:
                    self.update_spec(txn, fe)
                except Exception as exc:
                    entry.result = exc
                adding = 0
                uncounted.clear()
                room = rounds.backend_room()
                continue
            seen.add(fe.addr)
            orphans: list[tuple[Addr, int]] | None = [] if drops else None
            try:
                pending = self.writer.prepare(txn, fe, is_local, orphans)
            except Exception as exc:
                entry.result = (
                    frontend_error(fe, exc)
                    if isinstance(exc, (MapError, ValueError, IDExhaustedError))
                    else exc
                )
                if orphans:
                    # As `update_spec` would have: gone before the frontend's writes.
                    rounds.delete_orphans(txn, [(fe.addr, a, i) for a, i in orphans])
                continue
            round_.append((entry, pending))
        if round_:
            rounds.write(txn, round_)
        for entry in batch:
            if entry.result is not None:
                self._failed(entry.result)

    def local_check(self, txn: ReadTxn) -> IsLocal | None:
        """Whether a frontend's VIP is one of the node's addresses in snapshot ``txn``
        (None: the node has none, so no VIP is). Through the node view's optional
        ``local_keys`` (the addresses' 16-byte keys) when it has it: no ``ipaddress``
        object per frontend."""
        node = self.node
        keys = getattr(node, "local_keys", None)
        if keys is None:
            return lambda addr: node.is_local_address(txn, addr.ip)
        local: frozenset[bytes] = keys(txn)
        if not local:
            return None
        return lambda addr: addr[:16] in local

    def delete_batch(self, txn: ReadTxn, batch: list[BatchEntry[R]]) -> None:
        """Delete each entry's frontend as `delete` does, one after the other (deletions are
        not batched); each entry's ``result`` is its error, if any."""
        for entry in batch:
            try:
                self.delete(txn, entry.revision, entry.obj)
            except Exception as exc:
                entry.result = exc

    def prune(self, txn: ReadTxn, objects: Iterator[R]) -> Awaitable[None] | None:
        """Remove everything the given rows (all desired frontends) do not explain (the
        look at the maps in the awaitable returned, with `audit_in_steps`)."""
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
                self.writer.delete_frontend(txn, addr)
            except Exception as exc:
                errors.append(f"{addr}: {exc}")
        for parent in [p for p in self.expansions if p not in wanted]:
            del self.expansions[parent]
        audit = False
        if self.maps_explained and not errors:
            # Maps created empty, nothing failed: every entry is one the record explains
            # (the initial sync's first prune, on a node's first start, costs no dump).
            prune_recorded(self.writer, errors)
        elif self.audit_in_steps:
            release_unclaimed(self.writer)
            audit = True
        else:
            self.prune_maps(errors)
        # Later prunes look at the maps (entries written behind the agent's back).
        self.maps_explained = False
        self.prune_count += 1
        if errors:
            raise LBOpsError("prune: " + "; ".join(errors[:5]))
        return self._audit() if audit else None

    async def _audit(self) -> None:
        errors: list[str] = []
        await audit_maps(self.writer, errors)
        if errors:
            raise LBOpsError("prune: " + "; ".join(errors[:5]))

    # -- one frontend and its node-address expansion ------------------------------------

    def update_spec(self, txn: ReadTxn, fe: FrontendSpec) -> None:
        """Write ``fe`` and its expansion; raises LBOpsError naming the frontend."""
        if not enabled(self.config, fe.addr):
            return
        candidate = is_candidate(self.config, fe)
        try:
            if candidate:
                self.writer.update_frontend(txn, fe, self.local_check(txn))
            else:
                self.writer.delete_frontend(txn, fe.addr)
        except LBOpsError:
            raise
        except (MapError, ValueError, IDExhaustedError) as exc:
            raise LBOpsError(f"frontend {fe.addr} ({fe.service.name}): {exc}") from exc
        if is_expansion(fe):
            self._update_expansion(txn, fe, candidate)

    def _update_expansion(self, txn: ReadTxn, fe: FrontendSpec, candidate: bool) -> None:
        """Write ``fe`` at each node address it expands to (none when not a candidate) and
        delete the expansion frontends of addresses it no longer expands to."""
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
                self.writer.update_frontend(txn, with_addr(fe, addr), None)
            except (MapError, ValueError, IDExhaustedError) as exc:
                self.expansions[fe.addr] = merge(old, done)
                raise LBOpsError(
                    f"frontend {addr} (node address expansion of {fe.addr}, "
                    f"{fe.service.name}): {exc}"
                ) from exc
            done.append(addr)
        for addr in old:
            if addr in new or self.node.is_primary_frontend(txn, addr):
                continue
            try:
                self.writer.delete_frontend(txn, addr)
            except MapError as exc:
                self.expansions[fe.addr] = merge(old, done)
                raise LBOpsError(f"frontend {addr} (stale expansion of {fe.addr}): {exc}") from exc
        if new:
            self.expansions[fe.addr] = new
        else:
            self.expansions.pop(fe.addr, None)

    def delete_spec(self, txn: ReadTxn, fe: FrontendSpec) -> None:
        """Remove ``fe`` and its expansion; raises LBOpsError naming the frontend."""
        if not enabled(self.config, fe.addr):
            return
        try:
            self.writer.delete_frontend(txn, fe.addr)
        except MapError as exc:
            raise LBOpsError(f"frontend {fe.addr} ({fe.service.name}): delete: {exc}") from exc
        if not is_expansion(fe):
            return
        remaining = list(self.expansions.get(fe.addr, ()))
        for addr in list(remaining):
            if self.node.is_primary_frontend(txn, addr):
                remaining.remove(addr)
                continue
            try:
                self.writer.delete_frontend(txn, addr)
            except MapError as exc:
                self.expansions[fe.addr] = remaining
                raise LBOpsError(
                    f"frontend {addr} (expansion of {fe.addr}): delete: {exc}"
                ) from exc
            remaining.remove(addr)
        self.expansions.pop(fe.addr, None)

    # -- prune -------------------------------------------------------------------------

    def prune_maps(self, errors: list[str] | None = None) -> None:
        """Delete map entries the state does not explain; release unclaimed restored ids
        (``errors`` collects the failed deletes)."""
        prune_maps(self.writer, errors if errors is not None else [])

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

