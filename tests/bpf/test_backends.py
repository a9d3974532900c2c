"""One behavioural suite, run against the in-memory and the kernel backend alike."""

from __future__ import annotations

import errno
import logging
from typing import Any

import pytest

from bpf import catalog, ipcache, lb
from bpf.errors import BatchError, MapError
from bpf.pinning import MapOpener, open_or_create, pin_path
from bpf.spec import UpdateFlag
from bpf.typed_map import TypedMap

from .helpers import ARRAY_SPEC, SPECS, backend4, closing, ip4, open_typed

BACKENDS = SPECS["lb4_backends"]


def test_update_lookup_delete(opener: MapOpener) -> None:
    """The basic cycle, through the codecs."""
    with open_typed(opener, SPECS["lb4_services"].resized(16)) as m:
        key = lb.Service4Key(ip4("10.96.0.1"), 443, 0, 6)
        value = lb.ServiceValue(backend_id=0, count=3, rev_nat_index=7, flags=0x10)
        assert m.lookup(key) is None
        m.update(key, value)
        assert m.lookup(key) == value
        assert list(m.items()) == [(key, value)]
        m.delete(key)
        assert m.lookup(key) is None
        assert m.count() == 0


def test_hash_capacity_is_e2big(opener: MapOpener) -> None:
    """A full hash map refuses new keys with E2BIG but still replaces existing ones."""
    with open_typed(opener, BACKENDS.resized(4)) as m:
        for i in range(4):
            m.update(i, backend4(i))
        with pytest.raises(MapError) as exc:
            m.update(99, backend4(99))
        assert exc.value.errno == errno.E2BIG
        assert str(exc.value) == "map lb4_backends: update: E2BIG (map full)"
        m.update(2, backend4(22))
        assert m.lookup(2) == backend4(22)
        m.delete(0)
        m.update(99, backend4(99))
        assert m.count() == 4


def test_update_flags(opener: MapOpener) -> None:
    """NOEXIST refuses existing keys (EEXIST), EXIST refuses missing ones (ENOENT)."""
    with open_typed(opener, BACKENDS.resized(8)) as m:
        m.update(1, backend4(1), UpdateFlag.NOEXIST)
        with pytest.raises(MapError) as exc:
            m.update(1, backend4(2), UpdateFlag.NOEXIST)
        assert exc.value.errno == errno.EEXIST
        with pytest.raises(MapError) as exc:
            m.update(2, backend4(2), UpdateFlag.EXIST)
        assert exc.value.errno == errno.ENOENT
        m.update(1, backend4(3), UpdateFlag.EXIST)
        assert m.lookup(1) == backend4(3)
        assert m.lookup(2) is None
        with pytest.raises(MapError) as exc:
            m.update(1, backend4(4), 7)
        assert exc.value.errno == errno.EINVAL


def test_delete_missing_is_enoent(opener: MapOpener) -> None:
    """Deleting an absent key reports ENOENT."""
    with open_typed(opener, BACKENDS.resized(8)) as m, pytest.raises(MapError) as exc:
        m.delete(5)
    assert exc.value.errno == errno.ENOENT
    assert "map lb4_backends: delete: ENOENT" in str(exc.value)


def test_sizes_are_checked(opener: MapOpener) -> None:
    """Keys and values of the wrong size are refused with EINVAL, naming the sizes."""
    with closing(opener.create(BACKENDS.resized(8))) as m:
        with pytest.raises(MapError, match="key is 3 bytes, want 4") as exc:
            m.update(b"abc", bytes(12))
        assert exc.value.errno == errno.EINVAL
        with pytest.raises(MapError, match="value is 11 bytes, want 12"):
            m.update(bytes(4), bytes(11))
        with pytest.raises(MapError, match="key is 5 bytes"):
            m.lookup(bytes(5))


def test_iteration_while_deleting(opener: MapOpener) -> None:
    """Deleting each key as it is yielded visits every key exactly once and empties the map."""
    with open_typed(opener, BACKENDS.resized(256)) as m:
        for i in range(200):
            m.update(i, backend4(i))
        seen = []
        for key in m:
            seen.append(key)
            m.delete(key)
        assert sorted(seen) == list(range(200))
        assert m.count() == 0


