"""Running Cilium's load-balancer corpus against Statewright: file discovery and backends.

The corpus directory is ``$STATEWRIGHT_LB_CORPUS`` or, by default,
``../shared/conformance/cilium-lb`` next to the repository. It is read in place,
never copied. Every ``*.txtar`` file in it is one test.

Backends: ``memory`` (in-process maps, pinned in the memory backend's registry
under a unique name) or ``kernel`` (real BPF maps pinned under a unique directory
in /sys/fs/bpf that is removed afterwards). Both run the same scripts; the
``[privileged]`` condition is true on the kernel backend, as upstream.
"""

from __future__ import annotations

import os
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.conformance.dbcmds import db_commands
from tests.conformance.engine import Engine
from tests.conformance.lbcmds import LBHarness, harness_factory, lb_commands
from tests.conformance.runner import FileResult, run_archive

REPO = Path(__file__).resolve().parents[2]
DEFAULT_CORPUS = REPO.parent / "shared" / "conformance" / "cilium-lb"
CORPUS_ENV = "STATEWRIGHT_LB_CORPUS"
#: Seconds a retried (``*``) command may keep retrying (the upstream script deadline).
RETRY_TIMEOUT = float(os.environ.get("STATEWRIGHT_LB_RETRY_TIMEOUT", "10"))
#: Seconds one script may spend waiting in retries overall (upstream: a 10 s context; more
#: here because the kernel backend on a loaded CI machine is slower).
SCRIPT_TIMEOUT = float(os.environ.get("STATEWRIGHT_LB_SCRIPT_TIMEOUT", "60"))
BPFFS = "/sys/fs/bpf"


def corpus_dir(override: str | None = None) -> Path:
    """The corpus directory: ``override``, else $STATEWRIGHT_LB_CORPUS, else the default."""
    return Path(override or os.environ.get(CORPUS_ENV) or DEFAULT_CORPUS)


def corpus_files(directory: Path) -> list[Path]:
    """Every ``*.txtar`` file of the corpus, sorted by name."""
    return sorted(p for p in directory.glob("*.txtar") if p.is_file())


def make_engine(
    retry_timeout: float = RETRY_TIMEOUT, script_timeout: float = SCRIPT_TIMEOUT
) -> Engine:
    """The engine with the generic, db and LB commands and the harness quiescence probe."""

    async def quiescence(state: object) -> object:
        harness = getattr(state, "harness", None)
        if isinstance(harness, LBHarness):
            return await harness.quiescence(state)  # type: ignore[arg-type]
        return None

    commands = {**db_commands(), **lb_commands()}
    return Engine(
        commands,
        retry_timeout=retry_timeout,
        script_timeout=script_timeout,
        quiescence=quiescence,
    )


@contextmanager
def pin_root(backend: str) -> Iterator[str]:
    """A unique pin directory for one run; kernel pins are removed afterwards."""
    if backend == "kernel":
        root = tempfile.mkdtemp(prefix="statewright-conformance-", dir=BPFFS)
    else:
        root = f"/memory/statewright-conformance-{uuid.uuid4().hex[:12]}"
    try:
        yield root
    finally:
        if backend == "kernel":
            import shutil

            shutil.rmtree(root, ignore_errors=True)
        else:
            from bpf.memory_map import MemoryMap

            for path in MemoryMap.pinned_paths():
                if path.startswith(root + "/"):
                    MemoryMap.remove_pin(path)


def run_file(path: Path, backend: str, root: str, engine: Engine | None = None) -> FileResult:
    """Run one corpus file on ``backend`` with pins under ``root``."""
    return run_archive(
        path,
        engine or make_engine(),
        harness_factory(backend, root),
        privileged=False,
    )
