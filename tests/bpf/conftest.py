"""Fixtures for the BPF map tests: backend parametrization and self-cleaning pin directories."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest

from bpf.kernel_map import KernelMap
from bpf.memory_map import MemoryMap
from bpf.pinning import MapOpener
from tests.pins import BPFFS, remove_memory_pins, remove_pin_dir


@pytest.fixture
def kernel_pin_dir() -> Iterator[str]:
    """A unique directory on bpffs (named with the pid), removed with everything pinned in it."""
    path = os.path.join(BPFFS, f"statewright-test-{os.getpid()}-{uuid.uuid4().hex[:12]}")
    os.makedirs(path)
    try:
        yield path
    finally:
        remove_pin_dir(path)


@pytest.fixture
def memory_pin_dir() -> Iterator[str]:
    """A unique prefix for memory pins, whose pins are dropped afterwards."""
    path = f"/memory/statewright-test-{uuid.uuid4().hex[:12]}"
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
    """Runs a test once per backend (kernel only where kernel BPF works)."""
    kind: str = request.param
    return kind


@pytest.fixture
def opener(backend_kind: str) -> MapOpener:
    """The backend class under test."""
    return KernelMap if backend_kind == "kernel" else MemoryMap


@pytest.fixture
def pin_dir(backend_kind: str, request: pytest.FixtureRequest) -> str:
    """A clean pin directory for the backend under test."""
    name = "kernel_pin_dir" if backend_kind == "kernel" else "memory_pin_dir"
    path: str = request.getfixturevalue(name)
    return path
