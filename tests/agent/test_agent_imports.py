"""What an agent imports: never the official ``kubernetes`` package, which costs about
35 MB of RSS and 0.2-0.3 s of CPU (the agent talks to the API server through its own
client, sources/k8s_http.py): neither one started without a Kubernetes source (``make
run``'s: the manifests of examples/) nor one pointed at an API server, which is checked to
have listed and watched through it (the check is not vacuous).

The real ``statewright agent`` command runs in a fresh interpreter; a thread of that
process waits until the agent's ``/health`` says it is up (and synced, with a Kubernetes
source), writes the ``kubernetes`` modules
loaded by then, and stops the agent with SIGTERM."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.agent.conftest import REPO
from tests.k8s.fake_apiserver import FakeAPIServer

#: Runs the agent (argv[3:]) on socket argv[1]; writes the modules to argv[2] once started.
SCRIPT = r"""
import json, os, signal, sys, threading, time

sock, out = sys.argv[1], sys.argv[2]


def report() -> None:
    from statewright.agent.client import AgentClient

    client = AgentClient(sock, timeout=2)
    deadline = time.monotonic() + 300
    while True:
        try:
            # Up, and with a Kubernetes source, synced (its lists read and applied).
            health = json.dumps(client.get("/health"))
            if "synced with" in health or "no k8s-kubeconfig" in health:
                break
        except Exception:
            pass
        if time.monotonic() > deadline:
            break
        time.sleep(0.05)
    loaded = sorted(m for m in sys.modules if m.partition(".")[0] == "kubernetes")
    with open(out, "w") as f:
        json.dump(loaded, f)
    os.kill(os.getpid(), signal.SIGTERM)


threading.Thread(target=report, daemon=True).start()
from statewright.cli import main

sys.exit(main(["agent", "--api-socket", sock, *sys.argv[3:]]))
"""


def _kubernetes_modules(tmp: Path, *args: str) -> list[str]:
    """Start the agent with ``args`` on ``tmp``; the kubernetes modules it had loaded once
    it answered."""
    out = tmp / "modules.json"
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp / "agent.sock"), str(out),
         "--backend", "memory", "--pin-dir", str(tmp / "pins"), "--state-dir",
         str(tmp / "state"), "--no-netlink", "--no-sysctl", *args],
        cwd=REPO, capture_output=True, text=True, timeout=600,
    )
    assert out.exists(), f"the agent did not start (exit {proc.returncode}):\n{proc.stderr}"
    loaded: list[str] = json.loads(out.read_text())
    return loaded


def test_an_agent_without_kubernetes_does_not_import_it(tmp_path: Path) -> None:
    examples = str(REPO / "examples" / "manifests")
    loaded = _kubernetes_modules(tmp_path, "--manifests", examples)
    assert loaded == [], f"imported without a Kubernetes source: {loaded[:5]}"


def test_an_agent_with_an_api_server_does_not_import_it(
    apiserver: FakeAPIServer, tmp_path: Path
) -> None:
    kubeconfig = apiserver.write_kubeconfig(tmp_path / "kubeconfig")
    loaded = _kubernetes_modules(tmp_path, "--k8s-kubeconfig", kubeconfig,
                                 "--node-name", "node-a")
    assert loaded == [], f"imported with a Kubernetes source: {loaded[:5]}"
    seen = {(q.resource, q.verb) for q in apiserver.requests if q.status == 200}
    assert {("services", "list"), ("endpointslices", "list")} <= seen, seen
