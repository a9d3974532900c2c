"""The child `count_frozen_garbage` forks does not outlive its parent: it holds every
descriptor of the parent (an agent's pin- and state-directory locks, its API socket), so
a child left counting after its agent was killed (SIGKILL) kept the restarted agent out.
And it runs only on CPU time nobody else wants (``SCHED_IDLE``): at the agent's own
priority, on a core reserved for the agent, it took half of it from the event loop.

A process whose child's collection is made slow (a minute) is killed while the child
counts; the child must be gone well before its collection would have ended."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.procs import children

ROOT = Path(__file__).resolve().parents[2]

#: Prints the parent's pid, then counts with a child whose full collection takes a minute.
SCRIPT = """
import gc, sys, time
from statedb import gc_tuning

gc.collect = lambda *a: time.sleep(60)  # what the forked child runs
print("counting", flush=True)
gc_tuning.count_frozen_garbage(timeout=120)
"""


@contextmanager
def _slow_counting_child() -> Iterator[tuple[subprocess.Popen[str], int]]:
    """A process counting with a child whose collection takes a minute: (it, the child);
    both are gone afterwards."""
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT], cwd=ROOT, stdout=subprocess.PIPE,
                            text=True)
    child = 0
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "counting\n"
        deadline = time.monotonic() + 30
        while not (kids := children(proc.pid)):
            assert time.monotonic() < deadline, "no counting child"
            time.sleep(0.01)
        child = kids[0]
        yield proc, child
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if child and os.path.exists(f"/proc/{child}") and _state(child) != "Z":
            os.kill(child, signal.SIGKILL)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_the_counting_child_ends_with_its_parent() -> None:
    with _slow_counting_child() as (proc, child):
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        deadline = time.monotonic() + 30  # a bound on waiting, well under the minute
        while os.path.exists(f"/proc/{child}") and _state(child) != "Z":
            assert time.monotonic() < deadline, f"child {child} outlived its parent"
            time.sleep(0.05)


@pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="SCHED_IDLE is Linux's")
def test_the_counting_child_runs_only_when_the_cpu_is_idle() -> None:
    with _slow_counting_child() as (_, child):
        deadline = time.monotonic() + 30
        while _policy(child) != os.SCHED_IDLE:
            assert time.monotonic() < deadline, f"child {child}: policy {_policy(child)}"
            time.sleep(0.01)


def _policy(pid: int) -> int:
    """The scheduling policy of ``pid`` (/proc/PID/stat, field 41)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[38])  # field 41 of the line: the fields after the name start at 3


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


#: A child whose collection takes a minute, counted with a 0.5 s timeout.
TIMEOUT_SCRIPT = """
import gc, time
from statedb import gc_tuning

gc.collect = lambda *a: time.sleep(60)  # what the forked child runs
try:
    gc_tuning.count_frozen_garbage(timeout=0.5)
except gc_tuning.CountTimedOut as e:
    print("timed out:", e)
"""


def test_a_count_over_its_timeout_is_killed_and_says_so() -> None:
    out = subprocess.run([sys.executable, "-c", TIMEOUT_SCRIPT], cwd=ROOT, capture_output=True,
                         text=True, timeout=30)
    assert out.stdout.startswith("timed out: gc: the cyclic-garbage count took over"), out