def test_lpm_longest_prefix(opener: MapOpener) -> None:
    """Lookups return the longest stored prefix containing the address."""
    with open_typed(opener, SPECS["ipcache"].resized(64)) as m:
        cidrs = {("10.0.0.0", 8): 1, ("10.1.0.0", 16): 2, ("10.1.2.0", 24): 3, ("0.0.0.0", 0): 9}
        for (addr, plen), ident in cidrs.items():
            m.update(
                ipcache.IPCacheKey.for_cidr(ip4(addr), plen), ipcache.RemoteEndpointInfo(ident)
            )

        def identity(addr: str) -> int | None:
            found = m.lookup(ipcache.IPCacheKey.for_cidr(ip4(addr), 32))
            return None if found is None else found.sec_identity

        assert identity("10.1.2.3") == 3
        assert identity("10.1.9.9") == 2
        assert identity("10.9.9.9") == 1
        assert identity("11.0.0.1") == 9
        m.delete(ipcache.IPCacheKey.for_cidr(ip4("10.1.0.0"), 16))
        assert identity("10.1.9.9") == 1
        assert identity("10.1.2.200") == 3
        with pytest.raises(MapError) as exc:
            m.delete(ipcache.IPCacheKey.for_cidr(ip4("10.1.0.0"), 16))
        assert exc.value.errno == errno.ENOENT
        assert m.count() == 3


def test_lpm_prefix_includes_key_header(opener: MapOpener) -> None:
    """Source ranges match per service: rev_nat_id is part of the prefix."""
    with open_typed(opener, SPECS["lb4_source_range"].resized(16)) as m:
        m.update(lb.SourceRange4Key.for_cidr(1, ip4("192.168.0.0"), 16), 1)
        probe = lb.SourceRange4Key.for_cidr(1, ip4("192.168.7.7"), 32)
        assert m.lookup(probe) == 1
        assert m.lookup(lb.SourceRange4Key.for_cidr(2, ip4("192.168.7.7"), 32)) is None


def test_lpm_errors(opener: MapOpener) -> None:
    """Too-long prefixes are EINVAL; a full trie is ENOSPC; flags behave as for hashes."""
    with open_typed(opener, SPECS["ipcache"].resized(2)) as m:
        key = ipcache.IPCacheKey.for_cidr(ip4("10.0.0.0"), 8)
        m.update(key, ipcache.RemoteEndpointInfo(1))
        with pytest.raises(MapError) as exc:
            m.update(key, ipcache.RemoteEndpointInfo(2), UpdateFlag.NOEXIST)
        assert exc.value.errno == errno.EEXIST
        m.update(ipcache.IPCacheKey.for_cidr(ip4("10.0.0.0"), 9), ipcache.RemoteEndpointInfo(2))
        with pytest.raises(MapError) as exc:
            m.update(
                ipcache.IPCacheKey.for_cidr(ip4("10.0.0.0"), 10), ipcache.RemoteEndpointInfo(3)
            )
        assert exc.value.errno == errno.ENOSPC
        with pytest.raises(MapError) as exc:
            m.update(ipcache.IPCacheKey(32 + 129, 0, 2, bytes(16)), ipcache.RemoteEndpointInfo(4))
        assert exc.value.errno == errno.EINVAL


def test_lru_evicts_instead_of_failing(opener: MapOpener) -> None:
    """An LRU map never reports a full map: it evicts old entries and keeps the newest."""
    spec = SPECS["lb4_affinity"].resized(256)
    with open_typed(opener, spec) as m:
        last = None
        for i in range(1024):
            last = lb.Affinity4Key(client_id=i, rev_nat_id=1)
            m.update(last, lb.AffinityValue(last_used=i, backend_id=i))
        count = m.count()
        assert 0 < count <= 256
        assert m.lookup(last) == lb.AffinityValue(1023, 1023)
        assert m.lookup(lb.Affinity4Key(client_id=0, rev_nat_id=1)) is None


def test_array_semantics(opener: MapOpener) -> None:
    """Arrays have every index present, refuse deletes and indexes past the end."""
    with open_typed(opener, ARRAY_SPEC) as m:
        assert sorted(m.keys()) == list(range(8))
        assert m.lookup(3) == 0
        m.update(3, 33)
        assert m.lookup(3) == 33
        assert m.lookup(8) is None
        for flags, err in ((UpdateFlag.NOEXIST, errno.EEXIST),):
            with pytest.raises(MapError) as exc:
                m.update(3, 1, flags)
            assert exc.value.errno == err
        with pytest.raises(MapError) as exc:
            m.update(8, 1)
        assert exc.value.errno == errno.E2BIG
        with pytest.raises(MapError) as exc:
            m.delete(3)
        assert exc.value.errno == errno.EINVAL
        assert dict(m.dump())[3] == 33


