"""The documented example must keep running."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_reconcile_to_files_example_runs() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "reconcile_to_files.py")],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr
    assert "['a.txt'] hello OK, 1 object(s)" in proc.stdout
