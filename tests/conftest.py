"""Shared pytest hooks: tests marked ``kernel`` run where kernel BPF works, skip elsewhere,
and fail instead of skipping in CI (CI=true) so a missing capability is never silent.
Shared fixtures: ``apiserver``, the wire-level fake Kubernetes API server (tests/k8s/);
``host_sysctls_untouched`` (every test): no test changes the machine's own kernel settings."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.k8s.fake_apiserver import FakeAPIServer

#: No agent a test starts in the machine's own network namespace sets the machine's kernel
#: settings (statewright/agent/components/sysctl.py): their default is off in the suite,
#: and `host_sysctls_untouched` checks every test. Agents run inside a test's namespace
#: (tests/e2e/node_harness.py) turn theirs on explicitly.
os.environ["STATEWRIGHT_SYSCTL"] = "off"  # statewright.agent.config.SYSCTL_ENV

#: The machine's settings an agent would change, checked around every test.
HOST_SYSCTLS = ("net/ipv4/ip_forward", "net/ipv4/conf/all/rp_filter",
                "net/ipv4/conf/default/rp_filter", "net/ipv6/conf/all/forwarding",
                "net/ipv6/conf/default/forwarding")


def _host_sysctls() -> dict[str, str]:
    out = {}
    for path in HOST_SYSCTLS:
        try:
            with open(f"/proc/sys/{path}") as f:
                out[path] = f.read().strip()
        except OSError:
            out[path] = "(none)"
    return out


@pytest.fixture(autouse=True)
def host_sysctls_untouched() -> Iterator[None]:
    """Fail the test after which a setting of the machine's own namespace changed."""
    before = _host_sysctls()
    yield
    after = _host_sysctls()
    changed = {p: f"{before[p]} -> {after[p]}" for p in before if before[p] != after[p]}
    assert not changed, f"the test changed the machine's own kernel settings: {changed}"


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
