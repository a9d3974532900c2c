"""FrontendWriter: writes one frontend's entries into the LB maps and keeps the record of
what is written (the ids, the per-frontend and per-backend states, the wildcard
references, the node-address expansions and the restored quarantines).

The plan of a frontend (flags, slot order, encodings) is ``bpfops.frontend_plan``; this
module turns it into map writes in the order the datapath needs: backend entries, slots,
maglev and source ranges, rev-NAT, then the master, then what follows the master
(scale-to-zero, the wildcard entry, the slots the master no longer counts).
`update_frontend` does all of it for one frontend; ``bpfops.frontend_round`` uses the
steps (`prepare`, `write_side_entries`, `master_entry`, `after_master`) to write a
reconciler round map by map. `delete_frontend` removes a frontend's entries, and
`drop_reference` a frontend's use of one backend.

Every step records state only after the map writes it depends on succeeded (the
collected writes are recorded as if written and put back on failure), so a failure part
way is repaired by the retry.
"""

from __future__ import annotations

from collections.abc import Sequence
from operator import itemgetter
from typing import Any

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
from bpfops.frontend_plan import (
    PACKS,
    SLOT_FLAGS_MASK,
    addr_head,
    backend_tail,
    backend_values,
    check_frontend,
    master_flags,
    master_key,
    master_value,
    revnat_entry,
    run_entries,
    slot_keys,
    slot_number,
    sorted_backends,
    svc_key,
    svc_key_tail,
    use_maglev,
    usual_keys,
)
from bpfops.frontend_state import (
    ABSENT,
    EMPTY,
    WANTS,
    CollectedWrites,
    FrontendState,
    IsLocal,
    PendingFrontend,
    backend_bytes,
    bulk_undo,
    bulk_writes,
    new_pending,
    new_state,
    want_of,
    write_entries,
)
from bpfops.ids import (
    BACKEND_ID_LIMIT,
    FIRST_BACKEND_ID,
    FIRST_SERVICE_ID,
    SERVICE_ID_LIMIT,
    IDAllocator,
)
from bpfops.lb_maps import LBMaps, delete_quiet
from bpfops.maglev import Maglev, MaglevBackend, hash_string
from bpfops.model import (
    CLUSTER_IP,
    SCOPE_INTERNAL,
    Addr,
    BackendSpec,
    FrontendSpec,
    LazyBackends,
    LBOpsConfig,
    proto_number,
)
from bpfops.node_view import NodeView
from bpfops.wildcards import VipKey, WildcardEntries
from statedb import ReadTxn

BACKEND_ACTIVE = lb.BACKEND_ACTIVE
BACKEND_TERMINATING = lb.BACKEND_TERMINATING
BACKEND_MAINTENANCE = lb.BACKEND_MAINTENANCE

#: A backend spec's address (``addr``, its first field).
_ADDR = itemgetter(0)
#: A services-map key's slot field of slot 0 (the master).
_SLOT0 = bytes(2)
#: How many `master_flags_of` results a writer keeps (cleared past it).
_FLAGS_CACHED = 4096


