"""The order of enforcement and allow entries, with the two reconcilers of the policy-maps
component (``policy-entries`` -> policy maps, ``policy-netns`` -> ``policy_netns``) run
independently on memory maps, one of them held back:

* a direction is switched on in ``policy_netns`` only once the endpoint's policy map holds
  every entry of it (every time the map gets the flag, the policy map already holds the
  entries: checked at each write, not sampled);
* a failing entry write keeps the direction off, the ``policy-netns`` row in Error naming
  the endpoint, the direction and the entry's error;
* when a policy stops selecting an endpoint, its entries are deleted (and its map
  removed) only once ``policy_netns`` no longer enforces the direction, also by a prune;
  entries of a direction that stays enforced (a narrower policy) go at once;
* a row derived from an older ``policy-endpoints`` row does not switch enforcement on;
* another writer of enforcement flags (the endpoint datapath's ``policy_endpoints``)
  follows the same order, and the realized revision waits for every writer.
"""

from __future__ import annotations

import errno
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import anyio
import pytest

from bpf.catalog import policy_maps_spec, policy_netns_spec
from bpf.memory_map import MemoryMap
from bpf.policy import PolicyMapEntry, PolicyMapKey, PolicyNetns
from bpf.typed_map import TypedMap
from bpfops.policy_ops import (
    EnforcementHeldError,
    PolicyMapSet,
    PolicyNetnsOps,
    PolicyOps,
    map_entry,
    map_key,
)
from reconciler import Config, Reconciler
from reconciler.status import StatusKind, status_done
from reconciler.testing import wait_until_done
from statedb import DB
from statewright.agent.components.policy_maps import realized_revisions
from tables.policy_entries import (
    PolicyEndpoint,
    PolicyEntry,
    PolicyKey,
    direction_backlog,
    new_policy_endpoints_table,
    new_policy_entries_table,
)
from tables.policy_netns import (
    F_EGRESS,
    F_INGRESS,
    PolicyNetnsEntry,
    new_policy_netns_table,
    writable_flags,
)
from tests.endpoints.helpers import new_pin_dir, remove_pins, wait_for
from tests.policy_datapath.map_hooks import FailingWrites, HookedMap

EP = 7
COOKIE = 7007


def allow(ident: int, port: int, egress: bool = True) -> PolicyEntry:
    return PolicyEntry(PolicyKey(EP, ident, egress, 6, port, 16), rules=("default/r",))


class NetnsMapSpy(FailingWrites):
    """``policy_netns`` that checks, at every write switching a direction on, that the
    endpoint's policy map holds every entry of that direction in the table, and can be
    made to fail its writes."""

    def __init__(self, m: TypedMap[int, PolicyNetns], h: Harness) -> None:
        super().__init__(m, failing=False)
        self.h = h
        self.early: list[str] = []
        self.enabled: list[int] = []

    def before_update(self, key: int, value: PolicyNetns) -> None:
        super().before_update(key, value)
        old = self.m.lookup(key)
        on = value.flags & ~(old.flags if old is not None else 0)
        for flag, egress in ((F_EGRESS, True), (F_INGRESS, False)):
            if on & flag:
                missing = self.h.missing(value.endpoint_id, egress)
                if missing:
                    self.early.append(f"flag {flag} on with {missing} entries missing")
                self.enabled.append(flag)


