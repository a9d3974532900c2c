"""Named ports (issue #26): a NetworkPolicy or CiliumNetworkPolicy port given by a
container port's name resolves per peer (egress: the peer's pods' ports; ingress: the
endpoint's own), in the policy entries (numeric, Cilium's layout) and in the rules'
verdict; a name no selected pod has matches nothing; the entries follow port changes."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from policy.errors import PolicyError
from policy.parse import parse_policy
from policy.verdict import evaluate_rules
from statewright.cni import CNIError, Invocation
from tables.endpoints import Endpoint, EndpointChange, EndpointRequestError
from tables.identities import pod_identity_labels

from .test_writer_and_sources import Harness

CLIENT = pod_identity_labels({"app": "client"}, "x", {})
SERVER_A = pod_identity_labels({"app": "server", "v": "a"}, "x", {})
SERVER_B = pod_identity_labels({"app": "server", "v": "b"}, "x", {})
OTHER = pod_identity_labels({"app": "server", "v": "c"}, "x", {})
TCP, UDP = 6, 17


def _np(spec: dict[str, Any], name: str = "p") -> dict[str, Any]:
    return {"kind": "NetworkPolicy", "metadata": {"name": name, "namespace": "x"}, "spec": spec}


def egress_to_servers(port: Any, protocol: str = "TCP") -> dict[str, Any]:
    return _np({
        "podSelector": {"matchLabels": {"app": "client"}},
        "policyTypes": ["Egress"],
        "egress": [{"to": [{"podSelector": {"matchLabels": {"app": "server"}}}],
                    "ports": [{"port": port, "protocol": protocol}]}],
    })


def ingress_from_clients(port: Any) -> dict[str, Any]:
    return _np({
        "podSelector": {"matchLabels": {"app": "server"}},
        "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "client"}}}],
                     "ports": [{"port": port}]}],
    }, "in")


def _ports(*items: tuple[str, str, int]) -> tuple[tuple[str, int, int], ...]:
    protos = {"TCP": TCP, "UDP": UDP}
    return tuple(sorted((n, protos[p], port) for n, p, port in items))


class NamedHarness(Harness):
    """The writer harness with endpoints that carry named ports."""

    def add(self, ep_id: int, labels: tuple[str, ...], ports: Any = ()) -> int:
        ident = self.add_endpoint(ep_id, labels)
        self.set_ports(ep_id, ports)
        return ident

    def set_ports(self, ep_id: int, ports: Any) -> None:
        with self.db.write_txn(self.endpoints) as txn:
            ep = next(e for e in self.endpoints.all(txn) if e.id == ep_id)
            self.endpoints.insert(txn, replace(ep, named_ports=ports))


def test_parse_keeps_names_and_refuses_bad_ones() -> None:
    (rule,) = [r for r in parse_policy(egress_to_servers("serve-80")).rules if r.ports]
    assert [p.text() for p in rule.ports] == ["serve-80/TCP"]
    assert rule.named
    with pytest.raises(PolicyError, match="not a port number or name"):
        parse_policy(egress_to_servers("Serve_80"))
    bad_range = egress_to_servers("web")
    bad_range["spec"]["egress"][0]["ports"][0]["endPort"] = 90
    with pytest.raises(PolicyError, match="endPort needs a numeric port"):
        parse_policy(bad_range)


def test_egress_named_port_resolves_per_peer() -> None:
    h = NamedHarness()
    h.add(1, CLIENT)
    a = h.add(2, SERVER_A, _ports(("web", "TCP", 80)))
    b = h.add(3, SERVER_B, _ports(("web", "TCP", 8080), ("web", "UDP", 53)))
    c = h.add(4, OTHER, _ports(("admin", "TCP", 81)))  # no port named web
    h.apply(egress_to_servers("web"))
    h.writer.step()
    assert h.keys(1) == {(a, True, TCP, 80, 16), (b, True, TCP, 8080, 16)}
    assert c not in {k[0] for k in h.keys(1)}
    # the rules give the same answers, resolving through each peer's ports
    rules = [r for p in h.writer.computation.repo.policies() for r in p.rules]
    b_ports = {("web", TCP): frozenset({8080}), ("web", UDP): frozenset({53})}
    for port, want in ((8080, True), (80, False)):
        v = evaluate_rules(rules, CLIENT, SERVER_B, egress=True, protocol=TCP, port=port,
                           peer_ports=b_ports)
        assert v.allowed == want
    # the port changes (a Pod update): the entries follow
    h.set_ports(2, _ports(("web", "TCP", 8000)))
    h.writer.step()
    assert h.keys(1) == {(a, True, TCP, 8000, 16), (b, True, TCP, 8080, 16)}
    # the pod of identity b goes: its entry goes
    h.remove_endpoint(3)
    h.writer.step()
    assert h.keys(1) == {(a, True, TCP, 8000, 16)}


def test_a_name_no_selected_pod_has_matches_nothing() -> None:
    h = NamedHarness()
    h.add(1, CLIENT)
    h.add(2, SERVER_A, _ports(("web", "TCP", 80)))
    h.apply(egress_to_servers("nothing-has"))
    h.writer.step()
    assert h.keys(1) == set()
    (row,) = [r for r in h.pe.all(h.db.read_txn()) if r.endpoint_id == 1]
    assert row.egress_enforced  # selected: default deny, nothing allowed
    # a UDP name does not match the TCP port of the same name
    h.apply(egress_to_servers("web", "UDP"))
    h.writer.step()
    assert h.keys(1) == set()


def test_ingress_named_port_resolves_to_the_endpoints_own_ports() -> None:
    h = NamedHarness()
    client = h.add(1, CLIENT)
    h.add(2, SERVER_A, _ports(("web", "TCP", 80)))
    h.add(3, SERVER_B, _ports(("web", "TCP", 8080)))
    h.apply(ingress_from_clients("web"))
    h.writer.step()
    assert h.keys(2) == {(client, False, TCP, 80, 16)}
    assert h.keys(3) == {(client, False, TCP, 8080, 16)}
    h.set_ports(3, ())
    h.writer.step()
    assert h.keys(3) == set()


def test_any_peer_resolves_on_each_pods_own_ports() -> None:
    h = NamedHarness()
    h.add(1, CLIENT)
    a = h.add(2, SERVER_A, _ports(("web", "TCP", 80)))
    b = h.add(3, SERVER_B, _ports(("web", "TCP", 8080)))
    h.apply(_np({"podSelector": {"matchLabels": {"app": "client"}}, "policyTypes": ["Egress"],
                 "egress": [{"ports": [{"port": "web"}]}]}))
    h.writer.step()
    assert h.keys(1) == {(a, True, TCP, 80, 16), (b, True, TCP, 8080, 16)}


def test_endpoint_named_ports_from_the_request_the_pod_and_cni_args(tmp_path: Any) -> None:
    change = EndpointChange.parse({"named-ports": [{"name": "web", "port": 80}]})
    ep = change.apply(Endpoint(1))
    assert ep.named_ports == (("web", TCP, 80),)
    assert ep.port_names() == {("web", TCP): frozenset({80})}
    # the Pod's ports win once it is known
    pod = replace(ep, pod_named_ports=(("web", TCP, 8080),))
    assert pod.port_names() == {("web", TCP): frozenset({8080})}
    assert Endpoint.from_json(pod.to_json()).pod_named_ports == (("web", TCP, 8080),)
    assert pod.to_json()["named-ports"] == [{"name": "web", "port": 80, "protocol": "TCP"}]
    for bad in ([{"name": "Web", "port": 80}], [{"name": "web", "port": 0}],
                [{"name": "web", "port": 80, "protocol": "ICMP"}], "web"):
        with pytest.raises(EndpointRequestError, match="named-ports"):
            EndpointChange.parse({"named-ports": bad})
    # statewright-cni: the runtime's container ports in args.cni.ports
    conf = {"cniVersion": "1.0.0", "name": "n", "type": "statewright-cni",
            "args": {"cni": {"ports": [{"name": "web", "containerPort": 80},
                                       {"containerPort": 9}]}}}
    inv = Invocation("ADD", "c", "/n", "eth0", {}, conf)
    assert inv.named_ports == [{"name": "web", "port": 80, "protocol": "TCP"}]
    inv = Invocation("ADD", "c", "/n", "eth0", {}, {**conf, "args": {"cni": {"ports": "web"}}})
    with pytest.raises(CNIError):
        _ = inv.named_ports


def test_pod_container_ports_become_the_endpoints_and_follow_updates(tmp_path: Any) -> None:
    from sources.k8s_source import pod_named_ports
    from statedb import DB
    from tables.endpoint_entries import EntryTables
    from tables.endpoint_manager import EndpointManager
    from tables.identities import IdentityAllocator
    from tables.ipam import IPAM, IPAMConfig

    pod = {"kind": "Pod", "metadata": {"name": "s", "namespace": "x"}, "spec": {"containers": [
        {"name": "a", "ports": [{"name": "web", "containerPort": 80},
                                {"containerPort": 9000}]},
        {"name": "b", "ports": [{"name": "dns", "containerPort": 53, "protocol": "UDP"}]}]}}
    assert pod_named_ports(pod) == (("dns", UDP, 53), ("web", TCP, 80))
    broken = {**pod, "spec": {"containers": [{"ports": [{"name": "x_y", "containerPort": 1}]}]}}
    assert pod_named_ports(broken) == ()

    known: dict[tuple[str, str], Any] = {}
    db = DB()
    ipam = IPAM(db, IPAMConfig.parse(("10.36.0.0/28",), str(tmp_path)))
    ipam.restore(reserve_router=False)
    ipam.reserve_routers()
    mgr = EndpointManager(db, ipam, IdentityAllocator(db), str(tmp_path), entries=EntryTables(),
                          pod_labels_of=lambda ns, n: {}, pod_ports_of=lambda ns, n:
                          known.get((ns, n)))
    request = EndpointChange.parse({"k8s-pod-name": "s", "k8s-namespace": "x",
                                    "named-ports": [{"name": "web", "port": 8080}]})
    ep = mgr.create("0", request)
    assert ep.port_names() == {("web", TCP): frozenset({8080})}  # no Pod yet: the request's
    known[("x", "s")] = pod_named_ports(pod)
    assert mgr.sync_pod_labels() == [ep.id]
    assert mgr.get(str(ep.id)).port_names() == {("web", TCP): frozenset({80}),
                                                ("dns", UDP): frozenset({53})}
    assert mgr.sync_pod_labels() == []
