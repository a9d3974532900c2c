"""The typed API of statedb and reconciler, checked by mypy (the project's own, from the
venv): ``mypy --strict`` over both packages finds nothing, the samples in
tests/typing_samples that use the API as intended pass, and every mistake in the ``bad_*``
samples is reported on its line with the error codes its ``# E: code, ...`` marker names
(and nothing else is reported). One mypy run covers it all; it takes some seconds.
"""

from __future__ import annotations

import re
import runpy
import subprocess
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, get_args

import pytest

from statedb import Index, Table, keys
from statedb.show import row_type_of
from tests.typing_samples.rows import Host

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "tests" / "typing_samples"
LIBRARY = ("statedb", "reconciler")

_MARKER = re.compile(r"#\s*E:\s*([\w-]+(?:\s*,\s*[\w-]+)*)\s*$")
_ERROR = re.compile(r"^(?P<path>[^:]+):(?P<line>\d+): error: (?P<text>.*?)\s+\[(?P<code>[\w-]+)\]$")

Errors = dict[tuple[str, int], set[str]]


@dataclass(frozen=True)
class MypyRun:
    """What one mypy run reported: error codes and messages by (path, line), and its output."""

    codes: Errors
    messages: dict[tuple[str, int], list[str]]
    output: str


def _expected(path: Path) -> Errors:
    """The ``# E:`` markers of one sample: (path, line) -> error codes."""
    rel = str(path.relative_to(ROOT))
    out: Errors = {}
    for number, text in enumerate(path.read_text().splitlines(), start=1):
        m = _MARKER.search(text)
        if m:
            out[(rel, number)] = {c.strip() for c in m.group(1).split(",")}
    return out


@pytest.fixture(scope="module")
def mypy_run(tmp_path_factory: pytest.TempPathFactory) -> MypyRun:
    """One ``mypy --strict`` run over the library and every sample: the errors by line."""
    cache = tmp_path_factory.mktemp("mypy-cache")
    samples = sorted(str(p.relative_to(ROOT)) for p in SAMPLES.glob("*.py"))
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--config-file", "pyproject.toml",
         "--cache-dir", str(cache), "--no-color-output", "--no-error-summary",
         *LIBRARY, *samples],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )
    if proc.returncode not in (0, 1) or proc.stderr.strip():
        pytest.fail(f"mypy did not run (exit {proc.returncode}):\n{proc.stderr}{proc.stdout}")
    errors: Errors = defaultdict(set)
    texts: dict[tuple[str, int], list[str]] = defaultdict(list)
    for line in proc.stdout.splitlines():
        m = _ERROR.match(line)
        if m:
            key = (m.group("path"), int(m.group("line")))
            errors[key].add(m.group("code"))
            texts[key].append(f"{m.group('text')} [{m.group('code')}]")
    return MypyRun(dict(errors), dict(texts), proc.stdout)


def test_library_is_strict_clean(mypy_run: MypyRun) -> None:
    in_library = [key for key in mypy_run.codes if key[0].split("/")[0] in LIBRARY]
    assert not in_library, mypy_run.output


@pytest.mark.parametrize("sample", sorted(p.name for p in SAMPLES.glob("good_*.py")))
def test_good_sample_passes(sample: str, mypy_run: MypyRun) -> None:
    path = f"tests/typing_samples/{sample}"
    assert not [key for key in mypy_run.codes if key[0] == path], mypy_run.output
    assert not _expected(SAMPLES / sample), "a good sample has no error markers"


@pytest.mark.parametrize("sample", sorted(p.name for p in SAMPLES.glob("good_*.py")))
def test_good_sample_runs(sample: str) -> None:
    """The good samples are real programs: they run as they type-check."""
    runpy.run_path(str(SAMPLES / sample), run_name="typing_sample")


@pytest.mark.parametrize("sample", sorted(p.name for p in SAMPLES.glob("bad_*.py")))
def test_bad_sample_fails_where_marked(sample: str, mypy_run: MypyRun) -> None:
    path = SAMPLES / sample
    rel = str(path.relative_to(ROOT))
    expected = _expected(path)
    assert expected, f"{sample} has no # E: markers"
    got = {key: codes for key, codes in mypy_run.codes.items() if key[0] == rel}
    problems = []
    for key in sorted(set(expected) | set(got)):
        want, have = expected.get(key, set()), got.get(key, set())
        if want != have:
            problems.append(f"line {key[1]}: expected {sorted(want)}, mypy reported "
                            f"{sorted(have)}: {mypy_run.messages.get(key, [])}")
    assert not problems, "\n".join(problems)


def test_markers_are_parsed() -> None:
    """The marker syntax the samples use: codes after ``# E:``, comma-separated."""
    m = _MARKER.search("x = 1  # E: arg-type, return-value")
    assert m is not None and m.group(1) == "arg-type, return-value"
    assert _ERROR.match(
        'a/b.py:3: error: Need type annotation for "x"  [var-annotated]'
    ) is not None



def test_subscripted_constructors_work_at_run_time() -> None:
    """``Index[Row, Key](...)``, ``Table[Row](...)`` and ``Table[Row, Key](...)`` build the
    same objects as the plain constructors; a table remembers its type arguments (an index,
    frozen with slots, has nowhere to keep them)."""
    by_id = Index[Host, int]("id", key=lambda h: h.id, encode=keys.uint64)
    assert type(by_id) is Index and by_id.encode is keys.uint64
    loose = Table[Host]("loose", by_id)
    assert get_args(getattr(loose, "__orig_class__", None)) == (Host, Any)
    assert row_type_of(loose) is Host
    assert row_type_of(Table[Host, int]("tight", by_id)) is Host
