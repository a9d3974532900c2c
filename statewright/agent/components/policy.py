"""The policy component: the policy tables, the policy writer and the ``/policy`` routes.

Needs ``db`` and ``endpoints`` (the endpoint manager: its ``identities`` and
``endpoints`` tables are the computation's inputs). Registers ``policies`` (the policy
objects), ``policy-entries`` and ``policy-endpoints`` (the computed policy,
tables/policy_entries.py), hands the policy kinds to the manifest source (when the agent
has one), reflects NetworkPolicies and CiliumNetworkPolicies from the API server (when the
``k8s`` component has a client; policy/k8s.py) and runs the `policy.writer.PolicyWriter`.
Provides ``policy`` (the writer). The ``policies`` table holds an initializer per source
(``manifests``, ``k8s``) until its initial state is in; the writer completes its own on
the output tables only then.

Routes:

* ``GET /policy``: the repository revision and every policy with its rules
  (``?endpoint=ID``: that endpoint's entries and enforcement instead);
* ``GET /policy/endpoints``: every endpoint's enforcement and policy revision;
* ``GET /policy/trace?from=LABELS&to=LABELS&port=P[/PROTO]``: whether traffic from
  endpoints labelled ``from`` to endpoints labelled ``to`` is allowed (egress at the
  source, ingress at the destination) and by which policies. Labels are comma-separated
  ``[source:]key=value`` (source ``k8s`` when missing); without a
  ``io.kubernetes.pod.namespace`` label, pod labels are in namespace ``default``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import anyio

from policy.errors import PolicyTraceError
from policy.model import PROTOCOLS, Policy
from policy.namespace_labels import unknown_namespaces, uses_namespace_labels
from policy.source import PolicyObjects, new_policies_table
from policy.verdict import evaluate_rules
from policy.writer import PolicyWriter
from statedb import DB, Table
from statewright.agent.components.endpoints import ENDPOINTS
from statewright.agent.components.kubernetes import K8S_CLIENT
from statewright.agent.components.policy_trace import TraceSide, datapath_notes, endpoint_side
from statewright.agent.components.sources import MANIFESTS
from statewright.agent.components.statedb import DATABASE
from statewright.api_types import ApiError, QueryParam, Request, Route
from statewright.component import DEGRADED, OK, Component, Health, Hive, Provided
from tables.endpoints import MAX_ENDPOINT_ID, MIN_ENDPOINT_ID
from tables.identities import POD_NAMESPACE_LABEL, Identity, normalize_labels
from tables.origins import origin_recorder
from tables.policy_entries import (
    PolicyEndpoint,
    PolicyEntry,
    new_policy_endpoints_table,
    new_policy_entries_table,
    policy_endpoint_id_index,
    policy_endpoint_index,
)

log = logging.getLogger("statewright.agent.policy")

#: How long `PolicyComponent.start` waits for the policy sources' initial state (seconds).
START_WAIT = 10.0


def parse_trace_labels(text: str, what: str) -> tuple[str, ...]:
    """Comma-separated labels of a trace request (see the module doc)."""
    items = [t.strip() for t in text.split(",") if t.strip()]
    if not items:
        raise PolicyTraceError("no labels given", obj="policy trace", field=what)
    raw = [i if ":" in i.partition("=")[0] else f"k8s:{i}" for i in items]
    try:
        labels = normalize_labels(raw)
    except ValueError as e:
        raise PolicyTraceError(str(e), obj="policy trace", field=what) from None
    if not any(label.startswith("reserved:") for label in labels) and not any(
        label.partition(":")[2].startswith(POD_NAMESPACE_LABEL + "=") for label in labels
    ):
        labels = tuple(sorted((*labels, f"k8s:{POD_NAMESPACE_LABEL}=default")))
    return labels


def parse_trace_port(text: str) -> tuple[int, int]:
    """``P`` or ``P/PROTO`` (TCP when missing; a name or a number) -> (protocol, port)."""
    port_s, _, proto_s = text.partition("/")
    try:
        port = int(port_s)
    except ValueError:
        raise PolicyTraceError(
            f"{port_s!r} is not a port", obj="policy trace", field="port"
        ) from None
    if not 0 <= port <= 65535:
        raise PolicyTraceError(f"port {port} is out of range", obj="policy trace", field="port")
    proto_s = proto_s or "TCP"
    if proto_s.upper() in PROTOCOLS:
        return PROTOCOLS[proto_s.upper()], port
    if proto_s.isdigit() and 0 <= int(proto_s) <= 255:
        return int(proto_s), port
    raise PolicyTraceError(f"{proto_s!r} is not a protocol", obj="policy trace", field="port")


def trace(
    policies: Sequence[Policy],
    src: tuple[str, ...] | TraceSide,
    dst: tuple[str, ...] | TraceSide,
    protocol: int,
    port: int,
) -> dict[str, Any]:
    """The trace document: egress at the source, ingress at the destination, the verdict
    (named ports resolve through the sides' ports: the destination's, in both
    directions)."""
    s = src if isinstance(src, TraceSide) else TraceSide(src)
    d = dst if isinstance(dst, TraceSide) else TraceSide(dst)
    rules = [r for p in policies for r in p.rules]
    egress = evaluate_rules(rules, s.labels, d.labels, egress=True, protocol=protocol,
                            port=port, peer_ports=d.ports)
    ingress = evaluate_rules(rules, d.labels, s.labels, egress=False, protocol=protocol,
                             port=port, subject_ports=d.ports)
    allowed = egress.allowed and ingress.allowed
    return {
        "from": list(s.labels),
        "to": list(d.labels),
        "protocol": protocol,
        "port": port,
        "verdict": "allowed" if allowed else "denied",
        "egress": egress.to_json(),
        "ingress": ingress.to_json(),
    }


_OFF = {503: "the policy component has not started"}
_ENDPOINT_PARAM = QueryParam("endpoint", {"type": "string", "pattern": "^[0-9]{1,9}$"},
                             "an endpoint id: its entries and enforcement instead")
_TRACE_PARAMS = (
    QueryParam("from", {"type": "string"}, "the source's labels, comma-separated"),
    QueryParam("to", {"type": "string"}, "the destination's labels, comma-separated"),
    QueryParam("from-pod", {"type": "string"}, "the source pod, NAMESPACE/NAME"),
    QueryParam("to-pod", {"type": "string"}, "the destination pod, NAMESPACE/NAME"),
    QueryParam("from-endpoint", {"type": "string", "pattern": "^[0-9]{1,9}$"},
               "the source endpoint's id"),
    QueryParam("to-endpoint", {"type": "string", "pattern": "^[0-9]{1,9}$"},
               "the destination endpoint's id"),
    QueryParam("port", {"type": "string"}, "PORT or PORT/PROTOCOL (TCP, UDP, SCTP, ANY)",
               required=True),
)
_POLICY_SCHEMA = {
    "type": "object",
    "required": ["revision"],
    "properties": {
        "revision": {"type": "integer"},
        "policies": {"type": "array", "items": {"type": "object"}},
        "endpoint": {"type": "integer"},
        "enforcement": {"type": "object", "nullable": True},
        "entries": {"type": "array", "items": {"type": "object"}},
    },
}
_ENDPOINTS_SCHEMA = {
    "type": "object",
    "required": ["revision", "endpoints", "ingress-datapath"],
    "properties": {
        "revision": {"type": "integer"},
        "endpoints": {"type": "array", "items": {"type": "object"}},
        # why this node's datapath does not enforce ingress rules (null: it does)
        "ingress-datapath": {"type": "string", "nullable": True},
    },
}
_VERDICT = {"type": "string", "enum": ["allowed", "denied"]}
_TRACE_SCHEMA = {
    "type": "object",
    "required": ["from", "to", "protocol", "port", "verdict", "egress", "ingress", "revision"],
    "properties": {
        "from": {"type": "array", "items": {"type": "string"}},
        "to": {"type": "array", "items": {"type": "string"}},
        "protocol": {"type": "integer"},
        "port": {"type": "integer"},
        "verdict": _VERDICT,
        "egress": {"type": "object", "properties": {"verdict": _VERDICT,
                                                    "datapath": {"type": "string"}}},
        "ingress": {"type": "object", "properties": {"verdict": _VERDICT,
                                                     "datapath": {"type": "string"}}},
        "from-endpoint": {"type": "object", "nullable": True},
        "to-endpoint": {"type": "object", "nullable": True},
        "revision": {"type": "integer"},
    },
}


#: The policy writer (its `synced_revision`: the policy-maps component's realized revisions).
POLICY: Provided[PolicyWriter] = Provided("policy", PolicyWriter)


class PolicyComponent(Component):
    """See the module doc."""

    name = "policy"
    needs = (DATABASE, ENDPOINTS)
    provides = (POLICY,)
    uses = (MANIFESTS, K8S_CLIENT)

    def __init__(self) -> None:
        self.db: DB | None = None
        self.writer: PolicyWriter | None = None
        self.policies: Table[Policy] | None = None
        self.entries: Table[PolicyEntry] | None = None
        self.policy_endpoints: Table[PolicyEndpoint] | None = None
        self.handler: PolicyObjects | None = None
        self.k8s: Any = None  # policy.k8s.PolicyK8sSource when the agent reads Kubernetes
        self.identities: Table[Identity] | None = None
        self.hive: Hive | None = None
        self.manager: Any = None  # the EndpointManager (trace by pod or endpoint)

    async def start(self, hive: Hive) -> None:
        """Register the tables, hand the policy kinds to the manifest source, start the
        writer (its first step computes everything already in the tables)."""
        db = hive.get(self, DATABASE)
        manager = hive.get(self, ENDPOINTS)
        self.db = db
        self.hive, self.manager = hive, manager
        self.identities = manager.identities.table
        self.policies = new_policies_table()
        self.entries = new_policy_entries_table()
        self.policy_endpoints = new_policy_endpoints_table()
        db.register(self.policies, self.entries, self.policy_endpoints)
        self.writer = PolicyWriter(
            db,
            identities=manager.identities.table,
            endpoints=manager.endpoints,
            policies=self.policies,
            entries=self.entries,
            policy_endpoints=self.policy_endpoints,
        )
        handler = PolicyObjects(self.policies, "manifests")
        self.handler = handler
        manifests = hive.find(self, MANIFESTS)
        if manifests is not None:
            with db.write_txn(self.policies) as txn:
                done = self.policies.register_initializer(txn, "manifests")

            def manifests_in() -> None:
                assert self.policies is not None
                with db.write_txn(self.policies) as wtxn:
                    done(wtxn)

            manifests.add_kind_handler(handler, on_synced=manifests_in)
        client = hive.find(self, K8S_CLIENT)
        if client is not None:
            from policy.k8s import PolicyK8sSource

            origins = origin_recorder(db)
            self.k8s = PolicyK8sSource(db, client, PolicyObjects(self.policies, "k8s", origins))
            with db.write_txn(self.policies) as txn:
                self.k8s.register_initializer(txn)
            await hive.spawn(self, self.k8s.run)
        await hive.spawn(self, self.writer.run)
        hive.provide(self, POLICY, self.writer)
        # Like the sources of the LB tables, start returns once the initial state is in:
        # the manifest source's next poll (at most its interval) and the writer's step.
        # Bounded: an API server that does not answer leaves the tables waiting, reported
        # by the statedb component's health.
        ready, watch = self.entries.initialized(db.read_txn())
        if not ready:
            with anyio.move_on_after(START_WAIT):
                await watch.wait_async()

    # ----- reporting ----------------------------------------------------------------------------
    def health(self) -> list[Health]:
        """OK with the number of policies, entries and the revision; one line per policy
        reflector when the agent reads Kubernetes (Degraded with refused objects)."""
        if self.writer is None or self.db is None or self.entries is None:
            return [Health(self.name, DEGRADED, "not started")]
        assert self.policies is not None
        txn = self.db.read_txn()
        out = [
            Health(
                self.name,
                OK,
                f"{self.policies.count(txn)} policies, {self.entries.count(txn)} entries, "
                f"revision {self.writer.revision}",
            )
        ]
        if self.k8s is not None:
            for name, ok, message in self.k8s.health():
                out.append(Health(f"{self.name}/{name}", OK if ok else DEGRADED, message))
        fail_closed = self._fail_closed_health(txn)
        if fail_closed is not None:
            out.append(fail_closed)
        unenforced = self._unenforced_ingress_health(txn)
        if unenforced is not None:
            out.append(unenforced)
        return out

    def ingress_datapath(self) -> str | None:
        """None when this node's tc programs enforce the endpoints' ingress rules (the
        ``endpoint-datapath`` component runs and is OK), else why they do not."""
        tc = self._component("endpoint-datapath")
        tc_health = tc.health() if tc is not None else []
        if tc_health and all(h.state == OK for h in tc_health):
            return None
        return tc_health[0].message if tc_health else "no tc programs (endpoint-datapath)"

    def _unenforced_ingress_health(self, txn: Any) -> Health | None:
        """``policy/ingress`` Degraded while policies select local endpoints for ingress
        that this node's datapath does not enforce: the rules are computed, the traffic
        is not filtered."""
        assert self.policy_endpoints is not None
        selected = sorted(e.endpoint_id for e in self.policy_endpoints.all(txn)
                          if e.ingress_enforced)
        if not selected:
            return None
        why = self.ingress_datapath()
        if why is None:
            return None
        more = f" and {len(selected) - 5} more" if len(selected) > 5 else ""
        return Health(
            f"{self.name}/ingress", DEGRADED,
            f"ingress rules of endpoint(s) {', '.join(map(str, selected[:5]))}{more} are "
            f"computed but not enforced on this node: {why}",
        )

    def _fail_closed_health(self, txn: Any) -> Health | None:
        """``policy/namespace-labels`` Degraded while a policy selects on namespace labels
        that some local pod's namespace does not have known (no Namespace object read):
        the namespaces and the policies, whose selectors fail closed for those pods."""
        assert self.policies is not None and self.identities is not None
        policies = sorted(p.key for p in self.policies.all(txn) if uses_namespace_labels(p))
        if not policies:
            return None
        namespaces = sorted(unknown_namespaces(self.identities.all(txn)))
        if not namespaces:
            return None
        return Health(
            f"{self.name}/namespace-labels", DEGRADED,
            f"labels of namespace(s) {', '.join(namespaces)} unknown (no Namespace object): "
            f"the namespace selectors of {', '.join(policies)} fail closed for their pods",
        )

    # ----- API --------------------------------------------------------------------------------
    def routes(self) -> Sequence[Route]:
        """``/policy``, ``/policy/endpoints``, ``/policy/trace`` (module doc)."""
        return (
            Route("/policy", self._get, query=(_ENDPOINT_PARAM,), response=_POLICY_SCHEMA,
                  errors={**_OFF, 400: "not an endpoint id"},
                  summary="the policies in force, or one endpoint's entries"),
            Route("/policy/endpoints", self._endpoints, response=_ENDPOINTS_SCHEMA,
                  errors=_OFF, summary="every endpoint's enforced directions and revision"),
            Route("/policy/trace", self._trace, query=_TRACE_PARAMS, response=_TRACE_SCHEMA,
                  errors={**_OFF, 400: "labels, port or protocol not understood"},
                  summary="whether traffic between two label sets is allowed"),
        )

    def _tables(self) -> tuple[DB, Table[Policy], Table[PolicyEntry], Table[PolicyEndpoint]]:
        if (
            self.db is None
            or self.policies is None
            or self.entries is None
            or self.policy_endpoints is None
        ):
            raise ApiError(503, "the policy component has not started")
        return self.db, self.policies, self.entries, self.policy_endpoints

    def _revision(self) -> int:
        return self.writer.revision if self.writer is not None else 0

    async def _get(self, req: Request) -> Any:
        db, policies, entries, endpoints = self._tables()
        txn = db.read_txn()
        ep_s = req.query.get("endpoint")
        if ep_s is None:
            return {
                "revision": self._revision(),
                "policies": [p.to_json() for p in policies.all(txn)],
            }
        ep = int(ep_s) if ep_s.isdigit() else -1
        if not MIN_ENDPOINT_ID <= ep <= MAX_ENDPOINT_ID:
            raise ApiError(400, f"endpoint: {ep_s!r} is not an endpoint id "
                                f"({MIN_ENDPOINT_ID}-{MAX_ENDPOINT_ID})")
        enf = endpoints.get(txn, policy_endpoint_id_index.query(ep))
        return {
            "revision": self._revision(),
            "endpoint": ep,
            "enforcement": enf.to_json() if enf is not None else None,
            "entries": [e.to_json() for e in entries.list(txn, policy_endpoint_index.query(ep))],
        }

    async def _endpoints(self, req: Request) -> Any:
        db, _, _, endpoints = self._tables()
        realized: dict[int, int] = getattr(self._component("policy-maps"), "realized", {})
        return {
            "revision": self._revision(),
            "endpoints": [
                {**e.to_json(), "realized-revision": realized.get(e.endpoint_id)}
                for e in endpoints.all(db.read_txn())
            ],
            "ingress-datapath": self.ingress_datapath(),
        }

    def _component(self, name: str) -> Component | None:
        """The agent's later component ``name`` (None when it has none or this one is not
        started), read at request time: it starts after this one, so it cannot be a need."""
        if self.hive is None:
            return None
        return next((c for c in self.hive.components if c.name == name), None)

    def _side(self, req: Request, which: str) -> TraceSide:
        """One side of a trace request: labels, a pod or an endpoint (exactly one)."""
        given = [k for k in (which, f"{which}-pod", f"{which}-endpoint") if req.query.get(k)]
        if len(given) != 1:
            raise PolicyTraceError(
                f"give one of {which}, {which}-pod, {which}-endpoint", obj="policy trace",
                field=which,
            )
        if given[0] == which:
            return TraceSide(parse_trace_labels(req.query[which], which))
        if self.manager is None:
            raise PolicyTraceError("no endpoints", obj="policy trace", field=given[0])
        return endpoint_side(self.manager, req.query[given[0]], given[0])

    async def _trace(self, req: Request) -> Any:
        db, policies, _, _ = self._tables()
        try:
            src, dst = self._side(req, "from"), self._side(req, "to")
            protocol, port = parse_trace_port(req.query.get("port", ""))
        except PolicyTraceError as e:
            raise ApiError(400, str(e)) from None
        doc = trace(list(policies.all(db.read_txn())), src, dst, protocol, port)
        doc["revision"] = self._revision()
        doc["from-endpoint"], doc["to-endpoint"] = src.describe(), dst.describe()
        why_not = self.ingress_datapath()
        maps = self._component("policy-maps")
        has_maps = maps is not None and getattr(maps, "policy_maps", None) is not None
        doc["egress"]["datapath"], doc["ingress"]["datapath"] = datapath_notes(
            src, dst, has_maps, why_not)
        return doc
