"""Runs one txtar script test and reports pass or fail (with the line and a diff).

`run_archive` is independent of the load balancer: it extracts the archive into a
fresh work directory, reads the ``#!`` flags, builds a harness with a factory,
runs the script with an `Engine` in an anyio event loop and always closes the
harness (and removes the work directory), also when the script fails.
"""

from __future__ import annotations

import shutil
import tempfile
import time
import traceback
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import anyio

from tests.conformance import txtar
from tests.conformance.engine import Engine, ScriptFailure, State


@dataclass
class FileResult:
    """The outcome of one script file."""

    file: str
    status: str  # "pass" or "fail"
    reason: str = ""
    line: int = 0
    command: str = ""
    diff: str = ""
    seconds: float = 0.0

    @property
    def passed(self) -> bool:
        """True when the script passed."""
        return self.status == "pass"

    def to_json(self) -> dict[str, Any]:
        """JSON-ready form."""
        return asdict(self)

    def describe(self) -> str:
        """A human-readable failure report (empty for a pass)."""
        if self.passed:
            return ""
        where = f"line {self.line}: {self.command}: " if self.line else ""
        text = f"{self.file}: {where}{self.reason}"
        return text + ("\n" + self.diff.rstrip("\n") if self.diff else "")


def shebang_flags(script: str, workdir: Path) -> list[str]:
    """The agent flags of the ``#!`` first line, with ``$WORK`` replaced."""
    first = script.split("\n", 1)[0]
    if not first.startswith("#!"):
        return []
    return [tok.replace("$WORK", str(workdir)) for tok in first[2:].split()]


#: Builds the harness for one script from its flags and work directory; the harness
#: is an async context manager that is entered before the script runs.
HarnessFactory = Callable[[list[str], Path], AbstractAsyncContextManager[Any]]


def run_archive(
    path: Path,
    engine: Engine,
    harness_factory: HarnessFactory | None = None,
    privileged: bool = False,
) -> FileResult:
    """Run the script in ``path``; never raises for a script failure."""
    started = time.monotonic()
    name = path.name
    archive = txtar.parse_file(path)
    workdir = Path(tempfile.mkdtemp(prefix=f"conformance-{path.stem}-"))
    try:
        txtar.extract(archive, workdir)
        flags = shebang_flags(archive.comment, workdir)
        state = State(workdir=workdir, env={"WORK": str(workdir)}, privileged=privileged)

        failures: list[ScriptFailure] = []

        async def script() -> None:
            try:
                await engine.execute(state, archive.comment)
            except ScriptFailure as f:
                failures.append(f)

        async def main() -> None:
            if harness_factory is None:
                await script()
                return
            async with harness_factory(flags, workdir) as harness:
                state.harness = harness
                # Variables the harness defines for its scripts (e.g. $HEALTHADDR).
                script_env = getattr(harness, "script_env", None)
                if script_env is not None:
                    state.env.update(script_env())
                await script()

        try:
            anyio.run(main)
        except ScriptFailure as f:  # raised by the harness itself
            failures.append(f)
        except Exception as e:  # a crash of the harness is a failure of this file only
            tb = traceback.format_exc(limit=6)
            return FileResult(
                name, "fail", f"harness error: {type(e).__name__}: {e}", diff=tb,
                seconds=time.monotonic() - started,
            )
        if failures:
            first = failures[0]
            return FileResult(
                name, "fail", first.message, first.lineno, first.line.strip(), first.diff,
                time.monotonic() - started,
            )
        return FileResult(name, "pass", seconds=time.monotonic() - started)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
