"""Restore and prune for FrontendOps: the two places its state meets maps it did not write.

Both work on the record of a ``bpfops.frontend_writer.FrontendWriter``.

* `restore_ids` (at start, and on ``FrontendOps.reset_and_restore``): forget the record,
  then reserve every service and backend id found in the maps, so a restarted agent keeps
  them; entries written with protocol ANY reserve their id for TCP, UDP and SCTP
  (`aliases`). A backend in a frontend's inactive tail whose backends-map entry says
  active was quarantined before the restart (``restored_quarantined``).
* `maps_are_empty`: whether the maps hold nothing (then the first prune needs no dump:
  ``FrontendOps.maps_explained``); `prune_recorded`: the prune's part that needs no dump.
* `prune_maps`: delete every entry of every LB map that the state does not explain
  (unknown service keys and slots, backends, rev-NAT, affinity, source-range, maglev and
  scale-to-zero entries, wildcard entries without a frontend), release restored ids
  nobody claimed. A failed delete is collected, not raised.
"""

from __future__ import annotations

import ipaddress
from typing import TYPE_CHECKING, Any

from bpf import lb
from bpf.errors import MapError
from bpf.typed_map import TypedMap
from bpfops.frontend_state import ip_of
from bpfops.lb_maps import LBMaps, delete_quiet
from bpfops.model import Addr, proto_name

if TYPE_CHECKING:
    from bpfops.frontend_writer import FrontendWriter

BACKEND_ACTIVE = lb.BACKEND_ACTIVE


def restore_ids(writer: FrontendWriter) -> None:
    """Forget the writer's record, then reserve the ids found in the maps, and take the
    backends of inactive tails still active in the backends map for quarantined."""
    writer.service_ids.reset()
    writer.backend_ids.reset()
    writer.frontends.clear()
    writer.backend_states.reset()
    writer.wildcards.refs.clear()
    writer.expansions.clear()
    writer.restored_quarantined.clear()
    be_addr_by_id: dict[int, tuple[Addr, int]] = {}
    for v6 in (False, True):
        for be_id, value in writer.maps.backends(v6).dump():
            addr = Addr(ip_of(value.address), value.port, proto_name(value.proto))
            be_addr_by_id[be_id] = (addr, value.flags)
            for alias in aliases(addr):
                writer.backend_ids.reserve(alias, be_id)
    for v6 in (False, True):
        slots_by_addr: dict[Addr, dict[int, lb.ServiceValue]] = {}
        for key, value in writer.maps.services(v6).dump():
            if key.dport == 0 and key.proto == 0:
                continue  # wildcard entries carry no id
            addr = Addr(ip_of(key.address), key.dport, proto_name(key.proto), key.scope)
            slots_by_addr.setdefault(addr, {})[key.backend_slot] = value
        for addr, slots in slots_by_addr.items():
            master = slots.get(0)
            if master is None or master.rev_nat_index == 0:
                continue
            for alias in aliases(addr):
                writer.service_ids.reserve(alias, master.rev_nat_index)
            # Backends in the inactive tail that are still active in the backends
            # map were quarantined (unhealthy) before the restart.
            first = 1 + master.count
            for slot in range(first, first + master.qcount):
                sv = slots.get(slot)
                if sv is None or sv.backend_id not in be_addr_by_id:
                    continue
                be_addr, state = be_addr_by_id[sv.backend_id]
                if state == BACKEND_ACTIVE:
                    writer.restored_quarantined.setdefault(addr, set()).add(be_addr)


def maps_are_empty(maps: LBMaps) -> bool:
    """Whether no LB map holds an entry (a node's first start, or maps not pinned): one
    key lookup per map."""
    return all(next(iter(m.backend.keys()), None) is None for m in maps.maps.values())


def aliases(addr: Addr) -> list[Addr]:
    """Entries written with protocol ANY by older versions map to TCP, UDP and SCTP."""
    if addr.proto != "ANY":
        return [addr]
    return [Addr(addr.ip, addr.port, p, addr.scope) for p in ("TCP", "UDP", "SCTP")]


