"""The tests' agent start (conftest.start_agent) fails with what a loaded CI machine's
reader needs: how long it waited, how much of that the agent waited for a CPU, the CPU
time it had used (a starved start and a stuck one look alike otherwise) and its log."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.agent.conftest import start_agent


def test_a_start_that_does_not_answer_names_the_wait_and_the_cpu_used(tmp_path: Path) -> None:
    # The agent never gets to run: the process in front of it (stopped by its PID as the
    # agent would be) sleeps past the deadline.
    prefix = ["sh", "-c", 'echo "sleeping before the agent"; exec sleep 30', "sh"]
    args = ["--backend", "memory", "--pin-dir", str(tmp_path / "pins"), "--no-netlink"]
    with pytest.raises(RuntimeError) as info:
        start_agent(args, str(tmp_path / "agent.sock"), tmp_path / "agent.log", timeout=1.0,
                    prefix=prefix)
    msg = str(info.value)
    assert "did not answer within 1.0 s of its own time" in msg, msg
    assert re.search(r"\d+\.\d s of wall time, \d+\.\d s of which it waited for a CPU", msg), msg
    assert re.search(r"\d+\.\d\d s of CPU used", msg), msg
    assert "sleeping before the agent" in msg, msg
