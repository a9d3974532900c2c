"""The OpenAPI document (statewright/agent/openapi.py): generated from the routes the agent's
components declare, covering every one of them, with schemas the server can enforce;
served by a live agent at /openapi.json; and the live agent refusing bad endpoint and
IPAM requests with 400 and the field, changing nothing."""

from __future__ import annotations

import http.client
import json
import socket
from typing import Any

import pytest
import schemathesis

from statewright.agent import openapi
from statewright.agent.components.api import API_INFO
from statewright.agent.config import AgentConfig
from statewright.agent.json_schema import check_schema
from statewright.agent.runtime import agent_components
from statewright.api_types import Route
from statewright.component import Hive
from tests.agent.conftest import AgentProc, run_cli


def _routes() -> list[Route]:
    return Hive(agent_components(AgentConfig())).routes()


def _document() -> dict[str, Any]:
    return openapi.document(_routes(), API_INFO)


def test_every_route_of_every_component_is_in_the_document() -> None:
    doc = _document()
    assert doc["openapi"].startswith("3.0")
    for route in _routes():
        for method in route.methods:
            op = doc["paths"][route.pattern][method.lower()]
            assert str(route.status) in op["responses"] and "405" in op["responses"]
            # 201 Created for the routes that create (Cilium's PUT /endpoint/{id}), else 200
            assert route.status == (201 if (route.pattern, method) == (
                "/endpoint/{id}", "PUT") else 200)
            assert [p["name"] for p in op.get("parameters", []) if p["in"] == "path"] == \
                route.path_params
    expected = {
        "/health": {"get"}, "/agent": {"get"}, "/openapi.json": {"get"},
        "/tables": {"get"}, "/tables/{name}": {"get"}, "/tables/{name}/changes": {"get"},
        "/lb/services": {"get"}, "/bpf/maps": {"get"}, "/bpf/maps/{name}": {"get"},
        "/k8s": {"get"}, "/endpoint": {"get"},
        "/endpoint/{id}": {"get", "put", "patch", "delete"},
        "/ipam": {"get", "post"}, "/ipam/{ip}": {"post", "delete"},
        "/policy": {"get"}, "/policy/endpoints": {"get"}, "/policy/trace": {"get"},
        "/ct": {"get", "delete"}, "/ct/stats": {"get"},
        "/ipcache": {"get"}, "/nodes": {"get"}, "/nodeport": {"get"},
        "/debug/probe": {"get"}, "/debug/tracemalloc": {"post"},
        "/explain/entry": {"get"}, "/explain/{kind}/{namespace}/{name}": {"get"},
        "/explain/node/{name}": {"get"},
        "/monitor": {"get"}, "/monitor/stats": {"get"},
    }
    assert {p: set(ops) for p, ops in doc["paths"].items()} == expected
    ids = [op["operationId"] for ops in doc["paths"].values() for op in ops.values()]
    assert len(ids) == len(set(ids))


def test_the_endpoint_change_request_follows_ciliums_field_names() -> None:
    put = _document()["paths"]["/endpoint/{id}"]["put"]
    body = put["requestBody"]["content"]["application/json"]["schema"]
    assert {"container-id", "interface-name", "interface-index", "container-interface-name",
            "mac", "host-mac", "addressing", "k8s-pod-name", "k8s-namespace", "labels",
            "netns-path", "datapath-configuration"} <= set(body["properties"])
    assert body["additionalProperties"] is False
    assert set(put["responses"]) >= {"201", "400", "409", "413", "503"}
    assert "200" not in put["responses"]
    assert put["responses"]["201"]["description"] == "Created"


def test_every_schema_uses_only_keywords_the_server_checks() -> None:
    for route in _routes():
        for schema in (route.body, route.response, *(q.schema for q in route.query)):
            if schema is not None:
                check_schema(schema, f"{route.methods} {route.pattern}")
    with pytest.raises(ValueError, match="unsupported JSON Schema keyword"):
        check_schema({"type": "object", "properties": {"a": {"const": 1}}})


def test_schemathesis_reads_every_operation() -> None:
    schema = schemathesis.openapi.from_dict(_document())
    operations = [r.ok() for r in schema.get_all_operations()]  # ok() raises on a bad one
    assert len(operations) == 35


def test_the_live_agent_serves_the_document(agent: AgentProc) -> None:
    served = agent.client.get("/openapi.json")
    assert served == json.loads(json.dumps(_document()))


def _call(agent: AgentProc, method: str, target: str, body: Any = None
          ) -> tuple[int, Any]:
    conn = http.client.HTTPConnection("agent", timeout=10)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(10)
    sock.connect(agent.socket)
    conn.sock = sock
    try:
        data = None if body is None else json.dumps(body).encode()
        conn.request(method, target, body=data)
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read())
    finally:
        conn.close()


@pytest.mark.parametrize(("method", "target", "body", "reason"), [
    ("PUT", "/endpoint/7", {"interface-index": "3"}, "field 'interface-index': expected an"),
    ("PUT", "/endpoint/7", {"addressing": {"ipv4": 4}}, "field 'addressing.ipv4'"),
    ("PUT", "/endpoint/7", {"mac": "zz"}, "field 'mac'"),
    ("PUT", "/endpoint/7", {"labels": "app=x"}, "field 'labels'"),
    ("PUT", "/endpoint/7", {"colour": "red"}, "field 'colour': unknown field"),
    ("PUT", "/endpoint/7", None, "request body: missing"),
    ("PATCH", "/endpoint/7", {"interface-name": "a/b"}, "field 'interface-name'"),
    ("POST", "/ipam?family=ipv5", None, "query parameter 'family'"),
    ("DELETE", "/endpoint/7", {"x": 1}, "takes no request body"),
])
def test_bad_requests_get_400_with_the_reason_and_change_nothing(
    agent: AgentProc, method: str, target: str, body: Any, reason: str
) -> None:
    before = (agent.client.get("/endpoint"), agent.client.get("/ipam"))
    status, doc = _call(agent, method, target, body)
    assert status == 400 and reason in doc["error"], doc
    assert (agent.client.get("/endpoint"), agent.client.get("/ipam")) == before


def test_the_cli_prints_the_document(agent: AgentProc, capsys: pytest.CaptureFixture[str]
                                     ) -> None:
    code, out, _ = run_cli(capsys, "api", "openapi", "--socket", agent.socket)
    assert code == 0 and json.loads(out) == agent.client.get("/openapi.json")
    code, out, _ = run_cli(capsys, "api", "openapi", "--offline")
    assert code == 0 and json.loads(out) == json.loads(json.dumps(_document()))
    code, _, err = run_cli(capsys, "api", "openapi", "--socket", agent.socket + ".none")
    assert code == 2 and "no agent is running" in err
