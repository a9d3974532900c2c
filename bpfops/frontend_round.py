"""RoundWriter: a reconciler round's frontends written map by map (FrontendOps.update_batch).

The frontends of a round are prepared one by one (``FrontendWriter.prepare``: ids,
dropped backends, collected backend entries and slots), then written with one batch call
per map and family, in the order that keeps every master's references valid: every
backend entry, every slot, then per frontend its maglev table and source ranges, every
rev-NAT entry, and every master (each followed by its VIP's wildcard entry when the VIP
has none yet). A batch that stops part way fails the frontends whose entries were not
written, and puts their recorded state back so that the retry writes them again.
Backends the round's frontends dropped that nobody references any more go last
(`delete_orphans`): a backend entry never goes while a slot a master counts points at it.
"""

from __future__ import annotations

import logging
from typing import Any

from bpf import lb
from bpf.errors import MapError
from bpfops.errors import frontend_error
from bpfops.frontend_plan import in_rounds
from bpfops.frontend_state import PendingFrontend, delete_counted, write_counted
from bpfops.frontend_writer import FrontendWriter
from bpfops.model import Addr, FrontendSpec
from bpfops.wildcards import VipKey
from reconciler.operations import BatchEntry
from statedb import ReadTxn

log = logging.getLogger("statewright.bpfops")

#: A round's frontend: its batch entry (whose ``result`` takes its error) and its writes.
Live = list[tuple[BatchEntry[Any], PendingFrontend]]