def test_batch_update_partial_result(opener: MapOpener) -> None:
    """A batch that overflows the map applies the leading entries and says how many."""
    with open_typed(opener, BACKENDS.resized(10)) as m:
        with pytest.raises(BatchError) as exc:
            m.update_batch(range(15), [backend4(i) for i in range(15)])
        assert exc.value.errno == errno.E2BIG
        assert exc.value.done == 10
        assert "after 10 elements" in str(exc.value)
        assert sorted(m.keys()) == list(range(10))
        assert m.lookup(9) == backend4(9)


def test_batch_update_flags(opener: MapOpener) -> None:
    """Element flags apply to each batch element; the batch stops at the first conflict."""
    with open_typed(opener, BACKENDS.resized(16)) as m:
        m.update(3, backend4(300))
        with pytest.raises(BatchError) as exc:
            m.update_batch(range(6), [backend4(i) for i in range(6)], UpdateFlag.NOEXIST)
        assert exc.value.errno == errno.EEXIST
        assert exc.value.done == 3
        assert m.lookup(3) == backend4(300)
        assert m.lookup(4) is None
        assert m.update_batch([4, 5], [backend4(4), backend4(5)]) == 2


def test_batch_delete_partial_result(opener: MapOpener) -> None:
    """A batch delete stops at the first missing key, leaving the rest."""
    with open_typed(opener, BACKENDS.resized(16)) as m:
        m.update_batch(range(5), [backend4(i) for i in range(5)])
        with pytest.raises(BatchError) as exc:
            m.delete_batch([0, 1, 9, 2])
        assert exc.value.errno == errno.ENOENT
        assert exc.value.done == 2
        assert sorted(m.keys()) == [2, 3, 4]
        assert m.delete_batch([2, 3, 4]) == 3
        assert m.count() == 0


def test_batch_dump_large(opener: MapOpener) -> None:
    """Batch lookups return every entry, including when chunks are small."""
    with open_typed(opener, BACKENDS.resized(4096)) as m:
        n = 3000
        assert m.update_batch(range(n), [backend4(i) for i in range(n)]) == n
        dumped = dict(m.dump())
        assert dumped == {i: backend4(i) for i in range(n)}
        chunks = list(m.backend.lookup_batch(batch_size=64))
        assert sum(len(c) for c in chunks) == n


def test_batch_on_lpm_falls_back(opener: MapOpener) -> None:
    """Map types without batch syscalls (LPM tries) still support the batch API."""
    with open_typed(opener, SPECS["ipcache"].resized(64)) as m:
        keys = [ipcache.IPCacheKey.for_cidr(ip4(f"10.0.{i}.0"), 24) for i in range(20)]
        values = [ipcache.RemoteEndpointInfo(i) for i in range(20)]
        assert m.update_batch(keys, values) == 20
        assert dict(m.dump()) == dict(zip(keys, values))
        assert m.delete_batch(keys[:10]) == 10
        assert m.count() == 10


def test_map_in_map(opener: MapOpener) -> None:
    """Maglev: inner arrays installed per service, read back, replaced and removed."""
    spec = catalog.maglev_spec(4, max_entries=4, table_size=251)
    assert spec.inner is not None
    with open_typed(opener, spec) as outer:
        tables = []
        for rev_nat in (1, 2):
            with open_typed(opener, spec.inner) as inner:
                table = tuple((rev_nat * 1000 + i) % 7 for i in range(251))
                inner.update(0, table)
                outer.set_inner(rev_nat, inner)
                tables.append(table)
        for rev_nat, table in zip((1, 2), tables):
            got = outer.get_inner(rev_nat)
            assert got is not None
            with got:
                assert got.lookup(0) == table
                assert got.backend.info().value_size == 4 * 251
        assert sorted(outer.keys()) == [1, 2]
        outer.delete(1)
        assert outer.get_inner(1) is None
        wrong = catalog.maglev_inner_spec(4, 257)
        with open_typed(opener, wrong) as bad:
            with pytest.raises(MapError) as exc:
                outer.set_inner(3, bad)
            assert exc.value.errno == errno.EINVAL


def test_map_in_map_capacity(opener: MapOpener) -> None:
    """The outer map of maps has a capacity like any hash."""
    spec = catalog.maglev_spec(4, max_entries=2, table_size=251)
    assert spec.inner is not None
    with open_typed(opener, spec) as outer, open_typed(opener, spec.inner) as inner:
        outer.set_inner(1, inner)
        outer.set_inner(2, inner)
        with pytest.raises(MapError) as exc:
            outer.set_inner(3, inner)
        assert exc.value.errno == errno.E2BIG


