"""`explain` on the maps the endpoints and policy components write: the endpoint map, the
ipcache (local pods, this node's addresses, the world, other nodes, other nodes' pods
from their CiliumEndpoints), ``policy_maps``, ``policy_netns`` and ``policy_endpoints``.
A hypothesis property checks, for random endpoints, nodes and CiliumEndpoints written
into memory maps, that entry -> objects inverts object -> entries."""

from __future__ import annotations

import ipaddress
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bpf.catalog import (
    endpoints_spec,
    ipcache_spec,
    policy_endpoints_spec,
    policy_maps_spec,
    policy_netns_spec,
)
from bpf.ct import POLICY_ENDPOINTS_MAP
from bpf.memory_map import MemoryMap
from bpf.policy import POLICY_MAPS, POLICY_NETNS, PolicyNetns
from bpf.typed_map import TypedMap
from bpfops.endpoint_ops import EndpointMapOps
from bpfops.ipcache_ops import IPCacheOps
from bpfops.policy_ops import PolicyMapSet, PolicyNetnsOps
from policy.source import new_policies_table
from statedb import DB
from statewright.observe.provenance import EndpointView, ObjectRef, PolicyView, Provenance
from tables.endpoint_entries import EntryTables
from tables.endpoints import Endpoint, EndpointState, new_endpoints_table
from tables.nodes import Node, NodeIP, new_nodes_table
from tables.origins import new_origins_table
from tables.policy_entries import new_policy_entries_table
from tables.policy_netns import desired_rows, new_policy_netns_table, sync_rows
from tables.remote_endpoints import RemoteEndpointEntries

POD_IPS = [f"10.244.{n}.{i}" for n in (0, 1) for i in (1, 2, 3)]
HOST_IPS = ["192.168.0.10", "10.244.0.1"]  # the router address collides with a pod's
NODES = ("n1", "n2")
NODE_IPS = ["192.168.0.11", "192.168.0.12", "192.168.0.10"]


def ip(text: str) -> Any:
    return ipaddress.ip_address(text)


