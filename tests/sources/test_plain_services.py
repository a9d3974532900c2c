"""`convert_service` builds most Service rows through `new_plain_service` (every shared
field but the traffic policies at its default) and the others field by field: whatever
combination of the fields a Service sets, its row has the values they convert to, and
the rows of services with the same shared fields (the same objects) share one tuple of
them."""

from __future__ import annotations

import ipaddress
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from sources.k8s_convert import convert_service
from tables.lb_config import LBConfig
from tables.services import (
    PREFER_SAME_NODE,
    PREFER_SAME_ZONE,
    ForwardingMode,
    LBAlgorithm,
    Service,
    SourceRangesPolicy,
    TrafficPolicy,
    new_plain_service,
    new_service,
    service_shared_part,
)

_ANNOTATIONS = {
    "service.cilium.io/scope": st.sampled_from(["external-only", "internal", "both"]),
    "service.cilium.io/proxy-delegation": st.sampled_from(["delegate-if-local", "none"]),
    "service.cilium.io/scale-to-zero": st.sampled_from(["true", "false"]),
    "service.cilium.io/src-ranges-policy": st.sampled_from(["deny", "allow"]),
    "service.cilium.io/lb-algorithm": st.sampled_from(["maglev", "random"]),
    "service.cilium.io/forwarding-mode": st.sampled_from(["dsr", "snat"]),
    "service.kubernetes.io/topology-mode": st.sampled_from(["auto", "off"]),
    "example.com/other": st.just("x"),
}


def _maybe(s: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(st.none(), s)


_spec = st.fixed_dictionaries(
    {},
    optional={
        "externalTrafficPolicy": st.sampled_from(["Cluster", "Local"]),
        "internalTrafficPolicy": st.sampled_from(["Cluster", "Local"]),
        "sessionAffinity": st.sampled_from(["None", "ClientIP"]),
        "sessionAffinityConfig": st.just({"clientIP": {"timeoutSeconds": 60}}),
        "loadBalancerSourceRanges": st.just(["10.0.0.0/8"]),
        "healthCheckNodePort": st.sampled_from([0, 32000]),
        "loadBalancerClass": st.just("example.com/lb"),
        "trafficDistribution": st.sampled_from(["PreferClose", PREFER_SAME_NODE, "bogus"]),
    },
)
_case = st.tuples(
    _spec,
    st.fixed_dictionaries({}, optional=_ANNOTATIONS),  # type: ignore[arg-type]
    st.booleans(),  # with the algorithm and mode annotations enabled
    st.booleans(),  # with internal traffic policies enabled
)


def _expected(spec: dict[str, Any], ann: dict[str, str], cfg: LBConfig) -> Service:
    """The row as the fields convert one by one (the converter's rules, restated)."""
    ext = TrafficPolicy(spec.get("externalTrafficPolicy", "Cluster"))
    internal = TrafficPolicy(spec.get("internalTrafficPolicy", "Cluster"))
    if not cfg.enable_internal_traffic_policy:
        internal = TrafficPolicy.CLUSTER
    affinity = spec.get("sessionAffinity") == "ClientIP"
    timeout = (60 if "sessionAffinityConfig" in spec else 10800) if affinity else 0
    ranges = tuple(ipaddress.ip_network(r) for r in spec.get("loadBalancerSourceRanges", ()))
    dist = spec.get("trafficDistribution", "")
    dist = {"PreferClose": PREFER_SAME_ZONE, "bogus": ""}.get(dist, dist)
    if not dist and ann.get("service.kubernetes.io/topology-mode") == "auto":
        dist = PREFER_SAME_ZONE
    algorithm = LBAlgorithm.UNDEF
    mode = ForwardingMode.UNDEF
    if cfg.algorithm_annotation and "service.cilium.io/lb-algorithm" in ann:
        algorithm = LBAlgorithm(ann["service.cilium.io/lb-algorithm"])
    if cfg.mode_annotation and "service.cilium.io/forwarding-mode" in ann:
        mode = ForwardingMode(ann["service.cilium.io/forwarding-mode"])
    deny = ann.get("service.cilium.io/src-ranges-policy") == "deny"
    return Service(
        "ns/svc",
        "k8s",
        annotations=tuple(sorted(ann.items())),
        ext_traffic_policy=ext,
        int_traffic_policy=internal,
        forwarding_mode=mode,
        session_affinity=affinity,
        session_affinity_timeout=timeout,
        load_balancer_class=spec.get("loadBalancerClass"),
        health_check_node_port=spec.get("healthCheckNodePort", 0),
        source_ranges=ranges,
        source_ranges_policy=SourceRangesPolicy.DENY if deny else SourceRangesPolicy.ALLOW,
        port_names=(("http", 80),),
        traffic_distribution=dist,
        lb_algorithm=algorithm,
        internal_scope_enabled=ann.get("service.cilium.io/scope") != "external-only",
        proxy_delegation=(
            "delegate-if-local"
            if ann.get("service.cilium.io/proxy-delegation") == "delegate-if-local" else ""
        ),
        scale_to_zero=ann.get("service.cilium.io/scale-to-zero") == "true",
    )


def _obj(spec: dict[str, Any], ann: dict[str, str]) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "svc", "namespace": "ns"}
    if ann:
        meta["annotations"] = ann
    return {
        "kind": "Service",
        "metadata": meta,
        "spec": {
            "type": "LoadBalancer",
            "clusterIP": "10.96.0.1",
            "ports": [{"name": "http", "port": 80, "nodePort": 30080}],
            **spec,
        },
    }


