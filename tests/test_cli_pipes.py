"""Every ``statewright`` command ends quietly when its reader closes standard output early
(``statewright ... | head -1``), as Unix tools do: exit status 128 + SIGPIPE, no traceback.

The subprocess's stdout is a pipe whose read end is closed before it starts, so its first
write fails with EPIPE whatever the size of the output: deterministic, nothing timed.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from statewright.cli import EXIT_BROKEN_PIPE

REPO = Path(__file__).resolve().parents[1]


def run_with_closed_stdout(*argv: str, module: str = "statewright"
                           ) -> subprocess.CompletedProcess[str]:
    """Run ``python -m MODULE ARGV`` with a stdout nobody reads; return the finished process."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return subprocess.run(
            [sys.executable, "-m", module, *argv], stdout=write_end, stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL, text=True, cwd=REPO, timeout=120,
        )
    finally:
        os.close(write_end)


def assert_quiet_broken_pipe(res: subprocess.CompletedProcess[str],
                             codes: tuple[int, ...] = (EXIT_BROKEN_PIPE,)) -> None:
    """Exit 128 + SIGPIPE (or one of ``codes``) without a traceback or an 'Exception ignored'
    message."""
    assert res.returncode in codes, res
    for word in ("Traceback", "BrokenPipeError", "Exception ignored", "Errno 32"):
        assert word not in res.stderr, res.stderr


# argparse ignores an OSError writing the help and exits 0 (before the command runs); what
# remains to check is that nothing is printed afterwards.
HELP_CODES = (0, EXIT_BROKEN_PIPE)


def test_help_to_a_closed_pipe_exits_quietly() -> None:
    assert_quiet_broken_pipe(run_with_closed_stdout("--help"), HELP_CODES)
    assert_quiet_broken_pipe(run_with_closed_stdout("agent", "--help"), HELP_CODES)


def test_a_command_writing_to_a_closed_pipe_exits_quietly() -> None:
    # The statedb + reconciler demo prints tables and maps on memory maps: no agent needed.
    assert_quiet_broken_pipe(run_with_closed_stdout("run", "--backend", "memory"))


def test_the_standalone_command_modules_exit_quietly_too() -> None:
    for group in ("bpf", "lb"):
        module = f"statewright.cli.{group}_commands"
        res = run_with_closed_stdout(group, "--help", module=module)
        assert_quiet_broken_pipe(res, HELP_CODES)


@pytest.mark.kernel
def test_a_standalone_command_module_writing_to_a_closed_pipe_exits_quietly() -> None:
    # `bpf maps` on an empty pin directory prints its header line.
    pin_dir = f"/sys/fs/bpf/swtest-pipes-{os.getpid()}"
    os.mkdir(pin_dir)
    try:
        res = run_with_closed_stdout("bpf", "maps", "--pin-dir", pin_dir,
                                     module="statewright.cli.bpf_commands")
    finally:
        os.rmdir(pin_dir)
    assert_quiet_broken_pipe(res)


def test_an_open_stdout_still_gets_everything() -> None:
    res = subprocess.run([sys.executable, "-m", "statewright", "run", "--backend", "memory"],
                         capture_output=True, text=True, cwd=REPO, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "level=OK message=OK, 2 object(s)" in res.stdout


def test_the_cni_plugin_exits_quietly_too() -> None:
    # No CNI_COMMAND: the plugin answers with its error JSON on the closed stdout.
    assert_quiet_broken_pipe(run_with_closed_stdout(module="statewright.cni"))
