"""The reconciler Operations writing computed network policy into the BPF maps.

``PolicyOps`` writes the ``policy-entries`` table (tables/policy_entries.py) into the
per-endpoint policy maps ``cilium_policy_v2_<id>`` (layout: bpf/include/policy.h, Cilium's
``cilium_policy_v2``; codec: bpf/policy.py), which `PolicyMapSet` creates, pins, installs
in the hash of maps ``policy_maps`` (endpoint id -> map, for the socket program) and
removes:

* an endpoint's map is created (or adopted from its pin) when its first entry is written
  and removed (unpinned, deleted from ``policy_maps``) when its last row is deleted;
* ``update`` reads the entry first and writes only a different one, so a restarted
  agent whose maps still hold the computed policy rewrites nothing (``writes`` and
  ``skipped`` count both, ``writes_by_endpoint`` per endpoint: what one policy or identity
  change cost is the difference of two readings);
* ``prune`` (the reconciler calls it only once every initializer of the table is done)
  deletes the entries no row explains and removes the maps of endpoints without rows,
  also maps pinned by an earlier run and never opened since.

Installing a map in ``policy_maps`` or deleting it from there makes the kernel wait for an
RCU grace period (milliseconds): those steps, and the prune, run in a worker thread (the
operation returns an awaitable then), so the event loop never waits for them. Writing an
entry into an open map stays on the loop (one or two syscalls).

``PolicyNetnsOps`` writes the ``policy-netns`` table (tables/policy_netns.py) into
``policy_netns``: network-namespace cookie -> endpoint id and the directions its policy
enforces. The socket program finds the connecting endpoint there; an endpoint that does
not enforce egress is never looked up in its policy map.

Enforcement order. The two reconcilers run independently, but an enforced direction
with an incomplete allow-list refuses flows its policy allows, so each one waits for the
other where it matters (given the tables; the policy-maps component always gives them):

* switching a direction **on**: `PolicyNetnsOps` writes the flag only once every entry of
  the endpoint and direction is Done in the round's snapshot (the map holds them: the
  policy writer writes the entries and the ``policy-endpoints`` row in one transaction,
  so the snapshot holds at least the entries of the decision) and that snapshot's
  ``policy-endpoints`` row still enforces it. Otherwise it writes the entry without that
  direction and raises `EnforcementHeldError` (the row goes to Error and is retried;
  ``held`` keeps the reason per cookie). A direction already on stays on (a restarted
  agent, or a policy change while enforced).
* switching a direction **off**: `PolicyOps` deletes an entry of a direction its
  endpoint's policy no longer enforces only once every ``policy-netns`` row of the
  endpoint is Done without that direction; otherwise `EnforcementStillOnError` (retried).
  The prune leaves such entries, and such an endpoint's map, to a later prune.
* **replacing** entries of a direction still enforced: `PolicyOps` deletes one only once
  the endpoint's other entries of the direction are all Done (`NewEntriesPendingError`
  otherwise; a failed write does not hold deletes, a full map needs the room): the
  reconciler runs a round's deletes before its updates, which would refuse, between the
  two, flows that both the old and the new policy allow. Other writers of
  enforcement flags (the endpoint datapath's ``policy_endpoints``, for the tc programs)
  join through ``PolicyOps.enforcers`` and switch a direction on by the same rule
  (tables/policy_netns.writable_flags).

Both checks read the endpoint's own rows through an index: O(entries of the endpoint)
and O(1). A failed entry write therefore keeps the direction as it was (off, for an
endpoint the policy newly selects), and a failed ``policy_netns`` write keeps the old
entries: the datapath holds the last state written completely (docs/policy.md says why).

Errors are `PolicyMapError` naming the map, the operation, the entry and the errno.
"""

from __future__ import annotations

import errno as errno_mod
import logging
import os
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.to_thread