class RoundWriter:
    """Writes prepared frontends of a round map by map through ``writer`` (see the module
    doc), and tells which frontends a round may hold (`drops`, `backend_room`)."""

    def __init__(self, writer: FrontendWriter) -> None:
        self.writer = writer

    def drops(self, fe: FrontendSpec) -> bool | None:
        """None when the round cannot hold ``fe`` (it is written on its own, see
        ``FrontendOps.update_batch``); else whether the frontend drops backends (each then
        referenced by this frontend alone)."""
        w = self.writer
        if not in_rounds(w.config, fe):
            return None
        state = w.frontends.get(fe.addr)
        if state is None or not state.backends:
            return False
        have = state.backends
        if len(have) == len(fe.backends) and all(be.addr in have for be in fe.backends):
            return False
        wanted = {be.addr for be in fe.backends}
        states = w.backend_states
        drops = False
        for a in have:
            if a in wanted:
                continue
            drops = True
            if a in states and (states.refcount(a) > 1 or states.is_shared(a)):
                return None
        return drops

    def backend_room(self) -> int:
        """Free backend entries in the fuller of the two backends maps, at least (entries
        the state holds counted against each)."""
        maps = self.writer.maps
        capacity = min(
            maps.backends(False).backend.spec.max_entries,
            maps.backends(True).backend.spec.max_entries,
        )
        return capacity - len(self.writer.backend_states)

    def write(self, txn: ReadTxn, round_: Live) -> None:
        """Write prepared frontends map by map (see the module doc), then delete the
        backends they orphaned; failures go to the entries' ``result``."""
        for v6 in (False, True):
            live = [(e, p) for e, p in round_ if p.state.v6 == v6 and e.result is None]
            if not live:
                continue
            live = self._write_backends(live, v6)
            live = self._write_slots(live, v6)
            live = self._write_side_entries(live)
            live = self._write_revnat(live, v6)
            self._write_masters(live, v6)
            # After the masters: a written master counts only its new slots (written before
            # it), so no slot it counts points at its frontend's orphans. Orphans of
            # frontends that failed go too, as ``FrontendOps.update_spec`` deletes them before
            # writing.
            orphans = [
                (p.fe.addr, a, i) for _, p in round_ if p.state.v6 == v6 for a, i in p.orphans
            ]
            if orphans:
                self.delete_orphans(txn, orphans)

    def _write_backends(self, live: Live, v6: bool) -> Live:
        """The backend entries of every frontend; those a failure left unwritten fail every
        frontend referencing them."""
        writes = [p.writes for _, p in live]
        count = sum([len(w.be_addrs) for w in writes])
        done, exc = write_counted(
            self.writer.maps.backends(v6).backend,
            b"".join([w.be_keys for w in writes]),
            b"".join([w.be_values for w in writes]),
            count,
        )
        if exc is None:
            return live
        # The entries from ``done`` on were not written: their state goes back, the last
        # collected first (a later frontend's entry of an address holds its earlier one's
        # want as the previous).
        lost: set[Addr] = set()
        states = self.writer.backend_states
        end = count
        for w in reversed(writes):
            start = end - w.be_count
            for i in range(w.be_count - 1, max(done - start, 0) - 1, -1):
                be_addr = w.be_addrs[i]
                if be_addr in states:
                    states.set_written(be_addr, w.be_prev[i])
                lost.add(be_addr)
            end = start
            if end <= done:
                break
        for e, p in live:
            if not lost.isdisjoint(p.state.backends):
                p.writes.undo(p.writes.be_count, 0)
                e.result = frontend_error(p.fe, exc)
        return [(e, p) for e, p in live if e.result is None]

    def _write_slots(self, live: Live, v6: bool) -> Live:
        """The slots of every frontend; a frontend whose slots were not all written fails."""
        writes = [p.writes for _, p in live]
        done, exc = write_counted(
            self.writer.maps.services(v6).backend,
            b"".join([w.svc_keys for w in writes]),
            b"".join([w.svc_values for w in writes]),
            sum([len(w.slot_idx) for w in writes]),
        )
        if exc is None:
            return live
        offset = 0
        for e, p in live:
            n = p.writes.slot_count
            if offset + n > done:
                p.writes.undo(p.writes.be_count, max(0, done - offset))
                e.result = frontend_error(p.fe, exc)
            offset += n
        return [(e, p) for e, p in live if e.result is None]

    def _write_side_entries(self, live: Live) -> Live:
        """Maglev tables and source ranges, per frontend."""
        w = self.writer
        maglev = w.maglev_possible
        failed = False
        for e, p in live:
            state = p.state
            # Nothing to write for the usual frontend (`write_side_entries`' own test).
            if not (maglev or state.maglev or p.fe.service.source_ranges or state.source_ranges):
                continue
            try:
                w.write_side_entries(p)
            except (MapError, ValueError) as exc:
                e.result = frontend_error(p.fe, exc)
                failed = True
        return [(e, p) for e, p in live if e.result is None] if failed else live

    def _write_revnat(self, live: Live, v6: bool) -> Live:
        """The rev-NAT entries of the frontends that have none written yet (an entry maps
        the frontend's id to its address, neither of which changes while the frontend is
        in the maps: a written one is not written again)."""
        todo = [(e, p) for e, p in live if not p.state.revnat]
        if not todo:
            return live
        # `revnat_entry` of each: the id (network order) -> the frontend's IP and port.
        pack = lb.BE16_STRUCT.pack
        done, exc = write_counted(
            self.writer.maps.revnat(v6).backend,
            b"".join([pack(p.state.id) for _, p in todo]),
            b"".join([p.head for _, p in todo]),  # addr_head
            len(todo),
        )
        for i, (e, p) in enumerate(todo):
            if i < done:
                p.state.revnat = True
            else:
                e.result = frontend_error(p.fe, exc or MapError("revnat", "update", 0))
        if done == len(todo):
            return live
        return [(e, p) for e, p in live if e.result is None]

    def _write_masters(self, live: Live, v6: bool) -> None:
        """The masters (a frontend without a master yet first loses stale slots), each
        followed by the wildcard entry of a VIP that has none yet; then what follows each
        master written."""
        w = self.writer
        keys: list[bytes] = []
        values: list[bytes] = []
        owners: list[int] = []  # keys[j] belongs to ready[owners[j]]
        masters: list[bool] = []  # whether keys[j] is its owner's master (or a wildcard)
        ready: Live = []
        ready_masters: list[bytes] = []
        # The VIP key of each frontend whose wildcard entry the batch writes, else None.
        new_wildcard: list[VipKey | None] = []
        queued: set[bytes] = set()
        for e, p in live:
            try:
                key, master = w.master_entry(p)
            except MapError as exc:
                e.result = frontend_error(p.fe, exc)
                continue
            # A master the map holds already (same counts, flags and id: e.g. one
            # backend replaced by another) is not written again; its slots, rewritten
            # before, are what changed.
            if master != p.state.master:
                keys.append(key)
                values.append(master)
                owners.append(len(ready))
                masters.append(True)
            wildcard = w.wildcards.new_entry(p)
            if wildcard is not None and wildcard[0] not in queued:
                queued.add(wildcard[0])
                keys.append(wildcard[1])
                values.append(wildcard[2])
                owners.append(len(ready))
                masters.append(False)
                new_wildcard.append(wildcard[0])
            else:
                new_wildcard.append(None)
            ready.append((e, p))
            ready_masters.append(master)
        done, exc2 = write_counted(
            w.maps.services(v6).backend, b"".join(keys), b"".join(values), len(keys)
        )
        if done < len(owners):
            complete = owners[done]
            # The masters written of frontends that fail (`after_master` records the
            # others').
            for j in range(done):
                if masters[j]:
                    ready[owners[j]][1].state.master = values[j]
        else:
            complete = len(ready)
        for i, (e, p) in enumerate(ready):
            if i >= complete:
                e.result = frontend_error(p.fe, exc2 or MapError("services", "update", 0))
                continue
            try:
                w.after_master(p, ready_masters[i], new_wildcard[i])
            except MapError as exc:
                e.result = frontend_error(p.fe, exc)

    def delete_orphans(self, txn: ReadTxn, orphans: list[tuple[Addr, Addr, int]]) -> None:
        """Delete the entries of backends the round's frontends dropped (after their masters)
        that still have no reference, with one batch call per map, and release their ids.
        One a frontend of the round took up again stays; one another frontend of the
        snapshot selects stays unreferenced (see ``FrontendWriter.drop_reference``).
        Orphans of frontends whose master was not written stay unreferenced too: prune
        drops them.

        A failed delete leaves the backend unreferenced (prune deletes it) and is logged:
        the frontends it served are written, so their rows are Done.

        Each orphan is (frontend address, backend address, the backend's id when it was
        orphaned): an entry deleted and made again since, with another id, is not it."""
        w = self.writer
        states = w.backend_states
        referenced = getattr(w.node, "backend_referenced", None)
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
            done, exc = delete_counted(w.maps.backends(v6).backend, [pack(i) for _, i in entries])
            for be_addr, _ in entries[:done]:
                w.backend_ids.release(be_addr)
                states.remove(be_addr)
            if exc is not None:
                log.warning(
                    "bpfops: %d orphaned backend(s) left for prune: %s", len(entries) - done, exc
                )
