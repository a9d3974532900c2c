"""Client commands of a running agent end quietly when their reader closes standard output
(``statewright db watch frontends | head -c 300``, ``status | head -1``,
``bpf dump MAP -o json | head``); see tests/test_cli_pipes.py for how the pipe is closed."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.agent.conftest import AgentProc, cli_json, service_yaml, wait_for
from tests.test_cli_pipes import assert_quiet_broken_pipe, run_with_closed_stdout


@pytest.fixture(scope="module")
def agent_with_service(agent: AgentProc) -> Iterator[AgentProc]:
    """The module's agent with one service in its tables and maps."""
    path = agent.manifests / "svc-pipes.yaml"
    path.write_text(service_yaml("pipes", "10.96.203.1", ["10.244.9.3", "10.244.9.4"]))
    try:
        yield agent
    finally:
        path.unlink()


def test_client_commands_writing_to_a_closed_pipe_exit_quietly(
    agent_with_service: AgentProc, capsys: pytest.CaptureFixture[str]
) -> None:
    agent = agent_with_service
    wait_for(lambda: any(r["address"].startswith("10.96.203.1:")
                         for r in cli_json(capsys, "lb", "list", "--socket", agent.socket)),
             what="the service in lb list")
    sock = ("--socket", agent.socket)
    for argv in (
        ("db", "watch", "frontends", *sock),  # follows forever unless the write fails
        ("status", *sock),
        ("db", "show", "frontends", *sock),
        ("lb", "list", *sock, "-o", "json"),
        ("bpf", "dump", "lb4_services", "--pin-dir", agent.pin_dir, *sock, "-o", "json"),
    ):
        res = run_with_closed_stdout(*argv)
        assert_quiet_broken_pipe(res)
