"""The beds remove what they created also on their failure paths:

* set-up interrupted (Ctrl-C, a test timeout) while node 2's agent is starting, after it
  pinned its first maps: the agent is stopped, and its pin directory, namespaces,
  cgroups and temporary directories are gone (a pin directory
  ``statewright-cn2-<pid>-<hex>`` once outlived such a run: the interrupted start left
  its agent running, which went on pinning after the clean-up);
* ``statewright agent --cleanup`` timing out: the pins are removed all the same.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import tests.agent.conftest as agent_conftest
import tests.e2e.cluster_harness as cluster_harness
import tests.e2e.harness as harness
from bpf.catalog import policy_endpoints_spec
from bpf.factory import BackendConfig, MapFactory
from tests.e2e.conftest import need_machine
from tests.pins import BPFFS, remove_pin_dir

pytestmark = pytest.mark.kernel


def _agents_started(monkeypatch: pytest.MonkeyPatch) -> list[subprocess.Popen[str]]:
    """Every agent process `start_agent` starts from now on."""
    started: list[subprocess.Popen[str]] = []
    real = subprocess.Popen

    class Recording(real):  # type: ignore[misc,valid-type]
        def __init__(self, args: Any, *a: Any, **kw: Any) -> None:
            super().__init__(args, *a, **kw)
            if "statewright" in args and "agent" in args and "--cleanup" not in args:
                started.append(self)

    monkeypatch.setattr(agent_conftest.subprocess, "Popen", Recording)
    return started


def test_interrupted_cluster_setup_leaves_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    need_machine()
    scratches: list[harness.Scratch] = []
    real_scratch = cluster_harness.scratch

    def recording_scratch(*args: Any, **kw: Any) -> harness.Scratch:
        sc = real_scratch(*args, **kw)
        scratches.append(sc)
        return sc

    monkeypatch.setattr(cluster_harness, "scratch", recording_scratch)
    started = _agents_started(monkeypatch)
    real_client = agent_conftest.AgentClient

    class InterruptingClient(real_client):  # type: ignore[misc,valid-type]
        """Node 2's start is interrupted once its agent pinned something."""

        def get(self, path: str) -> Any:
            [sc] = [s for s in scratches if str(s.tmp) == os.path.dirname(self.socket_path)]
            if sc.ns.startswith("swcn2-"):
                deadline = time.monotonic() + 120
                while not (os.path.isdir(sc.pin_dir) and os.listdir(sc.pin_dir)):
                    assert time.monotonic() < deadline, "node 2's agent pinned nothing"
                    time.sleep(0.01)
                raise KeyboardInterrupt
            return super().get(path)

    monkeypatch.setattr(agent_conftest, "AgentClient", InterruptingClient)
    with pytest.raises(KeyboardInterrupt), cluster_harness.cluster_env():
        pytest.fail("node 2's start was not interrupted")
    assert [s.ns for s in scratches] == [f"swcn{i}-{scratches[0].tag}" for i in (1, 2)]
    assert len(started) == 2
    running = [p.pid for p in started if p.poll() is None]
    assert not running, f"agents still running: {running}"
    left = []
    for sc in scratches:
        left += [what for what, path in (
            ("pins", sc.pin_dir), ("cgroup", sc.cgroup), ("dir", str(sc.tmp)),
            ("netns", f"/var/run/netns/{sc.ns}"),
        ) if os.path.exists(path)]
    underlay = f"/var/run/netns/swul-{scratches[0].tag}"
    left += ["underlay"] if os.path.exists(underlay) else []
    assert not left, left


@pytest.fixture
def pin_dir() -> Iterator[str]:
    """A pin directory on bpffs holding one pinned map (removed after in any case)."""
    path = os.path.join(BPFFS, f"statewright-hcl-{os.getpid()}-{time.monotonic_ns() % 10**6}")
    m = MapFactory(BackendConfig(backend="kernel", pin_dir=path)).open_typed(
        policy_endpoints_spec())
    m.close()
    assert os.listdir(path)
    try:
        yield path
    finally:
        remove_pin_dir(path)


def test_pins_go_when_the_cleanup_command_times_out(
    pin_dir: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def timing_out(args: Any, **kw: Any) -> Any:
        raise subprocess.TimeoutExpired(args, kw.get("timeout", 0))

    monkeypatch.setattr(harness.subprocess, "run", timing_out)
    with pytest.raises(subprocess.TimeoutExpired):
        harness._cleanup_agent_state(pin_dir, str(tmp_path / "agent.sock"),
                                     str(tmp_path / "no-cgroup"))
    assert not os.path.exists(pin_dir)
