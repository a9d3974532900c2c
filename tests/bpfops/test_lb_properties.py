"""Random sequences of Kubernetes changes through the converter, the writer and FrontendOps
(on in-memory maps), checking after every batch invariants that hold whatever the rules
of backend selection are:

* ids are stable: a frontend address that stays programmed from one batch to the next
  keeps its service id (also when another service takes the address over in the batch);
* no backend slot of the services map points at a backend id missing from the backends
  map, and every master's slots are exactly ``1..COUNT+QCOUNT``;
* QCOUNT is the number of inactive slots: slots ``1..COUNT`` hold backends the frontend
  row has active (or, with no active one, serving terminating ones), slots after them
  backends that are not active;
* every map entry is reachable from a table row: service keys from a frontend row (or its
  node-address expansion, or the wildcard entry of a ClusterIP/LoadBalancer row's VIP),
  backends from a selected backend, rev-NAT and Maglev entries from a programmed id.

Changes are applied the way the reconciler applies them: the frontends table's change
stream is read after each batch (one write transaction of one to three changes) and its
deletions run before its updates.
"""

from __future__ import annotations

import copy
import ipaddress
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bpfops.adapter import frontend_ops_for
from bpfops.lb_maps import LBMaps
from bpfops.model import proto_name
from sources.k8s_convert import K8sConverter
from statedb import DB, InputError
from tables.backends import BackendState
from tables.frontends import SVCType
from tables.lb_config import LBConfig
from tables.lb_writer import LBWriter
from tables.node_addresses import NodeAddress

NODE_IP = "1.1.1.1"
MAGLEV_SIZE = 251
SERVICES = ("a", "b", "c")
LB_IPS = ("172.16.0.1", "172.16.0.2")
POD_IPS = [f"10.244.0.{i}" for i in range(1, 7)]

# ----- generated Kubernetes objects --------------------------------------------------------


@st.composite
def services(draw: st.DrawFn) -> dict[str, Any]:
    """A Service of one of three names, with a type, ports and policies drawn."""
    name = draw(st.sampled_from(SERVICES))
    idx = SERVICES.index(name) + 1
    svc_type = draw(st.sampled_from(["ClusterIP", "NodePort", "LoadBalancer"]))
    ports: list[dict[str, Any]] = [{"name": "http", "port": 80, "protocol": "TCP"}]
    if draw(st.booleans()):
        ports.append({"name": "https", "port": 443, "protocol": "TCP"})
    if svc_type != "ClusterIP":
        for i, p in enumerate(ports):
            p["nodePort"] = 30000 + 10 * idx + i
    spec: dict[str, Any] = {"clusterIP": f"10.96.0.{idx}", "type": svc_type, "ports": ports}
    dist = draw(st.sampled_from(["", "PreferClose", "PreferSameZone", "PreferSameNode"]))
    if dist:
        spec["trafficDistribution"] = dist
    if svc_type != "ClusterIP" and draw(st.booleans()):
        spec["externalTrafficPolicy"] = "Local"
    obj: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": "ns"},
        "spec": spec,
    }
    if svc_type == "LoadBalancer":
        # Two services may claim the same VIP: conflicts and owner changes.
        obj["status"] = {"loadBalancer": {"ingress": [{"ip": draw(st.sampled_from(LB_IPS))}]}}
    return obj


@st.composite
def endpoints(draw: st.DrawFn) -> dict[str, Any]:
    """An endpoint of the pod address pool in a drawn condition, node and zone."""
    ready = draw(st.booleans())
    terminating = draw(st.booleans())
    ep: dict[str, Any] = {
        "addresses": [draw(st.sampled_from(POD_IPS))],
        "conditions": {
            "ready": ready and not terminating,
            "serving": draw(st.booleans()) if terminating else ready,
            "terminating": terminating,
        },
        "nodeName": draw(st.sampled_from(["testnode", "othernode"])),
    }
    zones = draw(st.lists(st.sampled_from(["za", "zb"]), max_size=2, unique=True))
    if zones:
        ep["hints"] = {"forZones": [{"name": z} for z in zones]}
    return ep


