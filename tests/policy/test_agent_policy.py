"""The whole agent (memory maps): policies from the manifest directory, an invalid one
reported alone, ``policy get`` / ``policy trace`` and the policy tables in ``db show``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from statewright.cni import AgentAPI
from tests.agent.conftest import AgentProc, cli_json, run_cli, running_agent, wait_for

from .test_writer_and_sources import TO_DB_5432, cnp


@pytest.fixture
def agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentProc]:
    tmp = tmp_path_factory.mktemp("policy-agent")
    manifests = tmp / "manifests"
    manifests.mkdir()
    # Present before the agent starts: in force when it first answers.
    (manifests / "policy.yaml").write_text(yaml.safe_dump(cnp("web-egress", TO_DB_5432)))
    with running_agent(tmp) as a:
        yield a


def test_policies_from_manifests(agent: AgentProc, capsys: pytest.CaptureFixture[str]) -> None:
    sock = ["--socket", agent.socket]
    doc = cli_json(capsys, "policy", "get", *sock)
    assert [p["name"] for p in doc["policies"]] == ["default/web-egress"]
    status = cli_json(capsys, "status", *sock)
    assert status["health"]["state"] == "OK", status
    code, out, _ = run_cli(
        capsys, "policy", "trace", "--from", "app=web", "--to", "app=db", "--port", "5432", *sock
    )
    assert code == 0 and "allowed by default/web-egress" in out

    bad = cnp("bad", [{"toEntities": ["moon"]}])
    Path(agent.manifests / "bad.yaml").write_text(yaml.safe_dump(bad))

    def reported() -> bool:
        comps = cli_json(capsys, "status", *sock)["health"]["components"]
        msg = next(c["message"] for c in comps if c["name"] == "manifests")
        return "CiliumNetworkPolicy default/bad" in msg and "toEntities[0]" in msg

    wait_for(reported, what="the bad policy's error")
    doc = cli_json(capsys, "policy", "get", *sock)
    assert [p["name"] for p in doc["policies"]] == ["default/web-egress"]
    rows = cli_json(capsys, "db", "show", "policies", *sock)
    assert [r["name"] for r in rows] == ["default/web-egress"]


def _namespace(name: str, labels: dict[str, str]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}}


def _not_in_y() -> dict[str, Any]:
    """The issue's example: egress of x/client to the pods of namespaces not labelled
    ns=y, on TCP 80."""
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": "not-y", "namespace": "x"},
        "spec": {
            "podSelector": {"matchLabels": {"app": "client"}},
            "policyTypes": ["Egress"],
            "egress": [{
                "to": [{"namespaceSelector": {"matchExpressions": [
                    {"key": "ns", "operator": "NotIn", "values": ["y"]}]}}],
                "ports": [{"port": 80}],
            }],
        },
    }


def test_namespaces_from_manifests_and_selectors_that_fail_closed(
    agent: AgentProc, capsys: pytest.CaptureFixture[str]
) -> None:
    sock = ["--socket", agent.socket]
    api = AgentAPI(agent.socket)
    (agent.manifests / "ns.yaml").write_text(yaml.safe_dump_all(
        [_namespace("y", {"ns": "y"}), _namespace("x", {"ns": "x"})]))
    (agent.manifests / "not-y.yaml").write_text(yaml.safe_dump(_not_in_y()))

    def put(ns: str, name: str, app: str) -> dict[str, Any]:
        doc: dict[str, Any] = api.request("PUT", "/endpoint/0", {
            "container-id": f"{ns}-{name}", "interface-name": f"lxc-{ns}-{name}"[:15],
            "k8s-namespace": ns, "k8s-pod-name": name, "labels": [f"k8s:app={app}"]})
        return doc

    def egress_remotes(ep: int) -> set[int]:
        doc = cli_json(capsys, "policy", "get", "--endpoint", str(ep), *sock)
        return {e["identity"] for e in doc["entries"] if e["direction"] == "egress"
                and not e["deny"]}

    wait_for(lambda: cli_json(capsys, "db", "show", "namespaces", *sock), what="namespaces")
    client = put("x", "client", "client")
    in_y = put("y", "server", "s")
    in_z = put("z", "server", "s")  # no Namespace object: labels unknown
    assert "k8s:io.cilium.k8s.namespace.labels.ns=y" in in_y["identity-labels"]
    assert in_y["k8s-namespace-labels"] == {"ns": "y", "kubernetes.io/metadata.name": "y"}
    assert in_z["k8s-namespace-labels"] is None
    assert "statewright:namespace-labels=unknown" in in_z["identity-labels"]

    def health() -> dict[str, Any]:
        comps = cli_json(capsys, "status", *sock)["health"]["components"]
        return {c["name"]: c for c in comps}

    line = wait_for(lambda: health().get("policy/namespace-labels"), what="fail-closed health")
    assert line["state"] == "Degraded"
    assert "namespace(s) z unknown" in line["message"]
    assert "NetworkPolicy/x/not-y" in line["message"]
    # neither y (excluded) nor z (unknown) is allowed
    wait_for(lambda: cli_json(capsys, "policy", "get", "--endpoint", str(client["id"]), *sock)
             ["enforcement"], what="client enforced")
    assert not egress_remotes(client["id"]) & {in_y["identity"], in_z["identity"]}

    # z's Namespace appears: its pod moves to an identity the selector allows
    (agent.manifests / "ns-z.yaml").write_text(yaml.safe_dump(_namespace("z", {"ns": "z"})))

    def z_identity() -> int:
        eps = {e["id"]: e for e in api.request("GET", "/endpoint")}
        ident: int = eps[in_z["id"]]["identity"]
        return ident if ident != in_z["identity"] else 0

    moved = wait_for(z_identity, what="z's pod moved")
    wait_for(lambda: moved in egress_remotes(client["id"]), what="z allowed")
    assert in_y["identity"] not in egress_remotes(client["id"])
    wait_for(lambda: "policy/namespace-labels" not in health(), what="health clear")
    for ep in (client, in_y, in_z):
        api.request("DELETE", f"/endpoint/{ep['id']}")
    for name in ("ns.yaml", "ns-z.yaml", "not-y.yaml"):
        (agent.manifests / name).unlink()


def _refused(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """Run a client command the agent refuses; its stderr (exit code 1)."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        run_cli(capsys, *argv)
    assert exc.value.code == 1
    return capsys.readouterr().err


