"""`explain` on policy maps: an entry back to its policy, rule and pod (with the policy's
manifest line), and a hypothesis property that entry -> objects inverts object -> entries
for random policy entries of random endpoints."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bpf.policy import policy_map_name
from policy.source import PolicyObjects, new_policies_table
from statewright.observe.provenance import EndpointView, ObjectRef, PolicyView, Provenance
from tables.endpoint_entries import new_endpoint_map_table
from tables.endpoints import Endpoint, new_endpoints_table
from tables.origins import SOURCE_MANIFESTS, OriginRecorder, new_origins_table
from tables.policy_entries import PolicyEntry, PolicyKey
from tests.policy_datapath.test_policy_ops import Harness

POLICIES = ("deny-all", "allow-web", "allow-db")


def netpol(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": {"name": name, "namespace": "ns"},
        "spec": {"podSelector": {"matchLabels": {"app": "web"}}, "policyTypes": ["Ingress"],
                 "ingress": [{"ports": [{"port": 80, "protocol": "TCP"}]}]},
    }


class PolicySystem:
    def __init__(self) -> None:
        self.h = Harness("memory")
        db = self.h.db
        self.policies = new_policies_table()
        self.origins = new_origins_table()
        self.endpoints = new_endpoints_table()
        self.map_rows = new_endpoint_map_table()
        db.register(self.policies, self.origins, self.endpoints, self.map_rows)
        handler = PolicyObjects(self.policies, SOURCE_MANIFESTS)
        rec = OriginRecorder(self.origins)
        with db.write_txn(self.policies, self.origins, self.endpoints) as txn:
            for i, name in enumerate(POLICIES):
                handler.upsert(txn, netpol(name))
                rec.record(txn, netpol(name), SOURCE_MANIFESTS, file="/m/pol.yaml",
                           line=1 + 12 * i)
            for ep_id, pod in ((7, "web"), (8, "db")):
                self.endpoints.insert(txn, Endpoint(id=ep_id, pod_name=pod, pod_namespace="ns"))

    def put(self, rows: list[PolicyEntry]) -> None:
        for r in rows:
            self.h.maps.ensure(r.key.endpoint_id)
        self.h.put(*rows)
        txn = self.h.db.read_txn()
        for r in self.h.table.all(txn):
            self.h.ops.update(txn, 0, r)

    def provenance(self) -> Provenance:
        return Provenance(
            self.h.db, self.origins, None,
            PolicyView(self.h.table, self.policies, self.h.maps),
            EndpointView(self.endpoints, self.map_rows, None),
        )


def test_a_policy_entry_explains_to_its_policy_rule_and_pod() -> None:
    sys = PolicySystem()
    row = PolicyEntry(PolicyKey(7, 0, False, 6, 80, 16), rules=("ns/allow-web",))
    sys.put([row])
    prov = sys.provenance()
    out = prov.explain_entry(policy_map_name(7), "0/ingress/TCP/80/16")
    assert out["present"]
    objs = {(o["kind"], o["name"]): o for o in out["objects"]}
    assert objs[("NetworkPolicy", "allow-web")]["line"] == 13
    assert objs[("NetworkPolicy", "allow-web")]["file"] == "/m/pol.yaml"
    assert ("Pod", "web") in objs
    assert out["rules"][0]["policy"] == "NetworkPolicy/ns/allow-web"
    assert out["rules"][0]["rules"][0]["direction"] == "ingress"
    assert {r["table"] for r in out["rows"]} == {"policy-entries", "endpoints"}
    listed = prov.describe_object("policy", "ns", "allow-web")["entries"]
    assert [e["map"] for e in listed] == [policy_map_name(7)]
    pod = prov.describe_object("pod", "ns", "web")["entries"]
    # Its entry in the hash of maps too (the socket program finds the map through it).
    assert [e["map"] for e in pod] == ["policy_maps", policy_map_name(7)]


keys = st.builds(
    PolicyKey,
    endpoint_id=st.sampled_from([7, 8]),
    identity=st.sampled_from([0, 1001, 1002]),
    egress=st.booleans(),
    protocol=st.sampled_from([0, 6, 17]),
    dport=st.sampled_from([0, 80, 443]),
    port_prefix_len=st.sampled_from([0, 16]),
).map(lambda k: k if k.protocol and k.port_prefix_len else PolicyKey(
    k.endpoint_id, k.identity, k.egress, k.protocol, 0, 0))
rows = st.lists(
    st.builds(PolicyEntry, key=keys, deny=st.booleans(),
              rules=st.lists(st.sampled_from([f"ns/{p}" for p in POLICIES]), min_size=1,
                             max_size=3, unique=True).map(tuple)),
    max_size=12, unique_by=lambda r: r.key)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows)
def test_policy_entries_invert(entries: list[PolicyEntry]) -> None:
    sys = PolicySystem()
    sys.put(entries)
    prov = sys.provenance()
    objects = [ObjectRef("NetworkPolicy", "ns", p) for p in POLICIES]
    objects += [ObjectRef("Pod", "ns", "web"), ObjectRef("Pod", "ns", "db")]
    forward = {}
    for ep in (7, 8):
        m = sys.h.maps.get(ep)
        for k, _ in (m.dump() if m is not None else []):
            forward[(policy_map_name(ep), k)] = prov.objects_of_entry(policy_map_name(ep), k)
    assert len(forward) == len(entries)
    for obj in objects:
        kind = "pod" if obj.kind == "Pod" else "policy"
        listed = {(e.map, e.key) for e in prov.entries_of(kind, obj.namespace, obj.name)}
        for entry, owners in forward.items():
            assert (obj in owners) == (entry in listed), (obj, entry, owners)
