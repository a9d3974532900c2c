"""benchmarks/sync_floor.py: each floor measures the work it names, on a tiny size."""

from __future__ import annotations

import orjson
import pytest

from benchmarks.sync_floor import (
    decode_and_rows_floor,
    entries_per_service,
    list_pages,
    maps_floor,
)


def test_pages_hold_every_service_then_every_slice_as_served() -> None:
    pages = list_pages(1_200)
    assert len(pages) == 6  # 3 pages of <= 500 per kind
    bodies = [orjson.loads(p) for p in pages]
    assert [b["kind"] for b in bodies] == ["ServiceList"] * 3 + ["EndpointSliceList"] * 3
    items = [item for b in bodies for item in b["items"]]
    assert len(items) == 2_400
    assert [i["metadata"]["name"] for i in items[:2]] == ["svc-0", "svc-1"]
    assert items[1_200]["metadata"]["name"] == "svc-0-abcde"
    for item in items:
        meta = item["metadata"]
        assert meta["uid"] and meta["resourceVersion"] and meta["creationTimestamp"]


def test_the_floor_store_keeps_every_row_the_agent_keeps() -> None:
    decode, rows, store = decode_and_rows_floor(list_pages(700))
    assert decode >= 0 and rows >= 0
    assert len(store.services) == len(store.frontends) == len(store.backends_of) == 700
    assert len(store.backends) == 7_000
    assert len(store.origins) == 1_400
    # Every frontend holds its slice's backends, in the slice's order.
    for name, addr in store.frontend_of.items():
        assert store.frontends[addr][6] == store.backends_of[name]
        assert len(store.backends_of[name]) == 10


def test_a_slice_before_its_service_is_refused() -> None:
    """The floor joins a slice to its service as the agent's converter does."""
    pages = list_pages(10)
    with pytest.raises(KeyError):
        decode_and_rows_floor(pages[1:])


def test_entries_per_service_are_the_lb_ops_own() -> None:
    """One ClusterIP port with 10 backends: the master, a slot per backend and the VIP's
    wildcard entry; a backend entry per backend; one reverse NAT entry."""
    assert entries_per_service(20) == {
        "lb4_services": 12.0, "lb4_backends": 10.0, "lb4_reverse_nat": 1.0,
    }


@pytest.mark.kernel
def test_maps_floor_writes_kernel_maps() -> None:
    assert maps_floor(2_000, {"lb4_services": 12.0, "lb4_backends": 10.0}) > 0
