"""``db/show TABLE -f json`` of the runner and the agent's ``statewright db show -o json``
(the API's ``/tables/NAME``) print the same documents: both come from the rows'
``to_json``. The shape is the one marshalling.txtar expects of the load-balancer tables
(see docs/conformance.md for why it is not newer Cilium's flat shape)."""

from __future__ import annotations

import json

from sources.k8s_convert import K8sConverter
from statedb import DB, show
from statewright.agent.components.statedb import row_document
from tables.lb_config import LBConfig
from tables.lb_writer import LBWriter


def _documents(text: str) -> list[object]:
    """The JSON documents of ``db/show -f json`` output (one after the other)."""
    decoder = json.JSONDecoder()
    out: list[object] = []
    pos = 0
    while text[pos:].strip():
        while text[pos].isspace():
            pos += 1
        doc, pos = decoder.raw_decode(text, pos)
        out.append(doc)
    return out


def test_runner_and_agent_print_the_same_json() -> None:
    db = DB()
    writer = LBWriter.create(db, LBConfig(node_name="testnode"))
    conv = K8sConverter(writer)
    with writer.write_txn() as txn:
        conv.upsert(txn, {
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "echo", "namespace": "test"},
            "spec": {"clusterIP": "10.96.0.1",
                     "ports": [{"name": "http", "port": 80, "protocol": "TCP"}]},
        })
        conv.upsert(txn, {
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": "echo-1", "namespace": "test",
                         "labels": {"kubernetes.io/service-name": "echo"}},
            "addressType": "IPv4",
            "endpoints": [{"addresses": ["10.244.0.1"], "nodeName": "n1"}],
            "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
        })
    snapshot = db.read_txn()
    for table in (writer.services, writer.frontends, writer.backends):
        rows = list(table.all(snapshot))
        assert rows, table.name
        runner = _documents(show.format_json(rows))
        agent = [row_document(r) for r in rows]
        assert runner == agent, table.name