def test_trace_by_pod_realized_revision_and_policy_wait(
    agent: AgentProc, capsys: pytest.CaptureFixture[str]
) -> None:
    sock = ["--socket", agent.socket]
    api = AgentAPI(agent.socket)
    web = api.request("PUT", "/endpoint/0", {
        "container-id": "default-web", "interface-name": "lxc-default-web",
        "k8s-namespace": "default", "k8s-pod-name": "web", "labels": ["k8s:app=web"]})
    db = api.request("PUT", "/endpoint/0", {
        "container-id": "default-db", "interface-name": "lxc-default-db",
        "k8s-namespace": "default", "k8s-pod-name": "db", "labels": ["k8s:app=db"],
        "named-ports": [{"name": "pg", "port": 5432}]})
    try:
        code, out, _ = run_cli(capsys, "policy", "trace", "--from-pod", "default/web",
                               "--to-pod", "default/db", "--port", "5432/TCP", *sock)
        assert code == 0 and "allowed by default/web-egress" in out, out
        # memory maps, no network namespace: the datapath says what it does not enforce
        assert "egress datapath: not enforced by this node" in out
        doc = cli_json(capsys, "policy", "trace", "--from-endpoint", str(web["id"]),
                       "--to-endpoint", str(db["id"]), "--port", "5433", *sock)
        assert doc["verdict"] == "denied" and doc["from-endpoint"]["pod"] == "default/web"
        assert doc["to-endpoint"]["identity"] == db["identity"]
        assert doc["from"] == web["identity-labels"]
        # raw labels still work; a side given twice is refused
        err = _refused(capsys, "policy", "trace", "--from", "app=web", "--from-pod",
                       "default/web", "--to", "app=db", "--port", "5432", *sock)
        assert "give one of from, from-pod, from-endpoint" in err
        err = _refused(capsys, "policy", "trace", "--from-pod", "default/nope",
                       "--to", "app=db", "--port", "5432", *sock)
        assert "no such endpoint" in err

        # GET /policy names each policy's source object and revision
        pol = cli_json(capsys, "policy", "get", *sock)
        (p,) = [p for p in pol["policies"] if p["name"] == "default/web-egress"]
        assert p["source"] == "manifests" and p["source-revision"].startswith("sha256:")

        # every endpoint realizes the current revision; policy wait returns at once
        revision = pol["revision"]

        def realized() -> bool:
            rows = api.request("GET", "/policy/endpoints")["endpoints"]
            ids = {r["endpoint_id"]: r["realized-revision"] for r in rows}
            return ids.get(web["id"]) == ids.get(db["id"]) == revision

        wait_for(realized, what="realized revisions")
        assert run_cli(capsys, "policy", "wait", str(revision), *sock)[0] == 0
        assert run_cli(capsys, "policy", "wait", str(revision), "--endpoint",
                       str(web["id"]), *sock)[0] == 0
        code, _, err = run_cli(capsys, "policy", "wait", str(revision + 100), "--timeout",
                               "0.3", *sock)
        assert code == 1 and "not realized" in err
        # a new policy revision: policy wait returns once the maps hold it
        (agent.manifests / "more.yaml").write_text(yaml.safe_dump(
            cnp("web-more", [{"toPorts": [{"ports": [{"port": "pg"}]}]}])))
        wait_for(lambda: cli_json(capsys, "policy", "get", *sock)["revision"] > revision,
                 what="the new policy")
        new = cli_json(capsys, "policy", "get", *sock)["revision"]
        assert run_cli(capsys, "policy", "wait", str(new), "--timeout", "10", *sock)[0] == 0
        # the named port resolves on the db pod: 5432 is now allowed twice over
        entries = cli_json(capsys, "policy", "get", "--endpoint", str(web["id"]), *sock)
        rules = {tuple(e["rules"]) for e in entries["entries"] if e["dport"] == 5432}
        assert ("default/web-egress", "default/web-more") in rules, entries
    finally:
        for ep in (web, db):
            api.request("DELETE", f"/endpoint/{ep['id']}")
        (agent.manifests / "more.yaml").unlink(missing_ok=True)


