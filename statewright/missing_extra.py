"""What the ``statewright`` command says when it was installed without the ``agent`` extra.

``pip install statewright`` installs the library (statedb, reconciler) and the console
script, but the command line needs the agent's dependencies: instead of a
``ModuleNotFoundError`` traceback it names the missing module and what to install.
"""

from __future__ import annotations

import sys
from typing import NoReturn

#: Top-level import names of the ``agent`` extra's distributions (pyproject.toml).
AGENT_EXTRA_MODULES = frozenset({
    "yaml", "pyroute2", "urllib3", "prometheus_client", "pyroaring", "starlette",
    "uvicorn", "sniffio", "httpx",
})

#: The exit code of a command that cannot run for want of a dependency.
EXIT_MISSING_EXTRA = 3


def exit_for_missing_extra(exc: ModuleNotFoundError) -> NoReturn:
    """Exit with a one-line message when ``exc`` is a missing agent dependency; re-raise
    anything else (a missing module of the project itself is a bug)."""
    top = (exc.name or "").split(".")[0]
    if top not in AGENT_EXTRA_MODULES:
        raise exc
    print(
        f"statewright: the command line needs the agent's dependencies (module {top!r} is "
        "not installed): pip install 'statewright[agent]'",
        file=sys.stderr,
    )
    raise SystemExit(EXIT_MISSING_EXTRA)
