"""The agent on memory maps: health, tables, change feed, LB list, manifest changes, errors,
client commands (-o json) and the API's own error handling."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.agent.conftest import (
    REPO,
    AgentProc,
    cli_json,
    run_cli,
    service_yaml,
    wait_for,
)


def _frontend(records: list[dict[str, object]], address: str) -> dict[str, object] | None:
    return next((r for r in records if r["address"] == address), None)


def test_status_reports_every_component(agent: AgentProc, capsys: pytest.CaptureFixture[str]
                                        ) -> None:
    doc = cli_json(capsys, "status", "--socket", agent.socket)
    assert doc["health"]["state"] == "OK", doc
    states = {c["name"]: c["state"] for c in doc["health"]["components"]}
    assert states["statedb"] == "OK" and states["reconciler"] == "OK"
    assert states["manifests"] == "OK" and states["maps"] == "OK"
    assert states["netlink"] == "Disabled"
    assert states["datapath"] == "Disabled"  # memory maps: says why
    assert "needs kernel maps" in next(
        c["message"] for c in doc["health"]["components"] if c["name"] == "datapath"
    )
    assert doc["agent"]["pid"] == agent.proc.pid
    assert doc["agent"]["maps"]["kind"] == "memory"
    code, out, _ = run_cli(capsys, "status", "--socket", agent.socket)
    assert code == 0 and "Agent:    OK" in out and "reconciler" in out


def test_db_list_and_show(agent: AgentProc, capsys: pytest.CaptureFixture[str]) -> None:
    tables = cli_json(capsys, "db", "list", "--socket", agent.socket)
    names = {t["name"]: t for t in tables}
    assert {"services", "frontends", "backends", "node-addresses"} <= set(names)
    assert all(t["initialized"] for t in tables)
    rows = cli_json(capsys, "db", "show", "services", "--socket", agent.socket)
    assert isinstance(rows, list)
    code, out, _ = run_cli(capsys, "db", "show", "frontends", "--socket", agent.socket)
    assert code == 0 and out.startswith("Address")
    code, _, err = run_cli(capsys, "db", "show", "nosuch", "--socket", agent.socket)
    assert code == 1 and "no table 'nosuch'" in err and "frontends" in err


def test_manifest_changes_flow_to_lb_list(agent: AgentProc, capsys: pytest.CaptureFixture[str]
                                          ) -> None:
    path = agent.manifests / "svc-a.yaml"
    path.write_text(service_yaml("a", "10.96.200.1", ["10.244.9.1", "10.244.9.2"]))

    def frontend() -> dict[str, object] | None:
        recs = cli_json(capsys, "lb", "list", "--socket", agent.socket)
        return _frontend(recs, "10.96.200.1:80/TCP")

    fe = wait_for(frontend, what="the new frontend in lb list")
    svc_id = fe["id"]
    assert sorted(b["address"] for b in fe["backends"]) == [
        "10.244.9.1:8080/TCP", "10.244.9.2:8080/TCP"]
    # Scale down to one backend: same service id, one backend.
    path.write_text(service_yaml("a", "10.96.200.1", ["10.244.9.2"]))
    fe = wait_for(lambda: (f := frontend()) and len(f["backends"]) == 1 and f,
                  what="one backend left")
    assert fe["id"] == svc_id
    # Table output for people.
    code, out, _ = run_cli(capsys, "lb", "list", "--socket", agent.socket)
    assert code == 0 and "10.96.200.1:80/TCP" in out
    path.unlink()
    wait_for(lambda: frontend() is None, what="the frontend to disappear")


def test_bad_manifest_degrades_health_until_fixed(
    agent: AgentProc, capsys: pytest.CaptureFixture[str]
) -> None:
    path = agent.manifests / "broken.yaml"
    path.write_text("kind: Service\nmetadata: [oops\n")
    try:
        doc = wait_for(
            lambda: (d := cli_json(capsys, "status", "--socket", agent.socket))["health"][
                "state"] == "Degraded" and d,
            what="Degraded",
        )
        msg = next(c["message"] for c in doc["health"]["components"] if c["name"] == "manifests")
        assert "broken.yaml" in msg
        code, _, _ = run_cli(capsys, "status", "--socket", agent.socket)
        assert code == 1
    finally:
        path.unlink()
    wait_for(lambda: cli_json(capsys, "status", "--socket", agent.socket)["health"]["state"]
             == "OK", what="OK again")


def _raw_get(sock_path: str, target: str, method: str = "GET", timeout: float = 10.0
             ) -> tuple[int, bytes, socket.socket]:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    s.connect(sock_path)
    s.sendall(f"{method} {target} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = s.recv(4096)
        if not chunk:
            break
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    status = int(head.split()[1])
    return status, rest, s


def _dechunk(body: bytes) -> bytes:
    """The data of a chunked HTTP/1.1 body (as much of it as ``body`` holds)."""
    out = b""
    while body:
        size_line, sep, rest = body.partition(b"\r\n")
        if not sep:
            break
        size = int(size_line.split(b";")[0], 16)
        if size == 0:
            break
        out += rest[:size]
        body = rest[size + 2:]
    return out


def test_change_feed_streams_new_rows(agent: AgentProc) -> None:
    status, rest, s = _raw_get(agent.socket, "/tables/frontends/changes")
    try:
        assert status == 200
        buf = rest
        path = agent.manifests / "svc-feed.yaml"
        path.write_text(service_yaml("feed", "10.96.201.1", ["10.244.9.9"]))
        try:
            while b'"AddrCluster": "10.96.201.1"' not in buf:
                chunk = s.recv(65536)
                assert chunk, "feed ended"
                buf += chunk
        finally:
            path.unlink()
        lines = [json.loads(x) for x in _dechunk(buf).decode().splitlines() if x.strip()]
        assert all({"revision", "deleted", "object"} <= set(d) for d in lines)
        assert any(not d["deleted"] and "10.96.201.1" in json.dumps(d["object"]) for d in lines)
    finally:
        s.close()
    # follow=0: the current rows, then the end of the response.
    status, rest, s = _raw_get(agent.socket, "/tables/services/changes?follow=0")
    with s:
        while chunk := s.recv(65536):
            rest += chunk
    assert status == 200
    assert all(json.loads(x)["deleted"] is False for x in _dechunk(rest).decode().splitlines())


def test_api_maps_and_errors(agent: AgentProc) -> None:
    maps = agent.client.get("/bpf/maps")
    names = {m["name"] for m in maps}
    assert {"lb4_services", "lb4_backends", "lb4_maglev"} <= names
    entries = agent.client.get("/bpf/maps/lb4_services")
    assert entries["name"] == "lb4_services" and isinstance(entries["entries"], list)
    assert agent.client.get("/bpf/maps/lb4_maglev")["entries"] == []
    status, _, s = _raw_get(agent.socket, "/nope")
    s.close()
    assert status == 404
    status, _, s = _raw_get(agent.socket, "/health", method="POST")
    s.close()
    assert status == 405
    status, _, s = _raw_get(agent.socket, "/bpf/maps/nosuch")
    s.close()
    assert status == 404


def test_exec_runs_the_command_and_says_when_nothing_translates(agent: AgentProc) -> None:
    res = subprocess.run(
        [sys.executable, "-m", "statewright", "exec", "--socket", agent.socket, "--",
         sys.executable, "-c", "print('hello from exec')"],
        capture_output=True, text=True, timeout=30, cwd=REPO,
    )
    assert res.returncode == 0, res.stderr
    assert "hello from exec" in res.stdout
    assert "datapath is not attached" in res.stderr


def test_clients_say_when_no_agent_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                        ) -> None:
    sock = str(tmp_path / "none.sock")
    for argv in (["status"], ["db", "show", "frontends"], ["db", "list"],
                 ["exec", "--", "true"]):
        code, _, err = run_cli(capsys, *argv[:1], *(argv[1:2] if argv[0] == "db" else []),
                               "--socket", sock, *argv[(2 if argv[0] == "db" else 1):])
        assert code == 2, (argv, err)
        assert "no agent is running" in err and sock in err


def test_bpf_dump_reads_memory_maps_through_the_agent(
    agent: AgentProc, capsys: pytest.CaptureFixture[str]
) -> None:
    path = agent.manifests / "svc-dump.yaml"
    path.write_text(service_yaml("dump", "10.96.202.1", ["10.244.9.7"]))
    try:
        entries = wait_for(
            lambda: cli_json(capsys, "bpf", "dump", "lb4_backends", "--pin-dir", agent.pin_dir,
                             "--socket", agent.socket),
            what="backend entries via the agent",
        )
        assert any("10.244.9.7" in json.dumps(e["value"]) for e in entries), entries
        code, out, _ = run_cli(capsys, "bpf", "dump", "lb4_backends", "--pin-dir", agent.pin_dir,
                               "--socket", agent.socket)
        assert code == 0 and out.startswith("KEY")
    finally:
        path.unlink()


def test_exec_refuses_a_cgroup_directory_that_is_not_a_cgroup(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An agent given a --cgroup outside the cgroup2 mount reports its datapath Degraded;
    ``exec`` then fails naming the directory instead of creating a cgroup.procs file in
    it (and running the command outside any cgroup of the agent's)."""
    from statewright.cli import agent_commands

    not_a_cgroup = tmp_path / "cg"
    not_a_cgroup.mkdir()
    info = {"datapath": {"state": "Degraded", "reason": "not under the cgroup2 mount",
                         "cgroup": str(not_a_cgroup)}, "netns": ""}

    class FakeClient:
        def get(self, path: str) -> object:
            assert path == "/agent"
            return info

    monkeypatch.setattr(agent_commands, "client", lambda args: FakeClient())
    code, _, err = run_cli(capsys, "exec", "--", "true")
    assert code == 1
    assert f"cannot join cgroup {not_a_cgroup}" in err and "No such file" in err
    assert list(not_a_cgroup.iterdir()) == []
