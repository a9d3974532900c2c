"""The child `count_frozen_garbage` forks does not outlive its parent: it holds every
descriptor of the parent (an agent's pin- and state-directory locks, its API socket), so
a child left counting after its agent was killed (SIGKILL) kept the restarted agent out.

A process whose child's collection is made slow (a minute) is killed while the child
counts; the child must be gone well before its collection would have ended."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: Prints the parent's pid, then counts with a child whose full collection takes a minute.
SCRIPT = """
import gc, sys, time
from statedb import gc_tuning

gc.collect = lambda *a: time.sleep(60)  # what the forked child runs
print("counting", flush=True)
gc_tuning.count_frozen_garbage(timeout=120)
"""


def _children(pid: int) -> list[int]:
    out: list[int] = []
    for task in os.listdir(f"/proc/{pid}/task"):
        text = Path(f"/proc/{pid}/task/{task}/children").read_text()
        out += [int(c) for c in text.split()]
    return out


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_the_counting_child_ends_with_its_parent() -> None:
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT], cwd=ROOT, stdout=subprocess.PIPE,
                            text=True)
    child = 0
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "counting\n"
        deadline = time.monotonic() + 30
        while not (kids := _children(proc.pid)):
            assert time.monotonic() < deadline, "no counting child"
            time.sleep(0.01)
        child = kids[0]
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        deadline = time.monotonic() + 30  # a bound on waiting, well under the minute
        while os.path.exists(f"/proc/{child}") and _state(child) != "Z":
            assert time.monotonic() < deadline, f"child {child} outlived its parent"
            time.sleep(0.05)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if child and os.path.exists(f"/proc/{child}") and _state(child) != "Z":
            os.kill(child, signal.SIGKILL)


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"
