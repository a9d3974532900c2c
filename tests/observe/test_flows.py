"""Events to flows without a kernel: the record layout round-trips, enrichment fills
Hubble's fields from the tables, filters select, and the flow log keeps the last N and
never blocks on a slow subscriber."""

from __future__ import annotations

import ipaddress
import time
from typing import Any

import anyio

from bpf import events as ev
from statedb import DB
from statewright.observe.flows import Enricher, EnrichTables, FlowFilter, flow_line
from statewright.observe.monitor import SUBSCRIBER_BUFFER, FlowLog
from tables.endpoints import Endpoint, new_endpoints_table
from tables.frontends import SVCType, new_frontend, new_frontends_table
from tables.identities import Identity, new_identities_table
from tables.l3n4 import L3n4Addr

IP = ipaddress.IPv4Address


def _raw(**kw: Any) -> ev.RawEvent:
    base: dict[str, Any] = dict(
        ts_ns=time.monotonic_ns(), type=ev.EVENT_DROP, verdict=ev.VERDICT_DROPPED, reason=133,
        direction=1, family=4, proto=6, lpm=ev.NO_LPM, source=1, src_identity=0,
        dst_identity=0, endpoint_id=7, sport=40000, dport=8080, orig_dport=0,
        saddr=IP("10.0.0.2"), daddr=IP("10.0.0.1"), orig_daddr=IP("0.0.0.0"))
    base.update(kw)
    return ev.RawEvent(**base)


def _enricher() -> Enricher:
    eps, ids, fes = new_endpoints_table(), new_identities_table(), new_frontends_table()
    db = DB(eps, ids, fes)
    from reconciler.status import status_pending

    with db.write_txn(eps, ids, fes) as txn:
        eps.insert(txn, Endpoint(id=7, pod_name="server", pod_namespace="web", identity=1001,
                                 ipv4=IP("10.0.0.1")))
        eps.insert(txn, Endpoint(id=8, pod_name="client", pod_namespace="web", identity=1002,
                                 ipv4=IP("10.0.0.2")))
        ids.insert(txn, Identity(1001, ("k8s:app=server",)))
        ids.insert(txn, Identity(1002, ("k8s:app=client",)))
        fes.insert(txn, new_frontend(L3n4Addr(IP("10.96.0.5"), 80, "TCP"), SVCType.CLUSTER_IP,
                                     "web/svc", "", 0, None, (), 0, None, status_pending()))
        txn.commit()
    return Enricher(db, EnrichTables(eps, ids, fes), "node-1")


def test_records_round_trip() -> None:
    raw = _raw(lpm=24, orig_daddr=IP("10.96.0.5"), orig_dport=80)
    assert len(ev.encode(raw)) == ev.EVENT_SIZE
    assert ev.decode(ev.encode(raw)) == raw


def test_a_drop_is_enriched_with_hubbles_field_names() -> None:
    flow = _enricher().flow(_raw())
    assert flow["verdict"] == "DROPPED" and flow["drop_reason_desc"] == "POLICY_DENIED"
    assert flow["IP"] == {"source": "10.0.0.2", "destination": "10.0.0.1",
                          "ipVersion": "IPv4"}
    assert flow["l4"] == {"TCP": {"source_port": 40000, "destination_port": 8080}}
    assert flow["source"]["pod_name"] == "client" and flow["source"]["identity"] == 1002
    assert flow["destination"]["namespace"] == "web"
    assert flow["destination"]["labels"] == ["k8s:app=server"]
    assert flow["traffic_direction"] == "INGRESS" and flow["node_name"] == "node-1"
    assert flow["Type"] == "L3_L4" and flow["event_type"] == {"type": 1, "sub_type": 133}
    assert flow["time"].endswith("Z")
    assert "DROPPED (POLICY_DENIED)" in flow_line(flow)


def test_a_translation_names_service_and_backend() -> None:
    raw = _raw(type=ev.EVENT_TRACE, verdict=ev.VERDICT_FORWARDED, reason=0, direction=2,
               source=2, endpoint_id=8, saddr=IP("0.0.0.0"), daddr=IP("10.0.0.1"),
               orig_daddr=IP("10.96.0.5"), orig_dport=80, sport=0)
    flow = _enricher().flow(raw)
    assert flow["verdict"] == "TRANSLATED" and flow["Type"] == "SOCK"
    assert flow["destination_service"] == {"name": "svc", "namespace": "web"}
    assert flow["IP"]["source"] == "10.0.0.2"  # the connecting endpoint's own address
    assert flow["source"]["pod_name"] == "client"
    assert flow["destination"]["pod_name"] == "server"


def test_filters() -> None:
    flow = _enricher().flow(_raw())
    assert FlowFilter(pods=("client",)).matches(flow)
    assert FlowFilter(pods=("web/server",)).matches(flow)
    assert not FlowFilter(pods=("other",)).matches(flow)
    assert FlowFilter(namespaces=("web",), identities=(1001,)).matches(flow)
    assert not FlowFilter(verdicts=("FORWARDED",)).matches(flow)
    assert FlowFilter(types=("drop",)).matches(flow)
    assert not FlowFilter.from_query({"type": "trace"}).matches(flow)


def test_the_log_keeps_the_last_n_and_counts_what_a_slow_subscriber_misses() -> None:
    async def main() -> None:
        enricher = _enricher()
        flog = FlowLog(keep=10)
        kept, recv, send = flog.subscribe(FlowFilter())
        assert kept == []
        flows = [enricher.flow(_raw(sport=i)) for i in range(SUBSCRIBER_BUFFER + 5)]
        flog.add(flows)
        assert len(flog.recent) == 10 and flog.recent[-1]["l4"]["TCP"]["source_port"] == (
            SUBSCRIBER_BUFFER + 4)
        assert flog.counters.subscriber_overflow == 5
        assert flog.counters.drops[("POLICY_DENIED", "ingress")] == SUBSCRIBER_BUFFER + 5
        first = await recv.receive()
        assert first["l4"]["TCP"]["source_port"] == 0
        flog.unsubscribe(send)
        assert flog.subscribers == 0

    anyio.run(main)


def test_the_prometheus_collector_names_the_counters() -> None:
    from statewright.observe.monitor import MonitorCollector

    flog = FlowLog()
    flog.add([_enricher().flow(_raw())])
    families = {f.name: f for f in MonitorCollector(
        flog, lambda: {"rate_limit": 3, "ring_full": 0}).collect()}
    drops = families["statewright_drop_count"].samples
    assert drops[0].labels == {"reason": "POLICY_DENIED", "direction": "ingress"}
    assert drops[0].value == 1
    lost = {s.labels["cause"]: s.value for s in families["statewright_monitor_lost_events"].samples
            if s.name.endswith("_total")}
    assert lost == {"rate_limit": 3, "ring_full": 0, "subscriber_overflow": 0}
    assert families["statewright_policy_verdicts"].samples[0].labels["action"] == "denied"
