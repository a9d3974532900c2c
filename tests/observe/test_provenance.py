"""`statewright explain`'s two directions on random LB tables: an object's entries name
the object, and every object an entry names lists the entry (hypothesis), plus the
origins the sources record and the key forms people copy."""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bpfops.lb_maps import (
    AFFINITY_MATCH,
    BACKENDS4,
    MAGLEV4,
    REVNAT4,
    SERVICES4,
    SRCRANGE4,
)
from statedb import InputError
from statewright.observe.provenance import LBView, ObjectRef, Provenance
from tables.origins import SOURCE_K8S, OriginRecorder
from tests.bpfops.test_lb_properties import SERVICES, System, batches

KIND_WORD = {"Service": "service", "Pod": "pod"}


#: Per service, whether it asks for ClientIP session affinity and its source ranges.
Extras = dict[str, tuple[bool, tuple[str, ...]]]
RANGES = ((), ("10.0.0.0/8",), ("192.168.0.0/16", "10.1.0.0/16"))
extras = st.dictionaries(st.sampled_from(SERVICES),
                         st.tuples(st.booleans(), st.sampled_from(RANGES)))


def decorate(obj: dict[str, Any], ext: Extras) -> dict[str, Any]:
    """``obj`` with its service's affinity and source ranges of ``ext`` (a Service)."""
    name = obj.get("metadata", {}).get("name", "")
    if obj.get("kind") != "Service" or name not in ext:
        return obj
    affinity, ranges = ext[name]
    out = copy.deepcopy(obj)
    if affinity:
        out["spec"]["sessionAffinity"] = "ClientIP"
    if ranges:
        out["spec"]["loadBalancerSourceRanges"] = list(ranges)
    return out


class OriginSystem(System):
    """The LB property test's system, recording origins as the sources do."""

    def __init__(self, ext: Extras | None = None) -> None:
        super().__init__()
        self.ext: Extras = ext or {}

    def apply(self, batch: list[tuple[str, Any]]) -> None:
        batch = [(op, decorate(obj, self.ext) if op != "zone" else obj) for op, obj in batch]
        checkpoint = self.conv.checkpoint()
        assert self.writer.origins is not None
        rec = OriginRecorder(self.writer.origins)
        try:
            with self.writer.write_txn() as txn:
                for op, obj in batch:
                    if op == "zone":
                        labels = {"topology.kubernetes.io/zone": obj} if obj else {}
                        self.writer.set_node_labels(txn, labels)
                    elif op == "upsert":
                        self.conv.upsert(txn, copy.deepcopy(obj))
                        rec.record(txn, obj, SOURCE_K8S)
                    else:
                        self.conv.delete(txn, copy.deepcopy(obj))
                        rec.forget(txn, obj)
        except InputError:
            self.conv.rollback(checkpoint)

    def provenance(self) -> Provenance:
        w = self.writer
        return Provenance(
            self.db, w.origins,
            LBView(w.services, w.frontends, w.backends, w.node_addresses, self.maps),
        )


def map_entries(sys: System) -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    out += [(SERVICES4, k) for k, _ in sys.maps.svc4.dump()]
    out += [(BACKENDS4, k) for k, _ in sys.maps.be4.dump()]
    out += [(REVNAT4, k) for k, _ in sys.maps.rev4.dump()]
    out += [(AFFINITY_MATCH, k) for k, _ in sys.maps.aff_match.dump()]
    out += [(SRCRANGE4, k) for k, _ in sys.maps.src4.dump()]
    out += [(MAGLEV4, k) for k, _ in sys.maps.maglev_tables(False)]
    return out


