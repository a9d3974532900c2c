"""Shared pytest hooks: tests marked ``kernel`` run where kernel BPF works, skip elsewhere,
and fail instead of skipping in CI (CI=true) so a missing capability is never silent.
Shared fixtures: ``apiserver``, the wire-level fake Kubernetes API server (tests/k8s/)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.k8s.fake_apiserver import FakeAPIServer


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Gate ``@pytest.mark.kernel`` tests on the kernel BPF probe."""
    if item.get_closest_marker("kernel") is None:
        return
    from bpf.probe import kernel_support

    support = kernel_support()
    if support.ok:
        return
    reason = f"kernel BPF unavailable: {support.reason}"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{reason} (CI=true requires kernel tests to run)", pytrace=False)
    pytest.skip(reason)


@pytest.fixture
def apiserver() -> Iterator[FakeAPIServer]:
    """A started fake API server (bookmarks every 0.2 s), stopped after the test."""
    srv = FakeAPIServer().start()
    try:
        yield srv
    finally:
        srv.stop()
