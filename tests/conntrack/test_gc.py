"""The CT maps' GC, flush and listing (bpfops/conntrack.py) on memory and kernel maps."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack

import pytest

from bpf import ct
from bpf.catalog import ct_specs, metrics_spec
from bpf.pinning import MapOpener
from bpf.typed_map import TypedMap
from bpfops.conntrack import CTMaps, delete_keys, monotonic_now
from tests.bpf.helpers import open_typed

NOW = 1_000_000


@pytest.fixture
def maps(opener: MapOpener) -> Iterator[CTMaps]:
    with ExitStack() as stack:
        ct4, ct6 = (stack.enter_context(open_typed(opener, s)) for s in ct_specs(4096))
        metrics = stack.enter_context(open_typed(opener, metrics_spec()))
        yield CTMaps(ct4, ct6, metrics)


def tuple4(i: int, flags: int = ct.F_EGRESS) -> ct.CTTuple4:
    return ct.CTTuple4(bytes([10, 0, i >> 8, i & 255]), bytes([10, 1, 0, 1]), 80, 40000 + i,
                       6, flags)


def tuple6(i: int) -> ct.CTTuple6:
    return ct.CTTuple6(bytes(15) + bytes([i]), bytes(14) + b"\x00\x02", 53, 5353, 17,
                       ct.F_INGRESS)


def fill(m: TypedMap[ct.CTTuple4, ct.CTEntry], n: int, lifetime: int, start: int = 0) -> None:
    keys = [tuple4(i) for i in range(start, start + n)]
    m.update_batch(keys, [ct.CTEntry(lifetime=lifetime, packets=1) for _ in keys])


def test_gc_removes_exactly_the_expired_entries(maps: CTMaps) -> None:
    fill(maps.ct4, 100, NOW - 1)
    fill(maps.ct4, 50, NOW + 10, start=100)
    maps.ct6.update(tuple6(1), ct.CTEntry(lifetime=NOW - 5))
    maps.ct6.update(tuple6(2), ct.CTEntry(lifetime=NOW))  # expires after NOW, not at it
    assert maps.gc(NOW) == 101
    left = {k for k, _ in maps.ct4.items()}
    assert left == {tuple4(i) for i in range(100, 150)}
    assert [k for k, _ in maps.ct6.items()] == [tuple6(2)]
    m = maps.metrics
    assert (m.gc_runs, m.removed_total, m.last_removed) == (1, 101, 101)
    assert m.entries == {"ct4_global": 50, "ct6_global": 1}
    assert maps.gc(NOW) == 0
    assert (maps.metrics.gc_runs, maps.metrics.removed_total) == (2, 101)


def test_delete_skips_keys_someone_else_removed(maps: CTMaps) -> None:
    fill(maps.ct4, 10, NOW)
    keys = [ct.CT_TUPLE4.encode(tuple4(i)) for i in range(10)]
    maps.ct4.delete(tuple4(3))
    maps.ct4.delete(tuple4(7))
    assert delete_keys(maps.ct4.backend, keys) == 8
    assert maps.ct4.count() == 0


def test_flush_and_list(maps: CTMaps) -> None:
    now = monotonic_now()
    maps.ct4.update(tuple4(1, ct.F_INGRESS),
                    ct.CTEntry(lifetime=now + 60, packets=3, bytes=180,
                               flags=ct.SEEN_NON_SYN, src_sec_id=1234))
    maps.ct6.update(tuple6(9), ct.CTEntry(lifetime=now + 5))
    listed = sorted(maps.entries(now), key=lambda e: e["family"])
    assert listed[0] == {
        "family": 4, "protocol": "TCP", "source": "10.1.0.1:40001",
        "destination": "10.0.0.1:80", "direction": "ingress", "expires_in": 60,
        "packets": 3, "bytes": 180, "flags": ["seen_non_syn"], "source_identity": 1234,
    }
    assert listed[1]["source"] == "[::2]:5353" and listed[1]["protocol"] == "UDP"
    assert len(list(maps.entries(now, limit=1))) == 1
    assert maps.flush() == 2
    assert list(maps.entries(now)) == []


def test_drops_are_listed_by_reason(maps: CTMaps) -> None:
    assert maps.metrics_map is not None
    maps.metrics_map.update(ct.MetricsKey(133, 1), ct.MetricsValue(4, 240))
    assert maps.drops() == [{"reason": 133, "description": "Policy denied",
                             "direction": "ingress", "packets": 4, "bytes": 240}]
