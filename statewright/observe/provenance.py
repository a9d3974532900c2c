"""Provenance: from a BPF map entry to the statedb rows and source objects that produced
it, and from a source object to every map entry it produced (`statewright explain`).

Both directions read the live maps and the tables, along separate paths:

* entry -> rows (`Provenance.explain_entry`): the key is decoded (`map_keys`), the
  rows found from it (a services-map key's address is a frontend's, or a node address of
  a NodePort/HostPort frontend expanded over them; a slot's backend id leads through the
  backends map to the backend row; a policy-map key with its map's endpoint is a
  ``policy-entries`` key; an endpoint-map key is an ``endpoint-map`` row's address),
  then from the rows to their objects (the service a frontend names, the EndpointSlices
  listing a backend, the policies a policy entry's rules name, the pod of an endpoint)
  and to the objects' origins (tables/origins.py);
* object -> entries (`Provenance.entries_of`): from the object to its rows (a service's
  frontends, a policy's entries, a pod's endpoint), then from each row to the keys it
  owns in the maps (a frontend's master entry, its slots, their backends and its
  reverse-NAT entry; a policy entry's key in its endpoint's map; an endpoint's address).

tests/observe/test_provenance.py checks with hypothesis that the two are inverse: every
entry an object lists names the object, and every object an entry names lists it.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from bpf import lb
from bpf.ct import POLICY_ENDPOINTS_MAP
from bpf.endpoints import FAMILY_IPV4
from bpf.policy import (
    POLICY_MAPS,
    POLICY_NETNS,
    STATIC_PREFIX,
    PolicyMapKey,
    endpoint_of_map,
    policy_map_name,
)
from bpfops.endpoint_ops import endpoint_key
from bpfops.ipcache_ops import ipcache_key
from bpfops.lb_maps import (
    AFFINITY_MATCH,
    BACKENDS4,
    BACKENDS6,
    MAGLEV4,
    MAGLEV6,
    REVNAT4,
    REVNAT6,
    SCALE_TO_ZERO,
    SERVICES4,
    SERVICES6,
    SRCRANGE4,
    SRCRANGE6,
    LBMaps,
)
from bpfops.model import PROTO_NUMBERS, proto_name
from bpfops.policy_ops import PolicyMapSet, map_key
from policy.source import policy_key_index as policy_object_index
from statedb import DB, ReadTxn, Table
from statedb.errors import InputError
from statewright.observe.map_keys import KeyTextError, numeric_id, parse_key
from statewright.observe.map_kinds import (
    RUNTIME_MAPS,
    affinity_match_text,
    exact_lookup,
    inner_table,
    ipcache_text,
    keys_by_service,
    maglev_summary,
    runtime_answer,
    scale_to_zero_text,
    source_range_text,
)
from tables.backends import Backend, backend_address_index
from tables.endpoint_entries import (
    HOST_OWNER,
    REMOTE_NODE_OWNER,
    WORLD_OWNER,
    EndpointMapEntry,
    IPCacheEntry,
    endpoint_map_ip_index,
    endpoint_map_owner_index,
    endpoint_owner,
    ipcache_owner_index,
    ipcache_prefix_index,
    remote_node_owner,
)
from tables.endpoints import Endpoint, endpoint_id_index, endpoint_pod_index
from tables.frontends import Frontend, SVCType, frontend_address_index, frontend_service_index
from tables.l3n4 import L3n4Addr
from tables.node_addresses import NodeAddress
from tables.nodes import Node, node_name_index
from tables.origins import Origin, origin, slices_of
from tables.policy_entries import (
    PolicyEntry,
    PolicyKey,
    policy_endpoint_index,
    policy_key_index,
)
from tables.policy_netns import PolicyNetnsEntry, netns_cookie_index, netns_endpoint_index
from tables.remote_endpoints import OWNER_PREFIX as CEP_OWNER
from tables.services import Service, service_name_index

#: Kinds `entries_of` answers for (a node is cluster-scoped: namespace "").
OBJECT_KINDS = ("service", "pod", "policy", "node", "ciliumendpoint")
#: Policy kinds a rule name ``namespace/name`` may belong to.
POLICY_KINDS = ("NetworkPolicy", "CiliumNetworkPolicy")
ENDPOINT_MAP = "endpoints"
IPCACHE_MAP = "ipcache"
#: The LB maps keyed by (or holding) a service id, besides the services map itself.
_LB_SIDE_MAPS = (AFFINITY_MATCH, SRCRANGE4, SRCRANGE6, MAGLEV4, MAGLEV6, SCALE_TO_ZERO)
_LB_MAIN_MAPS = (SERVICES4, SERVICES6, BACKENDS4, BACKENDS6, REVNAT4, REVNAT6)
#: What the ipcache's owners without a source object are.
_OWNER_NOTES = {
    HOST_OWNER: "one of this node's own addresses (host identity), from the node-addresses "
                "table (netlink) and IPAM's router addresses: no source object",
    WORLD_OWNER: "the world identity's catch-all prefix, written for every enabled family: "
                 "no source object",
}


class ExplainError(InputError):
    """A map, key or object `statewright explain` cannot answer for."""


@dataclass(frozen=True, slots=True)
class EntryRef:
    """One map entry: its map's name and its key (the codec's object)."""

    map: str
    key: Any

    def to_json(self, key_json: Callable[[str, Any], Any]) -> dict[str, Any]:
        return {"map": self.map, "key": key_json(self.map, self.key)}


@dataclass(frozen=True, slots=True)
class ObjectRef:
    """A source object: kind, namespace, name."""

    kind: str
    namespace: str
    name: str

    @property
    def key(self) -> str:
        return f"{self.kind}/{self.namespace}/{self.name}"


@dataclass(slots=True)
class Explanation:
    """What `Provenance.explain_entry` found for one entry."""

    map: str
    key: Any
    value: Any
    rows: list[dict[str, Any]] = field(default_factory=list)
    objects: list[ObjectRef] = field(default_factory=list)
    rules: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def add_object(self, ref: ObjectRef) -> None:
        if ref not in self.objects:
            self.objects.append(ref)


@dataclass(slots=True)
class LBView:
    """The load balancer's tables and maps."""

    services: Table[Service]
    frontends: Table[Frontend]
    backends: Table[Backend]
    node_addresses: Table[NodeAddress]
    maps: LBMaps
    #: Backend address -> its id in the backends map (FrontendOps.backend_id); None: found
    #: by reading the backends map.
    backend_id: Callable[[L3n4Addr], int | None] | None = None


