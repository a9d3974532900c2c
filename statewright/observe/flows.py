"""Datapath events as flows: enriched from statedb and written with Hubble's field names.

`Enricher.flow(raw)` turns a `bpf.events.RawEvent` into a flow document as ``hubble
observe -o json`` prints one (``time``, ``verdict``, ``drop_reason_desc``, ``IP.source``
and ``destination``, ``l4.TCP``/``UDP`` ports, ``source``/``destination`` with
``identity``, ``namespace``, ``pod_name`` and ``labels``, ``traffic_direction``,
``node_name``, ``Type``, ``event_type``), plus ``destination_service`` for a service
translation and ``policy_lpm_prefix_length`` for a policy decision. The endpoint, pod,
namespace and labels come from the endpoints and identities tables, the service from the
frontends table, each read in one snapshot per event.

`FlowFilter` selects flows as ``statewright monitor`` asks (pod, namespace, identity,
verdict, type); `flow_line` is the human form.
"""

from __future__ import annotations

import datetime
import ipaddress
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from bpf import events as ev
from statedb import DB, ReadTxn, Table
from tables.endpoints import Endpoint, endpoint_id_index, endpoint_ip_index
from tables.frontends import Frontend, frontend_address_index
from tables.identities import Identity, identity_id_index
from tables.l3n4 import L3n4Addr

#: Cilium's drop reason names, as Hubble's ``drop_reason_desc`` spells them.
DROP_REASON_NAMES = {
    133: "POLICY_DENIED",
    134: "INVALID_PACKET_DROPPED",
    135: "CT_TRUNCATED_OR_INVALID_HEADER",
    141: "ERROR_WRITING_TO_PACKET",
    153: "CSUM_L3_ERROR",
    154: "CSUM_L4_ERROR",
    155: "CT_MAP_INSERTION_FAILED",
    158: "SERVICE_BACKEND_NOT_FOUND",
    167: "SNAT_NO_MAP_FOUND",
    177: "NOT_IN_SRC_RANGE",
    181: "POLICY_DENY",
}
#: Hubble's event types: drop, trace, policy verdict.
EVENT_TYPE_NUMBERS = {ev.EVENT_DROP: 1, ev.EVENT_TRACE: 4, ev.EVENT_POLICY: 5}
#: ``monitor --type`` words.
TYPE_WORDS = {ev.EVENT_DROP: "drop", ev.EVENT_POLICY: "policy", ev.EVENT_TRACE: "trace"}
PROTO_NAMES = {6: "TCP", 17: "UDP", 132: "SCTP", 1: "ICMPv4", 58: "ICMPv6"}
DIRECTIONS = {1: "INGRESS", 2: "EGRESS"}

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


@dataclass(slots=True)
class EnrichTables:
    """The tables enrichment reads (any may be missing: fields then stay empty)."""

    endpoints: Table[Endpoint] | None = None
    identities: Table[Identity] | None = None
    frontends: Table[Frontend] | None = None


def _time(ts_ns: int, mono_to_wall: float) -> str:
    t = ts_ns / 1e9 + mono_to_wall
    dt = datetime.datetime.fromtimestamp(t, datetime.UTC)
    return dt.strftime("%Y-%m-%dT%H:%M:%S.%f") + "000Z"


