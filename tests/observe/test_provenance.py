"""`statewright explain`'s two directions on random LB tables: an object's entries name
the object, and every object an entry names lists the entry (hypothesis), plus the
origins the sources record and the key forms people copy."""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import HealthCheck, given, settings

from bpfops.lb_maps import BACKENDS4, REVNAT4, SERVICES4
from statedb import InputError
from statewright.observe.provenance import LBView, ObjectRef, Provenance
from tables.origins import SOURCE_K8S, OriginRecorder
from tests.bpfops.test_lb_properties import SERVICES, System, batches

KIND_WORD = {"Service": "service", "Pod": "pod"}


class OriginSystem(System):
    """The LB property test's system, recording origins as the sources do."""

    def apply(self, batch: list[tuple[str, Any]]) -> None:
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
@given(batches)
def test_entry_to_rows_inverts_object_to_entries(batch_list: list[list[Any]]) -> None:
    sys = OriginSystem()
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
    assert maps == [BACKENDS4, REVNAT4, SERVICES4]
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