class EndpointSystem:
    """Endpoints, nodes, CiliumEndpoints and policy modes through the agent's tables and
    ops into fresh memory maps."""

    def __init__(self) -> None:
        self.db = DB()
        self.entries = EntryTables()
        self.endpoints = new_endpoints_table()
        self.nodes = new_nodes_table()
        self.netns = new_policy_netns_table()
        self.policy_entries = new_policy_entries_table()
        self.policies = new_policies_table()
        self.origins = new_origins_table()
        self.db.register(self.entries.endpoint_map, self.entries.ipcache, self.endpoints,
                         self.nodes, self.netns, self.policy_entries, self.policies,
                         self.origins)
        self.ep_map = TypedMap(endpoints_spec(64), MemoryMap.create(endpoints_spec(64)))
        self.ipc_map = TypedMap(ipcache_spec(256), MemoryMap.create(ipcache_spec(256)))
        self.netns_map = TypedMap(policy_netns_spec(64), MemoryMap.create(policy_netns_spec(64)))
        self.flags_map = TypedMap(policy_endpoints_spec(64),
                                  MemoryMap.create(policy_endpoints_spec(64)))
        outer_spec = policy_maps_spec(64, 64)
        self.policy_maps = PolicyMapSet(TypedMap(outer_spec, MemoryMap.create(outer_spec)),
                                        MemoryMap, None)
        self.remote = RemoteEndpointEntries(self.entries.ipcache)
        self.last_nodes: dict[str, Node] = {}

    def load(self, eps: list[Endpoint], nodes: list[Node], ceps: dict[str, dict[str, Any]],
             enforced: dict[int, int]) -> None:
        tables = (self.entries.endpoint_map, self.entries.ipcache, self.endpoints,
                  self.nodes, self.netns)
        with self.db.write_txn(*tables) as txn:
            for ep in eps:
                self.endpoints.insert(txn, ep)
                self.entries.set_endpoint(txn, ep)
            self.entries.set_host(txn, [ip(a) for a in HOST_IPS], [4])
            for node in nodes:
                self.nodes.insert(txn, node)
            self.entries.set_nodes(txn, nodes, "local", self.last_nodes)
            self.remote.apply(txn, ceps.items())
            from tables.policy_entries import PolicyEndpoint

            modes = [PolicyEndpoint(e, ingress_enforced=bool(f & 2),
                                    egress_enforced=bool(f & 1)) for e, f in enforced.items()]
            sync_rows(txn, self.netns, desired_rows(eps, modes))
        txn = self.db.read_txn()
        for ops, table in ((EndpointMapOps(self.ep_map), self.entries.endpoint_map),
                           (IPCacheOps(self.ipc_map), self.entries.ipcache),
                           (PolicyNetnsOps(self.netns_map), self.netns)):
            for row in table.all(txn):
                ops.update(txn, 0, row)  # type: ignore[attr-defined]
        for ep_id, flags in enforced.items():
            self.flags_map.update(ep_id, PolicyNetns(ep_id, flags))
            self.policy_maps.ensure(ep_id)

    def provenance(self) -> Provenance:
        return Provenance(
            self.db, self.origins, None,
            PolicyView(self.policy_entries, self.policies, self.policy_maps,
                       netns_rows=self.netns, netns_map=self.netns_map,
                       flags_map=self.flags_map),
            EndpointView(self.endpoints, self.entries.endpoint_map, self.ep_map,
                         self.entries.ipcache, self.ipc_map, self.nodes),
        )

    def map_entries(self) -> list[tuple[str, Any]]:
        out: list[tuple[str, Any]] = [("endpoints", k) for k, _ in self.ep_map.dump()]
        out += [("ipcache", k) for k, _ in self.ipc_map.dump()]
        out += [(POLICY_NETNS, k) for k, _ in self.netns_map.dump()]
        out += [(POLICY_ENDPOINTS_MAP, k) for k, _ in self.flags_map.dump()]
        out += [(POLICY_MAPS, k) for k, _ in self.policy_maps.outer.dump()]
        return out


def endpoint(ep_id: int, pod: str, addr: str, cookie: int) -> Endpoint:
    return Endpoint(id=ep_id, pod_name=pod, pod_namespace="ns", ipv4=ip(addr),
                    identity=1000 + ep_id, netns_cookie=cookie, ifindex=ep_id,
                    state=EndpointState.READY)


def cep(addr: str, node: str, created: str) -> dict[str, Any]:
    return {"metadata": {"creationTimestamp": created},
            "status": {"identity": {"id": 2000},
                       "networking": {"addressing": [{"ipv4": addr}], "node": node}}}


endpoints = st.lists(
    st.builds(endpoint, st.sampled_from([7, 8, 9]), st.sampled_from(["web", "db"]),
              st.sampled_from(POD_IPS), st.sampled_from([0, 11, 12])),
    max_size=3, unique_by=lambda e: e.id,
).filter(lambda eps: len({e.ipv4 for e in eps}) == len(eps))
nodes = st.lists(
    st.builds(lambda n, a: Node(n, (NodeIP("InternalIP", ip(a)),)),
              st.sampled_from(NODES), st.sampled_from(NODE_IPS)),
    max_size=2, unique_by=lambda n: n.name,
)
ceps = st.dictionaries(
    st.sampled_from(["ns/r1", "ns/r2", "ns/web"]),
    st.builds(cep, st.sampled_from(POD_IPS), st.sampled_from(NODE_IPS),
              st.sampled_from(["2026-01-01", "2026-01-02"])),
    max_size=3,
)
modes = st.dictionaries(st.sampled_from([7, 8, 9]), st.integers(0, 3), max_size=3)

KIND_WORDS = {"Pod": "pod", "Node": "node", "CiliumEndpoint": "ciliumendpoint"}


