"""PolicyOps and PolicyNetnsOps on memory maps: the policy-map encoding (Cilium's layout,
LPM semantics of protocol and port prefixes), the per-endpoint map life cycle (created with
the first entry, removed with the last row), prune, and convergence under injected faults."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bpf.catalog import policy_maps_spec, policy_netns_spec, spec_for
from bpf.kernel_map import KernelMap
from bpf.memory_map import MemoryMap
from bpf.pinning import MapOpener, pin_path
from bpf.policy import (
    POLICY_ENTRY,
    POLICY_KEY,
    POLICY_NETNS_VALUE,
    PolicyMapEntry,
    PolicyMapKey,
    PolicyNetns,
    endpoint_of_map,
    policy_map_name,
)
from bpf.typed_map import TypedMap
from bpfops.policy_ops import (
    PolicyMapSet,
    PolicyNetnsOps,
    PolicyOps,
    egress_allowed,
    map_entry,
    map_key,
)
from reconciler import Config, Reconciler
from reconciler.testing import FaultPlan, FaultyOps, wait_until_done
from statedb import DB
from tables.endpoints import Endpoint
from tables.policy_entries import (
    PolicyEndpoint,
    PolicyEntry,
    PolicyKey,
    new_policy_entries_table,
)
from tables.policy_netns import F_EGRESS, desired_rows, new_policy_netns_table, sync_rows
from tests.endpoints.helpers import new_pin_dir, remove_pins


def test_key_and_entry_bytes() -> None:
    """The bytes are Cilium's: prefixlen, identity, direction bit, protocol, port in
    network order; the value's flags carry deny and lpm_prefix_length << 3."""
    k = PolicyMapKey.entry(identity=1234, egress=True, protocol=6, dport=8080, port_prefix_len=16)
    assert k.prefixlen == 64 and k.lpm_prefix_length == 24
    assert POLICY_KEY.encode(k) == (
        (64).to_bytes(4, "little") + (1234).to_bytes(4, "little") + b"\x01\x06" + b"\x1f\x90"
    )
    assert POLICY_KEY.size == 12 and POLICY_ENTRY.size == 12 and POLICY_NETNS_VALUE.size == 8
    assert POLICY_KEY.decode(POLICY_KEY.encode(k)) == k
    v = PolicyMapEntry.verdict(deny=True, lpm_prefix_length=24)
    assert POLICY_ENTRY.encode(v)[2] == 1 | (24 << 3)
    assert v.deny and v.lpm_prefix_length == 24

    # any protocol: identity and direction only; protocol with any port: 8 more bits
    assert PolicyMapKey.entry(7, False, 0, 80, 16) == PolicyMapKey(40, 7, 0, 0, 0)
    assert PolicyMapKey.entry(7, True, 17, 80, 0) == PolicyMapKey(48, 7, 1, 17, 0)
    # a port range as a prefix: bits beyond the prefix are zero
    assert PolicyMapKey.entry(0, True, 6, 8081, 12) == PolicyMapKey(60, 0, 1, 6, 8080)
    assert policy_map_name(42) == "cilium_policy_v2_00042"
    assert endpoint_of_map("cilium_policy_v2_00042") == 42
    assert endpoint_of_map("cilium_policy_v2") is None
    assert endpoint_of_map("policy_maps") is None
    spec = spec_for("cilium_policy_v2_00042")
    assert spec is not None and spec.name == "cilium_policy_v2_00042" and spec.key is POLICY_KEY
    assert spec_for("policy_netns") is not None and spec_for("nothing") is None


def test_lpm_lookup_covers_ranges_and_wildcards() -> None:
    """A full-prefix lookup finds the port-range and any-port entries that cover it."""
    spec = policy_maps_spec().inner
    assert spec is not None
    m = TypedMap(spec, MemoryMap.create(spec))
    rows = [
        PolicyEntry(PolicyKey(1, 100, True, 6, 8080, 12)),  # 8080-8095
        PolicyEntry(PolicyKey(1, 100, True, 17, 0, 0)),  # any UDP port
        PolicyEntry(PolicyKey(1, 0, True, 6, 443, 16), deny=True),  # any identity, 443
    ]
    for r in rows:
        m.update(map_key(r.key), map_entry(r))
    tcp_8090 = m.lookup(PolicyMapKey.lookup(100, True, 6, 8090))
    assert tcp_8090 is not None and tcp_8090.lpm_prefix_length == 20
    assert m.lookup(PolicyMapKey.lookup(100, True, 6, 8100)) is None
    assert m.lookup(PolicyMapKey.lookup(100, True, 17, 53)) == map_entry(rows[1])
    assert m.lookup(PolicyMapKey.lookup(100, False, 17, 53)) is None  # ingress: nothing
    any_443 = m.lookup(PolicyMapKey.lookup(0, True, 6, 443))
    assert any_443 is not None and any_443.deny
    m.close()


