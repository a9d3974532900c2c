"""Kubernetes Service/EndpointSlice/Pod conversion and the stateful K8sConverter."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from sources.k8s_convert import (
    ConversionError,
    K8sConverter,
    convert_endpoint_slice,
    convert_pod_host_ports,
    convert_service,
    endpoint_state,
)
from statedb import DB
from tables.backends import BackendState
from tables.frontends import SVCType
from tables.lb_config import LBConfig
from tables.lb_writer import FrontendConflictError, LBWriter
from tables.services import ForwardingMode, LBAlgorithm, SourceRangesPolicy, TrafficPolicy


def service(name: str = "echo", ns: str = "test", **spec: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "clusterIP": "10.96.50.104",
        "clusterIPs": ["10.96.50.104"],
        "ports": [{"name": "http", "port": 80, "protocol": "TCP", "targetPort": 80}],
        "type": "ClusterIP",
    }
    status = spec.pop("status", None)
    annotations = spec.pop("annotations", None)
    labels = spec.pop("labels", None)
    base.update(spec)
    obj: dict[str, Any] = {"apiVersion": "v1", "kind": "Service",
                           "metadata": {"name": name, "namespace": ns}, "spec": base}
    if annotations is not None:
        obj["metadata"]["annotations"] = annotations
    if labels is not None:
        obj["metadata"]["labels"] = labels
    if status is not None:
        obj["status"] = status
    return obj


def endpoint(ip: str, node: str = "", **cond: Any) -> dict[str, Any]:
    ep: dict[str, Any] = {"addresses": [ip]}
    if node:
        ep["nodeName"] = node
    if cond:
        ep["conditions"] = cond
    return ep


def eps(name: str = "echo-1", svc: str = "echo", ns: str = "test", endpoints: Any = None,
        ports: Any = None, address_type: str = "IPv4") -> dict[str, Any]:
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {"name": name, "namespace": ns,
                     "labels": {"kubernetes.io/service-name": svc}},
        "addressType": address_type,
        "endpoints": endpoints if endpoints is not None else [endpoint("10.244.1.1", "n1")],
        "ports": ports if ports is not None else [{"name": "http", "port": 80,
                                                   "protocol": "TCP"}],
    }


def fe_addrs(conv: Any) -> list[str]:
    return sorted(str(f.address) for f in conv.frontends)


# ----- Service ------------------------------------------------------------------------------
def test_clusterip_service() -> None:
    c = convert_service(service())
    assert c.service.name == "test/echo" and c.service.port_names == (("http", 80),)
    (f,) = c.frontends
    assert (str(f.address), f.type, f.port_name, f.service_port) == (
        "10.96.50.104:80/TCP", SVCType.CLUSTER_IP, "http", 80)


def test_nodeport_and_loadbalancer_and_external_ips() -> None:
    obj = service(
        type="LoadBalancer",
        ports=[{"name": "http", "port": 80, "nodePort": 30781},
               {"name": "dns", "port": 53, "protocol": "UDP", "nodePort": 30053}],
        externalIPs=["192.0.2.1"],
        status={"loadBalancer": {"ingress": [{"ip": "172.16.1.1"},
                                              {"ip": "172.16.1.2", "ipMode": "Proxy"},
                                              {"hostname": "lb.example"}]}},
    )
    c = convert_service(obj)
    assert fe_addrs(c) == [
        "0.0.0.0:30053/UDP", "0.0.0.0:30781/TCP", "10.96.50.104:53/UDP", "10.96.50.104:80/TCP",
        "172.16.1.1:53/UDP", "172.16.1.1:80/TCP", "192.0.2.1:53/UDP", "192.0.2.1:80/TCP",
    ]
    types = {str(f.address): f.type for f in c.frontends}
    assert types["0.0.0.0:30781/TCP"] is SVCType.NODE_PORT
    assert types["192.0.2.1:80/TCP"] is SVCType.EXTERNAL_IPS
    np = next(f for f in c.frontends if f.type is SVCType.NODE_PORT and f.port_name == "http")
    assert np.service_port == 80
    no_ext = convert_service(obj, LBConfig(enable_external_ips=False))
    assert not any(f.type is SVCType.EXTERNAL_IPS for f in no_ext.frontends)


def test_dual_stack_nodeport_surrogates() -> None:
    c = convert_service(service(type="NodePort", clusterIPs=["10.96.0.5", "fd00::5"],
                                ports=[{"name": "http", "port": 80, "nodePort": 30001}]))
    assert fe_addrs(c) == ["0.0.0.0:30001/TCP", "10.96.0.5:80/TCP", "[::]:30001/TCP",
                           "[fd00::5]:80/TCP"]
    v4only = convert_service(service(type="NodePort", clusterIPs=["10.96.0.5", "fd00::5"],
                                     ports=[{"port": 80, "nodePort": 30001}]),
                             LBConfig(enable_ipv6=False))
    assert fe_addrs(v4only) == ["0.0.0.0:30001/TCP", "10.96.0.5:80/TCP"]


def test_headless_and_external_name_have_no_frontends() -> None:
    assert convert_service(service(clusterIP="None", clusterIPs=["None"])).frontends == ()
    assert convert_service(service(labels={"service.kubernetes.io/headless": ""})).frontends == ()
    c = convert_service(service(type="ExternalName", externalName="x.example"))
    assert c.frontends == () and c.service.name == "test/echo"


def test_affinity_policies_ranges_and_annotations() -> None:
    obj = service(
        type="LoadBalancer",
        sessionAffinity="ClientIP",
        externalTrafficPolicy="Local",
        loadBalancerSourceRanges=["10.0.0.0/8", "192.168.2.5/24"],
        healthCheckNodePort=31000,
        loadBalancerClass="io.cilium/node",
        status={"loadBalancer": {"ingress": [{"ip": "172.16.1.1"}]}},
        annotations={"service.cilium.io/src-ranges-policy": "Deny",
                     "service.cilium.io/lb-algorithm": "maglev",
                     "service.cilium.io/forwarding-mode": "dsr"},
    )
    s = convert_service(obj).service
    assert s.session_affinity and s.session_affinity_timeout == 10800
    assert s.ext_traffic_policy is TrafficPolicy.LOCAL
    assert s.int_traffic_policy is TrafficPolicy.CLUSTER
    assert [str(r) for r in s.source_ranges] == ["10.0.0.0/8", "192.168.2.0/24"]
    assert s.source_ranges_policy is SourceRangesPolicy.DENY
    assert s.health_check_node_port == 31000 and s.load_balancer_class == "io.cilium/node"
    # Algorithm and forwarding annotations need their flags.
    assert s.lb_algorithm is LBAlgorithm.UNDEF and s.forwarding_mode is ForwardingMode.UNDEF
    s2 = convert_service(obj, LBConfig(algorithm_annotation=True, mode_annotation=True)).service
    assert s2.lb_algorithm is LBAlgorithm.MAGLEV and s2.forwarding_mode is ForwardingMode.DSR
    obj["spec"]["sessionAffinityConfig"] = {"clientIP": {"timeoutSeconds": 42}}
    assert convert_service(obj).service.flags_text().startswith(
        "HealthCheckNodePort=31000, LoadBalancerClass=io.cilium/node, SessionAffinity=42s")


def test_two_scopes_and_scope_annotation() -> None:
    obj = service(type="LoadBalancer", externalTrafficPolicy="Local",
                  status={"loadBalancer": {"ingress": [{"ip": "1.2.19.98"}]}})
    assert fe_addrs(convert_service(obj)) == ["1.2.19.98:80/TCP", "1.2.19.98:80/TCP/i",
                                             "10.96.50.104:80/TCP"]
    obj["metadata"]["annotations"] = {"service.cilium.io/scope": "external-only"}
    assert fe_addrs(convert_service(obj)) == ["1.2.19.98:80/TCP", "10.96.50.104:80/TCP"]


def test_type_annotation_restricts_frontends() -> None:
    obj = service(type="LoadBalancer", ports=[{"name": "http", "port": 80, "nodePort": 30781}],
                  status={"loadBalancer": {"ingress": [{"ip": "172.16.1.1"}]}},
                  annotations={"service.cilium.io/type": "NodePort"})
    assert fe_addrs(convert_service(obj)) == ["0.0.0.0:30781/TCP"]
    obj["metadata"]["annotations"]["service.cilium.io/type"] = "Bogus"
    with pytest.raises(ConversionError, match=r"service\.cilium\.io/type"):
        convert_service(obj)


def test_topology_annotation_and_traffic_distribution() -> None:
    a = convert_service(service(annotations={"service.kubernetes.io/topology-mode": "Auto"}))
    assert a.service.traffic_distribution == "PreferSameZone"
    b = convert_service(service(trafficDistribution="PreferSameNode"))
    assert b.service.traffic_distribution == "PreferSameNode"
    # PreferClose is the deprecated alias of PreferSameZone: stored and shown as the new name.
    for value in ("PreferSameZone", "PreferClose"):
        c = convert_service(service(trafficDistribution=value))
        assert c.service.traffic_distribution == "PreferSameZone"
        assert "TrafficDistribution=PreferSameZone" in c.service.flags_text()
        assert c.service.to_json()["TrafficDistribution"] == "PreferSameZone"


def test_prefer_close_row_is_stored_as_prefer_same_zone() -> None:
    """A Service row built directly with the deprecated name holds the new one."""
    from tables.services import Service

    assert Service("a/b", traffic_distribution="PreferClose").traffic_distribution == (
        "PreferSameZone"
    )


def test_node_exposure_annotation() -> None:
    obj = service(annotations={"service.cilium.io/node": "foo"})
    assert convert_service(obj, node_labels={"service.cilium.io/node": "foo"}).not_exposed == ""
    assert "does not match" in convert_service(obj, node_labels={}).not_exposed


@pytest.mark.parametrize(
    "mutate, field",
    [(lambda o: o["spec"]["ports"][0].update(port=0), "spec.ports[0].port"),
     (lambda o: o["spec"]["ports"][0].update(port="eighty"), "spec.ports[0].port"),
     (lambda o: o["spec"]["ports"][0].update(protocol="QUIC"), "spec.ports[0].protocol"),
     (lambda o: o["spec"].update(clusterIPs=["10.96.0.300"]), "spec.clusterIPs[0]"),
     (lambda o: o["spec"].update(type="Weird"), "spec.type"),
     (lambda o: o["spec"].update(externalTrafficPolicy="Nearby"), "spec.externalTrafficPolicy"),
     (lambda o: o["spec"].update(externalIPs=["nope"]), "spec.externalIPs[0]"),
     (lambda o: o["spec"].update(loadBalancerSourceRanges=["10.0.0.0/33"]),
      "spec.loadBalancerSourceRanges[0]"),
     (lambda o: o["spec"].update(sessionAffinity="ClientIP",
                                 sessionAffinityConfig={"clientIP": {"timeoutSeconds": -1}}),
      "timeoutSeconds"),
     (lambda o: o["metadata"].pop("name"), "metadata.name"),
     (lambda o: o.update(spec=[1]), "spec")],
)
def test_invalid_service_names_object_and_field(mutate: Any, field: str) -> None:
    obj = service()
    mutate(obj)
    with pytest.raises(ConversionError) as e:
        convert_service(obj)
    assert field in str(e.value) and "Service test/" in str(e.value)


# ----- EndpointSlice ----------------------------------------------------------------------------
def test_endpoint_slice_states_ports_and_zones() -> None:
    obj = eps(
        endpoints=[
            endpoint("10.244.1.1", "n1"),
            endpoint("10.244.1.2", "n1", ready=False, serving=True, terminating=True),
            endpoint("10.244.1.3", "n2", ready=False, serving=False, terminating=True),
            endpoint("10.244.1.4", "n2", ready=False, serving=False, terminating=False),
            {"addresses": ["10.244.1.5"], "zone": "a",
             "hints": {"forZones": [{"name": "b"}, {"name": "a"}]}},
        ],
        ports=[{"name": "http", "port": 8080, "protocol": "TCP"},
               {"name": "alt", "port": 8080, "protocol": "TCP"},
               {"name": "dns", "port": 53, "protocol": "UDP"}],
    )
    c = convert_endpoint_slice(obj)
    assert c.service_name == "test/echo" and c.slice_name == "test/echo-1"
    by = {str(b.address): b for b in c.backends}
    assert len(by) == 10
    assert by["10.244.1.1:8080/TCP"].port_names == ("alt", "http")
    assert by["10.244.1.1:53/UDP"].port_names == ("dns",)
    assert by["10.244.1.2:53/UDP"].state is BackendState.TERMINATING
    assert by["10.244.1.3:53/UDP"].state is BackendState.TERMINATING_NOT_SERVING
    assert by["10.244.1.4:53/UDP"].state is BackendState.MAINTENANCE
    assert (by["10.244.1.5:53/UDP"].zone, by["10.244.1.5:53/UDP"].for_zones) == ("a", ("a", "b"))
    assert by["10.244.1.1:8080/TCP"].node_name == "n1"



def test_endpoint_slice_update_gives_back_its_unchanged_backends() -> None:
    """With the backends of the slice's last conversion, an equal backend is that very
    object, a changed one is new; the result equals a conversion from scratch."""
    ports = [{"name": "http", "port": 8080, "protocol": "TCP"},
             {"name": "dns", "port": 53, "protocol": "UDP"}]
    before = convert_endpoint_slice(eps(endpoints=[
        endpoint("10.244.1.1", "n1"), endpoint("10.244.1.2", "n1"), endpoint("10.244.1.3", "n2"),
    ], ports=ports))
    after_obj = eps(endpoints=[
        endpoint("10.244.1.9", "n1"),  # replaced
        endpoint("10.244.1.2", "n1"),
        endpoint("10.244.1.3", "n2", ready=False),  # changed state
    ], ports=ports)
    previous = {b.address: b for b in before.backends}
    after = convert_endpoint_slice(after_obj, previous=previous)
    assert after == convert_endpoint_slice(after_obj)
    same = {str(b.address) for b in after.backends if previous.get(b.address) is b}
    assert same == {"10.244.1.2:8080/TCP", "10.244.1.2:53/UDP"}
    # A port renamed changes every backend.
    renamed = eps(endpoints=[endpoint("10.244.1.2", "n1")],
                  ports=[{"name": "web", "port": 8080, "protocol": "TCP"}])
    c = convert_endpoint_slice(renamed, previous=previous)
    assert c == convert_endpoint_slice(renamed)
    assert not any(previous.get(b.address) is b for b in c.backends)

@pytest.mark.parametrize(
    "cond, state",
    [
        ({}, BackendState.ACTIVE),
        ({"ready": True}, BackendState.ACTIVE),
        # Ready overrides terminating and serving (publishNotReadyAddresses).
        ({"ready": True, "serving": True, "terminating": True}, BackendState.ACTIVE),
        ({"ready": True, "serving": False, "terminating": True}, BackendState.ACTIVE),
        ({"ready": True, "serving": False}, BackendState.ACTIVE),
        ({"ready": False, "serving": True, "terminating": True}, BackendState.TERMINATING),
        ({"ready": False, "terminating": True}, BackendState.TERMINATING_NOT_SERVING),
        ({"ready": False, "serving": False, "terminating": True},
         BackendState.TERMINATING_NOT_SERVING),
        ({"ready": False}, BackendState.MAINTENANCE),
        ({"ready": False, "serving": False, "terminating": False}, BackendState.MAINTENANCE),
        ({"ready": False, "serving": True}, BackendState.MAINTENANCE),
        ({"ready": None, "serving": None, "terminating": None}, BackendState.ACTIVE),
    ],
)
def test_endpoint_conditions_to_state(cond: dict[str, Any], state: BackendState) -> None:
    """The slice conversion (its fast path) and `endpoint_state` (the checked path,
    for endpoints the fast path declines) give the same state."""
    fast = convert_endpoint_slice(eps(endpoints=[endpoint("10.244.1.1", **cond)]))
    assert [b.state for b in fast.backends] == [state]
    assert endpoint_state("ref", "conditions", cond) is state


def test_endpoint_slice_ipv6_and_fqdn() -> None:
    c = convert_endpoint_slice(eps(address_type="IPv6", endpoints=[endpoint("fd00::1")]))
    assert [str(b.address) for b in c.backends] == ["[fd00::1]:80/TCP"]
    assert convert_endpoint_slice(eps(address_type="FQDN",
                                      endpoints=[endpoint("a.example")])).backends == ()


@pytest.mark.parametrize(
    "mutate, field",
    [(lambda o: o["metadata"]["labels"].clear(), "kubernetes.io/service-name"),
     (lambda o: o["endpoints"][0].update(addresses=["10.244.1.300"]), "endpoints[0].addresses[0]"),
     (lambda o: o["endpoints"][0].update(addresses=["fd00::1"]), "endpoints[0].addresses[0]"),
     (lambda o: o["endpoints"][0].update(conditions={"ready": "yes"}),
      "endpoints[0].conditions.ready"),
     (lambda o: o["ports"][0].update(port=0), "ports[0].port"),
     (lambda o: o["ports"][0].update(protocol="XTP"), "ports[0].protocol"),
     (lambda o: o.update(addressType="IPv5"), "addressType")],
)
def test_invalid_endpoint_slice(mutate: Any, field: str) -> None:
    obj = eps()
    mutate(obj)
    with pytest.raises(ConversionError) as e:
        convert_endpoint_slice(obj)
    assert field in str(e.value) and "EndpointSlice test/echo-1" in str(e.value)


# ----- Pods ------------------------------------------------------------------------------------
def pod(uid: str = "u1", ip: str = "10.244.1.113", host_port: int = 4444) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "my-app", "namespace": "default", "uid": uid},
        "spec": {"nodeName": "testnode", "containers": [
            {"name": "c", "ports": [{"containerPort": 80, "hostPort": host_port,
                                     "protocol": "TCP"}, {"containerPort": 9090}]}]},
        "status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}]},
    }


def test_pod_host_ports() -> None:
    ((c, bes),) = convert_pod_host_ports(pod())
    assert c.service.name == "default/my-app:host-port:4444:u1"
    assert [(str(f.address), f.type) for f in c.frontends] == [("0.0.0.0:4444/TCP",
                                                               SVCType.HOST_PORT)]
    assert [str(b.address) for b in bes] == ["10.244.1.113:80/TCP"]
    done = pod()
    done["status"]["phase"] = "Succeeded"
    assert convert_pod_host_ports(done) == []


# ----- the converter -------------------------------------------------------------------------
def _conv() -> tuple[DB, LBWriter, K8sConverter]:
    db = DB()
    w = LBWriter.create(db, LBConfig(node_name="testnode"))
    return db, w, K8sConverter(w)


def _backends(db: DB, w: LBWriter) -> list[str]:
    return [str(b.address) for b in w.backends.all(db.read_txn())]


def test_multiple_slices_merge_and_release_their_own() -> None:
    db, w, c = _conv()
    with w.write_txn() as t:
        c.upsert(t, service())
        c.upsert(t, eps("echo-1", endpoints=[endpoint("10.244.1.1"), endpoint("10.244.1.2")]))
        c.upsert(t, eps("echo-2", endpoints=[endpoint("10.244.1.3")]))
    assert _backends(db, w) == ["10.244.1.1:80/TCP", "10.244.1.2:80/TCP", "10.244.1.3:80/TCP"]
    (f,) = list(w.frontends.all(db.read_txn()))
    assert len(f.backends) == 3
    with w.write_txn() as t:
        c.upsert(t, eps("echo-1", endpoints=[endpoint("10.244.1.2")]))
    assert _backends(db, w) == ["10.244.1.2:80/TCP", "10.244.1.3:80/TCP"]
    with w.write_txn() as t:
        c.delete(t, eps("echo-2"))
    assert _backends(db, w) == ["10.244.1.2:80/TCP"]
    with w.write_txn() as t:
        c.delete(t, service())
        c.delete(t, eps("echo-1"))
        c.delete(t, eps("never-added"))
    r = db.read_txn()
    assert all(tb.count(r) == 0 for tb in (w.services, w.frontends, w.backends))


def test_slice_moving_between_services() -> None:
    db, w, c = _conv()
    with w.write_txn() as t:
        c.upsert(t, eps("s", svc="one"))
        c.upsert(t, eps("s", svc="two"))
    (b,) = list(w.backends.all(db.read_txn()))
    assert b.service_names() == ["test/two"]


def test_conflict_and_rollback() -> None:
    db, w, c = _conv()
    with w.write_txn() as t:
        c.upsert(t, service())
    cp = c.checkpoint()
    other = service(name="other")
    with pytest.raises(FrontendConflictError), w.write_txn() as t:
        c.upsert(t, eps("other-1", svc="other"))
        c.upsert(t, other)
    c.rollback(cp)
    assert c.known_objects("EndpointSlice") == []
    assert w.services.count(db.read_txn()) == 1 and w.backends.count(db.read_txn()) == 0


def test_node_exposure_deletes_service() -> None:
    db, w, c = _conv()
    obj = service(annotations={"service.cilium.io/node": "foo"})
    with w.write_txn() as t:
        w.set_node_labels(t, {"service.cilium.io/node": "foo"})
        c.upsert(t, obj)
    assert w.services.count(db.read_txn()) == 1
    bar = copy.deepcopy(obj)
    bar["metadata"]["annotations"]["service.cilium.io/node"] = "bar"
    with w.write_txn() as t:
        c.upsert(t, bar)
    assert w.services.count(db.read_txn()) == 0 and w.frontends.count(db.read_txn()) == 0


def test_resync_replaces_all_objects_of_a_kind() -> None:
    db, w, c = _conv()
    with w.write_txn() as t:
        c.upsert(t, service())
        c.upsert(t, service(name="two", clusterIP="10.96.0.2", clusterIPs=["10.96.0.2"]))
        c.upsert(t, eps())
    with w.write_txn() as t:
        c.resync(t, "EndpointSlice", [])
        c.resync(t, "Service", [service(name="two", clusterIP="10.96.0.2",
                                        clusterIPs=["10.96.0.2"])])
    r = db.read_txn()
    assert [s.name for s in w.services.all(r)] == ["test/two"] and w.backends.count(r) == 0
    with pytest.raises(ConversionError, match="expected Service"), w.write_txn() as t:
        c.resync(t, "Service", [eps()])


def test_pods_add_update_delete() -> None:
    db, w, c = _conv()
    with w.write_txn() as t:
        c.upsert(t, pod())
    assert [s.name for s in w.services.all(db.read_txn())] == [
        "default/my-app:host-port:4444:u1"]
    with w.write_txn() as t:
        c.upsert(t, pod(uid="u2"))
    assert [s.name for s in w.services.all(db.read_txn())] == [
        "default/my-app:host-port:4444:u2"]
    assert w.backends.count(db.read_txn()) == 1
    with w.write_txn() as t:
        c.delete(t, pod(uid="u2"))
    r = db.read_txn()
    assert w.services.count(r) == 0 and w.backends.count(r) == 0 and w.frontends.count(r) == 0


def test_unsupported_kind() -> None:
    _, w, c = _conv()
    assert not K8sConverter.supports({"kind": "Deployment"})
    with pytest.raises(ConversionError, match="unsupported kind"), w.write_txn() as t:
        c.upsert(t, {"kind": "Deployment", "metadata": {"name": "x"}})


def test_no_nodeport_frontends_without_kube_proxy_replacement() -> None:
    obj = service(type="LoadBalancer", ports=[{"name": "http", "port": 80, "nodePort": 30781}],
                  status={"loadBalancer": {"ingress": [{"ip": "172.16.1.1"}]}})
    assert fe_addrs(convert_service(obj, LBConfig(kube_proxy_replacement=False))) == [
        "10.96.50.104:80/TCP", "172.16.1.1:80/TCP"]


# ----- API server validation limits and error shape ---------------------------------------
def _many(n: int) -> list[dict[str, Any]]:
    return [endpoint(f"10.{i // 65536}.{i // 256 % 256}.{i % 256}") for i in range(n)]


@pytest.mark.parametrize(
    "mutate, field, words",
    [(lambda o: o.update(endpoints=_many(1001)), "endpoints", "at most 1000 endpoints, got 1001"),
     (lambda o: o.update(ports=[{"name": f"p{i}", "port": i + 1} for i in range(101)]),
      "ports", "at most 100 ports"),
     (lambda o: o["endpoints"][0].update(addresses=[]), "endpoints[0].addresses",
      "at least one address"),
     (lambda o: o["endpoints"][0].pop("addresses"), "endpoints[0].addresses",
      "at least one address"),
     (lambda o: o["endpoints"][0].update(addresses=[f"10.0.0.{i}" for i in range(101)]),
      "endpoints[0].addresses", "at most 100 addresses"),
     (lambda o: o.update(addressType="FQDN", endpoints=[{"addresses": []}]),
      "endpoints[0].addresses", "at least one address"),
     (lambda o: o.update(addressType="FQDN", endpoints=_many(1001)), "endpoints", "at most 1000")],
)
def test_endpoint_slice_limits(mutate: Any, field: str, words: str) -> None:
    obj = eps()
    mutate(obj)
    with pytest.raises(ConversionError) as e:
        convert_endpoint_slice(obj)
    assert (e.value.obj, e.value.field) == ("EndpointSlice test/echo-1", field)
    assert words in e.value.message


def test_endpoint_slice_at_the_limits_converts() -> None:
    obj = eps(endpoints=_many(1000))
    obj["endpoints"][0]["addresses"] = [f"10.200.0.{i}" for i in range(100)]
    assert len(convert_endpoint_slice(obj).backends) == 1099
    ports = [{"name": f"p{i}", "port": i + 1} for i in range(100)]
    assert len(convert_endpoint_slice(eps(ports=ports)).backends) == 100


@pytest.mark.parametrize(
    "spec, field, words",
    [({"ports": [{"name": "a", "port": 80}, {"port": 81}]}, "spec.ports[1].name", "required"),
     ({"ports": [{"port": 80}, {"name": "b", "port": 81}]}, "spec.ports[0].name", "required"),
     ({"ports": [{"port": 80}, {"port": 81}]}, "spec.ports[0].name", "required"),
     ({"ports": [{"name": "a", "port": 80}, {"name": "a", "port": 81}]}, "spec.ports[1].name",
      "duplicate port name"),
     ({"ports": [{"name": "a", "port": 80}, {"name": "b", "port": 80, "protocol": "TCP"}]},
      "spec.ports[1]", "duplicate port 80/TCP"),
     ({"clusterIPs": ["10.96.0.1", "fd00::1", "10.96.0.2"]}, "spec.clusterIPs", "at most 2"),
     ({"ipFamilies": ["IPv4", "IPv4"]}, "spec.ipFamilies[1]", "duplicate IP family"),
     ({"ipFamilies": ["IPv4", "IPv6", "IPv4"]}, "spec.ipFamilies", "at most 2 families")],
)
def test_service_api_limits(spec: dict[str, Any], field: str, words: str) -> None:
    with pytest.raises(ConversionError) as e:
        convert_service(service(**spec))
    assert (e.value.obj, e.value.field) == ("Service test/echo", field)
    assert words in e.value.message


def test_service_same_port_other_protocol_is_fine() -> None:
    c = convert_service(service(ports=[{"name": "dns", "port": 53, "protocol": "UDP"},
                                       {"name": "dns-tcp", "port": 53, "protocol": "TCP"}]))
    assert fe_addrs(c) == ["10.96.50.104:53/TCP", "10.96.50.104:53/UDP"]


def test_conversion_error_is_an_input_error_naming_object_and_field() -> None:
    import pickle

    from statedb import InputError, StatewrightError

    obj = service(name="echo", ns="default")
    obj["spec"]["ports"][0]["port"] = 0
    with pytest.raises(InputError) as e:
        convert_service(obj)
    err = e.value
    assert isinstance(err, ConversionError) and isinstance(err, StatewrightError)
    assert isinstance(err, ValueError)
    assert str(err) == "Service default/echo: spec.ports[0].port: port 0 is not allowed"
    copy_ = pickle.loads(pickle.dumps(err))
    assert type(copy_) is ConversionError and str(copy_) == str(err)
    assert (copy_.obj, copy_.field, copy_.message) == (err.obj, err.field, err.message)


@pytest.mark.parametrize(
    "value, weight, state",
    [
        (None, 100, BackendState.ACTIVE),
        ("300", 300, BackendState.ACTIVE),
        (" 7 ", 7, BackendState.ACTIVE),
        ("65535", 65535, BackendState.ACTIVE),
        ("0", 0, BackendState.MAINTENANCE),
        ("65536", 100, BackendState.ACTIVE),  # out of range: ignored
        ("-1", 100, BackendState.ACTIVE),
        ("heavy", 100, BackendState.ACTIVE),
        ("²", 100, BackendState.ACTIVE),
    ],
)
def test_slice_weight_annotation(value: str | None, weight: int, state: BackendState) -> None:
    """service.cilium.io/weight on a slice is every backend's weight; 0 is maintenance."""
    obj = eps(endpoints=[endpoint("10.244.1.1", "n1"), endpoint("10.244.1.2", "n1")])
    if value is not None:
        obj["metadata"]["annotations"] = {"service.cilium.io/weight": value}
    c = convert_endpoint_slice(obj)
    assert {(b.weight, b.state) for b in c.backends} == {(weight, state)}
