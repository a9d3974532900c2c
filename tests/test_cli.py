"""The command line and the ``make run`` demo: they start, name their backend, and converge."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from statewright import cli, demo


def test_demo_converges_on_memory_maps(capsys: pytest.CaptureFixture[str]) -> None:
    assert demo.main("memory") == 0
    out = capsys.readouterr().out
    assert "using memory BPF maps" in out
    assert "level=OK message=OK, 2 object(s)" in out
    final_map = out.split("prunes what no row explains:")[1]
    assert "10.0.9.9" not in final_map and "10.0.0.2" not in final_map


@pytest.mark.kernel
def test_demo_converges_on_kernel_maps(capsys: pytest.CaptureFixture[str]) -> None:
    assert demo.main("kernel") == 0
    out = capsys.readouterr().out
    assert "using kernel BPF maps" in out
    assert "level=OK message=OK, 2 object(s)" in out


def test_cli_lists_command_groups(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "run" in out and "bpf" in out


def test_help_names_the_agent_as_the_main_job_and_run_as_the_small_demo(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(["--help"])
    assert exc.value.code == 0
    out = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    assert "The main job is `statewright agent`" in out
    assert "run small demo" in out and "(not the agent)" in out
    assert "agent the main job" in out
    assert "currently the demo" not in out


def test_every_command_is_registered_with_its_path() -> None:
    from statewright.cli import agent_commands, bpf_commands, lb_commands, run_commands

    parser, commands = cli.build_commands()
    assert set(commands) == {
        "run", "bpf maps", "bpf dump", "lb maps-dump", "lb list",
        "agent", "status", "db show", "db list", "db watch", "exec",
        "endpoint list", "endpoint get", "ipam", "policy get", "policy trace", "policy wait",
        "api openapi",
        "ct list", "ct flush", "ct stats", "nodeport",
        "explain", "plan", "monitor",
        "operator",
    }
    assert commands["run"].get_default("func") is run_commands.cmd_run
    # agent_commands extended the parsers lb_commands and bpf_commands registered: the agent
    # first, the pinned maps as the fallback.
    assert commands["lb list"].get_default("func") is agent_commands.cmd_lb_list
    assert commands["lb list"].get_default("pinned_func") is lb_commands.cmd_list
    assert commands["bpf dump"].get_default("func") is agent_commands.cmd_bpf_dump
    assert commands["bpf dump"].get_default("pinned_func") is bpf_commands.cmd_dump
    args = parser.parse_args(["lb", "list", "--socket", "/x.sock", "-o", "json"])
    assert (args.func, args.pinned_func, args.socket) == (
        agent_commands.cmd_lb_list, lb_commands.cmd_list, "/x.sock")
    args = parser.parse_args(["bpf", "maps"])
    assert args.func is bpf_commands.cmd_maps and not hasattr(args, "socket")


def test_agent_commands_refuse_to_extend_commands_not_registered() -> None:
    import argparse

    from statewright.cli import agent_commands

    sub = argparse.ArgumentParser().add_subparsers()
    with pytest.raises(RuntimeError, match="extends `lb list`, which is not registered"):
        agent_commands.add_commands(sub, {})


def test_the_cli_uses_no_private_argparse_attributes() -> None:
    import inspect

    from statewright.cli import agent_commands, bpf_commands, lb_commands, run_commands

    for module in (cli, agent_commands, bpf_commands, lb_commands, run_commands):
        source = inspect.getsource(module)
        assert "._actions" not in source and "_SubParsersAction" not in source, module


def test_a_command_module_that_cannot_be_imported_fails_the_cli(tmp_path: Path) -> None:
    # As if statewright/cli/lb_commands.py were missing: importing it raises ImportError.
    code = (
        "import sys; sys.modules['statewright.cli.lb_commands'] = None\n"
        "from statewright import cli\n"
        "raise SystemExit(cli.main(['--help']))\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=tmp_path, timeout=60)
    assert res.returncode == 1, res
    assert "ModuleNotFoundError: import of statewright.cli.lb_commands" in res.stderr
    assert res.stdout == ""


def test_status_help_states_its_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    from statewright.cli import main

    with pytest.raises(SystemExit):
        main(["status", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "exit codes: 0 the agent is OK, 1 it is Degraded" in out
    assert "2 no agent answers" in out


def test_lb_list_help_explains_non_routable_and_wildcards(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from statewright.cli import main

    with pytest.raises(SystemExit):
        main(["lb", "list", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "'non-routable':" in out and "id 0 is a wildcard entry" in out


def test_the_agent_banner_names_a_command_that_works() -> None:
    """``make run`` printed ``statewright status``, but only ``.venv/bin/statewright`` was
    there: the banner names the script beside the interpreter unless PATH has it."""
    import os
    import shutil
    import sys

    from statewright.cli.agent_commands import cli_command

    cmd = cli_command()
    script = os.path.join(os.path.dirname(sys.executable), "statewright")
    if cmd == "statewright":
        found = shutil.which("statewright")
        assert found is not None and os.path.samefile(found, script)
    else:
        assert os.path.samefile(cmd.split(" -m ")[0] if " -m " in cmd else cmd,
                                sys.executable if " -m " in cmd else script)


def test_exec_can_target_a_pods_namespace(monkeypatch: pytest.MonkeyPatch) -> None:
    import argparse

    from statewright.cli import agent_commands

    def args(**kw: object) -> argparse.Namespace:
        base: dict[str, object] = {"netns": None, "endpoint": None, "no_netns": False,
                                   "socket": None}
        return argparse.Namespace(**{**base, **kw})

    demo = {"netns": "statewright-demo"}
    wrap = agent_commands._in_netns
    assert wrap(args(), demo, ["id"]) == ["ip", "netns", "exec", "statewright-demo", "id"]
    assert wrap(args(no_netns=True), demo, ["id"]) == ["id"]
    assert wrap(args(netns="pod1"), demo, ["id"]) == ["ip", "netns", "exec", "pod1", "id"]
    assert wrap(args(netns="/var/run/netns/p"), {}, ["id"]) == [
        "nsenter", "--net=/var/run/netns/p", "--", "id"]

    class Client:
        def get(self, path: str) -> dict[str, str]:
            assert path == "/endpoint/7"
            return {"netns-path": "/var/run/netns/cni-1234"}

    monkeypatch.setattr(agent_commands, "client", lambda a: Client())
    assert wrap(args(endpoint="7"), demo, ["id"]) == [
        "nsenter", "--net=/var/run/netns/cni-1234", "--", "id"]


def test_bpf_maps_lists_the_datapaths_own_maps(tmp_path: Path) -> None:
    """``statewright bpf maps`` listed only the top of the pin directory and missed the
    socket LB's rev-NAT maps pinned under ``sock_lb/``."""
    from statewright.cli.bpf_commands import pinned_map_names

    (tmp_path / "lb4_services").write_text("")
    (tmp_path / "sock_lb" / "links" / "cg1").mkdir(parents=True)
    (tmp_path / "sock_lb" / "links" / "cg1" / "connect4").write_text("")
    for name in ("lb4_sock_revnat", "lb6_sock_revnat"):
        (tmp_path / "sock_lb" / name).write_text("")
    assert pinned_map_names(str(tmp_path)) == [
        "lb4_services", "sock_lb/lb4_sock_revnat", "sock_lb/lb6_sock_revnat"]