class Harness:
    """A DB with the policy-entries table and maps of one backend pinned under a unique
    directory (bpffs for the kernel, a memory prefix otherwise)."""

    def __init__(self, backend: str) -> None:
        self.backend = backend
        self.opener: MapOpener = KernelMap if backend == "kernel" else MemoryMap
        self.pin_dir = new_pin_dir(backend)
        if backend == "kernel":
            os.makedirs(self.pin_dir)
        self.db = DB()
        self.table = new_policy_entries_table()
        self.db.register(self.table)
        spec = policy_maps_spec(max_entries=64, policy_max_entries=256)
        self.outer = TypedMap(spec, self.opener.create(spec))
        self.maps = PolicyMapSet(self.outer, self.opener, self.pin_dir)
        self.ops = PolicyOps(self.table, self.maps)

    def config(self, ops: object) -> Config[PolicyEntry]:
        return Config(
            table=self.table,
            operations=ops,  # type: ignore[arg-type]
            get_object_status=lambda r: r.status,
            set_object_status=lambda r, s: replace(r, status=s),
            name="policy-entries",
            retry_min_backoff=0.001,
            retry_max_backoff=0.01,
        )

    def put(self, *rows: PolicyEntry) -> None:
        with self.db.write_txn(self.table) as txn:
            for r in rows:
                self.table.insert(txn, r)

    def drop(self, *rows: PolicyEntry) -> None:
        with self.db.write_txn(self.table) as txn:
            for r in rows:
                self.table.delete(txn, r)

    def pinned(self) -> set[int]:
        if self.backend == "kernel":
            names = os.listdir(self.pin_dir)
        else:
            names = [
                os.path.basename(p)
                for p in MemoryMap.pinned_paths()
                if os.path.dirname(p) == self.pin_dir
            ]
        return {i for n in names if (i := endpoint_of_map(n)) is not None}

    def content(self, ep: int) -> dict[PolicyMapKey, PolicyMapEntry]:
        inner = self.outer.get_inner(ep)
        assert inner is not None, f"endpoint {ep} has no map in policy_maps"
        try:
            return dict(inner.items())
        finally:
            inner.close()

    def expected(self, ep: int) -> dict[PolicyMapKey, PolicyMapEntry]:
        txn = self.db.read_txn()
        return {
            map_key(r.key): map_entry(r) for r in self.table.all(txn) if r.key.endpoint_id == ep
        }

    def close(self) -> None:
        self.maps.close()
        self.outer.close()
        remove_pins(self.backend, self.pin_dir)


@pytest.fixture(params=["memory", pytest.param("kernel", marks=pytest.mark.kernel)])
def h(request: pytest.FixtureRequest) -> Iterator[Harness]:
    harness = Harness(request.param)
    try:
        yield harness
    finally:
        harness.close()


def allow(ep: int, ident: int, port: int, proto: int = 6, plen: int = 16) -> PolicyEntry:
    return PolicyEntry(PolicyKey(ep, ident, True, proto, port, plen), rules=("default/r",))


def test_map_life_cycle_and_counts(h: Harness) -> None:
    """First entry creates, pins and installs the map; the last row's delete removes it;
    unchanged entries are not rewritten."""

    async def main() -> None:
        rec = Reconciler(h.db, h.config(h.ops))
        async with anyio.create_task_group() as tg:
            await tg.start(rec.run)
            a, b, c = allow(5, 100, 80), allow(5, 101, 443), allow(9, 0, 53, proto=17)
            h.put(a, b, c)
            await wait_until_done(rec, timeout=10)
            assert h.pinned() == {5, 9}
            assert h.content(5) == h.expected(5) and len(h.content(5)) == 2
            assert h.content(9) == h.expected(9)
            assert h.ops.writes == 3 and h.ops.writes_by_endpoint == {5: 2, 9: 1}
            assert h.maps.created == 2

            h.drop(a)
            await wait_until_done(rec, timeout=10)
            assert h.content(5) == h.expected(5) and len(h.content(5)) == 1
            h.drop(b)
            await wait_until_done(rec, timeout=10)
            assert h.pinned() == {9}
            assert h.outer.get_inner(5) is None
            assert h.maps.removed == 1

            # a rewrite of an unchanged row (new status) writes nothing
            before = h.ops.writes
            h.put(replace(c, rules=("default/other",)))
            await wait_until_done(rec, timeout=10)
            assert h.ops.writes == before and h.ops.skipped >= 1
            tg.cancel_scope.cancel()

    anyio.run(main)


