"""The ct component through a running agent (memory maps): routes, GC loop, CLI."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.agent.conftest import cli_json, run_cli, running_agent, wait_for


def test_ct_routes_gc_and_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with running_agent(tmp_path, "--conntrack-gc-interval", "0.1",
                       "--bpf-ct-global-max", "1024") as agent:
        client = agent.client
        assert client.get("/ct") == {"entries": []}
        stats = wait_for(lambda: (s := client.get("/ct/stats"))["gc"]["gc_runs"] >= 2 and s,
                         what="two GC runs")
        assert stats["gc"]["entries"] == {"ct4_global": 0, "ct6_global": 0}
        assert stats["drops"] == []
        health = {h["name"]: h for h in client.get("/health")["components"]}
        assert "maps of 1024 entries" in health["ct"]["message"]
        sock = ["--socket", agent.socket]
        assert cli_json(capsys, "ct", "list", *sock) == {"entries": []}
        assert cli_json(capsys, "ct", "flush", *sock) == {"removed": 0}
        code, out, _ = run_cli(capsys, "ct", "flush", *sock)
        assert (code, out) == (0, "flushed 0 entries\n")
        code, out, _ = run_cli(capsys, "ct", "stats", *sock)
        assert code == 0 and out.startswith("GC: ") and "REASON" in out
        code, _, err = run_cli(capsys, "ct", "list", "--limit", "-1", *sock)
        assert code == 2 and "--limit" in err
        maps = {m["name"] for m in client.get("/bpf/maps")}
        assert {"ct4_global", "ct6_global", "metrics"} <= maps


def test_ct_cli_without_agent(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sock = ["--socket", str(tmp_path / "none.sock")]
    for cmd in ("list", "flush", "stats"):
        code, _, err = run_cli(capsys, "ct", cmd, *sock)
        assert code == 2 and "no agent is running" in err


def test_ct_metrics_are_exported(tmp_path: Path) -> None:
    import socket
    import urllib.request

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with running_agent(tmp_path, "--metrics-port", str(port),
                       "--conntrack-gc-interval", "0.1") as agent:
        wait_for(lambda: agent.client.get("/ct/stats")["gc"]["gc_runs"] >= 1, what="a GC run")
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
        assert b"statewright_ct_gc_runs_total" in text
        assert b'statewright_ct_entries{map="ct4_global"} 0.0' in text
