"""Every benchmark runs as the README shows it: ``python benchmarks/NAME.py``.

Run as a script, a benchmark's own directory comes first on ``sys.path``, where
benchmarks/statedb.py would shadow the statedb package: each script puts the repository
root first. ``--help`` imports everything the script imports and runs nothing.
"""

from __future__ import annotations

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