@dataclass(slots=True)
class PolicyView:
    """The policy entries, the policies and the per-endpoint maps."""

    entries: Table[PolicyEntry]
    policies: Table[Any]
    maps: PolicyMapSet
    #: The ``policy-netns`` table and the ``policy_netns`` map (socket program).
    netns_rows: Table[PolicyNetnsEntry] | None = None
    netns_map: Any = None
    #: ``policy_endpoints`` (the tc programs' enforced directions per endpoint id).
    flags_map: Any = None


@dataclass(slots=True)
class EndpointView:
    """The endpoints, the endpoint-map rows and the endpoint map (when open)."""

    endpoints: Table[Endpoint]
    map_rows: Table[EndpointMapEntry]
    map: Any = None
    #: The ``ipcache`` table and map.
    ipcache_rows: Table[IPCacheEntry] | None = None
    ipcache_map: Any = None
    #: The nodes table (remote-node ipcache entries name their Node), when there is one.
    nodes: Table[Node] | None = None


def _status(row: Any) -> str:
    st = getattr(row, "status", None)
    return "" if st is None else str(st)


def _ip_of(raw: bytes) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    return ipaddress.ip_address(raw)


def _svc_addr(key: Any) -> L3n4Addr:
    return L3n4Addr.make(_ip_of(key.address), key.dport, proto_name(key.proto), key.scope)


def _svc_key(v6: bool, addr: L3n4Addr, slot: int) -> Any:
    cls = lb.Service6Key if v6 else lb.Service4Key
    return cls(addr.address.packed, addr.port, slot, PROTO_NUMBERS[addr.protocol], addr.scope)


