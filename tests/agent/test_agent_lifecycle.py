"""Agent configuration, shutdown on signals, restart on pinned kernel maps (ids kept, stale
entries pruned after the sources are in, datapath links adopted) and --cleanup."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from statewright.agent import config
from tests.agent.conftest import (
    REPO,
    cli_json,
    run_cli,
    running_agent,
    service_yaml,
    start_agent,
    state_dir_of,
    stop_agent,
    wait_for,
)
from tests.datapath.conftest import _remove_cgroup

# ----- configuration --------------------------------------------------------------------------


def test_config_file_then_overrides(tmp_path: Path) -> None:
    f = tmp_path / "agent.yaml"
    f.write_text(
        "backend: memory\nmanifests: [m1, /abs/m2]\nmetrics-port: 9999\nlb_flags: [--x=1]\n"
        "node-addresses: {devices: [eth0], nodeport-cidrs: 10.0.0.0/8}\napi-socket-mode: '0600'\n"
    )
    cfg = config.load(str(f), {"metrics_port": 0, "node_name": None, "netlink": False})
    assert cfg.backend == "memory"
    assert cfg.manifests == (str(tmp_path / "m1"), "/abs/m2")
    assert cfg.metrics_port == 0  # the override wins
    assert cfg.netlink is False
    assert cfg.lb_flags == ("--x=1",)
    assert cfg.node_addresses.devices == ("eth0",)
    assert cfg.api_socket_mode == 0o600
    assert cfg.to_json()["backend"] == "memory"
    default = config.load()
    assert default.api_socket == "/run/statewright/agent.sock"
    assert default.api_socket_mode == 0o660 and default.metrics_port == 0
    assert default.metrics_address == "127.0.0.1" and default.cgroup == ""
    assert default.manifests[0].endswith("statewright/agent/example_manifests")


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("backnd: memory\n", "unknown field 'backnd'"),
        ("backend: fast\n", "backend: 'fast'"),
        ("metrics-port: 70000\n", "metrics-port"),
        ("netlink: maybe\n", "field netlink: expected true or false"),
        ("node-addresses: {devics: [x]}\n", "devics"),
        ("- a\n", "expected a mapping"),
        ("pod-cidrs: [bogus]\n", "pod-cidrs: ipam: pod CIDR 'bogus'"),
        ("pod-cidrs: [10.0.0.1/24]\n", "host bits set"),
        ("pod-cidrs: [10.0.0.0/16, 10.0.1.0/24]\n", "overlap"),
        ("k8s-in-cluster: true\nk8s-api-server: https://10.0.0.1:6443\n", "k8s-in-cluster"),
        ("k8s-in-cluster: true\nk8s-kubeconfig: /k\n", "k8s-in-cluster"),
        ("api-socket-mode: 999\n", "api-socket-mode"),
        ("state-dir: ''\n", "state-dir: must not be empty"),
        ("node-name: ''\n", "node-name: must not be empty"),
        ("k8s-qps: .nan\n", "k8s-qps"),
        ("manifests-interval: .inf\n", "manifests-interval"),
    ],
)
def test_config_errors_name_the_file_and_field(tmp_path: Path, text: str, needle: str) -> None:
    f = tmp_path / "bad.yaml"
    f.write_text(text)
    with pytest.raises(config.ConfigError) as exc:
        config.load(str(f))
    assert needle in str(exc.value) and "bad.yaml" in str(exc.value)


def test_nodeport_datapath_flag_overrides_the_file(tmp_path: Path) -> None:
    from statewright.cli import build_parser
    from statewright.cli.agent_commands import _overrides

    f = tmp_path / "a.yaml"
    f.write_text("nodeport-datapath: true\n")
    args = build_parser().parse_args(["agent", "--no-nodeport-datapath"])
    assert config.load(str(f), _overrides(args)).nodeport_datapath is False
    args = build_parser().parse_args(["agent"])
    assert config.load(str(f), _overrides(args)).nodeport_datapath is True


def test_agent_refuses_a_bad_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "bad.yaml"
    f.write_text("backend: fast\n")
    code, _, err = run_cli(capsys, "agent", "--config", str(f))
    assert code == 2 and "bad.yaml" in err


def test_agent_refuses_a_bad_pod_cidr_before_it_creates_anything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run_cli(
        capsys, "agent", "--backend", "memory", "--no-netlink", "--pin-dir", str(tmp_path / "p"),
        "--api-socket", str(tmp_path / "s.sock"), "--state-dir", str(tmp_path / "state"),
        "--pod-cidr", "10.0.0.1/24",
    )
    assert code == 2 and "pod-cidrs" in err and "10.0.0.1/24" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_agent_refuses_lb_flags_it_does_not_implement(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run_cli(
        capsys, "agent", "--backend", "memory", "--no-netlink", "--pin-dir", str(tmp_path / "p"),
        "--api-socket", str(tmp_path / "s.sock"), "--lb-flag=--bpf-lb-dsr-dispatch=geneve",
    )
    assert code != 0 and "not implemented" in err and "--bpf-lb-dsr-dispatch" in err


def test_agent_refuses_a_map_size_it_cannot_honour(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A map size out of range stops the start before anything is created, naming the
    flag (docs/bpf.md: sizes are 1..4294967295, 0 only for a group's own flag)."""
    code, _, err = run_cli(
        capsys, "agent", "--backend", "memory", "--no-netlink", "--pin-dir", str(tmp_path / "p"),
        "--api-socket", str(tmp_path / "s.sock"), "--lb-flag=--bpf-lb-map-max=0",
    )
    assert code != 0 and "--bpf-lb-map-max" in err and "below 1" in err
    assert not (tmp_path / "s.sock").exists()