class Enricher:
    """Turns raw events into flow documents (see the module doc)."""

    def __init__(self, db: DB, tables: EnrichTables, node_name: str) -> None:
        self.db = db
        self.tables = tables
        self.node_name = node_name
        # bpf_ktime_get_ns is CLOCK_MONOTONIC: wall = monotonic + this offset.
        self.mono_to_wall = time.time() - time.monotonic()
        # Lookups of the current table revisions (a flood repeats the same peers): cleared
        # whenever one of the tables changed.
        self._revisions: tuple[int, ...] = ()
        self._by_ip: dict[IPAddress, Endpoint | None] = {}
        self._label_cache: dict[int, list[str]] = {}

    def _fresh(self, txn: ReadTxn) -> None:
        revs = tuple(t.revision(txn) for t in (self.tables.endpoints, self.tables.identities,
                                                self.tables.frontends) if t is not None)
        if revs != self._revisions:
            self._revisions = revs
            self._by_ip.clear()
            self._label_cache.clear()

    def _endpoint_by_id(self, txn: ReadTxn, ep_id: int) -> Endpoint | None:
        t = self.tables.endpoints
        if t is None or not ep_id:
            return None
        return t.get(txn, endpoint_id_index.query(ep_id))

    def _endpoint_by_ip(self, txn: ReadTxn, ip: IPAddress) -> Endpoint | None:
        t = self.tables.endpoints
        if t is None or ip.is_unspecified:
            return None
        if ip in self._by_ip:
            return self._by_ip[ip]
        if len(self._by_ip) > 4096:
            self._by_ip.clear()
        found = self._by_ip[ip] = next(iter(t.list(txn, endpoint_ip_index.query(ip))), None)
        return found

    def _labels(self, txn: ReadTxn, identity: int) -> list[str]:
        t = self.tables.identities
        if t is None or not identity:
            return []
        cached = self._label_cache.get(identity)
        if cached is None:
            row = t.get(txn, identity_id_index.query(identity))
            cached = self._label_cache[identity] = list(row.labels) if row is not None else []
        return list(cached)

    def _peer(self, txn: ReadTxn, ep: Endpoint | None, identity: int) -> dict[str, Any]:
        if ep is not None and not identity:
            identity = ep.identity
        out: dict[str, Any] = {"identity": identity}
        if ep is not None:
            out["ID"] = ep.id
            if ep.pod_name:
                out["namespace"] = ep.pod_namespace
                out["pod_name"] = ep.pod_name
        out["labels"] = self._labels(txn, identity)
        return out

    def _service(self, txn: ReadTxn, raw: ev.RawEvent) -> dict[str, str] | None:
        """The service of the event's frontend (a translation's, or a drop's when the
        program named the frontend): its own row, else for a node address the NodePort
        row it expands (``0.0.0.0:<port>``)."""
        t = self.tables.frontends
        if t is None or (raw.type != ev.EVENT_TRACE and not raw.orig_dport):
            return None
        proto = PROTO_NAMES.get(raw.proto, "ANY")
        if proto not in ("TCP", "UDP", "SCTP"):
            proto = "ANY"
        addr = raw.orig_daddr
        fe = t.get(txn, frontend_address_index.query(L3n4Addr(addr, raw.orig_dport, proto)))
        if fe is None and raw.source == ev.SOURCE_NODEPORT:
            unspec = ipaddress.ip_address("::" if addr.version == 6 else "0.0.0.0")
            fe = t.get(txn, frontend_address_index.query(
                L3n4Addr(unspec, raw.orig_dport, proto)))
        if fe is None:
            return None
        ns, _, name = fe.service_name.rpartition("/")
        return {"name": name, "namespace": ns}

    def flow(self, raw: ev.RawEvent) -> dict[str, Any]:
        """The flow document of one event."""
        txn = self.db.read_txn()
        self._fresh(txn)
        local = self._endpoint_by_id(txn, raw.endpoint_id)
        saddr = raw.saddr
        if raw.source == 2 and local is not None and saddr.is_unspecified:
            # A connect() has no source address yet: the endpoint's own.
            own = [a for a in local.addresses() if a.version == raw.family]
            saddr = own[0] if own else saddr
        src_ep = self._endpoint_by_ip(txn, saddr) or (local if raw.direction == 2 else None)
        dst_ep = self._endpoint_by_ip(txn, raw.daddr) or (local if raw.direction == 1 else None)
        src_id = raw.src_identity or (src_ep.identity if src_ep is not None else 0)
        dst_id = raw.dst_identity or (dst_ep.identity if dst_ep is not None else 0)
        verdict = "DROPPED" if raw.verdict == ev.VERDICT_DROPPED else (
            "TRANSLATED" if raw.type == ev.EVENT_TRACE else "FORWARDED")
        flow: dict[str, Any] = {
            "time": _time(raw.ts_ns, self.mono_to_wall),
            "verdict": verdict,
            "IP": {"source": str(saddr), "destination": str(raw.daddr),
                   "ipVersion": "IPv4" if raw.family == 4 else "IPv6"},
            "source": self._peer(txn, src_ep, src_id),
            "destination": self._peer(txn, dst_ep, dst_id),
            "Type": "SOCK" if raw.source == 2 else "L3_L4",
            "node_name": self.node_name,
            "event_type": {"type": EVENT_TYPE_NUMBERS.get(raw.type, 0)},
            "traffic_direction": DIRECTIONS.get(raw.direction, "TRAFFIC_DIRECTION_UNKNOWN"),
            "is_reply": False,
            "Summary": "",
        }
        proto = PROTO_NAMES.get(raw.proto)
        if proto in ("TCP", "UDP", "SCTP"):
            flow["l4"] = {proto: {"source_port": raw.sport, "destination_port": raw.dport}}
        elif proto:
            flow["l4"] = {proto: {}}
        if raw.type == ev.EVENT_DROP:
            flow["drop_reason"] = raw.reason
            flow["drop_reason_desc"] = DROP_REASON_NAMES.get(raw.reason, str(raw.reason))
            flow["event_type"]["sub_type"] = raw.reason
        if raw.lpm != ev.NO_LPM and raw.type != ev.EVENT_TRACE:
            flow["policy_lpm_prefix_length"] = raw.lpm
        svc = self._service(txn, raw)
        if raw.type == ev.EVENT_TRACE or raw.orig_dport:
            flow["destination_service"] = svc or {}
            fe_addr = raw.orig_daddr
            flow["service_frontend"] = (f"[{fe_addr}]:{raw.orig_dport}" if fe_addr.version == 6
                                        else f"{fe_addr}:{raw.orig_dport}")
        flow["Summary"] = summary(flow)
        flow["statewright"] = {"type": TYPE_WORDS.get(raw.type, "unknown"),
                               "observed_by": ev.SOURCE_NAMES.get(raw.source, "?")}
        return flow


