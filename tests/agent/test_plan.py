"""`statewright plan` against maps pinned by a real agent (kernel maps): none while the
agent runs (its maps equal what its own sources say), exactly one change after one
manifest edit while it is stopped, none again once it restarted; the exit codes and the
JSON document."""

from __future__ import annotations

import ipaddress
import json
import os
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from bpf import lb
from statewright.cli.lb_commands import open_pinned_lb_maps
from tests.agent.conftest import (
    AgentProc,
    cli_json,
    run_cli,
    running_agent,
    start_agent,
    stop_agent,
    wait_for,
)
from tests.k8s.fake_apiserver import FakeAPIServer
from tests.pins import remove_pin_dir

SERVICE = """\
apiVersion: v1
kind: Service
metadata: {{name: web, namespace: plan}}
spec:
  clusterIP: 10.96.210.1
  sessionAffinity: ClientIP
  sessionAffinityConfig: {{clientIP: {{timeoutSeconds: {timeout}}}}}
  ports: [{{name: http, port: 80, protocol: TCP}}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-1
  namespace: plan
  labels: {{kubernetes.io/service-name: web}}
addressType: IPv4
endpoints:
- addresses: [10.244.7.1]
  conditions: {{ready: true}}
- addresses: [10.244.7.2]
  conditions: {{ready: true}}
ports: [{{name: http, port: 80, protocol: TCP}}]
"""


def _plan(capsys: pytest.CaptureFixture[str], agent: AgentProc) -> tuple[int, dict[str, object]]:
    code, out, err = run_cli(capsys, "plan", "--pin-dir", agent.pin_dir, "--manifests",
                             str(agent.manifests), "--no-netlink", "-o", "json")
    assert code in (0, 2), err
    return code, json.loads(out)


def _write_stray_backend(pin_dir: str) -> None:
    with open_pinned_lb_maps(pin_dir) as maps:
        maps.be4.update(4000, lb.Backend4(ipaddress.ip_address("10.9.9.9").packed, 80, 6))


def _restart_shows_no_change(agent: AgentProc, no_change: Callable[[], bool]) -> None:
    """Start the stopped agent again, wait until ``no_change`` (its plan is empty), stop
    it, and start it once more as ``agent.proc`` (which the fixture stops on exit)."""
    proc = start_agent(agent.args, agent.socket, agent.log)
    try:
        wait_for(lambda: agent.client.get("/health")["pid"] == proc.pid, what="restart")
        wait_for(no_change, what="no change after the restart")
    finally:
        stop_agent(proc)
    agent.proc = start_agent(agent.args, agent.socket, agent.log)