class Harness:
    """The three tables, memory maps, and the two reconcilers' Operations wired as the
    policy-maps component wires them."""

    def __init__(self) -> None:
        self.db = DB()
        self.entries = new_policy_entries_table()
        self.modes = new_policy_endpoints_table()
        self.netns = new_policy_netns_table()
        for t in (self.entries, self.modes, self.netns):
            self.db.register(t)
        self.pin_dir = new_pin_dir("memory")
        spec = policy_maps_spec(max_entries=64, policy_max_entries=256)
        self.outer = TypedMap(spec, MemoryMap.create(spec))
        self.maps = PolicyMapSet(self.outer, MemoryMap, self.pin_dir)
        nspec = policy_netns_spec(max_entries=16)
        self.netns_map = TypedMap(nspec, MemoryMap.create(nspec))
        self.spy = NetnsMapSpy(self.netns_map, self)
        self.ops = PolicyOps(self.entries, self.maps, self.modes, self.netns)
        self.netns_ops = PolicyNetnsOps(self.spy, self.entries, self.modes)  # type: ignore[arg-type]

    def reconciler(self, which: str, **kw: Any) -> Reconciler[Any]:
        table: Any = self.entries if which == "entries" else self.netns
        ops: Any = self.ops if which == "entries" else self.netns_ops
        return Reconciler(self.db, Config(
            table=table,
            operations=ops,
            get_object_status=lambda r: r.status,
            set_object_status=lambda r, s: replace(r, status=s),
            name=table.name,
            retry_min_backoff=0.001,
            retry_max_backoff=0.02,
            **kw,
        ))

    def apply(self, mode: PolicyEndpoint | None, entries: list[PolicyEntry],
              gone: list[PolicyEntry] = (), flags: int | None = None) -> None:  # type: ignore[assignment]
        """What the policy writer and the netns follower write: the mode and entries in
        one transaction, then the netns row derived from the mode."""
        with self.db.write_txn(self.entries, self.modes) as txn:
            for e in gone:
                self.entries.delete(txn, e)
            for e in entries:
                self.entries.insert(txn, e)
            if mode is not None:
                self.modes.insert(txn, mode)
        if flags is None:
            flags = (F_EGRESS if mode and mode.egress_enforced else 0) | (
                F_INGRESS if mode and mode.ingress_enforced else 0)
        with self.db.write_txn(self.netns) as txn:
            self.netns.insert(txn, PolicyNetnsEntry(COOKIE, EP, flags))

    def content(self) -> dict[PolicyMapKey, PolicyMapEntry]:
        m = self.maps.get(EP)
        return dict(m.items()) if m is not None else {}

    def missing(self, ep: int, egress: bool) -> int:
        """Entries of the endpoint's direction in the table that its map does not hold."""
        txn = self.db.read_txn()
        m = self.maps.get(ep)
        have = dict(m.items()) if m is not None else {}
        return sum(
            1 for e in self.entries.all(txn)
            if e.key.endpoint_id == ep and e.key.egress == egress
            and have.get(map_key(e.key)) != map_entry(e)
        )

    def flags(self) -> int:
        v = self.netns_map.lookup(COOKIE)
        return v.flags if v is not None else 0

    def netns_row(self) -> PolicyNetnsEntry:
        rows = list(self.netns.all(self.db.read_txn()))
        assert len(rows) == 1
        return rows[0]

    def close(self) -> None:
        self.maps.close()
        self.outer.close()
        self.netns_map.close()
        remove_pins("memory", self.pin_dir)


@pytest.fixture
def h() -> Iterator[Harness]:
    harness = Harness()
    try:
        yield harness
    finally:
        harness.close()


async def _attempted(rec: Reconciler[Any], h: Harness) -> None:
    """Wait until the reconciler attempted every change of its table up to now."""
    with anyio.fail_after(10):
        await rec.wait_until_reconciled()


def test_enforcement_waits_until_the_entries_are_written(h: Harness) -> None:
    """The entries reconciler held back: the netns reconciler attempts the row, and
    egress stays off (the row in Error naming the endpoint) until the policy map holds
    both allow entries; then it goes on, never before."""
    a, b = allow(100, 80), allow(101, 443)

    async def main() -> None:
        netns_rec = h.reconciler("netns")
        entries_rec = h.reconciler("entries")
        async with anyio.create_task_group() as tg:
            await tg.start(netns_rec.run)
            h.apply(PolicyEndpoint(EP, egress_enforced=True, revision=1), [a, b])
            await _attempted(netns_rec, h)
            await anyio.sleep(0.1)  # retries of the held row come and go meanwhile
            assert h.flags() & F_EGRESS == 0, "egress enforced before its allow entries"
            row = h.netns_row()
            assert row.status.kind is StatusKind.ERROR, row
            assert f"policy of endpoint {EP} not enforced yet in egress" in row.status.error
            assert "2 of 2 policy entries not written" in row.status.error
            held = h.netns_ops.held[COOKIE]
            assert isinstance(held, EnforcementHeldError) and not held.failed
            assert netns_rec.health.error_count == 1

            await tg.start(entries_rec.run)
            await wait_until_done(entries_rec, timeout=10)
            await wait_until_done(netns_rec, timeout=10)
            assert h.flags() == F_EGRESS and COOKIE not in h.netns_ops.held
            assert h.spy.enabled == [F_EGRESS] and h.spy.early == []
            tg.cancel_scope.cancel()

    anyio.run(main)