class Provenance:
    """Answers `explain` from the tables and maps it is given (parts may be None)."""

    def __init__(
        self,
        db: DB,
        origins: Table[Origin] | None,
        lb_view: LBView | None = None,
        policy: PolicyView | None = None,
        endpoints: EndpointView | None = None,
    ) -> None:
        self.db = db
        self.origins = origins
        self.lb = lb_view
        self.policy = policy
        self.endpoints = endpoints
        #: Per family, backend address -> id, read from the map once per `entries_of`.
        self._backend_ids: dict[bool, dict[L3n4Addr, int]] = {}
        #: Per side map, service id -> its keys, read once per `entries_of`.
        self._side_keys: dict[str, dict[int, list[Any]]] = {}

    # ----- keys -----------------------------------------------------------------------
    def _maps(self) -> dict[str, Any]:
        """Every map `explain_entry` reads, by name (the per-endpoint policy maps apart)."""
        out: dict[str, Any] = {}
        if self.lb is not None:
            out.update({n: m for n, m in self.lb.maps.maps.items()
                        if n in _LB_MAIN_MAPS or n in _LB_SIDE_MAPS})
        if self.policy is not None:
            for n, m in ((POLICY_MAPS, self.policy.maps.outer),
                         (POLICY_NETNS, self.policy.netns_map),
                         (POLICY_ENDPOINTS_MAP, self.policy.flags_map)):
                if m is not None:
                    out[n] = m
        if self.endpoints is not None:
            for n, m in ((ENDPOINT_MAP, self.endpoints.map),
                         (IPCACHE_MAP, self.endpoints.ipcache_map)):
                if m is not None:
                    out[n] = m
        return out

    def map_names(self) -> list[str]:
        """The maps `explain_entry` reads (the runtime maps it describes apart)."""
        names = list(self._maps())
        if self.policy is not None:
            names += sorted(policy_map_name(i) for i in self.policy.maps.open_maps())
        return names

    def _typed_map(self, name: str) -> Any:
        base = name.rsplit("/", 1)[-1]
        if base == "cilium_lxc":  # Cilium's name of the endpoint map
            base = ENDPOINT_MAP
        if base == "cilium_ipcache":
            base = IPCACHE_MAP
        maps = self._maps()
        if base in maps:
            return maps[base]
        ep = endpoint_of_map(base)
        if ep is not None and self.policy is not None:
            m = self.policy.maps.get(ep)
            if m is not None:
                return m
            raise ExplainError(f"endpoint {ep} has no policy map", obj=base)
        raise ExplainError(f"explain reads the maps {', '.join(self.map_names())} and "
                           f"describes {', '.join(RUNTIME_MAPS)}; not {name}", obj=name)

    def parse_key(self, map_name: str, text: str) -> tuple[str, Any]:
        """(map name, key object) of ``text`` in ``map_name`` (see `map_keys`)."""
        m = self._typed_map(map_name)
        base = m.spec.name
        if endpoint_of_map(base) is not None:
            return base, parse_key(m.spec, text, _policy_text,
                                   "IDENTITY/ingress|egress/PROTO/PORT/PREFIX, hex bytes or "
                                   "field=value")
        short, forms = _SHORT_FORMS.get(base, (_endpoint_text, "an IP"))
        if base in (SERVICES4, SERVICES6):
            short = _frontend_text(base == SERVICES6)
        elif base in (SRCRANGE4, SRCRANGE6):
            short = source_range_text(base == SRCRANGE6)
        return base, parse_key(m.spec, text, short, f"{forms}, hex bytes or field=value")

    def key_json(self, map_name: str, key: Any) -> Any:
        """A key as ``bpf dump -o json`` shows it."""
        return self._typed_map(map_name).spec.key.to_json(key)

    # ----- entry -> rows ----------------------------------------------------------------
    def explain_entry(self, map_name: str, key_text: str) -> dict[str, Any]:
        """The rows and objects behind one entry, as JSON (for a map of runtime state,
        what the map holds)."""
        base = map_name.rsplit("/", 1)[-1]
        if base in RUNTIME_MAPS:
            return runtime_answer(base, key_text)
        name, key = self.parse_key(map_name, key_text)
        return self.explain_key(name, key)

    def _lookup(self, name: str, m: Any, key: Any) -> tuple[Any, Any]:
        """(value as looked up, value as JSON) of an entry; (None, None) when absent."""
        if name in (MAGLEV4, MAGLEV6):
            table = inner_table(m, key)
            return (None, None) if table is None else (table, maglev_summary(table))
        value = exact_lookup(m, key)
        return (None, None) if value is None else (value, m.spec.value.to_json(value))

    def explain_key(self, name: str, key: Any) -> dict[str, Any]:
        """`explain_entry` for a parsed key."""
        m = self._typed_map(name)
        value, value_json = self._lookup(name, m, key)
        out = Explanation(name, key, value)
        txn = self.db.read_txn()
        if value is not None:
            self._attribute(txn, name, key, value, out)
        answer = {
            "map": name,
            "key": m.spec.key.to_json(key),
            "present": value is not None,
            "value": value_json,
            "rows": out.rows,
            "objects": [self._object_json(txn, o) for o in out.objects],
            "rules": out.rules,
        }
        if out.notes:
            answer["notes"] = out.notes
        return answer

    def objects_of_entry(self, name: str, key: Any) -> list[ObjectRef]:
        """The objects behind one entry (the property test's view of `explain_key`)."""
        m = self._typed_map(name)
        value, _ = self._lookup(name, m, key)
        out = Explanation(name, key, value)
        if value is not None:
            self._attribute(self.db.read_txn(), name, key, value, out)
        return out.objects

    def _attribute(self, txn: ReadTxn, name: str, key: Any, value: Any, out: Explanation) -> None:
        if name in (SERVICES4, SERVICES6):
            self._explain_service_entry(txn, name == SERVICES6, key, value, out)
        elif name in (BACKENDS4, BACKENDS6):
            self._explain_backend_entry(txn, name == BACKENDS6, key, value, out)
        elif name in (REVNAT4, REVNAT6):
            self._explain_revnat_entry(txn, name == REVNAT6, key, value, out)
        elif name in _LB_SIDE_MAPS:
            self._explain_side_entry(txn, name, key, value, out)
        elif endpoint_of_map(name) is not None:
            self._explain_policy_entry(txn, endpoint_of_map(name) or 0, key, out)
        elif name == ENDPOINT_MAP:
            self._explain_endpoint_entry(txn, key, out)
        elif name == IPCACHE_MAP:
            self._explain_ipcache_entry(txn, key, out)
        elif name in (POLICY_MAPS, POLICY_ENDPOINTS_MAP):
            self._add_endpoint(txn, int(key), out)
        elif name == POLICY_NETNS:
            self._explain_netns_entry(txn, int(key), out)

    def _row(self, txn: ReadTxn, table: Table[Any], q: Any, extra: dict[str, Any]) -> Any:
        found = table.get_revision(txn, q)
        if found is None:
            return None
        row, rev = found
        rec = {"table": table.name, **extra, "revision": rev}
        status = _status(row)
        if status:
            rec["status"] = status
        return row, rec

    # LB ---------------------------------------------------------------------------------
    def _frontends_at(self, txn: ReadTxn, v6: bool, addr: L3n4Addr) -> list[Frontend]:
        """The frontend rows that own services-map entries at ``addr``: its own row, else
        the NodePort/HostPort surrogate expanded over a node address, or for a wildcard
        ``vip:0/ANY`` every frontend at the address."""
        assert self.lb is not None
        fe = self.lb.frontends.get(txn, frontend_address_index.query(addr))
        if fe is not None:
            return [fe]
        if addr.port == 0 and addr.protocol == "ANY":
            ip = addr.address
            return [
                f for f in self.lb.frontends.all(txn)
                if f.address.address == ip and f.type in (SVCType.CLUSTER_IP,
                                                          SVCType.LOAD_BALANCER)
            ]
        unspec = ipaddress.ip_address("::" if v6 else "0.0.0.0")
        sur = self.lb.frontends.get(
            txn, frontend_address_index.query(L3n4Addr(unspec, addr.port, addr.protocol,
                                                       addr.scope))
        )
        if sur is not None and sur.is_surrogate and self._is_nodeport_ip(txn, addr.address):
            return [sur]
        return []

    def _is_nodeport_ip(self, txn: ReadTxn, ip: Any) -> bool:
        assert self.lb is not None
        return any(a.nodeport and a.address == ip for a in self.lb.node_addresses.all(txn))

    def _nodeport_ips(self, txn: ReadTxn, v6: bool) -> list[Any]:
        assert self.lb is not None
        return sorted({a.address for a in self.lb.node_addresses.all(txn)
                       if a.nodeport and (a.address.version == 6) == v6})

    def _add_frontend(self, txn: ReadTxn, fe: Frontend, out: Explanation) -> None:
        assert self.lb is not None
        found = self._row(txn, self.lb.frontends, frontend_address_index.query(fe.address),
                          {"key": str(fe.address), "type": str(fe.type), "service": fe.service_name,
                           "id": fe.id})
        if found is not None:
            out.rows.append(found[1])
        svc = self._row(txn, self.lb.services, service_name_index.query(fe.service_name),
                        {"key": fe.service_name})
        if svc is not None and svc[1] not in out.rows:
            out.rows.append(svc[1])
        out.add_object(_service_ref(fe.service_name))

    def _add_backend(self, txn: ReadTxn, addr: L3n4Addr, services: Iterable[str],
                     out: Explanation) -> None:
        assert self.lb is not None
        found = self._row(txn, self.lb.backends, backend_address_index.query(addr),
                          {"key": str(addr)})
        if found is not None:
            found[1]["instances"] = found[0].instances_text()
            out.rows.append(found[1])
        for svc in sorted(set(services)):
            out.add_object(_service_ref(svc))
            if self.origins is not None:
                for o in slices_of(txn, self.origins, svc):
                    if o.lists(str(addr.address)):
                        out.add_object(ObjectRef(o.kind, o.namespace, o.name))

    def _backend_addr(self, v6: bool, be_id: int) -> L3n4Addr | None:
        assert self.lb is not None
        value = self.lb.maps.backends(v6).lookup(be_id)
        if value is None:
            return None
        return L3n4Addr.make(_ip_of(value.address), value.port, proto_name(value.proto))

    def _explain_service_entry(
        self, txn: ReadTxn, v6: bool, key: Any, value: lb.ServiceValue, out: Explanation
    ) -> None:
        fes = self._frontends_at(txn, v6, _svc_addr(key))
        for fe in fes:
            self._add_frontend(txn, fe, out)
        if key.backend_slot:
            addr = self._backend_addr(v6, value.backend_id)
            if addr is not None:
                self._add_backend(txn, addr, {fe.service_name for fe in fes}, out)

    def _explain_backend_entry(
        self, txn: ReadTxn, v6: bool, be_id: int, value: Any, out: Explanation
    ) -> None:
        # A backend entry is there for the frontends that select its address (the slots
        # of their services-map entries point at it, or it waits in the map as their
        # terminating fallback).
        assert self.lb is not None
        addr = L3n4Addr.make(_ip_of(value.address), value.port, proto_name(value.proto))
        services = {
            fe.service_name for fe in self.lb.frontends.all(txn)
            if any(b.address == addr for b in fe.backends)
        }
        self._add_backend(txn, addr, services, out)

    def _explain_revnat_entry(
        self, txn: ReadTxn, v6: bool, rev_id: int, value: Any, out: Explanation
    ) -> None:
        for fe in self._frontends_of_id(txn, v6, rev_id, value):
            self._add_frontend(txn, fe, out)

    def _frontends_of_id(
        self, txn: ReadTxn, v6: bool, svc_id: int, revnat: Any = None
    ) -> list[Frontend]:
        """The frontend rows whose services-map masters carry service id ``svc_id``:
        found from the reverse-NAT entry of the id (its address and port), else from a
        scan of the masters."""
        assert self.lb is not None
        svc_map = self.lb.maps.services(v6)
        if revnat is None:
            revnat = self.lb.maps.revnat(v6).lookup(svc_id)
        addrs: list[L3n4Addr] = []
        if revnat is not None:
            ip = _ip_of(revnat.address)
            for proto in ("TCP", "UDP", "SCTP", "ANY"):
                for scope in (0, 1):
                    addr = L3n4Addr.make(ip, revnat.port, proto, scope)
                    master = svc_map.lookup(_svc_key(v6, addr, 0))
                    if master is not None and master.rev_nat_index == svc_id:
                        addrs.append(addr)
        else:
            addrs = [_svc_addr(k) for k, v in svc_map.dump()
                     if k.backend_slot == 0 and v.rev_nat_index == svc_id]
        found: list[Frontend] = []
        for addr in addrs:
            for fe in self._frontends_at(txn, v6, addr):
                if fe not in found:
                    found.append(fe)
        return found

    def _explain_side_entry(
        self, txn: ReadTxn, name: str, key: Any, value: Any, out: Explanation
    ) -> None:
        """An entry of a map keyed by service id: maglev, source range, affinity match,
        scale-to-zero. The affinity-match and scale-to-zero maps serve both families."""
        if name in (MAGLEV4, MAGLEV6):
            svc_id, families = int(key), [name == MAGLEV6]
        elif name == SCALE_TO_ZERO:
            svc_id, families = key.svc_id, [False, True]
        else:
            svc_id = key.rev_nat_id
            families = [name == SRCRANGE6] if name != AFFINITY_MATCH else [False, True]
        for v6 in families:
            fes = self._frontends_of_id(txn, v6, svc_id)
            for fe in fes:
                self._add_frontend(txn, fe, out)
            if name == AFFINITY_MATCH and fes:
                addr = self._backend_addr(v6, key.backend_id)
                if addr is not None:
                    self._add_backend(txn, addr, {fe.service_name for fe in fes}, out)
        if name in (SRCRANGE4, SRCRANGE6):
            net = ipaddress.ip_network((_ip_of(key.address), key.prefixlen - 32))
            out.notes.append(f"source range {net} of service id {svc_id} "
                             "(the Service's loadBalancerSourceRanges)")
        elif name == AFFINITY_MATCH:
            out.notes.append(f"backend id {key.backend_id} is eligible for session affinity "
                             f"of service id {svc_id} (the Service's sessionAffinity)")

    # policy -----------------------------------------------------------------------------
    def _explain_policy_entry(
        self, txn: ReadTxn, endpoint_id: int, key: PolicyMapKey, out: Explanation
    ) -> None:
        assert self.policy is not None
        lpm = key.prefixlen - STATIC_PREFIX
        pkey = PolicyKey(endpoint_id, key.sec_label, bool(key.egress), key.protocol,
                         key.dport, max(0, lpm - 8))
        found = self._row(txn, self.policy.entries, policy_key_index.query(pkey),
                          {"key": _policy_key_text(pkey)})
        self._add_endpoint(txn, endpoint_id, out)
        if found is None:
            return
        row, rec = found
        rec["action"] = "deny" if row.deny else "allow"
        out.rows.append(rec)
        for rule in row.rules:
            for kind in POLICY_KINDS:
                prow = self.policy.policies.get(
                    txn, policy_object_index.query(f"{kind}/{rule}")
                )
                if prow is None:
                    continue
                ns, _, name = rule.partition("/")
                out.add_object(ObjectRef(kind, ns, name))
                out.rules.append({
                    "policy": f"{kind}/{rule}",
                    "revision": prow.source_revision,
                    "rules": [r.to_json() for r in prow.rules
                              if r.egress == pkey.egress and r.deny == row.deny],
                })

    # endpoints --------------------------------------------------------------------------
    def _add_endpoint(self, txn: ReadTxn, endpoint_id: int, out: Explanation) -> None:
        if self.endpoints is None:
            return
        found = self._row(txn, self.endpoints.endpoints, endpoint_id_index.query(endpoint_id),
                          {"key": str(endpoint_id)})
        if found is None:
            return
        ep, rec = found
        rec["pod"] = f"{ep.pod_namespace}/{ep.pod_name}"
        rec["state"] = ep.state.value if hasattr(ep.state, "value") else str(ep.state)
        out.rows.append(rec)
        if ep.pod_name:
            out.add_object(ObjectRef("Pod", ep.pod_namespace or "default", ep.pod_name))

    def _explain_endpoint_entry(self, txn: ReadTxn, key: Any, out: Explanation) -> None:
        assert self.endpoints is not None
        ip = _key_ip(key)
        self._add_owned_row(txn, self.endpoints.map_rows, endpoint_map_ip_index.query(ip),
                            str(ip), out)

    def _add_owned_row(self, txn: ReadTxn, table: Table[Any], q: Any, key_text: str,
                       out: Explanation) -> None:
        """An endpoint-map or ipcache row (with its owner, and an ipcache row's identity)
        and the object behind its owner."""
        found = self._row(txn, table, q, {"key": key_text})
        if found is None:
            return
        row, rec = found
        rec["owner"] = row.owner
        if hasattr(row, "identity"):
            rec["identity"] = row.identity
        out.rows.append(rec)
        self._add_owner(txn, row.owner, out)

    def _add_owner(self, txn: ReadTxn, owner: str, out: Explanation) -> None:
        """The object behind an endpoint-map or ipcache row's owner: a local endpoint's
        Pod, a remote node's Node, a remote pod's CiliumEndpoint; for the host's and the
        world's entries, a note (no source object)."""
        kind, _, rest = owner.partition(":")
        if kind == "endpoint" and rest.isdigit():
            self._add_endpoint(txn, int(rest), out)
        elif kind == REMOTE_NODE_OWNER:
            nodes = None if self.endpoints is None else self.endpoints.nodes
            found = None if nodes is None else self._row(
                txn, nodes, node_name_index.query(rest), {"key": rest})
            if found is not None:
                out.rows.append(found[1])
            out.add_object(ObjectRef("Node", "", rest))
        elif owner.startswith(CEP_OWNER):
            ns, _, name = owner[len(CEP_OWNER):].partition("/")
            out.add_object(ObjectRef("CiliumEndpoint", ns, name))
        elif owner in _OWNER_NOTES:
            out.notes.append(_OWNER_NOTES[owner])

    def _explain_ipcache_entry(self, txn: ReadTxn, key: Any, out: Explanation) -> None:
        assert self.endpoints is not None and self.endpoints.ipcache_rows is not None
        net = ipaddress.ip_network((_key_ip(key), key.prefixlen - 32))
        self._add_owned_row(txn, self.endpoints.ipcache_rows, ipcache_prefix_index.query(net),
                            str(net), out)

    def _explain_netns_entry(self, txn: ReadTxn, cookie: int, out: Explanation) -> None:
        assert self.policy is not None
        if self.policy.netns_rows is None:
            return
        found = self._row(txn, self.policy.netns_rows, netns_cookie_index.query(cookie),
                          {"key": str(cookie)})
        if found is None:
            return
        row, rec = found
        rec["endpoint"] = row.endpoint_id
        out.rows.append(rec)
        self._add_endpoint(txn, row.endpoint_id, out)

    # ----- object -> entries ---------------------------------------------------------------
    def entries_of(self, kind: str, namespace: str, name: str) -> list[EntryRef]:
        """Every map entry present that object ``kind`` (service, pod, policy, node,
        ciliumendpoint) produced."""
        txn = self.db.read_txn()
        self._backend_ids = {}
        self._side_keys = {}
        full = f"{namespace}/{name}"
        if kind == "service":
            return list(dict.fromkeys(self._service_entries(txn, full)))
        if kind == "pod":
            return list(dict.fromkeys(self._pod_entries(txn, namespace, name)))
        if kind == "policy":
            return list(dict.fromkeys(self._policy_entries(txn, full)))
        if kind == "node":
            return list(self._owned_ipcache(txn, remote_node_owner(name)))
        if kind == "ciliumendpoint":
            return list(self._owned_ipcache(txn, f"{CEP_OWNER}{full}"))
        raise ExplainError(f"unknown kind {kind!r} (expected one of {', '.join(OBJECT_KINDS)})",
                           obj=kind)

    def _service_entries(self, txn: ReadTxn, service: str) -> Iterator[EntryRef]:
        if self.lb is None:
            return
        seen: set[EntryRef] = set()
        for fe in self.lb.frontends.list(txn, frontend_service_index.query(service)):
            for ref in self._frontend_entries(txn, fe):
                if ref not in seen:
                    seen.add(ref)
                    yield ref

    def _frontend_addresses(self, txn: ReadTxn, fe: Frontend) -> list[L3n4Addr]:
        assert self.lb is not None
        addrs = [fe.address]
        if fe.is_surrogate:
            for ip in self._nodeport_ips(txn, fe.address.is_ipv6):
                addr = L3n4Addr(ip, fe.address.port, fe.address.protocol, fe.address.scope)
                if self.lb.frontends.get(txn, frontend_address_index.query(addr)) is None:
                    addrs.append(addr)
        return addrs

    def _frontend_entries(self, txn: ReadTxn, fe: Frontend) -> Iterator[EntryRef]:
        assert self.lb is not None
        v6 = fe.address.is_ipv6
        svc_name, be_name, rev_name = (
            (SERVICES6, BACKENDS6, REVNAT6) if v6 else (SERVICES4, BACKENDS4, REVNAT4)
        )
        svc_map = self.lb.maps.services(v6)
        be_map = self.lb.maps.backends(v6)
        for b in fe.backends:
            be_id = self._backend_id(v6, b.address)
            if be_id is not None and be_map.lookup(be_id) is not None:
                yield EntryRef(be_name, be_id)
        for addr in self._frontend_addresses(txn, fe):
            master_key = _svc_key(v6, addr, 0)
            master = svc_map.lookup(master_key)
            if master is None:
                continue
            yield EntryRef(svc_name, master_key)
            slot = 1
            while True:
                k = _svc_key(v6, addr, slot)
                v = svc_map.lookup(k)
                if v is None:
                    break
                yield EntryRef(svc_name, k)
                if self.lb.maps.backends(v6).lookup(v.backend_id) is not None:
                    yield EntryRef(be_name, v.backend_id)
                slot += 1
            if self.lb.maps.revnat(v6).lookup(master.rev_nat_index) is not None:
                yield EntryRef(rev_name, master.rev_nat_index)
            yield from self._side_entries(v6, master.rev_nat_index)
            if fe.type in (SVCType.CLUSTER_IP, SVCType.LOAD_BALANCER):
                wild = _svc_key(v6, L3n4Addr(addr.address, 0, "ANY", addr.scope), 0)
                if svc_map.lookup(wild) is not None:
                    yield EntryRef(svc_name, wild)

    def _side_entries(self, v6: bool, svc_id: int) -> Iterator[EntryRef]:
        """The entries of the maps keyed by service id ``svc_id`` (`_LB_SIDE_MAPS`)."""
        assert self.lb is not None
        maps = self.lb.maps
        maglev = MAGLEV6 if v6 else MAGLEV4
        if inner_table(maps.maglev(v6), svc_id) is not None:
            yield EntryRef(maglev, svc_id)
        for name in (SRCRANGE6 if v6 else SRCRANGE4, AFFINITY_MATCH):
            by_id = self._side_keys.get(name)
            if by_id is None:
                by_id = self._side_keys[name] = keys_by_service(maps.maps[name])
            for k in by_id.get(svc_id, ()):
                yield EntryRef(name, k)
        stz = maps.scale_to_zero
        if stz is not None and stz.lookup(lb.ScaleToZeroKey(svc_id)) is not None:
            yield EntryRef(SCALE_TO_ZERO, lb.ScaleToZeroKey(svc_id))

    def _backend_id(self, v6: bool, addr: L3n4Addr) -> int | None:
        assert self.lb is not None
        if self.lb.backend_id is not None:
            return self.lb.backend_id(addr)
        ids = self._backend_ids.get(v6)
        if ids is None:
            ids = {
                L3n4Addr.make(_ip_of(v.address), v.port, proto_name(v.proto)): be_id
                for be_id, v in self.lb.maps.backends(v6).dump()
            }
            self._backend_ids[v6] = ids
        return ids.get(addr)

    def _endpoints_of_pod(self, txn: ReadTxn, namespace: str, name: str) -> list[Endpoint]:
        if self.endpoints is None:
            return []
        return list(self.endpoints.endpoints.list(
            txn, endpoint_pod_index.query(f"{namespace}/{name}")))

    def _pod_entries(self, txn: ReadTxn, namespace: str, name: str) -> Iterator[EntryRef]:
        if self.lb is not None:
            prefix = service_name_index.query(f"{namespace}/{name}{HOST_PORT_MARK}")
            for svc in list(self.lb.services.prefix(txn, prefix)):
                yield from self._service_entries(txn, svc.name)
        for ep in self._endpoints_of_pod(txn, namespace, name):
            assert self.endpoints is not None
            if self.endpoints.map is not None:
                for row in self.endpoints.map_rows.list(
                    txn, endpoint_map_owner_index.query(endpoint_owner(ep.id))
                ):
                    k = _endpoint_key(row.ip)
                    if self.endpoints.map.lookup(k) is not None:
                        yield EntryRef(ENDPOINT_MAP, k)
            yield from self._owned_ipcache(txn, endpoint_owner(ep.id))
            if self.policy is not None:
                yield from self._endpoint_policy_entries(txn, ep)

    def _endpoint_policy_entries(self, txn: ReadTxn, ep: Endpoint) -> Iterator[EntryRef]:
        """An endpoint's policy-map entries, its entry in ``policy_maps``, in
        ``policy_endpoints`` and (its namespace's row names it) in ``policy_netns``."""
        assert self.policy is not None
        pol = self.policy
        for name, m in ((POLICY_MAPS, pol.maps.outer), (POLICY_ENDPOINTS_MAP, pol.flags_map)):
            if m is not None and m.lookup(ep.id) is not None:
                yield EntryRef(name, ep.id)
        if pol.netns_rows is not None and pol.netns_map is not None:
            for row in pol.netns_rows.list(txn, netns_endpoint_index.query(ep.id)):
                if pol.netns_map.lookup(row.netns_cookie) is not None:
                    yield EntryRef(POLICY_NETNS, row.netns_cookie)
        m = pol.maps.get(ep.id)
        if m is None:
            return
        for entry in pol.entries.list(txn, policy_endpoint_index.query(ep.id)):
            k = map_key(entry.key)
            if exact_lookup(m, k) is not None:
                yield EntryRef(policy_map_name(ep.id), k)

    def _owned_ipcache(self, txn: ReadTxn, owner: str) -> Iterator[EntryRef]:
        """The ipcache entries present of the rows ``owner`` owns."""
        ep = self.endpoints
        if ep is None or ep.ipcache_rows is None or ep.ipcache_map is None:
            return
        for row in ep.ipcache_rows.list(txn, ipcache_owner_index.query(owner)):
            k = ipcache_key(row.prefix)
            if exact_lookup(ep.ipcache_map, k) is not None:
                yield EntryRef(IPCACHE_MAP, k)

    def _policy_entries(self, txn: ReadTxn, policy: str) -> Iterator[EntryRef]:
        if self.policy is None:
            return
        for row in self.policy.entries.all(txn):
            if policy not in row.rules:
                continue
            m = self.policy.maps.get(row.key.endpoint_id)
            k = map_key(row.key)
            if m is not None and exact_lookup(m, k) is not None:
                yield EntryRef(policy_map_name(row.key.endpoint_id), k)

    # ----- objects ------------------------------------------------------------------------
    def _object_json(self, txn: ReadTxn, ref: ObjectRef) -> dict[str, Any]:
        o = None if self.origins is None else origin(txn, self.origins, ref.kind,
                                                       ref.namespace, ref.name)
        if o is not None:
            return o.to_json()
        out: dict[str, Any] = {"kind": ref.kind, "namespace": ref.namespace, "name": ref.name}
        if ref.kind == "Pod" and self.endpoints is not None:
            eps = self._endpoints_of_pod(txn, ref.namespace, ref.name)
            if eps:
                out["source"] = "cni"
                out["container_id"] = eps[0].container_id
                return out
        if ref.kind == "Service" and self.lb is not None:
            svc = self.lb.services.get(txn, service_name_index.query(f"{ref.namespace}/{ref.name}"))
            if svc is not None:
                out["source"] = svc.source
        nodes = None if self.endpoints is None else self.endpoints.nodes
        if ref.kind == "Node" and nodes is not None:
            node = nodes.get(txn, node_name_index.query(ref.name))
            if node is not None:
                out["source"] = node.source
        if ref.kind == "CiliumEndpoint":
            out["source"] = "k8s"  # the watch keeps no uid or resourceVersion of it
        out.setdefault("source", "unknown")
        return out

    def describe_object(self, kind: str, namespace: str, name: str) -> dict[str, Any]:
        """`entries_of` as JSON, with the object's origin."""
        entries = self.entries_of(kind, namespace, name)
        ref = ObjectRef(_KIND_NAMES.get(kind, kind), namespace, name)
        txn = self.db.read_txn()
        objects: list[dict[str, Any]] = []
        if kind == "policy" and self.policy is not None:
            for k in POLICY_KINDS:
                row = self.policy.policies.get(
                    txn, policy_object_index.query(f"{k}/{namespace}/{name}"))
                if row is not None:
                    objects.append(self._object_json(txn, ObjectRef(k, namespace, name)))
        else:
            objects.append(self._object_json(txn, ref))
        return {
            "object": objects,
            "entries": [e.to_json(self.key_json) for e in entries],
        }


