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
  nobody claimed. A failed delete is collected, not raised. `audit_maps` does the dump's
  part in steps of `AUDIT_STEP` entries with pauses between them, for a prune that runs
  beside the reconciler's rounds (``FrontendOps.audit_in_steps``).
"""

from __future__ import annotations

import ipaddress
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import anyio

from bpf import lb
from bpf.errors import MapError
from bpf.spec import MAP_OF_MAPS
from bpf.typed_map import TypedMap
from bpfops.frontend_state import ip_of
from bpfops.lb_maps import LBMaps, delete_quiet
from bpfops.model import Addr, proto_name
from bpfops.wildcards import vip_key

if TYPE_CHECKING:
    from bpfops.frontend_state import FrontendState
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
    release_unclaimed(writer)
    for be_addr in writer.backend_states.unreferenced():
        _drop_if_unreferenced(writer, errs, be_addr)


def release_unclaimed(writer: FrontendWriter) -> None:
    """Release the restored ids nobody claimed; forget restored quarantines of frontends
    that are gone."""
    writer.service_ids.release_unclaimed()
    writer.backend_ids.release_unclaimed()
    quarantined = writer.restored_quarantined
    for addr in [a for a in quarantined if a not in writer.frontends]:
        del quarantined[addr]


def _drop_if_unreferenced(writer: FrontendWriter, errs: list[str], be_addr: Addr) -> None:
    states = writer.backend_states
    be_id = states.get(be_addr)
    if be_id is None or states.refcount(be_addr) > 0:
        return
    _prune_delete(errs, writer.maps.backends(be_addr.is_v6), be_id)
    writer.backend_ids.release(be_addr)
    states.remove(be_addr)


#: Entries an audit step looks at (decoding and checking one costs about 8 us): one step
#: holds the event loop for a few milliseconds.
AUDIT_STEP = 512

Entry = tuple[Any, Any]
LiveIds = dict[int, tuple[Addr, "FrontendState"]]
#: Given a chunk of a map's entries and the live service ids, the entries to delete.
Check = Callable[[list[Entry], LiveIds], list[Entry]]


def _live_ids(writer: FrontendWriter) -> LiveIds:
    return {st.id: (a, st) for a, st in writer.frontends.items()}


def _audited(writer: FrontendWriter) -> list[tuple[TypedMap[Any, Any], Check, bool]]:
    """Every LB map with the check of its entries, and whether the check reads the live
    service ids (entries keyed by service id) rather than the record by address."""
    maps = writer.maps
    out: list[tuple[TypedMap[Any, Any], Check, bool]] = []
    for v6 in (False, True):
        out.append((maps.services(v6), _service_check(writer, v6), False))
        out.append((maps.backends(v6), _backend_check(writer), False))
        out.append((maps.revnat(v6), _by_id(lambda st, key: st.revnat, v6), True))
        out.append((maps.source_ranges(v6), _source_range_check(v6), True))
        out.append((maps.maglev(v6), _by_id(lambda st, key: st.maglev, v6), True))
    affinity = _by_id(lambda st, key: key.backend_id in st.affinity,
                      id_of=lambda key: key.rev_nat_id)
    out.append((maps.aff_match, affinity, True))
    if maps.scale_to_zero is not None:
        # Entries of a previous run whose frontend is gone or no longer opted in.
        stz = _by_id(lambda st, key: st.scale_to_zero, id_of=lambda key: key.svc_id)
        out.append((maps.scale_to_zero, stz, True))
    return out


def _service_check(writer: FrontendWriter, v6: bool) -> Check:
    def check(entries: list[Entry], live: LiveIds) -> list[Entry]:
        doomed = []
        for key, value in entries:
            addr = Addr(ip_of(key.address), key.dport, proto_name(key.proto), key.scope)
            if key.dport == 0 and key.proto == 0:
                keep = vip_key(addr) in writer.wildcards.refs
            else:
                st = writer.frontends.get(addr)
                keep = (
                    st is not None
                    and st.v6 == v6
                    and key.backend_slot <= st.slot_count
                    and (key.backend_slot > 0 or st.master is not None)
                )
            if not keep:
                doomed.append((key, value))
        return doomed

    return check


def _backend_check(writer: FrontendWriter) -> Check:
    def check(entries: list[Entry], live: LiveIds) -> list[Entry]:
        states = writer.backend_states
        return [
            (be_id, value)
            for be_id, value in entries
            if states.get(Addr(ip_of(value.address), value.port, proto_name(value.proto)))
            != be_id
        ]

    return check


def _by_id(
    wants: Callable[[FrontendState, Any], Any],
    v6: bool | None = None,
    id_of: Callable[[Any], int] | None = None,
) -> Check:
    """Entries keyed by a service id (the key itself, or ``id_of(key)``): kept while that
    id's frontend (of family ``v6``, when given) ``wants`` them."""

    def check(entries: list[Entry], live: LiveIds) -> list[Entry]:
        doomed = []
        for key, value in entries:
            hit = live.get(key if id_of is None else id_of(key))
            if hit is None or (v6 is not None and hit[1].v6 != v6) or not wants(hit[1], key):
                doomed.append((key, value))
        return doomed

    return check