def test_lb_state_file_feeds_the_agent(tmp_path: Path) -> None:
    """``--lb-flag=--lb-state-file=F``: the file's services reach the maps; a broken file
    turns the agent's health Degraded naming the file, and nothing else changes."""
    state = tmp_path / "state.yaml"
    svc, eps = service_yaml("st", "10.96.201.1", ["10.244.20.1"]).split("---\n")
    state.write_text("services:\n" + _indent_item(svc) + "endpoints:\n" + _indent_item(eps))
    with running_agent(
        tmp_path, f"--lb-flag=--lb-state-file={state}", "--lb-flag=--lb-state-file-interval=50ms"
    ) as agent:
        wait_for(lambda: "10.96.201.1:80/TCP" in json_text(agent.client.get("/lb/services")),
                 what="the state file's frontend")
        tmp = tmp_path / "next.yaml"
        tmp.write_text("services: [\n")
        tmp.replace(state)
        wait_for(lambda: agent.client.get("/health")["state"] == "Degraded", what="Degraded health")
        assert "state.yaml" in json_text(agent.client.get("/health"))
        assert "10.96.201.1:80/TCP" in json_text(agent.client.get("/lb/services"))


def _indent_item(doc: str) -> str:
    lines = doc.strip("\n").splitlines()
    return "".join(("  - " if i == 0 else "    ") + line + "\n" for i, line in enumerate(lines))


def json_text(obj: object) -> str:
    import json

    return json.dumps(obj)


# ----- signals ----------------------------------------------------------------------------------


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_stops_the_agent_cleanly(tmp_path: Path, sig: int) -> None:
    with running_agent(tmp_path) as agent:
        (agent.manifests / "a.yaml").write_text(service_yaml("a", "10.96.200.9", ["10.244.9.1"]))
        t0 = time.monotonic()
        assert stop_agent(agent.proc, sig) == 0
        assert time.monotonic() - t0 < 5
        log = agent.logs()
        assert "agent: stopping" in log and "agent: stopped (pinned maps" in log
        assert not os.path.exists(agent.socket)
        assert "Traceback" not in log