def check_inverse(sys: OriginSystem) -> None:
    prov = sys.provenance()
    objects: set[ObjectRef] = {ObjectRef("Service", "ns", s) for s in SERVICES}
    objects.add(ObjectRef("Pod", "ns", "hp"))
    forward: dict[tuple[str, Any], list[ObjectRef]] = {}
    for name, key in map_entries(sys):
        found = prov.objects_of_entry(name, key)
        owners = [o for o in found if o.kind in KIND_WORD]
        assert owners, f"{name} {key}: no object"
        forward[(name, key)] = owners
    for obj in objects:
        entries = prov.entries_of(KIND_WORD[obj.kind], obj.namespace, obj.name)
        for e in entries:
            assert obj in forward.get((e.map, e.key), []), (
                f"{obj.key} lists {e.map} {e.key}, whose objects are "
                f"{forward.get((e.map, e.key))}")
        listed = {(e.map, e.key) for e in entries}
        for entry, owners in forward.items():
            if obj in owners:
                assert entry in listed, f"{entry} names {obj.key}, which does not list it"


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(batches, extras)
def test_entry_to_rows_inverts_object_to_entries(batch_list: list[list[Any]],
                                                 ext: Extras) -> None:
    """Every map the LB writes: services, backends, reverse NAT, maglev, source ranges
    and session-affinity matches."""
    sys = OriginSystem(ext)
    for batch in batch_list:
        sys.apply(batch)
        sys.reconcile()
    check_inverse(sys)


def _objects(sys: OriginSystem, batch: list[tuple[str, Any]]) -> Provenance:
    sys.apply(batch)
    sys.reconcile()
    return sys.provenance()


SVC = {
    "apiVersion": "v1", "kind": "Service",
    "metadata": {"name": "a", "namespace": "ns", "uid": "u-a", "resourceVersion": "7"},
    "spec": {"clusterIP": "10.96.0.1", "type": "NodePort",
             "ports": [{"name": "http", "port": 80, "protocol": "TCP", "nodePort": 30010}]},
}
SLICE = {
    "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
    "metadata": {"name": "a-1", "namespace": "ns", "uid": "u-s", "resourceVersion": "8",
                 "labels": {"kubernetes.io/service-name": "a"}},
    "addressType": "IPv4",
    "endpoints": [{"addresses": ["10.244.0.1"], "conditions": {"ready": True}}],
    "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
}


def test_explain_a_clusterip_slot_names_service_slice_and_rows() -> None:
    sys = OriginSystem()
    prov = _objects(sys, [("upsert", SVC), ("upsert", SLICE)])
    out = prov.explain_entry(SERVICES4, "10.96.0.1:80/TCP SLOT=1")
    assert out["present"]
    kinds = {(o["kind"], o["name"]): o for o in out["objects"]}
    assert kinds[("Service", "a")]["uid"] == "u-a"
    assert kinds[("Service", "a")]["resourceVersion"] == "7"
    assert kinds[("EndpointSlice", "a-1")]["resourceVersion"] == "8"
    tables = [r["table"] for r in out["rows"]]
    assert tables == ["frontends", "services", "backends"]
    fe = out["rows"][0]
    assert fe["status"] == "Pending" and fe["revision"] > 0  # no reconciler here


def test_explain_a_nodeport_expansion_and_hex_keys() -> None:
    sys = OriginSystem()
    prov = _objects(sys, [("upsert", SVC), ("upsert", SLICE)])
    # The node address 1.1.1.1 expands the 0.0.0.0:30010 surrogate.
    key = prov.parse_key(SERVICES4, "1.1.1.1:30010/TCP")[1]
    raw = sys.maps.svc4.spec.key.encode(key)
    bpftool = " ".join(f"{b:02x}" for b in raw)
    for text in ("1.1.1.1:30010/TCP", bpftool, "key: " + bpftool,
                 "address=1.1.1.1 dport=30010 backend_slot=0 proto=6 scope=0"):
        out = prov.explain_entry(SERVICES4, text)
        assert out["present"], text
        assert out["rows"][0]["type"] == "NodePort"
        assert out["objects"][0]["name"] == "a"


def test_explain_service_lists_every_entry() -> None:
    sys = OriginSystem()
    prov = _objects(sys, [("upsert", SVC), ("upsert", SLICE)])
    entries = prov.describe_object("service", "ns", "a")["entries"]
    maps = sorted({e["map"] for e in entries})
    # Maglev tables for the NodePort frontends (the System's algorithm is maglev).
    assert maps == [BACKENDS4, MAGLEV4, REVNAT4, SERVICES4]
    # ClusterIP master + slot + wildcard, 0.0.0.0 and 1.1.1.1 NodePort master + slot.
    assert len([e for e in entries if e["map"] == SERVICES4]) == 7