# ----- small helpers ---------------------------------------------------------------------------
#: What a Pod's HostPort service name holds after ``namespace/pod``.
HOST_PORT_MARK = ":host-port:"


def _service_ref(name: str) -> ObjectRef:
    """The object behind a service row: the Service, or the Pod of a HostPort service
    (``namespace/pod:host-port:<port>:<uid>``)."""
    ns, _, short = name.rpartition("/")
    ns = ns.rsplit("/", 1)[-1] or "default"
    if HOST_PORT_MARK in short:
        return ObjectRef("Pod", ns, short.split(HOST_PORT_MARK, 1)[0])
    return ObjectRef("Service", ns, short)


def _policy_key_text(k: PolicyKey) -> str:
    return (f"{k.endpoint_id}/{k.identity}/{'egress' if k.egress else 'ingress'}/"
            f"{k.protocol}/{k.dport}/{k.port_prefix_len}")


def _key_ip(key: Any) -> Any:
    """The address of an endpoint-map or ipcache key (IPv4 in its first four bytes)."""
    return _ip_of(key.ip[:4] if key.family == FAMILY_IPV4 else key.ip)


def _endpoint_key(ip: Any) -> Any:
    return endpoint_key(ip)


def _frontend_text(v6: bool) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        parts = text.split()
        if not parts or "=" in parts[0]:
            return None
        try:
            addr = L3n4Addr.parse(parts[0])
        except InputError as e:
            raise ValueError(str(e)) from None
        slot = 0
        for p in parts[1:]:
            if p.upper().startswith("SLOT="):
                slot = int(p.split("=", 1)[1])
        if addr.is_ipv6 != v6:
            raise ValueError(f"{addr} is IPv{6 if addr.is_ipv6 else 4}")
        return _svc_key(v6, addr, slot)

    return parse


