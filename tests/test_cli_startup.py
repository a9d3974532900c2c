"""What every ``statewright`` command pays before it runs: building the parser imports
each command group, and must not import the clients only some commands use (the
Kubernetes client is ~0.2 s of CPU per command: `statewright operator` imports it when it
runs, not when the parser is built). A fresh interpreter, as this process has imported
everything already."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: Clients of a few commands or components only: imported where those run.
HEAVY = ("kubernetes", "httpx", "pyroute2", "uvicorn", "starlette")


def test_building_the_parser_imports_no_client_of_one_command() -> None:
    code = (
        "import json, sys\n"
        "from statewright.cli import build_parser\n"
        "build_parser()\n"
        f"print(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True,
                         capture_output=True, text=True).stdout
    assert json.loads(out) == []
