"""Kubernetes' NetworkPolicy truth tables on the datapath (issue #26): the cases of
tests/policy/netpol_model.py with real connections between nine pods created by
``statewright-cni`` on the node of tests/e2e/node_harness.py.

Namespaces x, y and z are Namespace objects in the agent's manifest directory (their
labels reach the pods' identities without an API server); pods a, b and c in each get
their labels and named container ports from ``args.cni.labels`` and ``args.cni.ports``,
as a runtime passes them. Each pod runs TCP listeners and UDP sockets on ports 80 and 81
(outside the test cgroup) and a probe client inside it (the socket program enforces its
egress). For each case the policies are written as manifests, the test waits until every
endpoint has realized the new policy revision (``GET /policy/endpoints``, what
``statewright policy wait`` reads), then probes every ordered pair of pods: TCP connects
(EPERM: egress refused at the socket; a timeout: the SYN dropped by the destination's tc
program) and UDP datagrams (allowed when the destination received it).

Ingress is enforced by the tc programs on the pods' veths (the ``endpoint-datapath``
component). `INGRESS_ENFORCED` says so and is checked against the agent's health: set to
False, the ingress rows are expected as not enforced (the control plane's egress verdicts
only), and the test fails as soon as the datapath enforces them, so the flag must flip.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.datapath.conftest import _readline
from tests.e2e.conftest import need_machine, record
from tests.e2e.node_harness import NodeEnv, Pod, node_env
from tests.policy.netpol_model import (
    ALL_PODS,
    CASES,
    NAMESPACE_LABELS,
    PORTS,
    Case,
    Cell,
    Expect,
    cells,
    compare,
    named_ports,
    pod_labels,
)
from tests.policy.test_netpol_matrix import ControlPlane

pytestmark = pytest.mark.kernel

#: The tc programs enforce ingress (issue #29's endpoint datapath).
INGRESS_ENFORCED = True
BOUND_S = 30.0
PROBE = str(Path(__file__).with_name("netpol_probe.py"))


@dataclass
class Cluster:
    """The node, its nine pods, their servers and probe clients."""

    env: NodeEnv
    pods: dict[str, Pod]
    servers: dict[str, Any] = field(default_factory=dict)
    clients: dict[str, Any] = field(default_factory=dict)
    round: int = 0

    def probe(self) -> dict[Cell, bool]:
        """Every probe of the matrix once (see the module doc)."""
        self.round += 1
        batches: dict[str, list[list[Any]]] = {p: [] for p in ALL_PODS}
        tokens: dict[str, Cell] = {}
        for n, (src, dst, port, proto) in enumerate(cells()):
            token = f"{self.round}-{n}"
            tokens[token] = (src, dst, port, proto)
            batches[src].append([token, self.pods[dst].address(4), port, proto])
        for src, batch in batches.items():
            self.clients[src].stdin.write(json.dumps(batch) + "\n")
            self.clients[src].stdin.flush()
        outcome: dict[str, str] = {}
        for src in batches:
            outcome.update(json.loads(_readline(self.clients[src], 30, f"probes of {src}")))
        time.sleep(0.3)  # the last datagrams
        received: set[str] = set()
        for pod, server in self.servers.items():
            server.stdin.write("tokens\n")
            server.stdin.flush()
            received.update(json.loads(_readline(server, 10, f"tokens of {pod}")))
        out: dict[Cell, bool] = {}
        for token, cell in tokens.items():
            sent = outcome.get(token) == "ok"
            out[cell] = sent and (cell[3] == "TCP" or token in received)
        return out


def _namespace(ns: str) -> str:
    return json.dumps({"apiVersion": "v1", "kind": "Namespace",
                       "metadata": {"name": ns, "labels": NAMESPACE_LABELS[ns]}})


def _until(what: str, check: Any, bound: float = BOUND_S) -> Any:
    deadline = time.monotonic() + bound
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {bound} s")
        time.sleep(0.05)


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    need_machine()
    with node_env() as env:
        for ns in NAMESPACE_LABELS:
            env.write(f"namespace-{ns}", _namespace(ns))
        pods = {p: env.add_pod(p.replace("/", "-"), p.split("/")[0], pod_labels(p),
                               named_ports()) for p in ALL_PODS}
        c = Cluster(env, pods)
        for name, pod in pods.items():
            ports = [str(p) for p in PORTS]
            server = env.run_in(pod, sys.executable, PROBE, "serve", pod.address(4), *ports)
            assert _readline(server, 10, f"server {name}").strip() == "ready"
            client = env.run_in(pod, sys.executable, PROBE, "client")
            with open(os.path.join(env.cgroup, "cgroup.procs"), "w", encoding="ascii") as f:
                f.write(str(client.pid))
            assert client.stdin is not None
            client.stdin.write("go\n")
            client.stdin.flush()
            assert json.loads(_readline(client, 10, f"client {name}")) == {"ready": True}
            c.servers[name], c.clients[name] = server, client

        def labelled() -> bool:  # every pod's identity has its namespace's labels
            eps = env.api.get("/endpoint")
            return len(eps) == 9 and all(e["k8s-namespace-labels"] for e in eps)

        _until("namespace labels on every pod", labelled)
        health = {h["name"]: h for h in env.api.get("/health")["components"]}
        tc = health.get("endpoint-datapath", {}).get("state")
        assert (tc == "OK") == INGRESS_ENFORCED, (
            f"INGRESS_ENFORCED is {INGRESS_ENFORCED} but endpoint-datapath is {tc}: "
            f"{health.get('endpoint-datapath')}")
        yield c


def _realized(env: NodeEnv, names: set[str]) -> None:
    """Wait until the policies in force are exactly ``names`` and every endpoint has
    realized the revision that has them (what ``statewright policy wait`` checks)."""
    def current() -> int:
        doc = env.api.get("/policy")
        got = {p["name"] for p in doc["policies"] if p["kind"] == "NetworkPolicy"}
        return int(doc["revision"]) if got == names else 0

    revision = _until(f"policies {sorted(names)}", current)

    def realized() -> bool:
        rows = env.api.get("/policy/endpoints")["endpoints"]
        return len(rows) == 9 and all((r["realized-revision"] or 0) >= revision for r in rows)

    _until(f"revision {revision} realized", realized)


def _expected(case: Case) -> dict[Cell, bool]:
    if INGRESS_ENFORCED:
        return case.expect().cells
    cp = ControlPlane()
    cp.apply(case.policies)
    return cp.verdicts(ingress=False)


def test_no_policy_everything_connects(cluster: Cluster) -> None:
    _realized(cluster.env, set())
    got = _until("every probe allowed", lambda: (lambda m: m if all(m.values()) else None)(
        cluster.probe()))
    compare("no policy", got, Expect())


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_matrix_on_the_datapath(cluster: Cluster, case: Case) -> None:
    env = cluster.env
    names = set()
    start = time.monotonic()
    for i, obj in enumerate(case.policies):
        env.write(f"case-{i}", json.dumps(obj))
        names.add(f"{obj['metadata']['namespace']}/{obj['metadata']['name']}")
    try:
        _realized(env, names)
        realized_s = time.monotonic() - start
        want = Expect()
        want.cells = _expected(case)
        got = cluster.probe()
        deadline = time.monotonic() + 10
        while got != want.cells and time.monotonic() < deadline:
            time.sleep(0.2)  # the tc programs follow policy-endpoints on their own
            got = cluster.probe()
        compare(f"{case.name} (datapath)", got, want)
        record(f"netpol {case.name}", realized_s)
    finally:
        for i in range(len(case.policies)):
            env.remove(f"case-{i}")
        _realized(env, set())