def test_prune_removes_stray_entries_and_maps(h: Harness) -> None:
    """Entries and maps an earlier run left behind go at the first prune."""
    # an earlier run's leftovers: endpoint 3 (no rows now) and a stray entry of endpoint 4
    stale = h.maps.ensure(3)
    stale.update(PolicyMapKey.entry(1, True, 6, 22, 16), PolicyMapEntry.verdict(False, 24))
    m4 = h.maps.ensure(4)
    m4.update(PolicyMapKey.entry(2, True, 6, 23, 16), PolicyMapEntry.verdict(False, 24))
    h.maps.close()  # a new agent: nothing open, only pins and policy_maps entries
    keep = allow(4, 100, 80)

    async def main() -> None:
        h.put(keep)
        rec = Reconciler(h.db, replace(h.config(h.ops), prune_interval=0.05))
        async with anyio.create_task_group() as tg:
            await tg.start(rec.run)
            await wait_until_done(rec, timeout=10)
            with anyio.fail_after(10):
                while h.pinned() != {4} or len(h.content(4)) != 1:
                    await anyio.sleep(0.01)
            tg.cancel_scope.cancel()

    anyio.run(main)
    assert h.content(4) == h.expected(4)
    assert not h.opener.is_pinned(pin_path(h.pin_dir, policy_map_name(3)))


def test_converges_under_faults(h: Harness) -> None:
    """Random failures of update, delete and prune (before or after applying): once they
    stop, every endpoint's map holds exactly its rows and endpoints without rows have none."""

    async def main() -> None:
        faulty = FaultyOps(h.ops, FaultPlan.uniform(0.3), seed=7, table=h.table)
        rec = Reconciler(h.db, replace(h.config(faulty), prune_interval=0.05))
        rows = [allow(ep, 100 + i, 1000 + i) for ep in (1, 2, 3) for i in range(6)]
        async with anyio.create_task_group() as tg:
            await tg.start(rec.run)
            h.put(*rows)
            await anyio.sleep(0.05)
            h.drop(*rows[:6], rows[7])  # endpoint 1 entirely, one of endpoint 2
            h.put(allow(4, 0, 0, proto=17, plen=0))
            await anyio.sleep(0.05)
            faulty.enabled = False
            await wait_until_done(rec, timeout=20)
            await anyio.sleep(0.2)  # one more prune without faults
            await wait_until_done(rec, timeout=20)
            tg.cancel_scope.cancel()
        assert faulty.injected, "no fault was injected"
        assert faulty.pruned_uninitialized == 0

    anyio.run(main)
    assert h.pinned() == {2, 3, 4}
    for ep in (2, 3, 4):
        assert h.content(ep) == h.expected(ep), ep
    assert h.outer.get_inner(1) is None


def test_netns_rows_and_ops() -> None:
    """policy-netns rows follow the endpoints' cookies and modes; the ops write them."""
    eps = [
        Endpoint(1, netns_cookie=11),
        Endpoint(2, netns_cookie=11),  # same namespace: the lower id keeps it
        Endpoint(3, netns_cookie=0),  # unknown: no row
        Endpoint(4, netns_cookie=44),
    ]
    modes = [PolicyEndpoint(1, egress_enforced=True), PolicyEndpoint(3, egress_enforced=True)]
    want = desired_rows(eps, modes)
    assert {c: (r.endpoint_id, r.flags) for c, r in want.items()} == {
        11: (1, F_EGRESS),
        44: (4, 0),
    }
    db = DB()
    table = new_policy_netns_table()
    db.register(table)
    with db.write_txn(table) as txn:
        assert sync_rows(txn, table, want) == 2
    with db.write_txn(table) as txn:
        assert sync_rows(txn, table, want) == 0
        assert sync_rows(txn, table, {44: want[44]}) == 1
    spec = policy_netns_spec(max_entries=16)
    m = TypedMap(spec, MemoryMap.create(spec))
    ops = PolicyNetnsOps(m)
    txn = db.read_txn()
    for row in want.values():
        ops.update(txn, 0, row)
        ops.update(txn, 0, row)
    assert ops.writes == 2 and ops.skipped == 2
    assert m.lookup(11) == PolicyNetns(1, F_EGRESS)
    ops.prune(txn, iter(table.all(txn)))
    assert dict(m.items()) == {44: PolicyNetns(4, 0)}
    m.close()