def test_bad_keys_are_refused_with_the_accepted_forms() -> None:
    sys = OriginSystem()
    prov = _objects(sys, [("upsert", SVC)])
    for mapname, text in ((SERVICES4, "nonsense"), (BACKENDS4, "x"), ("lb9_nothing", "1")):
        try:
            prov.explain_entry(mapname, text)
        except InputError as e:
            assert "expected" in str(e) or "explain reads" in str(e)
        else:
            raise AssertionError(f"{mapname} {text!r} accepted")


def test_an_id_of_four_digits_is_an_id_not_two_hex_bytes() -> None:
    """``4729`` also reads as two bytes of hex: for a map whose key is not two bytes long
    (the backends' four, ``policy_netns``' eight), the map's short form (an id, a cookie)
    reads it; hex of the key's own length is still hex."""
    prov = _objects(OriginSystem(), [("upsert", SVC)])
    for text in ("4729", "123456"):  # two and three bytes of hex; the key has four
        assert prov.parse_key(BACKENDS4, text)[1] == int(text)
        assert prov.parse_key(BACKENDS4, text)[1] == prov.parse_key(BACKENDS4, f"ID={text}")[1]
    raw = OriginSystem().maps.be4.spec.key.encode(4729)
    assert prov.parse_key(BACKENDS4, raw.hex())[1] == 4729  # the key's own length: hex


def test_side_maps_explain_to_their_service_and_back() -> None:
    """Source ranges, session-affinity matches and maglev tables, by their short key
    forms, back to the Service (and a match's backend to its EndpointSlice)."""
    sys = OriginSystem({"a": (True, ("10.0.0.0/8",))})
    svc = copy.deepcopy(SVC)
    svc["spec"]["type"] = "LoadBalancer"
    svc["status"] = {"loadBalancer": {"ingress": [{"ip": "172.16.0.1"}]}}
    prov = _objects(sys, [("upsert", svc), ("upsert", SLICE)])
    lb_id = sys.maps.svc4.lookup(prov.parse_key(SERVICES4, "172.16.0.1:80/TCP")[1])
    assert lb_id is not None
    svc_id = lb_id.rev_nat_index
    be_id = next(iter(k for k, _ in sys.maps.be4.dump()))
    for mapname, text in ((SRCRANGE4, f"{svc_id} 10.0.0.0/8"),
                          (AFFINITY_MATCH, f"{be_id}/{svc_id}"),
                          (MAGLEV4, str(svc_id))):
        out = prov.explain_entry(mapname, text)
        assert out["present"], (mapname, text)
        names = {(o["kind"], o["name"]) for o in out["objects"]}
        assert ("Service", "a") in names, (mapname, names)
        assert any(r["table"] == "frontends" and r["key"] == "172.16.0.1:80/TCP"
                   for r in out["rows"]), out["rows"]
        listed = prov.describe_object("service", "ns", "a")["entries"]
        assert {"map": mapname, "key": out["key"]} in listed
    match = prov.explain_entry(AFFINITY_MATCH, f"{be_id}/{svc_id}")
    assert ("EndpointSlice", "a-1") in {(o["kind"], o["name"]) for o in match["objects"]}
    maglev = prov.explain_entry(MAGLEV4, str(svc_id))
    assert maglev["value"]["size"] == 251
    assert maglev["value"]["backend_slots"] == {str(be_id): 251}
    absent = prov.explain_entry(SRCRANGE4, f"{svc_id} 10.0.0.0/16")  # covered, not stored
    assert not absent["present"]


def test_runtime_maps_are_described_not_refused() -> None:
    sys = OriginSystem()
    prov = _objects(sys, [("upsert", SVC)])
    for mapname in ("nodeport_nat4", "ct4_global", "lb4_affinity", "sw_events_lost"):
        out = prov.explain_entry(mapname, "anything")
        assert out["present"] is None and out["rows"] == [] and out["runtime"], mapname
    assert "NAT" in prov.explain_entry("nodeport_nat6", "x")["runtime"]