def test_a_failing_entry_keeps_the_direction_off_and_says_so(h: Harness) -> None:
    """An entry write that fails: egress stays off (the endpoint keeps allowing what it
    allowed), the netns row's error names the endpoint, the direction, the failed entry
    and the map error; once the write succeeds, egress goes on."""
    a, b = allow(100, 80), allow(101, 443)
    failing = {"on": True}
    real_ensure = h.maps.ensure

    def refusing_101(m: Any) -> FailingWrites:
        """The endpoint's policy map, refusing the entry of identity 101."""
        return FailingWrites(m, err=errno.E2BIG,
                             when=lambda key: failing["on"] and key.sec_label == 101)

    h.maps.ensure = lambda ep: refusing_101(real_ensure(ep))  # type: ignore[method-assign,assignment,return-value]

    async def main() -> None:
        netns_rec = h.reconciler("netns")
        entries_rec = h.reconciler("entries")
        async with anyio.create_task_group() as tg:
            await tg.start(entries_rec.run)
            await tg.start(netns_rec.run)
            h.apply(PolicyEndpoint(EP, egress_enforced=True, revision=1), [a, b])
            await wait_for(lambda: COOKIE in h.netns_ops.held
                           and h.netns_ops.held[COOKIE].failed, "the held row's failure")
            await anyio.sleep(0.1)
            assert h.flags() & F_EGRESS == 0
            err = str(h.netns_ops.held[COOKIE])
            assert f"endpoint {EP}" in err and "egress" in err, err
            assert "1 failed (allow identity 101 proto 6 port 443/16" in err, err
            assert "E2BIG" in err, err
            failing["on"] = False
            await wait_until_done(entries_rec, timeout=10)
            await wait_until_done(netns_rec, timeout=10)
            assert h.flags() == F_EGRESS and h.spy.early == []
            tg.cancel_scope.cancel()

    anyio.run(main)


def test_entries_go_only_after_enforcement_is_off(h: Harness) -> None:
    """The policy stops selecting the endpoint while the netns reconciler cannot write:
    the entries reconciler keeps the allow entries (and the map) as long as egress may be
    enforced; once the flag is off they are deleted and the map removed."""
    a, b = allow(100, 80), allow(101, 443)

    async def main() -> None:
        netns_rec = h.reconciler("netns")
        entries_rec = h.reconciler("entries")
        async with anyio.create_task_group() as tg:
            await tg.start(entries_rec.run)
            await tg.start(netns_rec.run)
            h.apply(PolicyEndpoint(EP, egress_enforced=True, revision=1), [a, b])
            await wait_until_done(entries_rec, timeout=10)
            await wait_until_done(netns_rec, timeout=10)
            assert h.flags() == F_EGRESS and len(h.content()) == 2

            h.spy.failing = True
            h.apply(PolicyEndpoint(EP, revision=2), [], gone=[a, b])
            await _attempted(entries_rec, h)
            await anyio.sleep(0.1)  # its held deletes are retried meanwhile
            assert h.flags() == F_EGRESS
            assert len(h.content()) == 2, "allow entries deleted while egress is enforced"
            assert "kept until the egress enforcement of endpoint 7 is switched off" in (
                entries_rec.health.message)

            h.spy.failing = False
            await wait_until_done(netns_rec, timeout=10)
            await wait_until_done(entries_rec, timeout=10)
            assert h.flags() == 0 and h.maps.get(EP) is None
            tg.cancel_scope.cancel()

    anyio.run(main)


def test_a_narrower_policy_deletes_at_once(h: Harness) -> None:
    """Egress stays enforced and loses one allow: that entry goes without waiting for
    the netns reconciler (which is not even running)."""
    a, b = allow(100, 80), allow(101, 443)

    async def main() -> None:
        entries_rec = h.reconciler("entries")
        async with anyio.create_task_group() as tg:
            await tg.start(entries_rec.run)
            h.apply(PolicyEndpoint(EP, egress_enforced=True, revision=1), [a, b])
            await wait_until_done(entries_rec, timeout=10)
            h.apply(PolicyEndpoint(EP, egress_enforced=True, revision=2), [], gone=[b])
            await wait_until_done(entries_rec, timeout=10)
            assert list(h.content()) == [map_key(a.key)]
            tg.cancel_scope.cancel()

    anyio.run(main)