def prune_maps(writer: FrontendWriter, errs: list[str]) -> None:
    """Delete map entries the writer's record does not explain, collecting failures in ``errs``;
    release unclaimed restored ids."""
    prune_recorded(writer, errs)
    _prune_unrecorded(writer, errs)


def prune_recorded(writer: FrontendWriter, errs: list[str]) -> None:
    """The part of a prune the record alone says: release unclaimed restored ids, and
    delete the backend entries no frontend references any more (kept for a frontend of
    the snapshot that did not take them, or allocated by an update that failed)."""
    writer.service_ids.release_unclaimed()
    writer.backend_ids.release_unclaimed()
    quarantined = writer.restored_quarantined
    for addr in [a for a in quarantined if a not in writer.frontends]:
        del quarantined[addr]
    maps = writer.maps
    states = writer.backend_states
    for be_addr, be_id in states.items():
        if states.refcount(be_addr) <= 0:  # allocated by an update that failed
            be_map_ = maps.backends(be_addr.is_v6)
            _prune_delete(errs, be_map_, be_id)
            writer.backend_ids.release(be_addr)
            states.remove(be_addr)


def _prune_unrecorded(writer: FrontendWriter, errs: list[str]) -> None:
    """Dump every LB map and delete the entries the record does not explain."""
    maps = writer.maps
    live_ids = {st.id: (a, st) for a, st in writer.frontends.items()}
    for v6 in (False, True):
        svc_map = maps.services(v6)
        for key, _value in svc_map.dump():
            addr = Addr(ip_of(key.address), key.dport, proto_name(key.proto), key.scope)
            if key.dport == 0 and key.proto == 0:
                keep = (addr.ip, key.scope) in writer.wildcards.refs
            else:
                st = writer.frontends.get(addr)
                keep = (
                    st is not None
                    and st.v6 == v6
                    and key.backend_slot <= len(st.slots)
                    and (key.backend_slot > 0 or st.master is not None)
                )
            if not keep:
                _prune_delete(errs, svc_map, key)
        be_map = maps.backends(v6)
        for be_id, value in be_map.dump():
            be_addr = Addr(ip_of(value.address), value.port, proto_name(value.proto))
            if writer.backend_states.get(be_addr) != be_id:
                _prune_delete(errs, be_map, be_id)
        rev_map = maps.revnat(v6)
        for rev_id, _ in rev_map.dump():
            hit = live_ids.get(rev_id)
            if hit is None or hit[1].v6 != v6 or not hit[1].revnat:
                _prune_delete(errs, rev_map, rev_id)
        src_map = maps.source_ranges(v6)
        for key, _ in src_map.dump():
            hit = live_ids.get(key.rev_nat_id)
            ok = False
            if hit is not None and hit[1].v6 == v6:
                net = ipaddress.ip_network(
                    (ipaddress.ip_address(key.address), key.prefixlen - 32), strict=False
                )
                ok = net in hit[1].source_ranges
            if not ok:
                _prune_delete(errs, src_map, key)
        mg_map = maps.maglev(v6)
        for rev_id in list(mg_map.keys()):
            hit = live_ids.get(rev_id)
            if hit is None or hit[1].v6 != v6 or not hit[1].maglev:
                _prune_delete(errs, mg_map, rev_id)
    aff = maps.aff_match
    for key, _ in aff.dump():
        hit = live_ids.get(key.rev_nat_id)
        if hit is None or key.backend_id not in hit[1].affinity:
            _prune_delete(errs, aff, key)
    stz = maps.scale_to_zero
    if stz is not None:
        # Entries of a previous run whose frontend is gone or no longer opted in.
        for key, _ in stz.dump():
            hit = live_ids.get(key.svc_id)
            if hit is None or not hit[1].scale_to_zero:
                _prune_delete(errs, stz, key)


def _prune_delete(errs: list[str], m: TypedMap[Any, Any], key: Any) -> None:
    try:
        delete_quiet(m, key)
    except MapError as exc:
        errs.append(str(exc))