def test_ingress_rules_this_node_does_not_enforce_are_said_so(
    agent: AgentProc, capsys: pytest.CaptureFixture[str]
) -> None:
    """Memory maps: no tc programs, so a policy selecting a pod's ingress is computed but
    not enforced; health, ``endpoint list`` and ``/policy/endpoints`` say so (issue #27),
    and nothing is said once no policy selects any ingress."""
    sock = ["--socket", agent.socket]
    api = AgentAPI(agent.socket)
    ingress = {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
               "metadata": {"name": "db-in", "namespace": "default"},
               "spec": {"podSelector": {"matchLabels": {"app": "db"}},
                        "policyTypes": ["Ingress"],
                        "ingress": [{"ports": [{"port": 5432}]}]}}
    db = api.request("PUT", "/endpoint/0", {
        "container-id": "default-db2", "interface-name": "lxc-default-db2",
        "k8s-namespace": "default", "k8s-pod-name": "db2", "labels": ["k8s:app=db"]})
    (agent.manifests / "ingress.yaml").write_text(yaml.safe_dump(ingress))

    def ingress_line() -> str:
        comps = cli_json(capsys, "status", *sock)["health"]["components"]
        return next((f"{c['state']}: {c['message']}" for c in comps
                     if c["name"] == "policy/ingress"), "")

    try:
        wait_for(lambda: bool(ingress_line()), what="the policy/ingress health line")
        line = ingress_line()
        assert line.startswith(f"Degraded: ingress rules of endpoint(s) {db['id']} are "
                               "computed but not enforced on this node: "), line
        assert "kernel maps" in line
        doc = api.request("GET", "/policy/endpoints")
        assert doc["ingress-datapath"] and "kernel maps" in doc["ingress-datapath"]
        code, out, _ = run_cli(capsys, "endpoint", "list", *sock)
        assert code == 0
        (row,) = [r for r in out.splitlines() if "default/db2" in r]
        assert "+ingress*" in row, out
        assert "* ingress rules computed but not enforced on this node:" in out
    finally:
        (agent.manifests / "ingress.yaml").unlink(missing_ok=True)
        api.request("DELETE", f"/endpoint/{db['id']}")
    wait_for(lambda: not ingress_line(), what="the line gone with the policy")