@st.composite
def slices(draw: st.DrawFn) -> dict[str, Any]:
    """One of two EndpointSlices of a service, maybe weighted."""
    svc = draw(st.sampled_from(SERVICES))
    meta: dict[str, Any] = {
        "name": f"{svc}-{draw(st.sampled_from(['1', '2']))}",
        "namespace": "ns",
        "labels": {"kubernetes.io/service-name": svc},
    }
    weight = draw(st.sampled_from([None, "0", "50", "300"]))
    if weight is not None:
        meta["annotations"] = {"service.cilium.io/weight": weight}
    ports = [{"name": "http", "port": 8080, "protocol": "TCP"}]
    if draw(st.booleans()):
        ports.append({"name": "https", "port": 8443, "protocol": "TCP"})
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": meta,
        "addressType": "IPv4",
        "endpoints": draw(st.lists(endpoints(), max_size=3)),
        "ports": ports,
    }


@st.composite
def pods(draw: st.DrawFn) -> dict[str, Any]:
    """A pod with a host port, recreated under new UIDs (HostPort owner changes)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "hp", "namespace": "ns", "uid": draw(st.sampled_from(["u1", "u2"]))},
        "spec": {
            "nodeName": "testnode",
            "containers": [
                {"name": "c", "ports": [{"containerPort": 80, "hostPort": 4444}]}
            ],
        },
        "status": {"phase": "Running", "podIP": draw(st.sampled_from(POD_IPS))},
    }


change = st.one_of(
    st.tuples(st.just("upsert"), st.one_of(services(), slices(), pods())),
    st.tuples(st.just("delete"), st.one_of(services(), slices(), pods())),
    st.tuples(st.just("zone"), st.sampled_from(["", "za", "zb"])),
)
batches = st.lists(st.lists(change, min_size=1, max_size=3), min_size=1, max_size=12)


# ----- the system ----------------------------------------------------------------------------


class System:
    """Tables, converter and FrontendOps on fresh in-memory maps, applied like the
    reconciler applies them."""

    def __init__(self) -> None:
        self.cfg = LBConfig.from_flags(
            [
                "--node-name=testnode",
                "--bpf-lb-algorithm=maglev",
                f"--bpf-lb-maglev-table-size={MAGLEV_SIZE}",
                "--enable-service-topology",
            ]
        )
        self.db = DB()
        self.writer = LBWriter.create(self.db, self.cfg)
        self.conv = K8sConverter(self.writer, self.cfg)
        self.maps = LBMaps.in_memory(max_entries=4096, maglev_table_size=MAGLEV_SIZE)
        with self.writer.write_txn() as txn:
            self.writer.upsert_node_address(
                txn,
                NodeAddress.from_dict(
                    {"addr": NODE_IP, "nodeport": True, "primary": True, "devicename": "eth0"}
                ),
            )
            self.changes = self.writer.frontends.changes(txn)
        self.ops = frontend_ops_for(self.writer, self.maps, self.cfg)
        self.labels: dict[str, str] = {}

    def apply(self, batch: list[tuple[str, Any]]) -> None:
        """One write transaction; when a change of it is refused the whole batch is."""
        checkpoint = self.conv.checkpoint()
        try:
            with self.writer.write_txn() as txn:
                for op, obj in batch:
                    if op == "zone":
                        labels = {"topology.kubernetes.io/zone": obj} if obj else {}
                        self.writer.set_node_labels(txn, labels)
                    elif op == "upsert":
                        self.conv.upsert(txn, copy.deepcopy(obj))
                    else:
                        self.conv.delete(txn, copy.deepcopy(obj))
        except InputError:
            self.conv.rollback(checkpoint)

    def reconcile(self) -> None:
        """Apply the frontends table's changes: deletions first, then updates."""
        txn = self.db.read_txn()
        found, _ = self.changes.next(txn)
        changes = list(found)  # an iterator: read twice below
        for c in changes:
            if c.deleted:
                self.ops.delete(txn, c.revision, c.obj)
        for c in changes:
            if not c.deleted:
                self.ops.update(txn, c.revision, c.obj)


# ----- invariants -----------------------------------------------------------------------------


def _addr_text(raw: bytes, port: int, proto: int) -> str:
    return f"{ipaddress.ip_address(raw)}:{port}/{proto_name(proto)}"


def programmed_ids(maps: LBMaps) -> dict[str, int]:
    """Frontend address (with scope) -> service id, from the master entries."""
    out: dict[str, int] = {}
    for key, value in maps.svc4.dump():
        if key.backend_slot == 0 and not (key.dport == 0 and key.proto == 0):
            out[f"{_addr_text(key.address, key.dport, key.proto)}/{key.scope}"] = (
                value.rev_nat_index
            )
    return out


