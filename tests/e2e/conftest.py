"""Fixtures of the end-to-end tests: one environment per module (see harness.py), skipped
where the machine cannot run it and failing instead when CI=true; and the timings the
tests measure, printed in pytest's terminal summary."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.e2e.harness import E2EEnv, EnvUnavailable, check_machine, e2e_env

#: (what, seconds) measured by the tests, printed at the end of the run.
TIMINGS: list[tuple[str, float]] = []


def record(what: str, seconds: float) -> None:
    """Remember a measured duration for the terminal summary (and print it for -s)."""
    TIMINGS.append((what, seconds))
    print(f"e2e: {what}: {seconds * 1000:.0f} ms")


def need_machine() -> None:
    """Skip (or fail when CI=true) unless the machine can run the environment."""
    try:
        check_machine()
    except EnvUnavailable as exc:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"{exc} (CI=true requires the e2e tests to run)", pytrace=False)
        pytest.skip(str(exc))


@pytest.fixture(scope="module")
def env() -> Iterator[E2EEnv]:
    """The namespace, backend servers, cgroup, agent and client shared by a module."""
    need_machine()
    with e2e_env() as e:
        yield e


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Print the measured convergence and restart figures."""
    if not TIMINGS:
        return
    terminalreporter.section("e2e timings")
    for what, seconds in TIMINGS:
        terminalreporter.write_line(f"{what}: {seconds * 1000:.0f} ms")
