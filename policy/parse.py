"""Parsing NetworkPolicy (networking.k8s.io/v1) and CiliumNetworkPolicy (cilium.io/v2)
objects into the policy model (policy/model.py).

Namespaces, as Cilium's agent does it: a namespaced policy selects only endpoints of its
namespace (the subject gets ``k8s:io.kubernetes.pod.namespace=<ns>``), and a peer
endpoint selector without a namespace requirement selects only pods of the policy's
namespace. A NetworkPolicy ``namespaceSelector`` selects on the namespace labels that
Cilium copies into every pod identity (``k8s:io.cilium.k8s.namespace.labels.<key>``;
tables/identities.py builds them), pods only; an empty one selects every pod of every
namespace. Every rule then goes through `policy.namespace_labels.fail_closed`: a selector
on namespace labels never allows traffic of a pod whose namespace's labels are unknown.

Entities: ``world`` selects the reserved identities world, world-ipv4 and world-ipv6;
``host``, ``remote-node``, ``health``, ``init``, ``unmanaged``, ``kube-apiserver`` and
``ingress`` their reserved identity; ``cluster`` everything but the world identities;
``all`` any identity (the wildcard).

CIDR peers (``toCIDR``, ``toCIDRSet``, ``fromCIDR``, ``fromCIDRSet``, NetworkPolicy
``ipBlock``) select the world identities. The ipcache gives every address outside the
cluster's endpoints and this node the world identity (``0.0.0.0/0`` and ``::/0``, owner
``world``, tables/endpoint_entries.py), and no CIDR identities exist, so a CIDR peer can
only be resolved to world: it allows (or denies) all traffic to addresses outside the
cluster on its ports, never traffic to endpoints inside the cluster, which is the part of
Cilium's semantics (CIDR rules do not select cluster endpoints) the datapath can
enforce. The CIDRs are still validated.

Named ports (``port: http``) are kept by name (`PortRule.name`, an IANA service name:
at most 15 lowercase letters, digits and ``-``, with a letter) and resolved against the
pods' container ports by the computation (policy/model.py).

Unsupported parts (L7 rules, ``toFQDNs``, ``toServices``, ``toGroups``,
``toRequires``/``fromRequires``, ``icmps``, node selectors) are errors, not silently
ignored: a policy the agent would enforce differently from its text is refused.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping, Sequence
from typing import Any

from policy.errors import PolicyError
from policy.model import PROTOCOLS, Policy, PortRule, Rule
from policy.namespace_labels import fail_closed_rules
from policy.selector import Requirement, Selector, parse_selector
from tables.endpoints import port_name_ok

KIND_NETWORK_POLICY = "NetworkPolicy"
KIND_CILIUM_NETWORK_POLICY = "CiliumNetworkPolicy"
POLICY_KINDS = (KIND_NETWORK_POLICY, KIND_CILIUM_NETWORK_POLICY)

NAMESPACE_LABEL = "io.kubernetes.pod.namespace"
NAMESPACE_LABELS_PREFIX = "io.cilium.k8s.namespace.labels."

_WORLD = tuple(
    Selector((Requirement("reserved", name, "Exists"),))
    for name in ("world", "world-ipv4", "world-ipv6")
)
_CLUSTER = Selector(
    tuple(
        sorted(
            Requirement("reserved", name, "DoesNotExist")
            for name in ("world", "world-ipv4", "world-ipv6")
        )
    )
)
#: Entity name -> the selectors it stands for; ``all`` is the wildcard (None).
ENTITIES: dict[str, tuple[Selector, ...] | None] = {
    "world": _WORLD,
    "cluster": (_CLUSTER,),
    "all": None,
    **{
        name: (Selector((Requirement("reserved", name, "Exists"),)),)
        for name in (
            "host",
            "remote-node",
            "health",
            "init",
            "unmanaged",
            "kube-apiserver",
            "ingress",
        )
    },
}


def namespace_requirement(namespace: str) -> Requirement:
    """Pods of ``namespace``."""
    return Requirement("k8s", NAMESPACE_LABEL, "In", (namespace,))


def _in_namespace(sel: Selector, namespace: str) -> Selector:
    """``sel`` restricted to ``namespace`` unless it says which namespace itself."""
    if any(r.key == NAMESPACE_LABEL for r in sel.requirements):
        return sel
    return sel.with_requirements(namespace_requirement(namespace))


def _ref(obj: Mapping[str, Any], kind: str) -> tuple[str, str]:
    """(``Kind namespace/name`` for messages, ``namespace/name``)."""
    meta = obj.get("metadata")
    if not isinstance(meta, Mapping):
        raise PolicyError("missing", obj=kind, field="metadata")
    name = meta.get("name")
    if not isinstance(name, str) or not name:
        raise PolicyError("missing or not a string", obj=kind, field="metadata.name")
    ns = meta.get("namespace", "default")
    if not isinstance(ns, str) or not ns:
        raise PolicyError("not a string", obj=f"{kind} {name}", field="metadata.namespace")
    return f"{kind} {ns}/{name}", f"{ns}/{name}"


def _list(ref: str, path: str, value: Any) -> Sequence[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise PolicyError("expected a list", obj=ref, field=path)
    return value


def _mapping(ref: str, path: str, value: Any) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise PolicyError("expected an object", obj=ref, field=path)
    return value


def _check_cidr(ref: str, path: str, value: Any) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
    if not isinstance(value, str):
        raise PolicyError("expected a CIDR string", obj=ref, field=path)
    try:
        return ipaddress.ip_network(value, strict=False)
    except ValueError:
        raise PolicyError(f"{value!r} is not a CIDR", obj=ref, field=path) from None


def _port_number(ref: str, path: str, value: Any, *, allow_zero: bool) -> int:
    if isinstance(value, str):
        if not value.isdigit():
            raise PolicyError(f"{value!r} is not a port number", obj=ref, field=path)
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise PolicyError("expected a port number", obj=ref, field=path)
    if not (0 if allow_zero else 1) <= value <= 65535:
        raise PolicyError(f"port {value} is out of range", obj=ref, field=path)
    return value


def _port_rules(
    ref: str, path: str, doc: Mapping[str, Any], default_protocol: str
) -> list[PortRule]:
    """One port entry (``port``, ``endPort``, ``protocol``) as PortRules (``ANY``: TCP,
    UDP and SCTP)."""
    proto_name = doc.get("protocol", default_protocol)
    if not isinstance(proto_name, str) or (
        proto_name.upper() not in PROTOCOLS and proto_name.upper() != "ANY"
    ):
        raise PolicyError(
            f"protocol {proto_name!r} is not one of TCP, UDP, SCTP, ANY",
            obj=ref,
            field=f"{path}.protocol",
        )
    protos = (
        sorted(PROTOCOLS.values())
        if proto_name.upper() == "ANY"
        else [PROTOCOLS[proto_name.upper()]]
    )
    raw = doc.get("port", 0)
    if isinstance(raw, str) and not raw.isdigit():
        if not port_name_ok(raw):
            raise PolicyError(f"{raw!r} is not a port number or name", obj=ref,
                              field=f"{path}.port")
        if doc.get("endPort") is not None:
            raise PolicyError("endPort needs a numeric port", obj=ref, field=f"{path}.endPort")
        return [PortRule(p, 0, 0, raw) for p in protos]
    port = _port_number(ref, f"{path}.port", raw, allow_zero=True)
    end = doc.get("endPort")
    if end is None or port == 0:
        if end is not None and end != 0:
            raise PolicyError("endPort needs a port", obj=ref, field=f"{path}.endPort")
        end_port = port
    else:
        end_port = _port_number(ref, f"{path}.endPort", end, allow_zero=False)
        if end_port < port:
            raise PolicyError(
                f"endPort {end_port} is below port {port}", obj=ref, field=f"{path}.endPort"
            )
    return [PortRule(p, port, end_port) for p in protos]


# ----- CiliumNetworkPolicy -----------------------------------------------------------------
_CNP_L3 = {
    True: ("toEndpoints", "toCIDR", "toCIDRSet", "toEntities"),
    False: ("fromEndpoints", "fromCIDR", "fromCIDRSet", "fromEntities"),
}
_CNP_UNSUPPORTED = (
    "toServices",
    "toFQDNs",
    "toGroups",
    "toRequires",
    "fromRequires",
    "toNodes",
    "fromNodes",
    "fromGroups",
    "icmps",
    "authentication",
)


def _cnp_ports(ref: str, path: str, value: Any) -> tuple[PortRule, ...]:
    out: list[PortRule] = []
    for i, tp in enumerate(_list(ref, path, value)):
        tpath = f"{path}[{i}]"
        tp = _mapping(ref, tpath, tp)
        for k, v in tp.items():
            if k != "ports" and v:
                raise PolicyError(
                    "L7 and TLS port rules are not supported", obj=ref, field=f"{tpath}.{k}"
                )
        ports = _list(ref, f"{tpath}.ports", tp.get("ports"))
        if not ports:
            out.extend(PortRule(p) for p in sorted(PROTOCOLS.values()))
        for j, p in enumerate(ports):
            ppath = f"{tpath}.ports[{j}]"
            out.extend(_port_rules(ref, ppath, _mapping(ref, ppath, p), "ANY"))
    return tuple(sorted(set(out)))


def _cnp_rule(
    ref: str, name: str, ns: str, path: str, doc: Any, subject: Selector, egress: bool, deny: bool
) -> Rule:
    doc = _mapping(ref, path, doc)
    for k in _CNP_UNSUPPORTED:
        if doc.get(k):
            raise PolicyError("not supported", obj=ref, field=f"{path}.{k}")
    ep_key, cidr_key, cidrset_key, ent_key = _CNP_L3[egress]
    known = {ep_key, cidr_key, cidrset_key, ent_key, "toPorts", *_CNP_UNSUPPORTED}
    for k in doc:
        if k not in known:
            raise PolicyError("unknown field", obj=ref, field=f"{path}.{k}")
    if deny and any(
        tp.get("rules")
        for tp in _list(ref, f"{path}.toPorts", doc.get("toPorts"))
        if isinstance(tp, Mapping)
    ):
        raise PolicyError("deny rules take no L7 rules", obj=ref, field=f"{path}.toPorts")
    ports = _cnp_ports(ref, f"{path}.toPorts", doc.get("toPorts"))
    has_l3 = any(k in doc for k in (ep_key, cidr_key, cidrset_key, ent_key))
    peers: set[Selector] | None = set()
    assert peers is not None
    wildcard = False
    for i, s in enumerate(_list(ref, f"{path}.{ep_key}", doc.get(ep_key))):
        sel = parse_selector(s, ref, f"{path}.{ep_key}[{i}]")
        peers.add(_in_namespace(sel, ns))
    for i, c in enumerate(_list(ref, f"{path}.{cidr_key}", doc.get(cidr_key))):
        _check_cidr(ref, f"{path}.{cidr_key}[{i}]", c)
        peers.update(_WORLD)
    for i, c in enumerate(_list(ref, f"{path}.{cidrset_key}", doc.get(cidrset_key))):
        cpath = f"{path}.{cidrset_key}[{i}]"
        c = _mapping(ref, cpath, c)
        net = _check_cidr(ref, f"{cpath}.cidr", c.get("cidr"))
        for j, e in enumerate(_list(ref, f"{cpath}.except", c.get("except"))):
            ex = _check_cidr(ref, f"{cpath}.except[{j}]", e)
            if ex.version != net.version or not ex.subnet_of(net):  # type: ignore[arg-type]
                raise PolicyError(f"{e} is not inside {net}", obj=ref, field=f"{cpath}.except[{j}]")
        peers.update(_WORLD)
    for i, e in enumerate(_list(ref, f"{path}.{ent_key}", doc.get(ent_key))):
        epath = f"{path}.{ent_key}[{i}]"
        if not isinstance(e, str) or e not in ENTITIES:
            raise PolicyError(
                f"{e!r} is not an entity ({', '.join(sorted(ENTITIES))})", obj=ref, field=epath
            )
        sels = ENTITIES[e]
        if sels is None:
            wildcard = True
        else:
            peers.update(sels)
    if wildcard or (not has_l3 and "toPorts" in doc and ports):
        peer_sels: tuple[Selector, ...] | None = None
    else:
        peer_sels = tuple(sorted(peers))
    return Rule(name, subject, egress, deny, peer_sels, ports)


def parse_cilium_network_policy(obj: Mapping[str, Any]) -> Policy:
    """A CiliumNetworkPolicy as a Policy; PolicyError naming the field when malformed."""
    ref, name = _ref(obj, KIND_CILIUM_NETWORK_POLICY)
    ns = name.partition("/")[0]
    specs: list[tuple[str, Any]] = []
    if obj.get("spec") is not None:
        specs.append(("spec", obj["spec"]))
    for i, s in enumerate(_list(ref, "specs", obj.get("specs"))):
        specs.append((f"specs[{i}]", s))
    if not specs:
        raise PolicyError("spec or specs is required", obj=ref, field="spec")
    rules: list[Rule] = []
    for spath, spec in specs:
        spec = _mapping(ref, spath, spec)
        if spec.get("nodeSelector") is not None:
            raise PolicyError("not supported", obj=ref, field=f"{spath}.nodeSelector")
        if "endpointSelector" not in spec:
            raise PolicyError("required", obj=ref, field=f"{spath}.endpointSelector")
        known = {
            "endpointSelector",
            "ingress",
            "egress",
            "ingressDeny",
            "egressDeny",
            "description",
            "labels",
            "enableDefaultDeny",
        }
        for k in spec:
            if k not in known:
                raise PolicyError("unknown field", obj=ref, field=f"{spath}.{k}")
        if spec.get("enableDefaultDeny"):
            raise PolicyError("not supported", obj=ref, field=f"{spath}.enableDefaultDeny")
        subject = _in_namespace(
            parse_selector(spec["endpointSelector"], ref, f"{spath}.endpointSelector"), ns
        )
        for section, egress, deny in (
            ("ingress", False, False),
            ("egress", True, False),
            ("ingressDeny", False, True),
            ("egressDeny", True, True),
        ):
            for i, r in enumerate(_list(ref, f"{spath}.{section}", spec.get(section))):
                rules.append(
                    _cnp_rule(ref, name, ns, f"{spath}.{section}[{i}]", r, subject, egress, deny)
                )
    return Policy(KIND_CILIUM_NETWORK_POLICY, name, fail_closed_rules(rules))


# ----- NetworkPolicy ---------------------------------------------------------------------------
def _np_peer(ref: str, ns: str, path: str, doc: Any) -> tuple[Selector, ...]:
    doc = _mapping(ref, path, doc)
    for k in doc:
        if k not in ("podSelector", "namespaceSelector", "ipBlock"):
            raise PolicyError("unknown field", obj=ref, field=f"{path}.{k}")
    if "ipBlock" in doc:
        if "podSelector" in doc or "namespaceSelector" in doc:
            raise PolicyError(
                "ipBlock cannot be combined with selectors", obj=ref, field=f"{path}.ipBlock"
            )
        block = _mapping(ref, f"{path}.ipBlock", doc["ipBlock"])
        net = _check_cidr(ref, f"{path}.ipBlock.cidr", block.get("cidr"))
        for j, e in enumerate(_list(ref, f"{path}.ipBlock.except", block.get("except"))):
            ex = _check_cidr(ref, f"{path}.ipBlock.except[{j}]", e)
            if ex.version != net.version or not ex.subnet_of(net):  # type: ignore[arg-type]
                raise PolicyError(
                    f"{e} is not inside {net}", obj=ref, field=f"{path}.ipBlock.except[{j}]"
                )
        return _WORLD
    pods = parse_selector(doc.get("podSelector"), ref, f"{path}.podSelector", key_source="k8s")
    if "namespaceSelector" not in doc:
        return (pods.with_requirements(namespace_requirement(ns)),)
    nss = parse_selector(
        doc["namespaceSelector"],
        ref,
        f"{path}.namespaceSelector",
        key_prefix=NAMESPACE_LABELS_PREFIX,
        key_source="k8s",
    )
    # Pods of the selected namespaces only: the pod namespace label exists (an empty
    # namespaceSelector selects every namespace; a NotIn or DoesNotExist alone would also
    # select identities that are not pods, such as host or world).
    sel = pods.with_requirements(
        *nss.requirements, Requirement("k8s", NAMESPACE_LABEL, "Exists")
    )
    return (sel,)


def parse_network_policy(obj: Mapping[str, Any]) -> Policy:
    """A NetworkPolicy as a Policy; PolicyError naming the field when malformed."""
    ref, name = _ref(obj, KIND_NETWORK_POLICY)
    ns = name.partition("/")[0]
    spec = _mapping(ref, "spec", obj.get("spec"))
    for k in spec:
        if k not in ("podSelector", "policyTypes", "ingress", "egress"):
            raise PolicyError("unknown field", obj=ref, field=f"spec.{k}")
    if "podSelector" not in spec:
        raise PolicyError("required", obj=ref, field="spec.podSelector")
    subject = parse_selector(spec["podSelector"], ref, "spec.podSelector", key_source="k8s")
    subject = subject.with_requirements(namespace_requirement(ns))
    types = spec.get("policyTypes")
    if types is None:
        types = ["Ingress"] + (["Egress"] if "egress" in spec else [])
    types = _list(ref, "spec.policyTypes", types)
    for i, t in enumerate(types):
        if t not in ("Ingress", "Egress"):
            raise PolicyError(
                f"{t!r} is not Ingress or Egress", obj=ref, field=f"spec.policyTypes[{i}]"
            )
    rules: list[Rule] = []
    for section, egress, peer_key in (("ingress", False, "from"), ("egress", True, "to")):
        if ("Egress" if egress else "Ingress") not in types:
            if spec.get(section):
                raise PolicyError(
                    f"{section} rules need {'Egress' if egress else 'Ingress'} in policyTypes",
                    obj=ref,
                    field=f"spec.{section}",
                )
            continue
        # The direction is enforced even without rules: a rule with no peers says so.
        rules.append(Rule(name, subject, egress, False, (), ()))
        for i, r in enumerate(_list(ref, f"spec.{section}", spec.get(section))):
            path = f"spec.{section}[{i}]"
            r = _mapping(ref, path, r)
            for k in r:
                if k not in (peer_key, "ports"):
                    raise PolicyError("unknown field", obj=ref, field=f"{path}.{k}")
            peer_docs = _list(ref, f"{path}.{peer_key}", r.get(peer_key))
            peers: tuple[Selector, ...] | None = None
            if peer_docs:
                sels: set[Selector] = set()
                for j, p in enumerate(peer_docs):
                    sels.update(_np_peer(ref, ns, f"{path}.{peer_key}[{j}]", p))
                peers = tuple(sorted(sels))
            ports: set[PortRule] = set()
            for j, p in enumerate(_list(ref, f"{path}.ports", r.get("ports"))):
                ppath = f"{path}.ports[{j}]"
                ports.update(_port_rules(ref, ppath, _mapping(ref, ppath, p), "TCP"))
            rules.append(Rule(name, subject, egress, False, peers, tuple(sorted(ports))))
    return Policy(KIND_NETWORK_POLICY, name, fail_closed_rules(rules))


def parse_policy(obj: Mapping[str, Any]) -> Policy:
    """A NetworkPolicy or CiliumNetworkPolicy object as a Policy (by ``kind``)."""
    kind = obj.get("kind")
    if kind == KIND_NETWORK_POLICY:
        return parse_network_policy(obj)
    if kind == KIND_CILIUM_NETWORK_POLICY:
        return parse_cilium_network_policy(obj)
    raise PolicyError(f"{kind!r} is not a policy kind", obj=str(kind), field="kind")