def _source_range_check(v6: bool) -> Check:
    def check(entries: list[Entry], live: LiveIds) -> list[Entry]:
        doomed = []
        for key, value in entries:
            hit = live.get(key.rev_nat_id)
            ok = False
            if hit is not None and hit[1].v6 == v6:
                net = ipaddress.ip_network(
                    (ipaddress.ip_address(key.address), key.prefixlen - 32), strict=False
                )
                ok = net in hit[1].source_ranges
            if not ok:
                doomed.append((key, value))
        return doomed

    return check


def _entries(m: TypedMap[Any, Any], step: int) -> Iterator[list[Entry]]:
    """A map's entries in chunks of about ``step``; a map of maps (maglev) by its keys,
    all read at once (get-next-key cannot resume from a key deleted meanwhile)."""
    if m.spec.type in MAP_OF_MAPS:
        keys = [(k, None) for k in m]
        for i in range(0, len(keys), step):
            yield keys[i : i + step]
        return
    yield from m.chunks(step)


def _prune_unrecorded(writer: FrontendWriter, errs: list[str]) -> None:
    """Dump every LB map and delete the entries the record does not explain."""
    live = _live_ids(writer)
    for m, check, _ in _audited(writer):
        for chunk in _entries(m, 4096):
            for key, _value in check(chunk, live):
                _prune_delete(errs, m, key)


async def audit_maps(writer: FrontendWriter, errs: list[str], step: int | None = None) -> None:
    """What `prune_maps` does after `release_unclaimed`, in steps of ``step`` entries
    (default `AUDIT_STEP`), each followed by a pause as long as the step took: the event
    loop is held a few milliseconds at a time, and changes reconciled between two steps
    are seen by the next (each step checks its entries against the record as it is then;
    entries keyed by service id that look unexplained are checked again against the ids
    live at that moment before they are deleted)."""
    step = step or AUDIT_STEP
    addrs = list(writer.backend_states)
    for i in range(0, len(addrs), step):
        began = time.perf_counter()
        for be_addr in addrs[i : i + step]:
            _drop_if_unreferenced(writer, errs, be_addr)
        await anyio.sleep(min(0.05, time.perf_counter() - began))
    live = _live_ids(writer)
    for m, check, by_id in _audited(writer):
        chunks = _entries(m, step)
        while True:
            began = time.perf_counter()
            chunk = next(chunks, None)
            if chunk is None:
                break
            doomed = check(chunk, live)
            if doomed and by_id:
                live = _live_ids(writer)
                doomed = check(doomed, live)
            for key, _value in doomed:
                _prune_delete(errs, m, key)
            await anyio.sleep(min(0.05, time.perf_counter() - began))


def _prune_delete(errs: list[str], m: TypedMap[Any, Any], key: Any) -> None:
    try:
        delete_quiet(m, key)
    except MapError as exc:
        errs.append(str(exc))