class FrontendWriter:
    """The per-frontend writes and the record of what the maps hold (see the module doc).

    ``node`` answers, through its optional ``backend_referenced``, whether another
    frontend of the snapshot still selects a backend a frontend drops.

    ``bulk_new``: whether the usual new frontend of an initial sync is collected in bulk
    (`_collect_new`); the per-backend path gives the same state and writes (the tests
    compare the two).
    """

    bulk_new = True

    def __init__(
        self, maps: LBMaps, config: LBOpsConfig, node: NodeView, maglev: Maglev | None = None
    ) -> None:
        self.maps = maps
        self.config = config
        self.node = node
        self.maglev = maglev or Maglev(maps.maglev_table_size, config.maglev_hash_seed)
        #: Whether any frontend may use maglev (`use_maglev`: the default algorithm, or
        #: the per-service annotation when honoured).
        self.maglev_possible = config.algorithm == "maglev" or config.algorithm_annotation
        if self.maglev.table_size != maps.maglev_table_size:
            raise ValueError(
                f"maglev table size {self.maglev.table_size} differs from the maps' "
                f"{maps.maglev_table_size}"
            )
        self.service_ids: IDAllocator[Addr] = IDAllocator(
            "service", FIRST_SERVICE_ID, min(config.service_id_limit, SERVICE_ID_LIMIT)
        )
        self.frontends: dict[Addr, FrontendState] = {}
        self.backend_states = BackendStates()
        # The backend states are the allocator's record of which address holds which id.
        self.backend_ids: IDAllocator[Addr] = IDAllocator(
            "backend", FIRST_BACKEND_ID, BACKEND_ID_LIMIT, self.backend_states
        )
        self.wildcards = WildcardEntries(maps, config)
        #: A NodePort (or HostPort without host IP) frontend -> the node-address frontends
        #: it is expanded into (written and deleted by FrontendOps).
        self.expansions: dict[Addr, list[Addr]] = {}
        self.restored_quarantined: dict[Addr, set[Addr]] = {}
        #: `master_flags_of`'s cache.
        self._flags: dict[tuple[Any, ...], int] = {}

    def update_frontend(
        self, txn: ReadTxn, fe: FrontendSpec, is_local: IsLocal | None
    ) -> None:
        """Write one frontend: its backend entries and slots (one batch call per map), maglev
        and source ranges, rev-NAT, then the master, then what follows the master."""
        p = self.prepare(txn, fe, is_local)
        state, maps = p.state, self.maps
        v6 = state.v6
        svc_raw = maps.services(v6).backend
        self.write_collected(maps.backends(v6).backend, svc_raw, p.writes)
        self.write_side_entries(p)
        # The rev-NAT entry (id -> address) and a master equal to the one the map holds
        # are not written again (`RoundWriter` skips them alike).
        if not state.revnat:
            maps.revnat(v6).backend.update(*revnat_entry(p))
            state.revnat = True
        key, master = self.master_entry(p)
        if master != state.master:
            svc_raw.update(key, master)
        self.after_master(p, master)

    def prepare(
        self,
        txn: ReadTxn,
        fe: FrontendSpec,
        is_local: IsLocal | None,
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
        check_frontend(fe)
        addr = fe.addr
        state = self.frontends.get(addr)
        fresh = state is None
        if state is None:
            state = new_state(self.service_ids.acquire(addr), addr[20] == 6)
            self.frontends[addr] = state
        flags = self.master_flags_of(fe)
        new_slot_flags = flags & SLOT_FLAGS_MASK
        if state.slot_flags != new_slot_flags:
            # Every written slot carries the old flags: rewrite them all (0 never matches).
            if not fresh and state.slot_count:
                slots = state.slots
                for i in range(len(slots)):
                    slots[i] = 0
            state.slot_flags = new_slot_flags
        # The backend entries and the slots are collected here and written with one batch
        # call per map right after (backends first, so no slot points to a backend not
        # yet written); the state is updated as if written, and `write_collected` puts
        # back what was not written. The usual new frontend, already in slot order and
        # with nothing to drop, is collected in bulk.
        # The frontend's IP and port (`addr_head`) and what follows the slot number in its
        # services-map keys: its slots' keys and its master's.
        head = addr[12:18] if addr[20] == 4 else addr[:18]
        key_tail = svc_key_tail(addr)
        collected = None
        if self.bulk_new and addr not in self.restored_quarantined:
            collected = self._collect_new(fe, state, head, key_tail, fresh)
        if collected is None:
            ordered = sorted_backends(fe, self.restored_quarantined)
            self._drop_orphans(txn, addr, state, ordered, orphans)
            writes = CollectedWrites.empty(self.backend_states, state)
            try:
                collected = self._collect_backends(fe, state, ordered, writes, head, key_tail)
            except BaseException:
                writes.undo(0, 0)
                raise
        writes, slot_backends, active, inactive = collected
        return new_pending(
            fe, state, is_local, writes, slot_backends, active, inactive, flags, orphans,
            head, head + _SLOT0 + key_tail,  # master_key
        )

    def master_flags_of(self, fe: FrontendSpec) -> int:
        """`master_flags` of the frontend, cached by what they depend on beside the
        config: the type, the protocol, whether the address is unspecified (asked only
        when the type can be routable) and the service settings but its name (the
        services of a cluster share a few combinations)."""
        cfg, addr, fe_type = self.config, fe.addr, fe.type
        unspecified = (fe_type != CLUSTER_IP or cfg.external_clusterip) and addr.is_unspecified
        key = (fe_type, addr[18], unspecified, fe.service[1:])
        cache = self._flags
        flags = cache.get(key)
        if flags is None:
            flags = master_flags(cfg, fe)
            if len(cache) >= _FLAGS_CACHED:
                cache.clear()
            cache[key] = flags
        return flags

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
        are appended to it (see `prepare`)."""
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
                self.set_affinity(state, dropped_id, False)
            if (
                orphans is not None
                and states.refcount(be_addr) <= 1
                and not states.is_shared(be_addr)
            ):
                # Unreferenced from here on, as `drop_reference` leaves a backend
                # that another frontend of the snapshot selects.
                states.pop_want(be_addr, fe_backends[be_addr])
                fe_backends[be_addr] = None
                states.set_refcount(be_addr, 0)
                orphans.append((be_addr, dropped_id))
            else:
                self.drop_reference(txn, addr, fe_backends, be_addr)
            fe_backends.pop(be_addr, None)

    def set_affinity(self, state: FrontendState, be_id: int, on: bool) -> None:
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

    def _collect_new(
        self,
        fe: FrontendSpec,
        state: FrontendState,
        head: bytes,
        key_tail: bytes,
        fresh: bool = False,
    ) -> tuple[CollectedWrites, Sequence[BackendSpec], int, int] | None:
        """`sorted_backends`, `_drop_orphans` and `_collect_backends` for the usual
        frontend of an initial sync, in bulk: one that references no backend and has no
        slot yet (``fresh``: its state was just made, so it has neither), without session
        affinity, whose backends are all new (no entry yet, ids from one run of the
        allocator), active, healthy, serving, of cluster 0 and no zone, of its IP family,
        all of one protocol, with a port, and listed in ascending address order (slot
        order: `in_slot_order`). It leaves the state as those would (every backend
        referenced once, wanted and recorded as written active; entries and slots in
        order) and returns the writes, the backends with a slot and the master's counts.
        None when the frontend is not such a one (nothing is changed then). ``head`` and
        ``key_tail``: how its services-map keys begin and end (`addr_head`,
        `svc_key_tail`)."""
        if fe.service.session_affinity or (
            not fresh and (state.slot_count or state.affinity or state.has_backends)
        ):
            return None
        addr = fe.addr
        family = addr[20]
        bes, shared = fe.backends, fe.shared_backends
        addrs: list[Addr] | None
        shared_known = False
        if type(bes) is not tuple and LazyBackends in type(bes).__mro__:
            # Their source tells whether they are all usual: no spec is built. (The
            # __mro__ test is isinstance without the ABC machinery's Python frame.)
            lazy: LazyBackends = bes  # type: ignore[assignment]
            addrs = lazy.usual_addresses()
            if addrs is None:
                return None
            shared_known = shared is not None and lazy.made_from(shared)
        else:
            for be in bes:
                if be.state or be.unhealthy or be.not_serving or be.cluster_id or be.zone:
                    return None
            addrs = list(map(_ADDR, bes))
        n = len(addrs)
        joined = b"".join(addrs)  # the addresses' keys, 21 bytes each (tables.l3n4)
        proto = usual_keys(joined, n, family)
        if proto is None:
            return None
        prev = b""  # below every address
        for a in addrs:
            if not prev < a:
                return None
            prev = a
        packed = self.backend_states.packed
        if not packed.keys().isdisjoint(addrs):
            return None
        ids = self.backend_ids.acquire_run(addrs)
        if ids is None:
            return None
        # Referenced once, the one want and the written want both active (0): the ids with
        # one reference. (A range's ints are allocated at their size; one made by ``+``
        # gets a spare digit, which puts it in the allocator's next size class: 8 bytes
        # more per backend.)
        packed.update(zip(addrs, range(ids.start | REF_ONE, ids.stop | REF_ONE)))
        # Every backend wants 0 (active): the compact form at once (the spec's shared tuple
        # of the backends, when it gives one), and the slots, as if written, the run of ids
        # (no array: `undo` builds one if a write fails).
        state.set_compact(addrs, 0, shared, ids.start, shared_known)
        keys, values = run_entries(ids.start, n, state.id, state.slot_flags)
        no_prev, indices, no_ids = bulk_undo(n)
        be_writes = (keys, backend_values(joined, n, proto, 0), addrs, no_prev)
        svc_writes = (
            slot_keys(head, key_tail, n),
            values,
            indices,
            no_ids,
        )
        return bulk_writes(self.backend_states, state, be_writes, svc_writes, ids.start), bes, n, 0

    def _collect_backends(
        self, fe: FrontendSpec, state: FrontendState, ordered: list[BackendSpec],
        w: CollectedWrites, key_head: bytes, key_tail: bytes,
    ) -> tuple[CollectedWrites, Sequence[BackendSpec], int, int]:
        """Reference every backend of ``ordered``, collect its entry (when it changed) and
        its slot (keys: ``key_head``, slot, ``key_tail``) into the writes ``w``, and keep
        its affinity entry; return the writes, the backends with a slot and the master's
        active and inactive counts."""
        addr, fe_id, v6, slots = fe.addr, state.id, state.v6, state.slots
        fe_backends = state.backends
        # Entries are encoded straight to bytes (bpf.lb's *_STRUCT layouts, identical to
        # the codecs'), from the addresses' key bytes: a slot's key is the frontend's IP
        # and port, the slot number and a tail; its value the backend id and a tail; a
        # backend's value its IP and port and a tail.
        family, u32_pack = addr[20], lb.U32_STRUCT.pack
        sf1, sf2 = svcflags.split(state.slot_flags)
        slot_tail = lb.SERVICE_VALUE_STRUCT.pack(0, 0, lb.swap16(fe_id), sf1, sf2, 0)[4:]
        active = terminating = inactive = 0
        slot, nslots = 1, len(slots)
        slot_backends: list[BackendSpec] = []
        packed_states, shared_wants = self.backend_states.packed, self.backend_states.shared
        affinity = fe.service.session_affinity
        be_keys, be_values, svc_keys, svc_values = w.buffers()
        be_addrs, be_prev, slot_idx, slot_prev = w.undo_lists()
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
            if not (be_addr[16] or be_addr[17]):
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
            id_bytes = u32_pack(be_id)
            if written != want:
                be_keys += id_bytes
                be_values += (
                    addr_head(be_addr) + backend_tail(be_addr[18], want)
                    if be_addr[20] == family
                    else PACKS[v6][1](be_addr.packed, lb.swap16(be_addr.port),
                                      proto_number(be_addr.proto), want >> 24,
                                      (want >> 8) & 0xFFFF, want & 0xFF)
                )
                be_addrs.append(be_addr)
                be_prev.append(None if written == NONE else written)
                v = (v & BELOW_WRITTEN) | (want << WRITTEN_SHIFT)
            packed_states[be_addr] = v
            fe_backends[be_addr] = own
            if be_state == BACKEND_MAINTENANCE:
                # Out of the slots, and out of session affinity: a client pinned to it
                # must be balanced again.
                if be_id in state.affinity:
                    self.set_affinity(state, be_id, False)
                continue
            idx = slot - 1
            if idx >= nslots or slots[idx] != be_id:
                svc_keys += key_head + slot_number(slot) + key_tail
                svc_values += id_bytes + slot_tail
                slot_idx.append(idx)
                if idx < nslots:
                    slot_prev.append(slots[idx])
                    slots[idx] = be_id
                else:
                    slot_prev.append(0)
                    slots.append(be_id)
                    nslots += 1
            want_aff = affinity and be_state == BACKEND_ACTIVE
            if want_aff != (be_id in state.affinity):
                self.set_affinity(state, be_id, want_aff)
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
            return w, slot_backends, terminating, inactive
        return w, slot_backends, active, inactive + terminating

    @staticmethod
    def write_collected(be_raw: MapBackend, svc_raw: MapBackend, w: CollectedWrites) -> None:
        """Write a frontend's collected backend entries, then its slots (one batch call per
        map, a single update for one entry). On a failure, the state of every entry not
        written is put back, so the next attempt writes it again, and the error is raised."""
        try:
            write_entries(be_raw, bytes(w.be_keys), bytes(w.be_values), w.be_count)
        except MapError as exc:
            w.undo(exc.done if isinstance(exc, BatchError) else 0, 0)
            raise
        try:
            write_entries(svc_raw, bytes(w.svc_keys), bytes(w.svc_values), w.slot_count)
        except MapError as exc:
            w.undo(w.be_count, exc.done if isinstance(exc, BatchError) else 0)
            raise

    def write_side_entries(self, p: PendingFrontend) -> None:
        """The frontend's maglev table and source ranges (after its slots, before rev-NAT
        and the master)."""
        if self.maglev_possible or p.state.maglev:
            self._sync_maglev(p)
        # The ranges are written for every frontend of the service; only the flags decide
        # whether the datapath checks them.
        if p.fe.service.source_ranges or p.state.source_ranges:
            self._sync_source_ranges(p)

    def _sync_maglev(self, p: PendingFrontend) -> None:
        """Write the frontend's maglev table over its active backends, or delete it when
        the frontend has none or no longer uses maglev."""
        fe, state, maps = p.fe, p.state, self.maps
        v6, fe_id = state.v6, state.id
        chosen = p.slot_backends[: p.active] if use_maglev(self.config, fe) else []
        if chosen:
            table = self.maglev.lookup_table(
                MaglevBackend(
                    self.backend_states.id(b.addr),
                    hash_string(
                        str(b.addr.ip), b.addr.port, b.addr.proto, b.addr.scope == SCOPE_INTERNAL
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

    def _sync_source_ranges(self, p: PendingFrontend) -> None:
        """Write the service's source ranges of the frontend's family, delete the others."""
        state, v6, fe_id = p.state, p.state.v6, p.state.id
        wanted_ranges = {n for n in p.fe.service.source_ranges if (n.version == 6) == v6}
        src_map = self.maps.source_ranges(v6)
        src_cls = lb.SourceRange6Key if v6 else lb.SourceRange4Key
        for net in sorted(wanted_ranges - state.source_ranges, key=str):
            src_map.update(src_cls.for_cidr(fe_id, net.network_address.packed, net.prefixlen), 0)
            if state.source_ranges is EMPTY:
                state.source_ranges = set()
            state.source_ranges.add(net)
        for net in sorted(state.source_ranges - wanted_ranges, key=str):
            delete_quiet(
                src_map, src_cls.for_cidr(fe_id, net.network_address.packed, net.prefixlen)
            )
            state.source_ranges.discard(net)

    def master_entry(self, p: PendingFrontend) -> tuple[bytes, bytes]:
        """The encoded master entry (slot 0) of the frontend (key, value). A frontend with
        no master in the map yet has its stale slots trimmed first."""
        state, addr = p.state, p.fe.addr
        master = master_value(self.config, p)
        if state.master is None and p.writes.run is None:
            # No master in the map yet, so no reader of the slots: stale slots of a failed
            # earlier attempt can go first, which frees room in a full services map. (Slots
            # collected in bulk are the frontend's only ones: nothing to trim.)
            self.trim_slots(addr, state, len(p.slot_backends))
        key = p.master_key
        return key if key is not None else master_key(addr), master

    def after_master(
        self, p: PendingFrontend, master: bytes, new_wildcard: VipKey | None = None
    ) -> None:
        """Record the master written, then scale-to-zero, the wildcard entry and the slots
        beyond the backend list (which the master no longer counts). ``new_wildcard``: the
        VIP's key when the round's batch wrote its entry (`WildcardEntries.new_entry`)."""
        fe, state, cfg = p.fe, p.state, self.config
        addr, svc = fe.addr, fe.service
        state.master = master

        want_scale_to_zero = cfg.scale_to_zero and svc.scale_to_zero
        if want_scale_to_zero != state.scale_to_zero:
            self.sync_scale_to_zero(state, want_scale_to_zero)

        if new_wildcard is None:
            self.wildcards.sync(fe, state, p.is_local)
        else:
            self.wildcards.written(fe, new_wildcard, state)

        run = p.writes.run
        if run is None and state.slot_count > len(p.slot_backends):
            self.trim_slots(addr, state, len(p.slot_backends))
        # The frontend's writes are done (nothing is left to put back): its backends and
        # slots wait for its next update compactly (the slots as their run's first id,
        # when they are one).
        state.compact(run)

    def sync_scale_to_zero(self, state: FrontendState, want: bool) -> None:
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

    def trim_slots(self, addr: Addr, state: FrontendState, count: int) -> None:
        """Delete the slots above ``count`` (after the master no longer counts them)."""
        if state.slot_count <= count:
            return
        svc_raw = self.maps.services(state.v6).backend
        while len(state.slots) > count:
            delete_quiet(svc_raw, svc_key(addr, len(state.slots)))
            state.slots.pop()

    def drop_reference(
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

    def delete_frontend(self, txn: ReadTxn, addr: Addr) -> None:
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
                self.drop_reference(txn, addr, state.backends, be_addr)
            state.backends.pop(be_addr, None)
        svc_raw = maps.services(v6).backend
        while state.slots:
            delete_quiet(svc_raw, svc_key(addr, len(state.slots)))
            state.slots.pop()
        delete_quiet(svc_raw, svc_key(addr, 0))
        state.master = None
        self.sync_scale_to_zero(state, False)
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
