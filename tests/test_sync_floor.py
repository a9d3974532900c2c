"""benchmarks/sync_floor.py: each floor measures the work it names, on a tiny size."""

from __future__ import annotations

import orjson
import pytest

from benchmarks.sync_floor import (
    decode_floor,
    entries_per_service,
    free_floor,
    list_pages,
    maps_floor,
    rows_floor,
)


def test_pages_hold_every_service_then_every_slice_as_served() -> None:
    pages = list_pages(1_200)
    assert len(pages) == 6  # 3 pages of <= 500 per kind
    kinds = [orjson.loads(p)["kind"] for p in pages]
    assert kinds == ["ServiceList"] * 3 + ["EndpointSliceList"] * 3
    cpu, items = decode_floor(pages)
    assert cpu >= 0
    assert len(items) == 2_400
    assert [i["metadata"]["name"] for i in items[:2]] == ["svc-0", "svc-1"]
    assert items[1_200]["metadata"]["name"] == "svc-0-abcde"
    for item in items:
        meta = item["metadata"]
        assert meta["uid"] and meta["resourceVersion"] and meta["creationTimestamp"]


def test_rows_floor_reads_every_object() -> None:
    _, items = decode_floor(list_pages(300))
    assert rows_floor(items, 300) >= 0
    # A slice whose service is missing is a KeyError: the floor joins them as the agent does.
    with pytest.raises(KeyError):
        rows_floor(items[:10] + items[300:320], 10)
    assert free_floor(items) >= 0
    assert items == []


def test_entries_per_service_are_the_lb_ops_own() -> None:
    """One ClusterIP port with 10 backends: the master, a slot per backend and the VIP's
    wildcard entry; a backend entry per backend; one reverse NAT entry."""
    assert entries_per_service(20) == {
        "lb4_services": 12.0, "lb4_backends": 10.0, "lb4_reverse_nat": 1.0,
    }


@pytest.mark.kernel
def test_maps_floor_writes_kernel_maps() -> None:
    assert maps_floor(2_000, {"lb4_services": 12.0, "lb4_backends": 10.0}) > 0