def test_second_agent_on_the_same_socket_is_refused(tmp_path: Path) -> None:
    with running_agent(tmp_path) as agent:
        res = subprocess.run(
            [sys.executable, "-m", "statewright", "agent", "--backend", "memory", "--no-netlink",
             "--pin-dir", str(tmp_path / "pins2"), "--api-socket", agent.socket,
             "--manifests", str(agent.manifests), "--state-dir", str(tmp_path / "state2")],
            capture_output=True, text=True, timeout=30, cwd=REPO,
        )
        assert res.returncode == 1
        assert "another agent is already listening" in res.stderr
        assert agent.proc.poll() is None  # the first one keeps running
        agent.client.get("/health")


def test_second_agent_on_the_same_state_dir_is_refused_before_it_starts(
    tmp_path: Path,
) -> None:
    """Two agents on one state directory (other sockets, other pin dirs) would hand out the
    same addresses and overwrite each other's state: the second one exits before any
    component starts, naming the directory's lock and the first agent's pid."""
    with running_agent(tmp_path) as agent:
        state = state_dir_of(agent.socket)
        other = tmp_path / "other"
        other.mkdir()
        res = subprocess.run(
            [sys.executable, "-m", "statewright", "agent", "--backend", "memory", "--no-netlink",
             "--pin-dir", str(other / "pins"), "--api-socket", str(other / "agent.sock"),
             "--manifests", str(agent.manifests), "--state-dir", state],
            capture_output=True, text=True, timeout=30, cwd=REPO,
        )
        assert res.returncode == 1, res.stderr
        assert f"{state}/agent.lock" in res.stderr
        assert f"in use by another agent (pid {agent.proc.pid})" in res.stderr
        assert list(other.iterdir()) == []  # no socket, no pins: nothing started
        assert agent.client.get("/health")["pid"] == agent.proc.pid  # the first one runs on


