"""The distribution installs as promised, in a fresh virtual environment:

* ``pip install .`` (no extras) brings only the library's dependencies; statedb and
  reconciler import without any agent dependency, mypy sees the installed packages as
  typed (py.typed), and the DNS controller example runs against the installed packages;
* ``pip install '.[agent]'`` then brings the agent's dependencies, ``statewright --help``
  works and every module of every package imports; the compiled BPF objects are found
  through ``$STATEWRIGHT_BPF_OBJECTS``, and a missing one is an error naming where it was
  looked for.

The sources are copied to a temporary directory first, so the build never writes into the
work tree (other tests run meanwhile). pip resolves with constraints.txt from the
configured index, with its cache; the project's own wheel is built with build isolation
(setuptools>=77). Slowish: about 30-60 s on the project's 2-core machine, most of it pip.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = (
    "statedb", "reconciler", "tables", "bpf", "bpfops", "sources", "statewright", "policy"
)
AGENT_DISTRIBUTIONS = ("pyyaml", "pyroute2", "urllib3", "prometheus-client", "pyroaring",
                       "starlette", "uvicorn")

pytestmark = [pytest.mark.slow, pytest.mark.install]


def _run(args: list[str], cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{args} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc


def _copy_sources(dest: Path) -> Path:
    """What the build needs: pyproject, README, constraints and the packages."""
    src = dest / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "constraints.txt"):
        shutil.copy2(ROOT / name, src / name)
    for pkg in PACKAGES:
        shutil.copytree(ROOT / pkg, src / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    return src


def _installed(python: Path) -> set[str]:
    out = _run(
        [sys.executable, "-m", "pip", "--python", str(python), "list", "--format=json"],
        python.parent,
    ).stdout
    return {d["name"].lower().replace("_", "-") for d in json.loads(out)}


def _import_all(python: Path, packages: tuple[str, ...], cwd: Path) -> list[str]:
    """Import every module of ``packages`` in ``python``'s environment; return their names.
    ``reconciler.testing.machine`` needs hypothesis (the ``test`` extra) and is left out."""
    code = (
        "import importlib, json, pkgutil, sys\n"
        "done = []\n"
        f"for name in {list(packages)!r}:\n"
        "    pkg = importlib.import_module(name)\n"
        "    done.append(name)\n"
        "    for info in pkgutil.walk_packages(pkg.__path__, name + '.'):\n"
        "        if info.name.endswith('__main__') or info.name == 'reconciler.testing.machine':\n"
        "            continue\n"
        "        importlib.import_module(info.name)\n"
        "        done.append(info.name)\n"
        "print(json.dumps(done))\n"
    )
    names: list[str] = json.loads(_run([str(python), "-c", code], cwd).stdout)
    return names


def test_fresh_install_core_then_agent(tmp_path: Path) -> None:
    src = _copy_sources(tmp_path)
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    python = env_dir / "bin" / "python"
    # The test environment's pip installs into the new environment (no ensurepip there).
    pip = [sys.executable, "-m", "pip", "--python", str(python), "install", "-q",
           "-c", str(src / "constraints.txt")]

    # 1. The library alone.
    _run([*pip, str(src)], tmp_path)
    names = _installed(python) - {"pip", "setuptools"}
    assert not names & set(AGENT_DISTRIBUTIONS), names
    assert names <= {"statewright", "anyio", "idna", "sniffio",
                     "typing-extensions"}, names
    check = (
        "import json, sys, pathlib, statedb, reconciler, reconciler.testing\n"
        "mods = sorted({m.split('.')[0] for m in sys.modules})\n"
        "typed = [(pathlib.Path(m.__file__).parent / 'py.typed').is_file()"
        " for m in (statedb, reconciler)]\n"
        "print(json.dumps({'mods': mods, 'typed': typed, 'file': statedb.__file__}))\n"
    )
    info = json.loads(_run([str(python), "-c", check], tmp_path).stdout)
    assert not set(info["mods"]) & {"yaml", "pyroute2", "kubernetes", "urllib3",
                                    "prometheus_client"}
    assert info["typed"] == [True, True]
    assert str(env_dir) in info["file"], "statedb was not imported from the new environment"
    # mypy sees the installed packages as typed (py.typed): a correct use checks clean, a
    # wrong one is caught, and nothing is reported as an untyped import.
    sample = tmp_path / "use_statedb.py"
    sample.write_text(
        "from statedb import DB, Index, Table\n"
        "from reconciler import Status, status_pending\n"
        "table: Table[str] = Table('t', Index('k', key=lambda s: s))\n"
        "db = DB(table)\n"
        "status: Status = status_pending()\n"
        "count: int = table.count(db.read_txn())\n"
        "wrong: str = table.count(db.read_txn())\n"
    )
    checked = subprocess.run(
        [sys.executable, "-m", "mypy", "--python-executable", str(python), "--no-incremental",
         str(sample)],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )
    assert "import-untyped" not in checked.stdout, checked.stdout
    assert "py.typed" not in checked.stdout, checked.stdout
    assert checked.stdout.count("error:") == 1, checked.stdout
    assert 'use_statedb.py:7: error: Incompatible types in assignment' in checked.stdout
    # Every module of the library imports with the core dependencies alone.
    assert "reconciler.testing.faults" in _import_all(python, ("statedb", "reconciler"), tmp_path)
    example = _run(
        [str(python), str(ROOT / "examples" / "dns_controller.py"), "--failure-rate", "0.3"],
        tmp_path, timeout=120,
    )
    assert "health: reconciler-dns level=OK message=OK, 3 object(s)" in example.stdout
    # The console script is installed too; without the extra it says what to install.
    bare = subprocess.run([str(env_dir / "bin" / "statewright"), "--help"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    assert bare.returncode == 3, bare.stderr
    assert "pip install 'statewright[agent]'" in bare.stderr and "Traceback" not in bare.stderr

    # 2. The agent's extra on top: the command line works.
    _run([*pip, f"{src}[agent]"], tmp_path)
    assert set(AGENT_DISTRIBUTIONS) <= _installed(python)
    helped = _run([str(env_dir / "bin" / "statewright"), "--help"], tmp_path)
    assert "agent" in helped.stdout
    helped = _run([str(env_dir / "bin" / "statewright"), "agent", "--help"], tmp_path)
    assert "--backend" in helped.stdout
    # The agent finds its example manifests in the installed package, not in a repository.
    found = _run(
        [str(python), "-c",
         "import json, os\n"
         "from statewright.agent.config import AgentConfig\n"
         "d = AgentConfig().manifests[0]\n"
         "print(json.dumps([d, sorted(os.listdir(d))]))\n"],
        tmp_path,
    ).stdout
    where, files = json.loads(found)
    assert where.startswith(str(env_dir)), where
    assert files == sorted(p.name for p in (ROOT / "examples" / "manifests").glob("*.yaml"))
    # Every module of every package imports with the agent's extra: no dependency missing.
    assert "statewright.agent.runtime" in _import_all(python, PACKAGES, tmp_path)
    _check_bpf_objects(python, env_dir, tmp_path)


def _check_bpf_objects(python: Path, env_dir: Path, cwd: Path) -> None:
    """The installed package finds the compiled BPF objects through one setting,
    $STATEWRIGHT_BPF_OBJECTS (it has no build/ of its own); unset, loading names where it
    looked and what to set. Loading is refused before any kernel call."""
    probe = (
        "import json, sys, tempfile\n"
        "from bpf import btf, datapath, lxc, nodeport, objects\n"
        "from bpf.lxc import EndpointPrograms, LxcConfig\n"
        "try:\n"
        "    EndpointPrograms(LxcConfig(pin_dir=tempfile.mkdtemp())).load()\n"
        "    error = ''\n"
        "except datapath.DatapathError as e:\n"
        "    error = str(e)\n"
        "print(json.dumps({'paths': [datapath.DEFAULT_OBJECT, lxc.DEFAULT_OBJECT,\n"
        "    nodeport.DEFAULT_OBJECT, str(btf.DEFAULT_OBJECT)], 'error': error,\n"
        "    'checkout': objects.in_checkout()}))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "STATEWRIGHT_BPF_OBJECTS"}
    unset = json.loads(_run_env([str(python), "-c", probe], cwd, env).stdout)
    assert not unset["checkout"]
    assert all(p.startswith(str(env_dir)) for p in unset["paths"]), unset
    assert "not found (looked in" in unset["error"], unset
    assert "set $STATEWRIGHT_BPF_OBJECTS to the directory holding" in unset["error"], unset
    objects_dir = cwd / "bpf-objects"
    objects_dir.mkdir()
    configured = json.loads(_run_env(
        [str(python), "-c", probe], cwd, {**env, "STATEWRIGHT_BPF_OBJECTS": str(objects_dir)}
    ).stdout)
    assert configured["paths"] == [
        str(objects_dir / name) for name in ("sock_lb.o", "lxc.o", "nodeport.o", "maps.o")
    ]
    assert f"looked in {objects_dir}: $STATEWRIGHT_BPF_OBJECTS=" in configured["error"]


def _run_env(
    args: list[str], cwd: Path, env: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"{args} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc
