"""The command line and the ``make run`` demo: they start, name their backend, and converge."""

from __future__ import annotations

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