def test_pin_and_reopen(opener: MapOpener, pin_dir: str) -> None:
    """A pinned map reopened by path has the same entries; unpinning removes the path."""
    spec = BACKENDS.resized(32)
    path = pin_path(pin_dir, spec.name)
    with closing(opener.create(spec)) as m:
        m.pin(path)
        TypedMap(spec, m).update_batch(range(5), [backend4(i) for i in range(5)])
    assert opener.is_pinned(path)
    with closing(opener.open_pinned(path, spec)) as again:
        assert dict(TypedMap(spec, again).items()) == {i: backend4(i) for i in range(5)}
        assert spec.mismatch(again.info()) is None
        again.unpin()
    assert not opener.is_pinned(path)


def test_open_or_create_reuses_and_recreates(
    opener: MapOpener, pin_dir: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Same layout: the pinned map is reused. Changed layout: recreated, with a warning."""
    spec = BACKENDS.resized(32)
    with closing(open_or_create(opener, spec, pin_dir)) as m:
        TypedMap(spec, m).update(1, backend4(1))
    with closing(open_or_create(opener, spec, pin_dir)) as m:
        assert TypedMap(spec, m).lookup(1) == backend4(1)
    changed: Any = SPECS["lb6_backends"].renamed("lb4_backends").resized(32)
    with (
        caplog.at_level(logging.WARNING, logger="statewright.bpf"),
        closing(open_or_create(opener, changed, pin_dir)) as m,
    ):
        assert m.count() == 0
        assert m.info().value_size == 24
    assert "different layout (value_size 12 (want 24))" in caplog.text
    assert "unpinning and recreating" in caplog.text
    bigger = changed.resized(64)
    with (
        caplog.at_level(logging.WARNING, logger="statewright.bpf"),
        closing(open_or_create(opener, bigger, pin_dir)) as m,
    ):
        assert m.info().max_entries == 64
    assert "max_entries 32 (want 64)" in caplog.text


def test_maglev_table_size_change_recreates(
    opener: MapOpener, pin_dir: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A new maglev table size is a layout change of the inner maps."""
    old = catalog.maglev_spec(4, max_entries=4, table_size=251)
    new = catalog.maglev_spec(4, max_entries=4, table_size=257)
    assert old.inner is not None
    with closing(open_or_create(opener, old, pin_dir)) as m, open_typed(opener, old.inner) as t:
        t.update(0, tuple(range(251)))
        TypedMap(old, m).set_inner(1, t)
    with (
        caplog.at_level(logging.WARNING, logger="statewright.bpf"),
        closing(open_or_create(opener, new, pin_dir)) as m,
    ):
        assert m.count() == 0
    assert "inner map: value_size 1004 (want 1028)" in caplog.text


def test_concurrent_threads_see_their_own_values(opener: MapOpener) -> None:
    """One handle shared by threads: lookups never return another thread's value and
    concurrent inserts never overfill the map."""
    import threading

    with open_typed(opener, BACKENDS.resized(64)) as m:
        errors: list[BaseException] = []

        def worker(base: int) -> None:
            try:
                for round_ in range(300):
                    key = base + round_ % 8
                    m.update(key, backend4(key))
                    got = m.lookup(key)
                    assert got == backend4(key), (key, got)
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=worker, args=(t * 8,)) for t in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors[0]
        assert m.count() == 32


@pytest.mark.parametrize(
    ("change", "logged"),
    [
        ("key_size", "key_size 12 (want 24)"),
        ("type", "type 1 (want 9)"),
        ("flags", "flags 1 (want 0)"),
    ],
)
def test_layout_change_kinds(
    opener: MapOpener,
    pin_dir: str,
    caplog: pytest.LogCaptureFixture,
    change: str,
    logged: str,
) -> None:
    """Key size, map type and flag changes are all detected and lead to recreation."""
    from dataclasses import replace

    from bpf.spec import MapType

    spec: Any = SPECS["lb4_services"].resized(16)
    if change == "key_size":
        changed: Any = replace(spec, key=SPECS["lb6_services"].key)
    elif change == "type":
        changed = replace(spec, type=MapType.LRU_HASH, flags=0)
        logged = "type 1 (want 9), flags 1 (want 0)"
    else:
        changed = replace(spec, flags=0)
    with closing(open_or_create(opener, spec, pin_dir)) as m:
        m.update(bytes(12), bytes(12))
    with (
        caplog.at_level(logging.WARNING, logger="statewright.bpf"),
        closing(open_or_create(opener, changed, pin_dir)) as m,
    ):
        assert m.count() == 0
        assert changed.mismatch(m.info()) is None
    assert logged in caplog.text
