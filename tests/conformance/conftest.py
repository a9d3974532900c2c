"""Pin locations the conformance tests share: one memory pin namespace and one bpffs
directory per test module, removed at the end of the module (also on failure)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.conformance.corpus import pin_root


@pytest.fixture(scope="module")
def memory_root() -> Iterator[str]:
    """A memory pin namespace for the module."""
    with pin_root("memory") as root:
        yield root


@pytest.fixture(scope="module")
def kernel_root() -> Iterator[str]:
    """A bpffs directory for the module."""
    with pin_root("kernel") as root:
        yield root
