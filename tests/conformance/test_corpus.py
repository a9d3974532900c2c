"""Every file of Cilium's LB script-test corpus, on in-memory maps and on kernel maps.

The corpus is read from $STATEWRIGHT_LB_CORPUS (default ../shared/conformance/cilium-lb);
the tests skip with a message when it is absent. A file that fails because it
needs something Statewright does not implement (its report starts with
``unsupported:``: an unknown command or an unimplemented ``#!`` flag) is an
expected failure (xfail, with the reason). Any other failure fails the test: the corpus
has no per-file exception.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conformance.corpus import corpus_dir, corpus_files, make_engine, run_file
from tests.conformance.runner import FileResult

CORPUS = corpus_dir()
FILES = corpus_files(CORPUS) if CORPUS.is_dir() else []
PARAMS = [pytest.param(p, id=p.stem) for p in FILES] or [
    pytest.param(None, id="corpus-missing")
]



def _check(result: FileResult) -> None:
    if result.passed:
        return
    if result.reason.startswith("unsupported:"):
        pytest.xfail(f"{result.file}: {result.reason}")
    pytest.fail(result.describe(), pytrace=False)


def _path(path: Path | None) -> Path:
    if path is None:
        pytest.skip(f"LB corpus not found at {CORPUS} (set $STATEWRIGHT_LB_CORPUS)")
    return path


@pytest.mark.parametrize("path", PARAMS)
def test_corpus_memory(path: Path | None, memory_root: str) -> None:
    """The script passes on in-memory maps."""
    _check(run_file(_path(path), "memory", memory_root, make_engine()))


@pytest.mark.kernel
@pytest.mark.parametrize("path", PARAMS)
def test_corpus_kernel(path: Path | None, kernel_root: str) -> None:
    """The script passes on kernel BPF maps (pinned under a temporary bpffs directory)."""
    _check(run_file(_path(path), "kernel", kernel_root, make_engine()))