def check_inverse(sys: EndpointSystem, objects: set[ObjectRef]) -> None:
    prov = sys.provenance()
    forward: dict[tuple[str, Any], list[ObjectRef]] = {}
    for name, key in sys.map_entries():
        out = prov.explain_key(name, key)
        assert out["present"], (name, key)
        found = prov.objects_of_entry(name, key)
        if not found:
            # Only this node's and the world's entries have no object: said in a note.
            assert out.get("notes"), (name, key, out)
        forward[(name, key)] = found
    for obj in objects:
        entries = prov.entries_of(KIND_WORDS[obj.kind], obj.namespace, obj.name)
        for e in entries:
            assert obj in forward.get((e.map, e.key), []), (obj, e, forward.get((e.map, e.key)))
        listed = {(e.map, e.key) for e in entries}
        for entry, owners in forward.items():
            if obj in owners:
                assert entry in listed, f"{entry} names {obj}, which does not list it"


@settings(max_examples=60, deadline=2000,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(endpoints, nodes, ceps, modes)
def test_endpoint_and_ipcache_entries_invert(
    eps: list[Endpoint], nds: list[Node], objs: dict[str, dict[str, Any]],
    enforced: dict[int, int],
) -> None:
    sys = EndpointSystem()
    live = {e.id for e in eps}
    sys.load(eps, nds, objs, {e: f for e, f in enforced.items() if e in live})
    objects = {ObjectRef("Pod", "ns", p) for p in ("web", "db")}
    objects |= {ObjectRef("Node", "", n) for n in NODES}
    objects |= {ObjectRef("CiliumEndpoint", "ns", n) for n in ("r1", "r2", "web")}
    check_inverse(sys, objects)


def test_ipcache_entries_name_their_owner() -> None:
    sys = EndpointSystem()
    web = endpoint(7, "web", "10.244.0.2", 11)
    sys.load([web], [Node("n1", (NodeIP("InternalIP", ip("192.168.0.11")),))],
             {"ns/r1": cep("10.244.1.5", "192.168.0.11", "2026-01-01")}, {7: 3})
    prov = sys.provenance()
    out = prov.explain_entry("ipcache", "10.244.0.2")
    assert out["present"] and out["value"]["sec_identity"] == 1007
    assert [(r["table"], r.get("owner")) for r in out["rows"]] == [
        ("ipcache", "endpoint:7"), ("endpoints", None)]
    assert [(o["kind"], o["name"]) for o in out["objects"]] == [("Pod", "web")]
    node = prov.explain_entry("cilium_ipcache", "192.168.0.11/32")
    assert [(o["kind"], o["name"], o["source"]) for o in node["objects"]] == [
        ("Node", "n1", "k8s")]
    assert node["rows"][1]["table"] == "nodes"
    remote = prov.explain_entry("ipcache", "10.244.1.5")
    assert [(o["kind"], o["namespace"], o["name"]) for o in remote["objects"]] == [
        ("CiliumEndpoint", "ns", "r1")]
    world = prov.explain_entry("ipcache", "0.0.0.0/0")
    assert world["present"] and not world["objects"] and "world" in world["notes"][0]
    host = prov.explain_entry("ipcache", "192.168.0.10")
    assert not host["objects"] and "this node's own addresses" in host["notes"][0]
    # A prefix only covered by world's /0 is not an entry of its own.
    assert not prov.explain_entry("ipcache", "10.9.9.9")["present"]
    pod = {e["map"] for e in prov.describe_object("pod", "ns", "web")["entries"]}
    assert pod == {"endpoints", "ipcache", POLICY_MAPS, POLICY_NETNS, POLICY_ENDPOINTS_MAP}
    for mapname, key in ((POLICY_NETNS, "11"), (POLICY_ENDPOINTS_MAP, "7"),
                         (POLICY_MAPS, "ID=7")):
        got = prov.explain_entry(mapname, key)
        assert [(o["kind"], o["name"]) for o in got["objects"]] == [("Pod", "web")], mapname
    assert [e["map"] for e in prov.describe_object("node", "", "n1")["entries"]] == [
        "ipcache"]
    assert len(prov.describe_object("ciliumendpoint", "ns", "r1")["entries"]) == 1