from bpf.catalog import policy_map_spec
from bpf.errors import MapError
from bpf.memory_map import MemoryMap
from bpf.pinning import MapOpener, open_or_create, pin_path
from bpf.policy import PolicyMapEntry, PolicyMapKey, PolicyNetns, endpoint_of_map
from bpf.typed_map import TypedMap
from bpfops.keyed_map_ops import KeyedMapOps
from statedb import ReadTxn, Table
from statedb.errors import StatewrightError
from tables.policy_entries import (
    DirectionBacklog,
    PolicyEndpoint,
    PolicyEntry,
    PolicyKey,
    direction_backlog,
    endpoint_mode,
    policy_endpoint_index,
)
from tables.policy_netns import (
    PolicyNetnsEntry,
    direction_flag,
    enforcement_may_be_on,
    mode_flags,
)

log = logging.getLogger("statewright.bpfops.policy")


@dataclass(frozen=True, slots=True)
class HeldDirection:
    """A direction whose enforcement may not be switched on yet, and why."""

    egress: bool
    reason: str
    #: The entries not written yet (None when the policy no longer enforces it).
    backlog: DirectionBacklog | None = None

    @property
    def direction(self) -> str:
        """``egress`` or ``ingress``."""
        return "egress" if self.egress else "ingress"

    @property
    def failed(self) -> bool:
        """Whether an entry of the direction failed (not merely not written yet)."""
        return self.backlog is not None and self.backlog.errors > 0


class EnforcementHeldError(StatewrightError):
    """An endpoint's policy is not switched on in a direction because its map does not
    hold every entry of it yet (Pending, or a write failed): the direction stays as it
    was (not enforced) and the row is retried."""

    def __init__(self, endpoint_id: int, cookie: int, held: list[HeldDirection]) -> None:
        parts = [f"{h.direction} ({h.reason})" for h in held]
        super().__init__(
            f"policy of endpoint {endpoint_id} not enforced yet in "
            + "; ".join(parts)
            + ": enforcement waits until its policy map holds every entry"
        )
        self.endpoint_id = endpoint_id
        self.cookie = cookie
        self.held = tuple(held)

    @property
    def failed(self) -> bool:
        """Whether an entry write failed (a lasting problem, not a moment's wait)."""
        return any(h.failed for h in self.held)


class EnforcementStillOnError(StatewrightError):
    """An entry of a direction the endpoint's policy no longer enforces is not deleted
    while the datapath may still enforce that direction (``policy_netns``, or another
    writer's flags: `PolicyOps.enforcers`); it is retried."""

    def __init__(self, obj: PolicyEntry) -> None:
        k = obj.key
        d = "egress" if k.egress else "ingress"
        super().__init__(
            f"{describe(obj)}: kept until the {d} enforcement of endpoint {k.endpoint_id} "
            "is switched off (policy_netns or policy_endpoints not written yet)"
        )
        self.endpoint_id = k.endpoint_id
        self.egress = k.egress


class NewEntriesPendingError(StatewrightError):
    """An entry of a direction the endpoint still enforces is not deleted while entries
    of that direction are waiting to be written (those replacing it, perhaps): deleting
    first would refuse, for a moment, flows both the old and the new policy allow. It is
    retried; a failed write does not hold it (a full map needs the room)."""

    def __init__(self, obj: PolicyEntry, backlog: DirectionBacklog) -> None:
        super().__init__(
            f"{describe(obj)}: kept until the endpoint's new {backlog.direction} entries are "
            f"written ({backlog.not_done} of {backlog.total} not yet)"
        )
        self.endpoint_id = obj.key.endpoint_id


class PolicyMapError(StatewrightError):
    """A failed operation on a policy map: map, operation, entry or endpoint, errno."""

    def __init__(self, map_name: str, op: str, obj: str, err: MapError) -> None:
        what = f"{op} {obj}" if obj else op
        super().__init__(f"map {map_name}: {what}: {err}")
        self.map_name = map_name
        self.errno = err.errno