@pytest.mark.kernel
def test_plan_against_a_running_stopped_and_restarted_agent(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pin_dir = f"/sys/fs/bpf/swplan-{uuid.uuid4().hex[:8]}"
    try:
        with running_agent(tmp_path, "--no-datapath", "--no-sysctl", backend="kernel",
                           pin_dir=pin_dir) as agent:
            path = agent.manifests / "web.yaml"
            path.write_text(SERVICE.format(timeout=100))

            def programmed() -> bool:
                recs = cli_json(capsys, "lb", "list", "--socket", agent.socket)
                return any(r["address"] == "10.96.210.1:80/TCP" and len(r["backends"]) == 2
                           for r in recs)

            wait_for(programmed, what="the service in the maps")
            # The running agent's maps hold what its own sources say.
            code, doc = _plan(capsys, agent)
            assert (code, doc["changes"], doc["maps"]) == (0, 0, {}), doc

            stop_agent(agent.proc)
            path.write_text(SERVICE.format(timeout=200))
            code, doc = _plan(capsys, agent)
            assert code == 2 and doc["changes"] == 1, doc
            (name, diff), = doc["maps"].items()
            assert name == "lb4_services" and len(diff["changed"]) == 1
            assert "AFFTimeout=200" in diff["changed"][0]["text"]
            assert "AFFTimeout=100" in diff["changed"][0]["old_text"]
            code, text, _ = run_cli(capsys, "plan", "--pin-dir", pin_dir, "--manifests",
                                    str(agent.manifests), "--no-netlink")
            assert code == 2 and "1 change(s)" in text and "~ SVC:" in text
            # Nothing was written: the pinned maps still hold the old timeout.
            assert _plan(capsys, agent)[1]["changes"] == 1
            # An entry no source explains (written behind the agent's back) is one the
            # plan removes, as the agent's prune would.
            _write_stray_backend(pin_dir)
            code, doc = _plan(capsys, agent)
            assert code == 2 and doc["changes"] == 2, doc
            assert len(doc["maps"]["lb4_backends"]["removed"]) == 1, doc
            assert not doc["maps"]["lb4_backends"]["added"], doc

            _restart_shows_no_change(agent, lambda: _plan(capsys, agent)[0] == 0)
    finally:
        remove_pin_dir(pin_dir)


def test_plan_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("manifests: [1, 2\n")
    code, _, err = run_cli(capsys, "plan", "--config", str(bad), "--pin-dir",
                           str(tmp_path / "none"))
    assert code == 1 and "statewright plan:" in err


def test_plan_without_pinned_maps_adds_everything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    manifests = tmp_path / "m"
    manifests.mkdir()
    (manifests / "web.yaml").write_text(SERVICE.format(timeout=100))
    code, out, err = run_cli(capsys, "plan", "--pin-dir", str(tmp_path / "no-pins"),
                             "--manifests", str(manifests), "--no-netlink", "-o", "json")
    assert code == 2, err
    doc = json.loads(out)
    services = doc["maps"]["lb4_services"]
    # master + two slots (+ the VIP's wildcard entry)
    assert len(services["added"]) >= 3 and not services["removed"]
    assert len(doc["maps"]["lb4_backends"]["added"]) == 2
    assert os.path.isdir(tmp_path / "no-pins") is False


def _k8s_objects(timeout: int) -> list[dict[str, Any]]:
    """The Service and EndpointSlice of `SERVICE`, as the API server holds them."""
    docs = [d for d in yaml.safe_load_all(SERVICE.format(timeout=timeout)) if d]
    for d in docs:
        d["metadata"]["namespace"] = "plan"
    return docs


def _k8s_plan(capsys: pytest.CaptureFixture[str], pin_dir: str, kubeconfig: str,
              manifests: str) -> tuple[int, dict[str, Any]]:
    code, out, err = run_cli(capsys, "plan", "--pin-dir", pin_dir, "--k8s-kubeconfig",
                             kubeconfig, "--manifests", manifests, "--no-netlink",
                             "--timeout", "20", "-o", "json")
    assert code in (0, 2), err
    return code, json.loads(out)


@pytest.mark.kernel
def test_plan_from_a_kubeconfig(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], apiserver: FakeAPIServer
) -> None:
    """An agent on the fake API server: no change while it runs, exactly one after one
    edit of the Service in the API server while it is stopped, none once it restarted."""
    kubeconfig = apiserver.write_kubeconfig(tmp_path / "kubeconfig")
    apiserver.upsert_many(_k8s_objects(100))
    pin_dir = f"/sys/fs/bpf/swplan-{uuid.uuid4().hex[:8]}"
    try:
        with running_agent(tmp_path, "--no-datapath", "--no-sysctl", "--k8s-kubeconfig",
                           kubeconfig, backend="kernel", pin_dir=pin_dir) as agent:
            manifests = str(agent.manifests)

            def programmed() -> bool:
                recs = cli_json(capsys, "lb", "list", "--socket", agent.socket)
                return any(r["address"] == "10.96.210.1:80/TCP" and len(r["backends"]) == 2
                           for r in recs)

            wait_for(programmed, what="the API server's service in the maps")
            code, doc = _k8s_plan(capsys, pin_dir, kubeconfig, manifests)
            assert (code, doc["changes"], doc["maps"]) == (0, 0, {}), doc
            assert doc["sources"]["kubeconfig"] == kubeconfig

            stop_agent(agent.proc)
            svc, _slice = _k8s_objects(200)
            apiserver.upsert(svc)
            code, doc = _k8s_plan(capsys, pin_dir, kubeconfig, manifests)
            assert code == 2 and doc["changes"] == 1, doc
            (name, diff), = doc["maps"].items()
            assert name == "lb4_services" and len(diff["changed"]) == 1
            assert "AFFTimeout=200" in diff["changed"][0]["text"]

            _restart_shows_no_change(
                agent, lambda: _k8s_plan(capsys, pin_dir, kubeconfig, manifests)[0] == 0)
    finally:
        remove_pin_dir(pin_dir)


def test_plan_kubeconfig_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A kubeconfig that is missing or not YAML, and an API server that does not answer:
    status 1 and one clear line, no traceback."""
    bad = tmp_path / "bad.kubeconfig"
    bad.write_text("clusters: [\n")
    srv = FakeAPIServer().start()
    gone = srv.write_kubeconfig(tmp_path / "gone.kubeconfig")
    srv.stop()
    cases = ((str(tmp_path / "missing"), "missing: no such file"), (str(bad), "bad.kubeconfig"),
             (gone, "cannot connect"))
    for kubeconfig, needle in cases:
        code, out, err = run_cli(capsys, "plan", "--pin-dir", str(tmp_path / "pins"),
                                 "--k8s-kubeconfig", kubeconfig, "--manifests",
                                 str(tmp_path / "m"), "--no-netlink", "--timeout", "3")
        assert code == 1 and out == "", (kubeconfig, out, err)
        assert err.startswith("statewright plan: ") and needle in err, err
        assert "Traceback" not in err
