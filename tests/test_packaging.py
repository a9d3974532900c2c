"""The library packages stay lean: importing statedb and reconciler (and the testing kit's
non-hypothesis part) must not pull in any of the agent's dependencies, which a controller
installing ``statewright`` without the ``agent`` extra does not have. Each check runs in a
fresh interpreter, because this test process has already imported everything."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

#: Import names of the `agent` extra's distributions (and of the test tools), none of which
#: the library may import.
AGENT_MODULES = ("yaml", "pyroute2", "urllib3", "kubernetes", "prometheus_client", "starlette",
                 "uvicorn")
TEST_MODULES = ("hypothesis", "pytest", "trio")

#: What the library modules listed in each case may import outside the standard library and
#: the project itself: the core dependencies and what they pull in.
ALLOWED_THIRD_PARTY = {"anyio", "sniffio", "idna", "typing_extensions"}


def _imported_after(modules: list[str]) -> set[str]:
    """Top-level names of the modules a fresh interpreter holds after importing ``modules``."""
    code = (
        "import importlib, json, sys\n"
        f"for m in {modules!r}:\n"
        "    importlib.import_module(m)\n"
        "print(json.dumps(sorted({n.split('.')[0] for n in sys.modules})))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout
    return set(json.loads(out))


@pytest.mark.parametrize(
    "modules",
    [
        ["statedb", "reconciler"],
        ["statedb.show", "statedb.gc_tuning", "statedb.metrics"],
        ["reconciler.testing"],
    ],
    ids=["core", "statedb-extras", "testing-kit"],
)
def test_library_imports_no_agent_dependency(modules: list[str]) -> None:
    loaded = _imported_after(modules)
    assert not loaded & set(AGENT_MODULES), f"{modules} imported {loaded & set(AGENT_MODULES)}"
    assert not loaded & set(TEST_MODULES), f"{modules} imported {loaded & set(TEST_MODULES)}"
    third_party = {
        n
        for n in loaded - set(sys.stdlib_module_names)
        if not n.startswith("_") and n not in ("statedb", "reconciler", "__main__")
    }
    # Tools that hook into every interpreter (an editable install's finder, coverage) are not
    # imports of the library.
    third_party = {n for n in third_party if not n.startswith(("__editable", "coverage"))}
    assert third_party <= ALLOWED_THIRD_PARTY, f"unexpected imports: {third_party}"


def test_core_dependencies_are_only_the_library_ones() -> None:
    """pyproject's runtime dependencies are the core's; the agent's are in the extra."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    core = {d.split(">")[0].split("=")[0].strip().lower() for d in project["dependencies"]}
    assert core == {"anyio"}
    agent = {
        d.split(">")[0].split("=")[0].strip().lower()
        for d in project["optional-dependencies"]["agent"]
    }
    assert {"pyyaml", "pyroute2", "urllib3", "prometheus-client", "pyroaring", "starlette",
            "uvicorn"} <= agent
    # The agent talks to the API server through its own client (sources/k8s_http.py); the
    # official client is a test dependency only, keeping the fake API server honest.
    assert "kubernetes" not in agent
    test = {
        d.split(">")[0].split("=")[0].strip().lower()
        for d in project["optional-dependencies"]["test"]
    }
    assert "kubernetes" in test
    assert project["license"] == "Apache-2.0"


@pytest.mark.parametrize(
    "package",
    ["statedb", "reconciler", "tables", "bpf", "bpfops", "sources", "statewright", "policy"],
)
def test_packages_are_marked_typed(package: str) -> None:
    """PEP 561: without py.typed, mypy treats the installed packages as untyped."""
    assert (ROOT / package / "py.typed").is_file()