def map_key(key: PolicyKey) -> PolicyMapKey:
    """The policy-map key of a row's key (the endpoint is the map, not part of the key)."""
    return PolicyMapKey.entry(
        key.identity, key.egress, key.protocol, key.dport, key.port_prefix_len
    )


def map_entry(row: PolicyEntry) -> PolicyMapEntry:
    """The policy-map value of a row: allow or deny, and the protocol/port bits matched."""
    return PolicyMapEntry.verdict(row.deny, map_key(row.key).lpm_prefix_length)


def describe(row: PolicyEntry) -> str:
    """A row as errors name it."""
    k = row.key
    port = "any" if k.port_prefix_len == 0 else f"{k.dport}/{k.port_prefix_len}"
    return (
        f"endpoint {k.endpoint_id} {'egress' if k.egress else 'ingress'} identity "
        f"{k.identity} proto {k.protocol} port {port}"
    )


def egress_allowed(
    policy_map: TypedMap[PolicyMapKey, PolicyMapEntry] | None,
    identity: int,
    protocol: int,
    dport: int,
) -> bool:
    """The socket program's verdict (bpf/sock_lb.c ``sw_policy_allows``) on one endpoint's
    map: the identity's entry, then any identity's; a deny wins, no entry or no map denies.
    For tools and for checking the map encoding against the rows' meaning."""
    if policy_map is None:
        return False
    l3 = policy_map.lookup(PolicyMapKey.lookup(identity, True, protocol, dport))
    if l3 is not None and l3.deny:
        return False
    l4 = policy_map.lookup(PolicyMapKey.lookup(0, True, protocol, dport))
    if l4 is not None:
        return not l4.deny
    return l3 is not None


