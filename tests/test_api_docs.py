"""The API reference of statedb and reconciler is generated from the docstrings (pdoc) and
built here, so it cannot rot: an annotation pdoc cannot resolve, a module that fails to
import or any other pdoc warning fails the test. The modules are those of ``make docs``
(``API_MODULES`` in the Makefile)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def api_modules() -> list[str]:
    """The modules ``make docs`` documents."""
    match = re.search(r"^API_MODULES\s*:=\s*(.+)$", (ROOT / "Makefile").read_text(), re.M)
    assert match, "Makefile has no API_MODULES"
    return match.group(1).split()


def test_api_reference_builds_without_warnings(tmp_path: Path) -> None:
    modules = api_modules()
    assert {"statedb", "reconciler", "reconciler.testing"} <= set(modules)
    proc = subprocess.run(
        [sys.executable, "-W", "error", "-m", "pdoc", *modules, "-o", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    assert "Warn" not in proc.stderr and "Error" not in proc.stderr, proc.stderr
    pages = {p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*.html")}
    for module in modules:
        assert module.replace(".", "/") + ".html" in pages, f"no page for {module}: {pages}"
    # The reference documents what users look up.
    statedb_page = (tmp_path / "statedb.html").read_text()
    for name in ("ObjectReusedError", "write_txn", "Index", "changes"):
        assert name in statedb_page, name
    testing_page = (tmp_path / "reconciler" / "testing.html").read_text()
    for name in ("FaultyOps", "MemoryTarget", "wait_until_done", "BackgroundReconciler"):
        assert name in testing_page, name