def test_prune_keeps_the_entries_of_an_enforced_direction(h: Harness) -> None:
    """Entries no row explains are pruned, except those of a direction ``policy_netns``
    may still enforce for an endpoint whose policy no longer does (a later prune, or the
    delete's retry, takes them); the map of an endpoint without rows stays while so."""
    a, b, c = allow(100, 80), allow(101, 443, egress=False), allow(102, 22, egress=False)
    for e in (a, b, c):
        h.maps.ensure(EP).update(map_key(e.key), map_entry(e))
    # the policy now enforces ingress only (allowing c); policy_netns still enforces egress
    h.apply(PolicyEndpoint(EP, ingress_enforced=True, revision=2), [c], flags=F_EGRESS)
    with h.db.write_txn(h.netns) as txn:
        h.netns.insert(txn, replace(h.netns_row(), status=status_done()))

    async def prune() -> None:
        txn = h.db.read_txn()
        await h.ops.prune(txn, iter(h.entries.all(txn)))

    anyio.run(prune)
    assert sorted(h.content(), key=repr) == sorted([map_key(a.key), map_key(c.key)], key=repr)
    h.apply(PolicyEndpoint(EP, revision=3), [], gone=[c], flags=F_EGRESS)
    with h.db.write_txn(h.netns) as txn:
        h.netns.insert(txn, replace(h.netns_row(), status=status_done()))
    anyio.run(prune)
    assert h.maps.exists(EP), "map removed while egress may be enforced"
    h.apply(None, [], flags=0)
    with h.db.write_txn(h.netns) as txn:
        h.netns.insert(txn, replace(h.netns_row(), status=status_done()))
    anyio.run(prune)
    assert not h.maps.exists(EP)


def test_a_row_of_an_older_mode_does_not_switch_enforcement_on(h: Harness) -> None:
    """The netns row still says egress while the policy-endpoints row no longer does
    (and the entries are gone): enforcing would refuse everything, so the row is held."""
    h.apply(PolicyEndpoint(EP, revision=2), [], flags=F_EGRESS)
    txn = h.db.read_txn()
    with pytest.raises(EnforcementHeldError, match="its policy no longer enforces it"):
        h.netns_ops.update(txn, 0, h.netns_row())
    assert h.netns_map.lookup(COOKIE) == PolicyNetns(EP, 0)


def test_direction_backlog_counts_one_direction() -> None:
    """Only the endpoint's entries of the asked direction count."""
    db = DB()
    entries = new_policy_entries_table()
    db.register(entries)
    with db.write_txn(entries) as wtxn:
        entries.insert(wtxn, allow(100, 80))
        entries.insert(wtxn, allow(100, 81, egress=False))
        entries.insert(wtxn, PolicyEntry(PolicyKey(EP + 1, 100, True, 6, 80, 16)))
    txn = db.read_txn()
    b = direction_backlog(txn, entries, EP, True)
    assert (b.total, b.not_done, b.errors, b.written) == (1, 1, 0, False)
    assert direction_backlog(txn, entries, 99, True).written