class PolicyMapSet:
    """The per-endpoint policy maps of one pin directory and the ``policy_maps`` hash of
    maps that holds them (see the module doc).

    ``pin_dir`` None keeps the maps unpinned (alive while this object and ``policy_maps``
    hold them). Handles stay open until `remove` or `close`.
    """

    def __init__(
        self,
        outer: TypedMap[int, int],
        opener: MapOpener,
        pin_dir: str | None,
        max_entries: int | None = None,
    ) -> None:
        self.outer = outer
        self.opener = opener
        self.pin_dir = pin_dir
        inner = outer.spec.inner
        self.max_entries = max_entries or (inner.max_entries if inner else 16384)
        self._maps: dict[int, TypedMap[PolicyMapKey, PolicyMapEntry]] = {}
        self.created = 0
        self.removed = 0

    def spec(self, endpoint_id: int) -> Any:
        """The spec of ``endpoint_id``'s map."""
        return policy_map_spec(endpoint_id, self.max_entries)

    def is_open(self, endpoint_id: int) -> bool:
        """Whether the endpoint's map is open here (using it needs no map-in-map update)."""
        return endpoint_id in self._maps

    def exists(self, endpoint_id: int) -> bool:
        """Whether the endpoint has a map: open here, in ``policy_maps`` or pinned."""
        if endpoint_id in self._maps:
            return True
        try:
            if self.outer.lookup(endpoint_id) is not None:
                return True
        except MapError as e:
            raise PolicyMapError(self.outer.name, "lookup", f"endpoint {endpoint_id}", e) from e
        if self.pin_dir is None:
            return False
        return self.opener.is_pinned(pin_path(self.pin_dir, self.spec(endpoint_id).name))

    def get(self, endpoint_id: int) -> TypedMap[PolicyMapKey, PolicyMapEntry] | None:
        """The endpoint's map if it exists (open, or pinned by an earlier run), else None."""
        m = self._maps.get(endpoint_id)
        if m is not None or self.pin_dir is None:
            return m
        if not self.opener.is_pinned(pin_path(self.pin_dir, self.spec(endpoint_id).name)):
            return None
        return self.ensure(endpoint_id)

    def ensure(self, endpoint_id: int) -> TypedMap[PolicyMapKey, PolicyMapEntry]:
        """The endpoint's map, created (and pinned) or adopted from its pin, and installed
        in ``policy_maps``."""
        m = self._maps.get(endpoint_id)
        if m is not None:
            return m
        spec = self.spec(endpoint_id)
        try:
            if self.pin_dir is None:
                backend = self.opener.create(spec)
            else:
                existed = self.opener.is_pinned(pin_path(self.pin_dir, spec.name))
                backend = open_or_create(self.opener, spec, self.pin_dir)
                if not existed:
                    self.created += 1
            m = TypedMap(spec, backend)
        except MapError as e:
            raise PolicyMapError(spec.name, "create", f"endpoint {endpoint_id}", e) from e
        try:
            if not self._installed(endpoint_id, m):
                self.outer.set_inner(endpoint_id, m)
        except MapError as e:
            m.close()
            raise PolicyMapError(self.outer.name, "install", f"endpoint {endpoint_id}", e) from e
        self._maps[endpoint_id] = m
        return m

    def _installed(self, endpoint_id: int, m: TypedMap[Any, Any]) -> bool:
        """Whether ``policy_maps`` already holds ``m`` for the endpoint (an adopted map
        after a restart: no map-in-map update needed)."""
        try:
            raw = self.outer.backend.lookup(self.outer.spec.key.encode(endpoint_id))
        except MapError:
            return False
        if raw is None:
            return False
        installed = int.from_bytes(raw, "little")
        if self.opener is MemoryMap:
            return installed == m.backend.fd
        own = m.backend.info().id
        return own != 0 and installed == own

    def remove(self, endpoint_id: int) -> None:
        """Remove the endpoint's map: out of ``policy_maps``, unpinned, closed."""
        name = self.spec(endpoint_id).name
        try:
            self.outer.delete(endpoint_id)
        except MapError as e:
            if e.errno != errno_mod.ENOENT:
                raise PolicyMapError(self.outer.name, "delete", f"endpoint {endpoint_id}", e) from e
        m = self._maps.pop(endpoint_id, None)
        if m is not None:
            m.close()
        if self.pin_dir is not None:
            try:
                self.opener.remove_pin(pin_path(self.pin_dir, name))
            except FileNotFoundError:
                pass
            except OSError as e:
                err = MapError(name, "unpin", e.errno or errno_mod.EIO)
                raise PolicyMapError(name, "unpin", f"endpoint {endpoint_id}", err) from e
        self.removed += 1
        log.debug("policy: removed the policy map of endpoint %d", endpoint_id)

    def endpoint_ids(self) -> set[int]:
        """Every endpoint with a map: open here, installed in ``policy_maps``, or pinned."""
        ids = set(self._maps)
        try:
            ids.update(self.outer.keys())
        except MapError as e:
            raise PolicyMapError(self.outer.name, "iterate", "", e) from e
        if self.pin_dir is not None:
            ids.update(self._pinned_ids())
        return ids

    def _pinned_ids(self) -> set[int]:
        assert self.pin_dir is not None
        if self.opener is MemoryMap:
            names = [
                os.path.basename(p)
                for p in MemoryMap.pinned_paths()
                if os.path.dirname(p) == self.pin_dir
            ]
        else:
            try:
                names = os.listdir(self.pin_dir)
            except FileNotFoundError:
                names = []
        return {i for i in map(endpoint_of_map, names) if i is not None}

    def open_maps(self) -> dict[int, TypedMap[PolicyMapKey, PolicyMapEntry]]:
        """The maps open now, by endpoint id."""
        return dict(self._maps)

    def close(self) -> None:
        """Close every handle (pins and ``policy_maps`` keep the maps)."""
        for m in self._maps.values():
            m.close()
        self._maps.clear()


