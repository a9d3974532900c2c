"""Every benchmark runs as the README shows it: ``python benchmarks/NAME.py``.

Run as a script, a benchmark's own directory comes first on ``sys.path``, where
benchmarks/statedb.py would shadow the statedb package: each script puts the repository
root first. ``--help`` imports everything the script imports and runs nothing.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.procs import descendants

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
SCRIPTS = sorted(p.name for p in BENCHMARKS.glob("*.py") if p.name != "__init__.py")


@pytest.mark.parametrize("script", SCRIPTS)
def test_runs_as_a_script(script: str) -> None:
    res = subprocess.run([sys.executable, str(BENCHMARKS / script), "--help"],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "usage:" in res.stdout


@pytest.mark.kernel
def test_soak_tiny_run_prints_every_key() -> None:
    """benchmarks/soak.py end to end on a tiny run: the agent process, the fake API
    server, the churn timed against the kernel map, the agent's own loop probe and
    tracemalloc snapshots; every key of the issue is there and plausible. Each service is
    churned once at most in the 6 s (300 services at 50 events/s): an agent that falls
    behind on a loaded machine may apply two changes of one slice in one batch, and the
    first one's address then never reaches the map (it would count as unconfirmed)."""
    res = subprocess.run(
        [sys.executable, str(BENCHMARKS / "soak.py"), "--services", "300", "--rate", "50",
         "--seconds", "6", "--tracemalloc-seconds", "3", "--sample-every", "2"],
        capture_output=True, text=True, timeout=240,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    doc = json.loads(res.stdout)
    for key in ("p99_ms_by_minute", "p99_ms_worst_minute", "stall_ms_max", "stalls_over_50ms",
                "rss_mb_start", "rss_mb_end", "rss_mb_per_hour_after_warmup",
                "tracemalloc_top", "load_avg_1m_at_start", "load_avg_1m_at_end",
                "steal_ms_by_minute"):
        assert key in doc, key
    assert doc["events_timed"] > 0 and doc["events_unconfirmed"] == 0
    assert doc["p99_ms_worst_minute"] == max(doc["p99_ms_by_minute"]) > 0
    assert doc["rss_mb_end"] > 0 and doc["rss_mb_start"] > 0
    assert sum(doc["loop_lag_counts"]) > 0
    assert all(ms >= 0 for ms in doc["steal_ms_by_minute"])
    assert isinstance(doc["tracemalloc_top"], list) and len(doc["tracemalloc_top"]) <= 5
    for row in doc["tracemalloc_top"]:
        assert {"where", "size_kb_diff", "count_diff"} <= set(row)


@pytest.mark.kernel
def test_soak_stopped_by_sigterm_removes_what_it_started() -> None:
    """A soak ended by SIGTERM (``timeout``, ``kill``) stops its agent and fake server and
    removes its pinned maps and temporary directory, as Ctrl-C does."""
    proc = subprocess.Popen(
        [sys.executable, str(BENCHMARKS / "soak.py"), "--services", "300", "--rate", "50",
         "--seconds", "120", "--tracemalloc-seconds", "0"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    pin_dir = Path(f"/sys/fs/bpf/statewright-soak-{proc.pid}")
    started: list[int] = []
    try:
        try:
            deadline = time.monotonic() + 120
            # Until the agent pinned its maps: every process of the run is up.
            while not (pin_dir / "lb4_backends").exists():
                assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
                assert time.monotonic() < deadline, "the soak's agent never pinned its maps"
                time.sleep(0.2)
            started = descendants(proc.pid)
            assert len(started) >= 2  # the fake server and the agent
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=90) == 128 + signal.SIGTERM
        finally:
            if proc.poll() is None:
                started = started or descendants(proc.pid)
                proc.kill()
                proc.wait()
        _assert_soak_left_nothing(proc.pid, started, pin_dir)
    finally:
        _remove_soak_leftovers(proc.pid, started, pin_dir)


def _soak_temp_dirs(soak_pid: int) -> list[Path]:
    return list(Path(tempfile.gettempdir()).glob(f"statewright-soak-{soak_pid}-*"))


def _assert_soak_left_nothing(soak_pid: int, started: list[int], pin_dir: Path) -> None:
    """No process the soak started is left, nor its pinned maps or temporary directory."""
    # multiprocessing's resource tracker leaves by itself once its parent is gone (it reads
    # EOF): give every process a few seconds, then none may be left.
    deadline = time.monotonic() + 15
    for pid in started:
        while Path(f"/proc/{pid}").exists() and not _zombie(pid):
            assert time.monotonic() < deadline, f"process {pid} left running"
            time.sleep(0.1)
    assert not pin_dir.exists()
    assert not _soak_temp_dirs(soak_pid)


def _remove_soak_leftovers(soak_pid: int, started: list[int], pin_dir: Path) -> None:
    """What a failed run left: its processes (by PID, those the soak started), its pinned
    maps and its temporary directories. Nothing when the run cleaned up after itself."""
    for pid in started:
        if Path(f"/proc/{pid}").exists() and not _zombie(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    shutil.rmtree(pin_dir, ignore_errors=True)
    for path in _soak_temp_dirs(soak_pid):
        shutil.rmtree(path, ignore_errors=True)


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True
