"""Small builders shared by the BPF map tests."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from bpf import catalog, lb
from bpf.backend import MapBackend
from bpf.codec import U32
from bpf.pinning import MapOpener
from bpf.spec import MapSpec, MapType
from bpf.typed_map import TypedMap

SPECS = catalog.all_specs()
ARRAY_SPEC: MapSpec[int, int] = MapSpec("test_array", MapType.ARRAY, U32, U32, 8)


def ip4(text: str) -> bytes:
    """Dotted quad to 4 bytes."""
    return bytes(int(p) for p in text.split("."))


def backend4(i: int) -> lb.Backend4:
    """A distinct backend value."""
    return lb.Backend4(ip4(f"10.{(i >> 16) & 255}.{(i >> 8) & 255}.{i & 255}"), 8080, 6)


@contextmanager
def open_typed(opener: MapOpener, spec: MapSpec[Any, Any]) -> Iterator[TypedMap[Any, Any]]:
    """Create an unpinned map for ``spec`` and close it afterwards."""
    m = TypedMap(spec, opener.create(spec))
    try:
        yield m
    finally:
        m.close()


@contextmanager
def closing(backend: MapBackend) -> Iterator[MapBackend]:
    """Close a backend handle afterwards."""
    try:
        yield backend
    finally:
        backend.close()


def tool(name: str) -> str:
    """Path of a build tool the layout tests need; skip (fail under CI=true) if absent."""
    found = shutil.which(name)
    if found is None:
        msg = f"{name} not installed (make system-deps installs it)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(msg, pytrace=False)
        pytest.skip(msg)
    return found