def test_other_enforcement_writers_follow_the_same_order(h: Harness) -> None:
    """The endpoint datapath's ``policy_endpoints`` (ingress, tc programs): a direction
    is switched on only once its entries are written (`writable_flags`), and the entries
    of a direction no longer enforced wait until that writer has it off too."""
    a, b = allow(100, 80, egress=False), allow(101, 443, egress=False)
    h.apply(PolicyEndpoint(EP, ingress_enforced=True, revision=1), [a, b])
    txn = h.db.read_txn()
    flags, held = writable_flags(txn, h.entries, {EP: F_INGRESS}, {})
    assert flags == {} and [(x.endpoint_id, x.direction, x.not_done) for x in held] == [
        (EP, "ingress", 2)]
    # already on: stays on whatever the entries say
    assert writable_flags(txn, h.entries, {EP: F_INGRESS}, {EP: F_INGRESS}) == (
        {EP: F_INGRESS}, [])
    tc_flags = {EP: F_INGRESS}
    h.ops.enforcers.append(lambda ep: tc_flags.get(ep, 0))

    async def main() -> None:
        entries_rec = h.reconciler("entries")
        netns_rec = h.reconciler("netns")
        async with anyio.create_task_group() as tg:
            await tg.start(entries_rec.run)
            await tg.start(netns_rec.run)
            await wait_until_done(entries_rec, timeout=10)
            done = h.db.read_txn()
            assert writable_flags(done, h.entries, {EP: F_INGRESS}, {}) == ({EP: F_INGRESS}, [])
            h.apply(PolicyEndpoint(EP, revision=2), [], gone=[a, b])
            await wait_until_done(netns_rec, timeout=10)
            await _attempted(entries_rec, h)
            await anyio.sleep(0.1)
            assert len(h.content()) == 2, "ingress entries deleted while the tc side enforces"
            tc_flags.clear()
            await wait_until_done(entries_rec, timeout=10)
            assert h.maps.get(EP) is None
            tg.cancel_scope.cancel()

    anyio.run(main)


def test_realized_needs_every_enforcement_writer() -> None:
    """An endpoint realizes its revision only once policy_netns and every other
    enforcement writer hold exactly its directions."""
    db = DB()
    entries, modes, netns = (
        new_policy_entries_table(), new_policy_endpoints_table(), new_policy_netns_table())
    for t in (entries, modes, netns):
        db.register(t)
    mode = PolicyEndpoint(EP, egress_enforced=True, ingress_enforced=True, revision=4)
    with db.write_txn(modes, netns) as wtxn:
        modes.insert(wtxn, mode)
        netns.insert(wtxn, PolicyNetnsEntry(COOKIE, EP, F_EGRESS | F_INGRESS))
    before = {EP: mode}
    tc: dict[int, int] = {}

    def realized() -> dict[int, int]:
        return realized_revisions(db.read_txn(), entries, modes, before, {}, False, 0, netns,
                                  [lambda ep: tc.get(ep, 0)])

    assert realized() == {}  # netns row Pending
    with db.write_txn(netns) as wtxn:
        row = next(iter(netns.all(wtxn)))
        netns.insert(wtxn, replace(row, status=status_done()))
    assert realized() == {}  # tc side not written
    tc[EP] = F_EGRESS | F_INGRESS
    assert realized() == {EP: 4}


def test_a_replaced_entry_goes_after_its_replacement(h: Harness) -> None:
    """Egress stays enforced while its allow-list is replaced (any port to identity 100
    becomes port 80 to identity 100, in one transaction): the new entry is written before
    the old one is deleted, so port 80, allowed before and after, is never refused."""
    old = PolicyEntry(PolicyKey(EP, 100, True, 6, 0, 0), rules=("default/r",))
    new = allow(100, 80)
    ops: list[str] = []
    real_ensure = h.maps.ensure

    class Recording(HookedMap):
        """The endpoint's policy map, recording writes and deletes in order."""

        def before_update(self, key: PolicyMapKey, value: Any) -> None:
            ops.append(f"update {key.dport}/{key.prefixlen}")

        def before_delete(self, key: PolicyMapKey) -> None:
            ops.append(f"delete {key.dport}/{key.prefixlen}")

    h.maps.ensure = lambda ep: Recording(real_ensure(ep))  # type: ignore[method-assign,assignment,return-value]
    h.maps.get = lambda ep: Recording(real_ensure(ep))  # type: ignore[method-assign,assignment,return-value]

    async def main() -> None:
        entries_rec = h.reconciler("entries")
        async with anyio.create_task_group() as tg:
            await tg.start(entries_rec.run)
            h.apply(PolicyEndpoint(EP, egress_enforced=True, revision=1), [old])
            await wait_until_done(entries_rec, timeout=10)
            ops.clear()
            h.apply(PolicyEndpoint(EP, egress_enforced=True, revision=2), [new], gone=[old])
            await wait_until_done(entries_rec, timeout=10)
            tg.cancel_scope.cancel()

    anyio.run(main)
    assert ops == ["update 80/64", "delete 0/48"], ops
    assert list(h.content()) == [map_key(new.key)]
