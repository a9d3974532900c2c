"""statedb.heap_trim: glibc's malloc_trim where there is one, nothing elsewhere."""

from __future__ import annotations

import ctypes
import ctypes.util
import platform

import pytest

from statedb import heap_trim


def _glibc() -> bool:
    return platform.libc_ver()[0] == "glibc"


def test_trim_returns_free_heap_pages_on_glibc() -> None:
    if not _glibc():
        pytest.skip("the C library is not glibc: trim_heap does nothing there")
    # Large blocks made and freed in the middle of the heap (held ones around them keep
    # the heap's top from shrinking by itself).
    held, freed = [], []
    for _ in range(200):
        freed.append(bytearray(64 * 1024))
        held.append(bytearray(600))
    del freed
    assert heap_trim.trim_heap() is True
    assert heap_trim.trim_heap() in (True, False)  # nothing left is not an error
    del held


def test_without_malloc_trim_nothing_is_done(monkeypatch: pytest.MonkeyPatch) -> None:
    class NoTrim:
        def __init__(self, name: str | None) -> None:
            pass

        def __getattr__(self, name: str) -> object:
            raise AttributeError(name)

    monkeypatch.setattr(heap_trim, "_looked_up", False)
    monkeypatch.setattr(heap_trim, "_trim", None)
    monkeypatch.setattr(ctypes, "CDLL", NoTrim)
    assert heap_trim.trim_heap() is False
    assert heap_trim.trim_heap() is False  # looked up once, remembered


@pytest.fixture
def no_c_library(monkeypatch: pytest.MonkeyPatch) -> None:
    """No C library to load, and neither function looked up yet."""

    def missing(name: str | None) -> object:
        raise OSError(f"{name}: cannot open shared object file")

    for cached, value in (("_looked_up", False), ("_trim", None),
                          ("_mallopt_looked_up", False), ("_mallopt", None)):
        monkeypatch.setattr(heap_trim, cached, value)
    monkeypatch.setattr(ctypes, "CDLL", missing)
    monkeypatch.setattr(ctypes.util, "find_library", lambda name: None)


def test_without_a_c_library_nothing_is_done(no_c_library: None) -> None:
    assert heap_trim.trim_heap() is False


def test_fixed_mmap_threshold_on_glibc() -> None:
    if not _glibc():
        pytest.skip("the C library is not glibc: fix_mmap_threshold does nothing there")
    assert heap_trim.fix_mmap_threshold() is True
    # Still usable: a block above the threshold is made and freed.
    block = bytearray(4 * heap_trim.MMAP_THRESHOLD_BYTES)
    del block


def test_mmap_threshold_must_be_positive() -> None:
    with pytest.raises(ValueError, match="must be > 0"):
        heap_trim.fix_mmap_threshold(0)


def test_without_mallopt_nothing_is_set(no_c_library: None) -> None:
    assert heap_trim.fix_mmap_threshold() is False
