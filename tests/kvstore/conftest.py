"""Fixtures of the kvstore tests: a real 3-member etcd cluster (Debian's etcd-server, which
the project's set-up installs) on loopback ports of its own, data under a temporary
directory, shared by the tests of one module and stopped by PID afterwards, also when a
test fails. Without the binary the tests skip, and under CI=true they fail."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest

from tests.kvstore.etcd_cluster import EtcdCluster, etcd_available


def _require_etcd() -> None:
    if etcd_available():
        return
    reason = "etcd not installed (make setup installs Debian's etcd-server)"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{reason}; CI=true requires the kvstore tests to run", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="module")
def etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdCluster]:
    """A started 3-member etcd cluster for the module's tests."""
    _require_etcd()
    cluster = EtcdCluster(tmp_path_factory.mktemp("etcd")).start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def prefix() -> str:
    """A key prefix of the test's own (tests of a module share the cluster)."""
    return f"t{uuid.uuid4().hex[:8]}/"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
