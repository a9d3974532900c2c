"""`statewright explain` against a running agent (memory maps): a frontend entry back to
its Service's manifest file and line, a slot to the EndpointSlice, a service to all its
entries, and the errors people meet (an unknown map, a bad key, an absent entry)."""

from __future__ import annotations

import pytest

from tests.agent.conftest import AgentProc, cli_json, run_cli, service_yaml, wait_for


def _wait_programmed(agent: AgentProc, capsys: pytest.CaptureFixture[str], vip: str) -> None:
    def done() -> bool:
        recs = cli_json(capsys, "lb", "list", "--socket", agent.socket)
        return any(r["address"] == f"{vip}:80/TCP" and r["backends"] for r in recs)

    wait_for(done, what=f"{vip} in lb list")


def test_explain_follows_entries_to_manifest_lines(
    agent: AgentProc, capsys: pytest.CaptureFixture[str]
) -> None:
    path = agent.manifests / "svc-x.yaml"
    path.write_text("# a comment line first\n" + service_yaml("x", "10.96.201.1", ["10.244.8.1"]))
    _wait_programmed(agent, capsys, "10.96.201.1")
    out = cli_json(capsys, "explain", "lb4_services", "10.96.201.1:80/TCP",
                   "--socket", agent.socket)
    assert out["present"]
    svc = next(o for o in out["objects"] if o["kind"] == "Service")
    assert (svc["namespace"], svc["name"]) == ("test", "x")
    assert svc["file"] == str(path) and svc["line"] == 2
    fe = out["rows"][0]
    assert fe["table"] == "frontends" and fe["status"] == "Done" and fe["revision"] > 0

    out = cli_json(capsys, "explain", "lb4_services", "10.96.201.1:80/TCP", "SLOT=1",
                   "--socket", agent.socket)
    sl = next(o for o in out["objects"] if o["kind"] == "EndpointSlice")
    assert sl["name"] == "x-1" and sl["line"] == 9
    assert [r["table"] for r in out["rows"]] == ["frontends", "services", "backends"]

    listed = cli_json(capsys, "explain", "service", "test/x", "--socket", agent.socket)
    maps = sorted({e["map"] for e in listed["entries"]})
    assert maps == ["lb4_backends", "lb4_reverse_nat", "lb4_services"]
    assert listed["object"][0]["file"] == str(path)
    # Each listed entry explains back to the service.
    for e in listed["entries"]:
        key = " ".join(f"{k}={v}" for k, v in e["key"].items()) if isinstance(
            e["key"], dict) else str(e["key"])
        back = cli_json(capsys, "explain", e["map"], key, "--socket", agent.socket)
        assert any(o["kind"] == "Service" and o["name"] == "x" for o in back["objects"]), e

    code, text, _ = run_cli(capsys, "explain", "lb4_services", "10.96.201.1:80/TCP",
                            "--socket", agent.socket)
    assert code == 0 and "frontends" in text and f"{path}:2" in text
    path.unlink()


def test_explain_errors(agent: AgentProc, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(capsys, "explain", "nosuch_map", "1", "--socket", agent.socket)
    assert code == 1 and "explain reads the maps" in err
    code, _, err = run_cli(capsys, "explain", "lb4_services", "garbage",
                           "--socket", agent.socket)
    assert code == 1 and "ADDR:PORT/PROTO" in err
    code, out, _ = run_cli(capsys, "explain", "lb4_services", "10.96.250.250:80/TCP",
                           "--socket", agent.socket)
    assert code == 1 and "not in the map" in out
    code, out, _ = run_cli(capsys, "explain", "service", "test/none", "--socket", agent.socket)
    assert code == 1 and "no map entries" in out
    code, _, err = run_cli(capsys, "explain", "service", "nonamespace", "--socket", agent.socket)
    assert code == 1 and "NAMESPACE/NAME" in err


def test_explain_follows_a_nodeport_entry_to_its_service_line(
    agent: AgentProc, capsys: pytest.CaptureFixture[str]
) -> None:
    path = agent.manifests / "svc-np.yaml"
    path.write_text(
        "apiVersion: v1\nkind: Service\nmetadata: {name: np, namespace: test}\n"
        "spec:\n  type: NodePort\n  clusterIP: 10.96.202.1\n"
        "  ports: [{name: http, port: 80, protocol: TCP, nodePort: 30999}]\n")

    def present() -> dict[str, object] | None:
        out = cli_json(capsys, "explain", "lb4_services", "0.0.0.0:30999/TCP",
                       "--socket", agent.socket)
        return out if out["present"] else None

    out = wait_for(present, what="the NodePort entry")
    svc = next(o for o in out["objects"] if o["kind"] == "Service")
    assert (svc["name"], svc["file"], svc["line"]) == ("np", str(path), 1)
    assert out["rows"][0]["type"] == "NodePort"
    path.unlink()


def test_explain_ipcache_and_runtime_maps(
    agent: AgentProc, capsys: pytest.CaptureFixture[str]
) -> None:
    """The world's ipcache entry has no source object (a note says what it is); a NAT
    map's entry is runtime state, said so with status 0; a node without entries is 1."""
    def world() -> bool:
        out = cli_json(capsys, "explain", "ipcache", "0.0.0.0/0", "--socket", agent.socket)
        return bool(out["present"])

    wait_for(world, what="the world's ipcache entry")
    out = cli_json(capsys, "explain", "ipcache", "0.0.0.0/0", "--socket", agent.socket)
    assert out["rows"][0]["table"] == "ipcache" and out["rows"][0]["owner"] == "world"
    assert out["objects"] == [] and "world identity" in out["notes"][0]
    code, text, _ = run_cli(capsys, "explain", "nodeport_nat4", "01 02", "--socket",
                            agent.socket)
    assert code == 0 and "runtime state" in text and "NAT" in text
    code, text, _ = run_cli(capsys, "explain", "node", "no-such-node", "--socket",
                            agent.socket)
    assert code == 1 and "no map entries" in text
