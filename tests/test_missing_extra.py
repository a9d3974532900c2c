"""``statewright`` installed without the ``agent`` extra names what to install instead of
crashing with a ModuleNotFoundError traceback (tests/test_install.py checks the installed
console script; this runs the same entry point with an agent dependency hidden)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from statewright.missing_extra import AGENT_EXTRA_MODULES, EXIT_MISSING_EXTRA

HIDE_AND_RUN = (
    "import sys\n"
    "sys.modules[{module!r}] = None  # import of it raises ModuleNotFoundError\n"
    "from statewright.cli import main\n"
    "raise SystemExit(main(['--help']))\n"
)


def test_console_entry_point_names_the_extra() -> None:
    res = subprocess.run([sys.executable, "-c", HIDE_AND_RUN.format(module="yaml")],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == EXIT_MISSING_EXTRA, res.stderr
    assert "Traceback" not in res.stderr
    assert "pip install 'statewright[agent]'" in res.stderr
    assert "'yaml'" in res.stderr


def test_a_command_importing_a_missing_dependency_names_the_extra(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Some dependencies (pyroute2, uvicorn...) are imported by a command on first use."""
    import argparse

    from statewright.cli import run

    def needs_pyroute2(args: argparse.Namespace) -> int:
        raise ModuleNotFoundError("No module named 'pyroute2'", name="pyroute2")

    parser = argparse.ArgumentParser()
    parser.set_defaults(func=needs_pyroute2)
    with pytest.raises(SystemExit) as info:
        run(parser, [])
    assert info.value.code == EXIT_MISSING_EXTRA
    assert "'pyroute2' is not installed" in capsys.readouterr().err


def test_a_missing_module_of_the_project_itself_is_not_hidden() -> None:
    from statewright.missing_extra import exit_for_missing_extra

    err = ModuleNotFoundError("No module named 'tables.nope'", name="tables.nope")
    with pytest.raises(ModuleNotFoundError):
        exit_for_missing_extra(err)
    assert "tables" not in AGENT_EXTRA_MODULES