class PolicyOps:
    """Operations of the ``policy-entries`` reconciler (see the module doc).

    Given the ``policy-endpoints`` and ``policy-netns`` tables, an entry of a direction
    its endpoint's policy no longer enforces is deleted (by a delete or a prune) only once
    neither ``policy_netns`` nor any of ``enforcers`` enforces that direction for the
    endpoint; until then the delete raises `EnforcementStillOnError` and is retried. An
    entry of a direction still enforced is deleted only once no other entry of it waits
    to be written (unless one failed), else `NewEntriesPendingError`: a policy replaced
    by another passes through the union of both, never through less than their common
    part (module doc, "Enforcement order")."""

    def __init__(
        self,
        table: Table[PolicyEntry],
        maps: PolicyMapSet,
        modes: Table[PolicyEndpoint] | None = None,
        netns: Table[PolicyNetnsEntry] | None = None,
    ) -> None:
        self.table = table
        self.maps = maps
        self.modes = modes
        self.netns = netns
        #: Other writers of enforcement flags (the endpoint datapath's tc programs): each
        #: says which directions it may enforce for an endpoint id now; entries of a
        #: direction no longer enforced also wait for them.
        self.enforcers: list[Callable[[int], int]] = []
        #: direction_backlog by (endpoint, egress) at one revision of the table.
        self._backlogs: dict[tuple[int, bool], DirectionBacklog] = {}
        self._backlog_revision = -1
        self.writes = 0
        self.skipped = 0
        self.deletes = 0
        self.writes_by_endpoint: Counter[int] = Counter()

    def update(self, txn: ReadTxn, revision: int, obj: PolicyEntry) -> Awaitable[None] | None:
        """Write the entry of ``obj`` into its endpoint's map unless it holds exactly it
        (an awaitable when the map must first be created or adopted: module doc).

        An LPM lookup with the entry's own key returns that entry or a shorter one
        covering it; the value carries the matched prefix length, so an equal value
        means this very entry is stored."""
        ep = obj.key.endpoint_id
        if not self.maps.is_open(ep):
            return self._update_new_map(obj)
        self._write(self.maps.ensure(ep), obj)
        return None

    async def _update_new_map(self, obj: PolicyEntry) -> None:
        m = await anyio.to_thread.run_sync(self.maps.ensure, obj.key.endpoint_id)
        self._write(m, obj)

    def _write(self, m: TypedMap[PolicyMapKey, PolicyMapEntry], obj: PolicyEntry) -> None:
        ep = obj.key.endpoint_id
        key, value = map_key(obj.key), map_entry(obj)
        try:
            if m.lookup(key) == value:
                self.skipped += 1
                return
            m.update(key, value)
        except MapError as e:
            raise PolicyMapError(m.name, "update", describe(obj), e) from e
        self.writes += 1
        self.writes_by_endpoint[ep] += 1

    def delete(self, txn: ReadTxn, revision: int, obj: PolicyEntry) -> Awaitable[None] | None:
        """Delete the entry of ``obj`` (an absent one is fine); remove the endpoint's map
        once no row of the endpoint is left (then an awaitable: module doc)."""
        ep = obj.key.endpoint_id
        if self._still_enforced(txn, ep, obj.key.egress):
            raise EnforcementStillOnError(obj)
        pending = self._new_entries_pending(txn, ep, obj.key.egress)
        if pending is not None:
            raise NewEntriesPendingError(obj, pending)
        if not self._has_rows(txn, ep):
            if not self.maps.exists(ep):
                return None  # removed with an earlier row of the same endpoint
            return anyio.to_thread.run_sync(self.maps.remove, ep)
        if not self.maps.is_open(ep):
            return anyio.to_thread.run_sync(self._delete_entry, obj)
        self._delete_entry(obj)
        return None

    def _delete_entry(self, obj: PolicyEntry) -> None:
        m = self.maps.get(obj.key.endpoint_id)
        if m is None:
            return
        try:
            m.delete(map_key(obj.key))
        except MapError as e:
            if e.errno == errno_mod.ENOENT:
                return
            raise PolicyMapError(m.name, "delete", describe(obj), e) from e
        self.deletes += 1

    def _still_enforced(self, txn: ReadTxn, endpoint_id: int, egress: bool) -> bool:
        """Whether deleting an entry of the endpoint's direction must wait: its policy no
        longer enforces the direction but ``policy_netns`` may still (class doc). An
        entry of a direction still enforced goes at once (the policy narrowed)."""
        if self.netns is None:
            return False
        flag = direction_flag(egress)
        modes = self.modes
        if modes is not None and mode_flags(endpoint_mode(txn, modes, endpoint_id)) & flag:
            return False
        if any(enforces(endpoint_id) & flag for enforces in self.enforcers):
            return True
        return enforcement_may_be_on(txn, self.netns, endpoint_id, flag)

    def _new_entries_pending(
        self, txn: ReadTxn, endpoint_id: int, egress: bool
    ) -> DirectionBacklog | None:
        """The backlog of a direction the endpoint still enforces when entries of it wait
        to be written and none failed (then an entry's delete waits: class doc), else
        None. Memoized per revision of the table: one count per endpoint and round, not
        one per deleted entry."""
        modes = self.modes
        if modes is None:
            return None
        if not mode_flags(endpoint_mode(txn, modes, endpoint_id)) & direction_flag(egress):
            return None
        revision = self.table.revision(txn)
        if revision != self._backlog_revision:
            self._backlogs.clear()
            self._backlog_revision = revision
        backlog = self._backlogs.get((endpoint_id, egress))
        if backlog is None:
            backlog = direction_backlog(txn, self.table, endpoint_id, egress)
            self._backlogs[endpoint_id, egress] = backlog
        return backlog if backlog.not_done and not backlog.errors else None

    async def prune(self, txn: ReadTxn, objects: Iterator[PolicyEntry]) -> None:
        """Delete every entry no row explains; remove the maps of endpoints without rows
        (in a worker thread: module doc). What a delete would wait for (class doc) is
        left to a later prune."""
        want: dict[int, set[PolicyMapKey]] = {}
        for row in objects:
            want.setdefault(row.key.endpoint_id, set()).add(map_key(row.key))
        held: dict[tuple[int, bool], bool] = {}

        def still_enforced(ep: int, egress: bool) -> bool:
            if (ep, egress) not in held:
                held[ep, egress] = self._still_enforced(txn, ep, egress)
            return held[ep, egress]

        await anyio.to_thread.run_sync(self._prune, want, still_enforced)

    def _prune(
        self, want: dict[int, set[PolicyMapKey]], held: Callable[[int, bool], bool]
    ) -> None:
        for ep in sorted(self.maps.endpoint_ids()):
            keys = want.get(ep)
            if keys is None:
                if not (held(ep, True) or held(ep, False)):
                    self.maps.remove(ep)
                continue
            m = self.maps.ensure(ep)
            try:
                stray = [k for k in m if k not in keys and not held(ep, bool(k.egress))]
            except MapError as e:
                raise PolicyMapError(m.name, "prune (iterate)", "", e) from e
            for k in stray:
                try:
                    m.delete(k)
                    self.deletes += 1
                except MapError as e:
                    if e.errno != errno_mod.ENOENT:
                        raise PolicyMapError(m.name, "prune", repr(k), e) from e

    def _has_rows(self, txn: ReadTxn, endpoint_id: int) -> bool:
        it = self.table.list(txn, policy_endpoint_index.query(endpoint_id))
        return next(iter(it), None) is not None


class PolicyNetnsOps(KeyedMapOps[PolicyNetnsEntry]):
    """Operations of the ``policy-netns`` reconciler: one ``policy_netns`` entry per row.

    Given the ``policy-entries`` and ``policy-endpoints`` tables, a direction is switched
    on only once the endpoint's entries of that direction are all Done in the round's
    snapshot and its ``policy-endpoints`` row there still enforces it (module doc,
    "Enforcement order"); until then the entry is written without that direction and the
    update raises `EnforcementHeldError` (retried; `held` says which namespaces wait and
    why). A direction already on stays on, and switching one off never waits."""

    def __init__(
        self,
        netns_map: TypedMap[int, PolicyNetns],
        entries: Table[PolicyEntry] | None = None,
        modes: Table[PolicyEndpoint] | None = None,
    ) -> None:
        super().__init__(netns_map)
        self.entries = entries
        self.modes = modes
        #: Netns cookie -> why its endpoint's enforcement is held back (the latest update).
        self.held: dict[int, EnforcementHeldError] = {}

    def key_of(self, obj: PolicyNetnsEntry) -> int:
        """The netns cookie."""
        return obj.netns_cookie

    def describe(self, obj: PolicyNetnsEntry) -> str:
        """Cookie and endpoint."""
        return f"netns {obj.netns_cookie} (endpoint {obj.endpoint_id})"

    def update(self, txn: ReadTxn, revision: int, obj: PolicyNetnsEntry) -> None:
        """Write the entry of ``obj`` unless the map already holds exactly it; a direction
        being switched on whose entries are not all written is left off (class doc)."""
        cookie = obj.netns_cookie
        try:
            have = self.map.lookup(cookie)
        except MapError as e:
            raise PolicyMapError(self.map.name, "lookup", self.describe(obj), e) from e
        on = have.flags if have is not None and have.endpoint_id == obj.endpoint_id else 0
        held = self._held_directions(txn, obj, obj.flags & ~on)
        flags = obj.flags
        for reason in held:
            flags &= ~direction_flag(reason.egress)
        value = PolicyNetns(obj.endpoint_id, flags)
        if have == value:
            self.skipped += 1
        else:
            try:
                self.map.update(cookie, value)
            except MapError as e:
                raise PolicyMapError(self.map.name, "update", self.describe(obj), e) from e
            self.writes += 1
        if held:
            err = EnforcementHeldError(obj.endpoint_id, cookie, held)
            self.held[cookie] = err
            raise err
        self.held.pop(cookie, None)

    def _held_directions(
        self, txn: ReadTxn, obj: PolicyNetnsEntry, turning_on: int
    ) -> list[HeldDirection]:
        """The directions among ``turning_on`` that may not be switched on in ``txn``."""
        out: list[HeldDirection] = []
        if not turning_on or self.entries is None:
            return out
        mode = endpoint_mode(txn, self.modes, obj.endpoint_id) if self.modes else None
        for egress in (True, False):
            flag = direction_flag(egress)
            if not turning_on & flag:
                continue
            if self.modes is not None and not mode_flags(mode) & flag:
                # derived from an older policy-endpoints row: the follower rewrites it
                out.append(HeldDirection(egress, "its policy no longer enforces it"))
                continue
            backlog = direction_backlog(txn, self.entries, obj.endpoint_id, egress)
            if not backlog.written:
                out.append(HeldDirection(egress, backlog.describe(), backlog))
        return out

    def delete(self, txn: ReadTxn, revision: int, obj: PolicyNetnsEntry) -> None:
        """Delete the entry of ``obj``; an absent entry is fine."""
        self.held.pop(obj.netns_cookie, None)
        super().delete(txn, revision, obj)

    def prune(self, txn: ReadTxn, objects: Iterator[PolicyNetnsEntry]) -> None:
        """Delete every entry no row explains (and forget what held them)."""
        rows = list(objects)
        keep = {r.netns_cookie for r in rows}
        for cookie in [c for c in self.held if c not in keep]:
            del self.held[cookie]
        super().prune(txn, iter(rows))
