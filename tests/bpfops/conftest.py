"""Fixtures for the LB Ops tests: LB map sets on the memory and the kernel backend."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator

import pytest

from bpfops.lb_maps import LBMaps, LBMapsConfig, Wrapper
from tests.pins import BPFFS, remove_memory_pins, remove_pin_dir

TEST_MAX_ENTRIES = 1024
TEST_MAGLEV_SIZE = 1021

MapsMaker = Callable[..., LBMaps]


@pytest.fixture
def pin_dir(backend_kind: str) -> Iterator[str]:
    """A unique pin directory for the backend (bpffs for kernel, a memory prefix otherwise)."""
    if backend_kind == "kernel":
        path = os.path.join(BPFFS, f"statewright-lbtest-{uuid.uuid4().hex[:12]}")
        try:
            yield path
        finally:
            remove_pin_dir(path)
    else:
        path = f"/memory/statewright-lbtest-{uuid.uuid4().hex[:12]}"
        try:
            yield path
        finally:
            remove_memory_pins(path)


@pytest.fixture(
    params=[
        pytest.param("memory"),
        pytest.param("kernel", marks=pytest.mark.kernel),
    ]
)
def backend_kind(request: pytest.FixtureRequest) -> str:
    """Runs a test once per map backend (kernel only where kernel BPF works)."""
    return str(request.param)


@pytest.fixture
def make_maps(backend_kind: str, pin_dir: str) -> Iterator[MapsMaker]:
    """Opens LB map sets pinned under the test's directory; closes them afterwards."""
    opened: list[LBMaps] = []

    def make(
        wrap: Wrapper | None = None,
        max_entries: int = TEST_MAX_ENTRIES,
        maglev_table_size: int = TEST_MAGLEV_SIZE,
    ) -> LBMaps:
        cfg = LBMapsConfig(
            backend=backend_kind,  # type: ignore[arg-type]
            pin_dir=pin_dir,
            max_entries=max_entries,
            maglev_table_size=maglev_table_size,
        )
        maps = LBMaps.open(cfg, wrap=wrap)
        opened.append(maps)
        return maps

    try:
        yield make
    finally:
        for m in opened:
            m.close()


@pytest.fixture
def lbmaps(make_maps: MapsMaker) -> LBMaps:
    """One LB map set on the parametrized backend."""
    return make_maps()
