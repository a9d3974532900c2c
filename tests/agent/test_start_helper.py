"""The tests' agent start (conftest.start_agent) fails with what a loaded CI machine's
reader needs: how long it waited, the CPU time the agent had used by then (a starved
start and a stuck one look alike otherwise) and the agent's log."""

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
    assert "did not answer within 1.0 s" in msg, msg
    assert re.search(r"having used \d+\.\d\d s of CPU", msg), msg
    assert "sleeping before the agent" in msg, msg