def check_invariants(sys: System, before: dict[str, int]) -> dict[str, int]:
    """Assert the module's invariants; return the programmed ids."""
    maps, txn = sys.maps, sys.db.read_txn()
    ids = programmed_ids(maps)
    for addr in before.keys() & ids.keys():
        assert ids[addr] == before[addr], f"{addr}: id {before[addr]} became {ids[addr]}"

    backends = {be_id: v for be_id, v in maps.be4.dump()}
    be_by_addr = {_addr_text(v.address, v.port, v.proto): be_id for be_id, v in backends.items()}
    slots: dict[tuple[bytes, int, int, int], dict[int, Any]] = {}
    for key, value in maps.svc4.dump():
        if key.dport == 0 and key.proto == 0:
            continue
        slots.setdefault((key.address, key.dport, key.proto, key.scope), {})[
            key.backend_slot
        ] = value
        if key.backend_slot > 0:
            assert value.backend_id in backends, f"slot {key} -> missing backend"

    rows = {str(fe.address): fe for fe in sys.writer.frontends.all(txn)}
    nodeport_rows = {
        (fe.address.port, fe.address.protocol, fe.address.scope): fe
        for fe in rows.values()
        if fe.type is SVCType.NODE_PORT
        or (fe.type is SVCType.HOST_PORT and fe.address.address.is_unspecified)
    }
    wanted_backends: set[str] = set()
    for (raw, port, proto, scope), by_slot in slots.items():
        text = _addr_text(raw, port, proto) + ("/i" if scope else "")
        row = rows.get(text)
        if row is None:
            # Only a node-address expansion of a NodePort/HostPort row may be rowless.
            assert str(ipaddress.ip_address(raw)) == NODE_IP, f"{text}: no frontend row"
            row = nodeport_rows.get((port, proto_name(proto), scope))
            assert row is not None, f"{text}: no NodePort/HostPort row to expand"
        master = by_slot.get(0)
        assert master is not None, f"{text}: slots without a master"
        n = master.count + master.qcount
        assert sorted(by_slot) == list(range(n + 1)), f"{text}: slots {sorted(by_slot)}"
        states = {str(b.address): b for b in row.backends}
        any_active = any(b.effective_state is BackendState.ACTIVE for b in row.backends)
        for slot in range(1, n + 1):
            be = backends[by_slot[slot].backend_id]
            be_text = _addr_text(be.address, be.port, be.proto)
            inst = states.get(be_text)
            assert inst is not None, f"{text} slot {slot}: {be_text} not selected by the row"
            wanted_backends.add(be_text)
            active = inst.effective_state is BackendState.ACTIVE
            if slot <= master.count:
                assert active or (
                    not any_active and inst.state is BackendState.TERMINATING
                ), f"{text} slot {slot}: {be_text} ({inst.state}) among the active slots"
            else:
                assert not active, f"{text} slot {slot}: active {be_text} in the QCOUNT tail"
        if row.backends:
            wanted_backends.update(str(b.address) for b in row.backends)
    for addr in be_by_addr:
        assert addr in wanted_backends, f"backend {addr} selected by no frontend row"

    live = set(ids.values())
    for rev_id, _ in maps.rev4.dump():
        assert rev_id in live, f"rev-NAT {rev_id} of no programmed frontend"
    for rev_id, table in maps.maglev_tables(False):
        assert rev_id in live, f"maglev table {rev_id} of no programmed frontend"
        assert set(table) <= backends.keys(), f"maglev table {rev_id}: unknown backend id"
    vips = {
        fe.address.address.packed
        for fe in rows.values()
        if fe.type in (SVCType.CLUSTER_IP, SVCType.LOAD_BALANCER)
    }
    for key, _ in maps.svc4.dump():
        if key.dport == 0 and key.proto == 0:
            assert key.address in vips, f"wildcard {ipaddress.ip_address(key.address)}: no VIP"
    for aff, _ in maps.aff_match.dump():
        assert aff.rev_nat_id in live and aff.backend_id in backends
    assert maps.svc6.count() == 0 and maps.be6.count() == 0
    return ids


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(batches)
def test_random_changes_keep_the_maps_consistent(batch_list: list[list[Any]]) -> None:
    """After every batch of changes the maps satisfy the module's invariants."""
    sys = System()
    ids: dict[str, int] = {}
    for batch in batch_list:
        sys.apply(batch)
        sys.reconcile()
        ids = check_invariants(sys, ids)