def _policy_text(text: str) -> Any:
    parts = text.strip().split("/")
    if len(parts) != 5 or "=" in text:
        return None
    ident, direction, proto, port, plen = parts
    if direction not in ("ingress", "egress"):
        raise ValueError(f"direction {direction!r}: expected ingress or egress")
    protocol = {"tcp": 6, "udp": 17, "sctp": 132, "any": 0}.get(proto.lower())
    return map_key(PolicyKey(0, int(ident), direction == "egress",
                             int(proto) if protocol is None else protocol, int(port), int(plen)))


def _endpoint_text(text: str) -> Any:
    if "=" in text:
        return None
    try:
        ip = ipaddress.ip_address(text.strip())
    except ValueError:
        return None
    return _endpoint_key(ip)


#: The object kind of each `OBJECT_KINDS` word (policy: either of `POLICY_KINDS`).
_KIND_NAMES = {"service": "Service", "pod": "Pod", "node": "Node",
               "ciliumendpoint": "CiliumEndpoint"}

#: Per map, its short key form (None: hex bytes and field=value only) and its words.
_SHORT_FORMS: dict[str, tuple[Callable[[str], Any] | None, str]] = {
    **{n: (numeric_id, "an id") for n in (BACKENDS4, BACKENDS6, REVNAT4, REVNAT6, MAGLEV4,
                                           MAGLEV6, POLICY_MAPS, POLICY_ENDPOINTS_MAP)},
    SERVICES4: (None, "ADDR:PORT/PROTO[/i] [SLOT=n]"),
    SERVICES6: (None, "ADDR:PORT/PROTO[/i] [SLOT=n]"),
    SRCRANGE4: (None, "SERVICE_ID CIDR"),
    SRCRANGE6: (None, "SERVICE_ID CIDR"),
    AFFINITY_MATCH: (affinity_match_text, "BACKEND_ID/SERVICE_ID"),
    SCALE_TO_ZERO: (scale_to_zero_text, "a service id"),
    POLICY_NETNS: (numeric_id, "a network-namespace cookie"),
    IPCACHE_MAP: (ipcache_text, "a CIDR or an IP"),
    ENDPOINT_MAP: (_endpoint_text, "an IP"),
}


__all__ = [
    "EndpointView",
    "EntryRef",
    "ExplainError",
    "KeyTextError",
    "LBView",
    "ObjectRef",
    "PolicyView",
    "Provenance",
]