@pytest.mark.kernel
def test_second_agent_on_the_same_pin_dir_is_refused_and_a_killed_ones_lock_is_not_stale(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two agents pinning under one directory (other state directories, other sockets)
    would overwrite each other's maps: the second one exits before any component starts,
    naming the pin directory and the first agent's pid; ``--cleanup`` is refused too. A
    SIGKILLed agent's lock goes with it: the restart takes it."""
    pin_dir = f"/sys/fs/bpf/swagent-lock-{uuid.uuid4().hex[:8]}"
    proc = None
    try:
        with running_agent(tmp_path, "--no-datapath", backend="kernel",
                           pin_dir=pin_dir) as agent:
            other = tmp_path / "other"
            other.mkdir()
            res = subprocess.run(
                [sys.executable, "-m", "statewright", "agent", "--backend", "kernel",
                 "--no-netlink", "--no-datapath", "--pin-dir", pin_dir,
                 "--api-socket", str(other / "agent.sock"), "--manifests",
                 str(agent.manifests), "--state-dir", str(other / "state")],
                capture_output=True, text=True, timeout=30, cwd=REPO,
            )
            assert res.returncode == 1, res.stderr
            assert (f"pin directory {pin_dir}: its maps are in use by another agent "
                    f"(pid {agent.proc.pid})") in res.stderr
            assert [p.name for p in other.iterdir()] == ["state"]  # no socket: not started
            code, _, err = run_cli(
                capsys, "agent", "--cleanup", "--backend", "kernel", "--pin-dir", pin_dir,
                "--api-socket", str(other / "agent.sock"), "--state-dir", str(other / "state"),
                "--no-datapath")
            assert code == 1 and f"pid {agent.proc.pid}" in err and pin_dir in err
            assert os.path.exists(os.path.join(pin_dir, "lb4_services"))
            assert agent.client.get("/health")["pid"] == agent.proc.pid  # the first runs on

            assert stop_agent(agent.proc, signal.SIGKILL) == -signal.SIGKILL
            proc = start_agent(agent.args, agent.socket, agent.log)
            assert agent.client.get("/health")["pid"] == proc.pid
            assert stop_agent(proc) == 0
            proc = None
    finally:
        if proc is not None:
            stop_agent(proc)
        if os.path.isdir(pin_dir):
            from tests.pins import remove_pin_dir

            remove_pin_dir(pin_dir)


def test_cleanup_is_refused_while_an_agent_holds_the_state_dir(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``agent --cleanup`` given another socket must not remove the state (and maps) of an
    agent that runs on the same state directory."""
    with running_agent(tmp_path) as agent:
        state = state_dir_of(agent.socket)
        code, _, err = run_cli(
            capsys, "agent", "--cleanup", "--backend", "memory", "--pin-dir", agent.pin_dir,
            "--api-socket", str(tmp_path / "elsewhere.sock"), "--state-dir", state,
        )
        assert code == 1 and f"pid {agent.proc.pid}" in err and state in err
        assert os.path.exists(os.path.join(state, "ipam.json"))


def test_metrics_are_served_on_localhost_when_asked(tmp_path: Path) -> None:
    import socket
    import urllib.request

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with running_agent(tmp_path, "--metrics-port", str(port)) as agent:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
        assert b"reconciler" in text
        assert agent.client.get("/health")["state"] == "OK"


# ----- restart on pinned kernel maps --------------------------------------------------------------


def _ids(capsys: pytest.CaptureFixture[str], sock: str) -> dict[str, int]:
    return {r["address"]: r["id"] for r in cli_json(capsys, "lb", "list", "--socket", sock)
            if r["id"]}


def _synced(capsys: pytest.CaptureFixture[str], sock: str) -> bool:
    doc = cli_json(capsys, "status", "--socket", sock)
    return bool(doc["health"]["state"] == "OK")


def _connect_via_exec(sock: str, vip: str) -> subprocess.CompletedProcess[str]:
    code = (
        f"import socket; s = socket.create_connection(({vip!r}, 80), timeout=5); "
        "s.sendall(b'GET / HTTP/1.0\\r\\n\\r\\n'); print(s.recv(4096).decode())"
    )
    return subprocess.run(
        [sys.executable, "-m", "statewright", "exec", "--socket", sock, "--",
         sys.executable, "-c", code],
        capture_output=True, text=True, timeout=30, cwd=REPO,
    )


@pytest.mark.kernel
def test_restart_keeps_ids_prunes_stale_entries_and_cleanup_removes_everything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from bpf.datapath import DEFAULT_OBJECT, SockLB, cgroup2_mount
    from statewright.agent.demo_netns import delete_netns

    if shutil.which("ip") is None:
        pytest.skip("iproute2 (ip) not installed")
    tag = uuid.uuid4().hex[:8]
    pin_dir = f"/sys/fs/bpf/swagent-test-{tag}"
    cgroup = os.path.join(cgroup2_mount(), f"swagent-test-{tag}")
    netns = f"swagent-{tag}"
    os.makedirs(cgroup)
    # The agent runs in the machine's own network namespace: its devices (eth0) are not the
    # test's, so the north-south programs stay off them.
    extra = ("--cgroup", cgroup, "--demo-netns", netns, "--netlink", "--no-nodeport-datapath")
    proc = None
    try:
        with running_agent(tmp_path, *extra, backend="kernel", pin_dir=pin_dir) as agent:
            sock = agent.socket
            (agent.manifests / "a.yaml").write_text(
                service_yaml("a", "10.96.210.1", ["10.244.50.1", "10.244.50.2"]))
            (agent.manifests / "b.yaml").write_text(
                service_yaml("b", "10.96.210.2", ["10.244.50.3"]))
            before = wait_for(
                lambda: (ids := _ids(capsys, sock)).get("10.96.210.2:80/TCP") and ids,
                what="both services in the maps")
            maps_before = {m["name"]: m["id"] for m in agent.client.get("/bpf/maps")}
            assert all(maps_before.values())
            datapath = os.path.exists(DEFAULT_OBJECT)
            if datapath:
                # The demo backends need a moment; the datapath translates the VIP.
                wait_for(lambda: _synced(capsys, sock), what="health OK")
                res = wait_for(lambda: (r := _connect_via_exec(sock, "10.96.210.1")
                                        ).returncode == 0 and r, what="a connection via exec")
                assert "backend 10.244.50." in res.stdout
            # SIGKILL: nothing is stopped gracefully; delete b while the agent is down.
            assert stop_agent(agent.proc, signal.SIGKILL) == -signal.SIGKILL
            (agent.manifests / "b.yaml").unlink()
            proc = start_agent(agent.args, sock, agent.log)
            after = wait_for(
                lambda: "10.96.210.2:80/TCP" not in (ids := _ids(capsys, sock)) and ids,
                what="the stale service pruned")
            assert after["10.96.210.1:80/TCP"] == before["10.96.210.1:80/TCP"]
            assert {k: v for k, v in after.items()} == {
                k: v for k, v in before.items() if k != "10.96.210.2:80/TCP"}
            maps_after = {m["name"]: m["id"] for m in agent.client.get("/bpf/maps")}
            assert maps_after == maps_before  # the pinned maps were adopted
            status = cli_json(capsys, "status", "--socket", sock)
            nodeport = [c for c in status["health"]["components"] if c["name"] == "nodeport"]
            assert [c["state"] for c in nodeport] == ["Disabled"], nodeport
            if datapath:
                assert "8 adopted links" in status["agent"]["datapath"]["reason"]
                res = wait_for(lambda: (r := _connect_via_exec(sock, "10.96.210.1")
                                        ).returncode == 0 and r, what="a connection via exec")
                assert "backend 10.244.50." in res.stdout
            assert stop_agent(proc, signal.SIGTERM) == 0
            proc = None
            # The pins outlive a graceful stop, and --cleanup removes them.
            assert os.path.exists(os.path.join(pin_dir, "lb4_services"))
            if datapath:
                assert SockLB.pinned(pin_dir)
            code, out, err = run_cli(capsys, "agent", "--cleanup", "--pin-dir", pin_dir,
                                     "--api-socket", sock, "--cgroup", cgroup,
                                     "--demo-netns", netns, "--state-dir", state_dir_of(sock))
            assert code == 0, err
            assert not os.path.exists(pin_dir)
            assert "lb4_services" in out
            assert not os.path.exists(f"/var/run/netns/{netns}")
    finally:
        if proc is not None:
            stop_agent(proc)
        if os.path.isdir(pin_dir):
            SockLB.cleanup(pin_dir)
            shutil.rmtree(pin_dir, ignore_errors=True)
        delete_netns(netns)
        _remove_cgroup(cgroup)


def test_json_logs_are_one_object_per_line(tmp_path: Path) -> None:
    import json

    with running_agent(tmp_path, "--log-format", "json") as agent:
        assert stop_agent(agent.proc) == 0
        lines = [x for x in agent.logs().splitlines() if x.strip()]
    docs = [json.loads(x) for x in lines]
    assert any(d["msg"].startswith("agent: started") for d in docs)
    assert all({"time", "level", "logger", "msg"} <= set(d) for d in docs)


def test_the_startup_log_names_the_kubernetes_converter(tmp_path: Path) -> None:
    """The compiled converter where a build of the sources now in the tree is there (and
    STATEWRIGHT_PURE_PYTHON is not set), else its source; the log says which."""
    from sources import native

    with running_agent(tmp_path) as agent:
        assert stop_agent(agent.proc) == 0
        log = agent.logs()
    compiled = native.current_build(native.repo_root())[0] is not None
    kind = "compiled" if compiled and not native.pure_forced() else "pure"
    assert f"agent: Kubernetes converter {kind}: " in log


def test_the_startup_log_names_the_row_builder(tmp_path: Path) -> None:
    """The compiled row builder (statedb/_rowbuild.c) where its current build is there
    (and STATEWRIGHT_PURE_PYTHON is not set), else the Python one; the log says which."""
    from sources import native
    from statedb import rowbuild

    with running_agent(tmp_path) as agent:
        assert stop_agent(agent.proc) == 0
        log = agent.logs()
    current = rowbuild.current_extension(Path(rowbuild.__file__).resolve().parent.parent)[0]
    kind = "compiled" if current is not None and not native.pure_forced() else "pure"
    assert f"agent: row builder {kind}: " in log
