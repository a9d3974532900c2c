"""Every benchmark runs as the README shows it: ``python benchmarks/NAME.py``.

Run as a script, a benchmark's own directory comes first on ``sys.path``, where
benchmarks/statedb.py would shadow the statedb package: each script puts the repository
root first. ``--help`` imports everything the script imports and runs nothing.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

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
                "tracemalloc_top", "load_avg_1m_at_start", "load_avg_1m_at_end"):
        assert key in doc, key
    assert doc["events_timed"] > 0 and doc["events_unconfirmed"] == 0
    assert doc["p99_ms_worst_minute"] == max(doc["p99_ms_by_minute"]) > 0
    assert doc["rss_mb_end"] > 0 and doc["rss_mb_start"] > 0
    assert sum(doc["loop_lag_counts"]) > 0
    assert isinstance(doc["tracemalloc_top"], list) and len(doc["tracemalloc_top"]) <= 5
    for row in doc["tracemalloc_top"]:
        assert {"where", "size_kb_diff", "count_diff"} <= set(row)
