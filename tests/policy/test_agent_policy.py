"""The whole agent (memory maps): policies from the manifest directory, an invalid one
reported alone, ``policy get`` / ``policy trace`` and the policy tables in ``db show``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

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