def _reference(rows: list[PolicyEntry], identity: int, proto: int, port: int) -> bool:
    """The verdict by arithmetic on the rows: per identity set (the identity's, then any
    identity's) the matching row with the most specific protocol/port wins; a deny among
    the two winners denies, any winner allows, none denies."""

    def specificity(k: PolicyKey) -> int:
        if k.protocol == 0:
            return 0
        return 8 + k.port_prefix_len

    def matches(k: PolicyKey) -> bool:
        if k.protocol == 0:
            return True
        if k.protocol != proto:
            return False
        shift = 16 - k.port_prefix_len
        return k.port_prefix_len == 0 or (port >> shift) == (k.dport >> shift)

    def best(ident: int) -> PolicyEntry | None:
        found = [r for r in rows if r.key.identity == ident and matches(r.key)]
        return max(found, key=lambda r: specificity(r.key), default=None)

    l3, l4 = best(identity), best(0)
    if (l3 is not None and l3.deny) or (l4 is not None and l4.deny):
        return False
    return l3 is not None or l4 is not None


_idents = st.sampled_from([0, 100, 101])
_protos = st.sampled_from([0, 6, 17])


@st.composite
def _rows(draw: st.DrawFn) -> list[PolicyEntry]:
    out: dict[PolicyMapKey, PolicyEntry] = {}
    for _ in range(draw(st.integers(0, 12))):
        proto = draw(_protos)
        plen = 0 if proto == 0 else draw(st.sampled_from([0, 8, 12, 14, 16]))
        port = draw(st.integers(0, 0xFFFF)) if plen else 0
        port &= (0xFFFF << (16 - plen)) & 0xFFFF
        key = PolicyKey(1, draw(_idents), True, proto, port, plen)
        row = PolicyEntry(key, deny=draw(st.booleans()))
        out[map_key(key)] = row  # one row per map entry, as the control plane writes them
    return list(out.values())


@settings(max_examples=60, deadline=None, derandomize=True)
@given(
    rows=_rows(),
    probes=st.lists(
        st.tuples(_idents.filter(bool), st.sampled_from([6, 17]), st.integers(0, 0xFFFF)),
        min_size=1,
        max_size=20,
    ),
)
def test_map_verdict_equals_reference(
    rows: list[PolicyEntry], probes: list[tuple[int, int, int]]
) -> None:
    """The socket program's lookups on the encoded map give the verdict the rows mean,
    for random wildcards, port prefixes, identities and denies (memory LPM trie)."""
    spec = policy_maps_spec().inner
    assert spec is not None
    m = TypedMap(spec, MemoryMap.create(spec))
    try:
        for r in rows:
            m.update(map_key(r.key), map_entry(r))
        for ident, proto, port in probes:
            # probe the rows' own ports too: the edges of every range
            for p in (port, *(r.key.dport for r in rows)):
                want = _reference(rows, ident, proto, p)
                assert egress_allowed(m, ident, proto, p) == want, (ident, proto, p)
    finally:
        m.close()


def test_adopted_map_is_not_installed_again(h: Harness) -> None:
    """A restarted agent adopts an endpoint's pinned map that policy_maps already holds
    without a map-in-map update (each costs the kernel an RCU grace period)."""
    h.maps.ensure(5)
    h.maps.close()
    installs: list[int] = []

    class CountingOuter:
        """policy_maps, counting set_inner calls."""

        def __getattr__(self, name: str) -> Any:
            return getattr(h.outer, name)

        def set_inner(self, key: int, inner: Any, flags: int = 0) -> None:
            installs.append(key)
            h.outer.set_inner(key, inner, flags)

    again = PolicyMapSet(CountingOuter(), h.opener, h.pin_dir)  # type: ignore[arg-type]
    again.ensure(5)
    again.ensure(6)
    assert installs == [6]
    again.close()
