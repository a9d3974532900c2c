"""Every file of Cilium's LB script-test corpus, on in-memory maps and on kernel maps.

The corpus is read from $STATEWRIGHT_LB_CORPUS (default ../shared/conformance/cilium-lb);
the tests skip with a message when it is absent. A file that fails because it
needs something Statewright does not implement (its report starts with
``unsupported:``: an unknown command or an unimplemented ``#!`` flag) is an
expected failure (xfail, with the reason). A file listed in KNOWN_CONFLICTS is an
expected failure too, strictly: it must fail at a maps-dump comparison, and if it starts
passing the test fails so that the list (and docs/conformance.md) gets updated. Any other
failure fails the test.
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




# Corpus files whose expected maps contradict other corpus files (different Cilium
# generations; see docs/conformance.md). Everything before the conflicting comparison
# must pass; tests/conformance/test_healthserver.py covers the rest of healthserver.
KNOWN_CONFLICTS: dict[str, str] = {
    "healthserver": (
        "its maps expect LBALG=random on every master entry without "
        "--bpf-lb-algorithm-annotation (the version at upstream commit c39bc9c); every "
        "other file, and upstream's later copy of the same test, expect LBALG=undef"
    ),
}


def _check(result: FileResult) -> None:
    known = KNOWN_CONFLICTS.get(Path(result.file).stem)
    if result.passed:
        if known is not None:
            pytest.fail(
                f"{result.file} passes now: remove it from KNOWN_CONFLICTS and "
                "docs/conformance.md",
                pytrace=False,
            )
        return
    if result.reason.startswith("unsupported:"):
        pytest.xfail(f"{result.file}: {result.reason}")
    if known is not None and "cmp" in result.command and "maps" in result.command:
        pytest.xfail(f"{result.file}: known corpus conflict: {known}")
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