def _who(peer: Mapping[str, Any], ip: str, port: int | None) -> str:
    where = f"{ip}:{port}" if port is not None else ip
    if peer.get("pod_name"):
        return f"{peer['namespace']}/{peer['pod_name']} ({where})"
    return where


def _ports(flow: Mapping[str, Any]) -> tuple[int | None, int | None]:
    for v in (flow.get("l4") or {}).values():
        if "source_port" in v:
            return v["source_port"], v["destination_port"]
    return None, None


def summary(flow: Mapping[str, Any]) -> str:
    """One line: what happened to which flow."""
    sport, dport = _ports(flow)
    proto = next(iter(flow.get("l4") or {"?": 0}))
    src = _who(flow["source"], flow["IP"]["source"], sport)
    dst = _who(flow["destination"], flow["IP"]["destination"], dport)
    kind = flow.get("statewright", {}).get("type", "")
    if flow["verdict"] == "DROPPED":
        what = f"DROPPED ({flow.get('drop_reason_desc', '?')})"
    elif flow["verdict"] == "TRANSLATED":
        svc = flow.get("destination_service") or {}
        name = f"{svc.get('namespace')}/{svc.get('name')}" if svc else "?"
        what = f"TRANSLATED {flow.get('service_frontend')} (service {name}) ->"
        return f"{what} {dst} for {src} {proto}"
    else:
        what = "FORWARDED" + (" policy-verdict" if kind == "policy" else "")
    lpm = flow.get("policy_lpm_prefix_length")
    extra = f" lpm={lpm}" if lpm is not None else ""
    return (f"{what} {flow.get('traffic_direction', '').lower()} {src} -> {dst} {proto} "
            f"identity {flow['source']['identity']}->{flow['destination']['identity']}"
            f"{extra}")


def flow_line(flow: Mapping[str, Any]) -> str:
    """The human line of a flow: time, node, summary."""
    return f"{flow['time']} [{flow['node_name']}] {flow['Summary']}"


@dataclass(frozen=True, slots=True)
class FlowFilter:
    """What ``monitor`` shows: all given conditions must hold (a pod or namespace on
    either side; a pod as ``name`` or ``namespace/name``)."""

    pods: tuple[str, ...] = ()
    namespaces: tuple[str, ...] = ()
    identities: tuple[int, ...] = ()
    verdicts: tuple[str, ...] = ()
    types: tuple[str, ...] = ()

    @classmethod
    def from_query(cls, query: Mapping[str, str]) -> FlowFilter:
        """From the API's query parameters (comma-separated lists)."""
        def items(name: str) -> tuple[str, ...]:
            return tuple(x for x in query.get(name, "").split(",") if x)

        return cls(items("pod"), items("namespace"),
                   tuple(int(x) for x in items("identity")),
                   tuple(x.upper() for x in items("verdict")),
                   tuple(x.lower() for x in items("type")))

    def matches(self, flow: Mapping[str, Any]) -> bool:
        """Whether ``flow`` passes."""
        peers = (flow["source"], flow["destination"])
        if self.pods and not any(
            p.get("pod_name") and (p["pod_name"] in self.pods
                                   or f"{p.get('namespace')}/{p['pod_name']}" in self.pods)
            for p in peers
        ):
            return False
        if self.namespaces and not any(p.get("namespace") in self.namespaces for p in peers):
            return False
        if self.identities and not any(p.get("identity") in self.identities for p in peers):
            return False
        if self.verdicts and flow["verdict"] not in self.verdicts:
            return False
        kind = flow.get("statewright", {}).get("type")
        return not (self.types and kind not in self.types)
