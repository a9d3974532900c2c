"""The Python examples of the README and the library docs run as shown and print what the
docs say they print.

Each ```python block is saved to a file of its own and run with this interpreter (the
repository on PYTHONPATH). The text between a block and the next fenced block says what is
expected of it:

* it starts with "prints": the next block is the exact standard output;
* it mentions ``mypy --strict``: the block is a type-checking demo, saved under the file
  name the next block's lines start with; mypy's errors and revealed types must be exactly
  the lines of the next block (its other notes are left out of the docs);
* anything else: the block must run without error.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = ("README.md", "docs/statedb.md", "docs/reconciler.md")
FENCE = re.compile(r"^```(\w*)\n(.*?)^```\n", re.S | re.M)


@dataclass(frozen=True)
class Example:
    """One ```python block and what its doc expects of it."""

    doc: str
    index: int
    code: str
    kind: str  # "prints", "mypy" or "runs"
    expected: str

    @property
    def id(self) -> str:
        return f"{self.doc}#{self.index}"


def examples() -> list[Example]:
    """Every ```python block of DOCS, with the expectation its doc states."""
    out: list[Example] = []
    for doc in DOCS:
        text = (REPO / doc).read_text()
        fences = list(FENCE.finditer(text))
        n = 0
        for i, m in enumerate(fences):
            if m.group(1) != "python":
                continue
            nxt = fences[i + 1] if i + 1 < len(fences) else None
            between = text[m.end() : nxt.start()].strip() if nxt else ""
            kind, expected = "runs", ""
            if nxt is not None and nxt.group(1) == "":
                if between.startswith("prints"):
                    kind, expected = "prints", nxt.group(2)
                elif "mypy --strict" in between:
                    kind, expected = "mypy", nxt.group(2)
            out.append(Example(doc, n, m.group(2), kind, expected))
            n += 1
    return out


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


@pytest.mark.parametrize("ex", examples(), ids=lambda e: e.id)
def test_doc_example(ex: Example, tmp_path: Path) -> None:
    if ex.kind == "mypy":
        name = ex.expected.split(":", 1)[0]
        (tmp_path / name).write_text(ex.code)
        env = _env()
        env["MYPYPATH"] = str(REPO)
        proc = subprocess.run(
            [sys.executable, "-m", "mypy", "--strict", "--no-incremental",
             "--cache-dir", os.devnull, "--config-file", os.devnull, name],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
        )
        got = [
            line for line in proc.stdout.splitlines()
            if ": error: " in line or ": note: Revealed type" in line
        ]
        assert got == ex.expected.splitlines(), proc.stdout
        return
    (tmp_path / "example.py").write_text(ex.code)
    proc = subprocess.run(
        [sys.executable, "example.py"], cwd=tmp_path, env=_env(), capture_output=True,
        text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    if ex.kind == "prints":
        assert proc.stdout == ex.expected, proc.stderr


def test_every_doc_has_its_examples_checked() -> None:
    """The collection above finds the blocks (a changed fence style would skip them)."""
    kinds = {(e.doc, e.kind) for e in examples()}
    assert ("docs/reconciler.md", "prints") in kinds
    assert ("docs/reconciler.md", "mypy") in kinds
    assert ("docs/statedb.md", "mypy") in kinds
    assert ("README.md", "runs") in kinds


def _machine_spec_example() -> str:
    import textwrap

    import reconciler.testing.machine as machine

    doc = machine.__doc__ or ""
    marker = "``mypy --strict`` clean)::"
    return textwrap.dedent(doc[doc.index(marker) + len(marker):])


def test_runnable_examples_are_mypy_strict_clean(tmp_path: Path) -> None:
    """A newcomer copies the README's quick tour and the testing kit's `MachineSpec`
    example into a typed project: they type-check under ``mypy --strict`` as they are,
    and the MachineSpec example runs."""
    names = []
    for ex in examples():
        if ex.kind != "mypy":
            name = f"ex_{re.sub(r'[^a-z0-9]', '_', ex.id.lower())}.py"
            (tmp_path / name).write_text(ex.code)
            names.append(name)
    (tmp_path / "machine_spec.py").write_text(_machine_spec_example())
    names.append("machine_spec.py")
    env = _env()
    env["MYPYPATH"] = str(REPO)
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental",
         "--cache-dir", os.devnull, "--config-file", os.devnull, *names],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stdout
    run = subprocess.run([sys.executable, "machine_spec.py"], cwd=tmp_path, env=_env(),
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