@settings(max_examples=400, deadline=None, derandomize=True)
@given(_case)
def test_the_row_has_the_converted_fields(case: tuple[Any, ...]) -> None:
    spec, ann, annotated, itp = case
    cfg = LBConfig(algorithm_annotation=annotated, mode_annotation=annotated,
                   enable_internal_traffic_policy=itp)
    row = convert_service(_obj(spec, ann), cfg).service
    want = _expected(spec, ann, cfg)
    assert row == want
    assert [getattr(row, f) for f in row.__match_args__] == [
        getattr(want, f) for f in want.__match_args__
    ]
    # Rows with the same shared fields (the same objects: source ranges are parsed anew
    # each time) share one tuple of them; plain ones that of `new_plain_service`.
    again = convert_service(_obj(spec, ann), cfg).service
    if "loadBalancerSourceRanges" not in spec:
        assert service_shared_part(again) is service_shared_part(row)
    plain = new_plain_service("ns/x", "k8s", (), (), (), (), want.ext_traffic_policy,
                              want.int_traffic_policy)
    if service_shared_part(plain) == service_shared_part(want):
        assert service_shared_part(row) is service_shared_part(plain)


def test_a_plain_row_is_the_row_of_the_defaults() -> None:
    for ext in TrafficPolicy:
        for internal in TrafficPolicy:
            own = ("ns/a", (("app", "a"),), (("note", "x"),), (("app", "a"),), (("http", 80),))
            plain = new_plain_service(own[0], "k8s", *own[1:], ext, internal)
            full = Service(own[0], "k8s", own[1], own[2], own[3], port_names=own[4],
                           ext_traffic_policy=ext, int_traffic_policy=internal)
            assert plain == full
            assert service_shared_part(plain) is service_shared_part(full)
            # A policy given as its text is a field of another type: not shared.
            text = new_service(own[0], "k8s", *own[1:4], "", ext.value, internal,
                               ForwardingMode.UNDEF, False, 0, None, None, 0, False, (),
                               SourceRangesPolicy.ALLOW, own[4], "", LBAlgorithm.UNDEF,
                               True, "", False)
            assert service_shared_part(text) is not service_shared_part(plain)
            assert type(text.ext_traffic_policy) is str
