"""The adapter's backend specs: read once per run of instances sharing everything but the
address (`backend_specs`), they equal the specs built one instance at a time
(`backend_spec`), whatever the instances share."""

from __future__ import annotations

import dataclasses
import ipaddress

from hypothesis import given, settings
from hypothesis import strategies as st

from bpfops.adapter import RowBackends, backend_spec, backend_specs, service_spec
from bpfops.model import BackendSpec, ServiceSpec
from tables.backends import (
    BackendParams,
    BackendState,
    backend_details,
    backend_rest,
    backend_shared_part,
    new_backend_params_from,
)
from tables.l3n4 import L3n4Addr
from tables.lb_config import LBConfig
from tables.services import (
    ForwardingMode,
    LBAlgorithm,
    ProxyRedirect,
    Service,
    SourceRangesPolicy,
    TrafficPolicy,
)

_FIELDS = st.tuples(
    st.sampled_from([(), ("http",), ("http", "metrics")]),  # port names
    st.sampled_from([0, 1, 100, 65535]),  # weight
    st.sampled_from(list(BackendState)),
    st.sampled_from(["", "node-a"]),  # node name
    st.sampled_from([0, 7]),  # cluster id
    st.booleans(),  # unhealthy
    st.sampled_from([0.0, 1700000000.5]),  # unhealthy_updated_at
)


def _addr(i: int, v6: bool) -> L3n4Addr:
    ip = ipaddress.ip_address("fd00::" if v6 else "10.0.0.0") + i + 1
    return L3n4Addr.of(ip, 8080, "TCP")


@st.composite
def _instances(draw: st.DrawFn) -> tuple[BackendParams, ...]:
    """Instances in runs: one built per fields tuple and shared (as a converter builds a
    slice's backends), or built on their own (equal fields, other objects)."""
    out: list[BackendParams] = []
    for run, (names, weight, state, node, cluster, unhealthy, at) in enumerate(
        draw(st.lists(_FIELDS, max_size=6))
    ):
        shared = draw(st.booleans())
        details = backend_details(node, "", (), cluster, "k8s", unhealthy, at)
        rest = backend_rest(details, names, weight, state)
        for j in range(draw(st.integers(1, 4))):
            addr = _addr(run * 8 + j, draw(st.booleans()))
            if shared:
                out.append(new_backend_params_from(addr, rest))
            else:
                out.append(
                    BackendParams(addr, names, weight, node, "", (), cluster, "k8s", state,
                                  unhealthy, at)
                )
    return tuple(out)


@settings(max_examples=200, deadline=None)
@given(_instances())
def test_backend_specs_equal_one_at_a_time(instances: tuple[BackendParams, ...]) -> None:
    assert backend_specs(instances) == tuple(backend_spec(b) for b in instances)


def _usual(spec: BackendSpec) -> bool:
    """What the bulk path asks of a backend's spec."""
    return not (spec.state or spec.unhealthy or spec.not_serving or spec.cluster_id or spec.zone)


@settings(max_examples=300, deadline=None)
@given(_instances())
def test_row_backends_stand_for_their_specs(instances: tuple[BackendParams, ...]) -> None:
    """`RowBackends` behaves as the tuple `backend_specs` gives, and its usual addresses
    (read without building specs) are the specs' addresses exactly when every spec is
    the usual kind, or None (never the addresses of backends that are not all usual)."""
    specs = backend_specs(instances)
    usual = RowBackends(instances).usual_addresses()
    if usual is not None:
        assert all(map(_usual, specs))
        assert usual == [s.addr for s in specs]
    if instances and len({backend_shared_part(b) for b in instances}) == 1:
        # One shared part: the answer is exact.
        assert (usual is not None) == all(map(_usual, specs))
    lazy = RowBackends(instances)
    assert len(lazy) == len(specs)
    assert lazy == specs and specs == lazy and hash(lazy) == hash(specs)
    assert tuple(lazy) == specs and list(lazy[:2]) == list(specs[:2])
    assert all(lazy[i] == specs[i] for i in range(len(specs)))
    assert lazy == RowBackends(instances) and repr(lazy) == repr(specs)
    # Made from the row's tuple itself (the spec's shared_backends), not an equal one.
    assert lazy.made_from(instances)
    if instances:
        assert not lazy.made_from(tuple(list(instances)))


def test_shared_part_is_one_object_for_a_run() -> None:
    details = backend_details("node-a", "", (), 0, "k8s", False, 0.0)
    rest = backend_rest(details, ("http",), 100, BackendState.ACTIVE)
    a = new_backend_params_from(_addr(1, False), rest)
    b = new_backend_params_from(_addr(2, False), rest)
    c = new_backend_params_from(
        _addr(3, False), backend_rest(details, ("http",), 100, BackendState.TERMINATING)
    )
    assert backend_shared_part(a) is backend_shared_part(b)
    assert backend_shared_part(a) is not backend_shared_part(c)
    specs = backend_specs((a, b, c))
    assert [s.addr for s in specs] == [a.address, b.address, c.address]
    assert [s.state for s in specs] == [0, 0, 1]


# ----- the service settings, read once per shared part -------------------------------------
_SERVICE_FIELDS = st.fixed_dictionaries(
    {
        "ext_traffic_policy": st.sampled_from(list(TrafficPolicy)),
        "int_traffic_policy": st.sampled_from(list(TrafficPolicy)),
        "forwarding_mode": st.sampled_from(list(ForwardingMode)),
        "session_affinity": st.booleans(),
        "session_affinity_timeout": st.sampled_from([0, 30]),
        "load_balancer_class": st.sampled_from([None, "io.cilium/bgp"]),
        "proxy_redirect": st.sampled_from(
            [None, ProxyRedirect(9000), ProxyRedirect(9001, (80,))]
        ),
        "loopback_host_port": st.booleans(),
        "source_ranges": st.sampled_from([(), (ipaddress.ip_network("10.0.0.0/8"),)]),
        "source_ranges_policy": st.sampled_from(list(SourceRangesPolicy)),
        "lb_algorithm": st.sampled_from(list(LBAlgorithm)),
        "proxy_delegation": st.sampled_from(["", "delegate-if-local"]),
        "scale_to_zero": st.booleans(),
    }
)


def _expected_service_spec(svc: Service, port: int, affinity_enabled: bool) -> ServiceSpec:
    """The service settings as the ops see them, field by field."""
    redirect = svc.proxy_redirect
    affinity = svc.session_affinity and affinity_enabled
    return ServiceSpec(
        name=svc.name,
        session_affinity=affinity,
        affinity_timeout=svc.session_affinity_timeout if affinity else 0,
        ext_local=svc.ext_traffic_policy == TrafficPolicy.LOCAL,
        int_local=svc.int_traffic_policy == TrafficPolicy.LOCAL,
        source_ranges=tuple(svc.source_ranges),
        source_ranges_deny=svc.source_ranges_policy == SourceRangesPolicy.DENY,
        lb_algorithm="" if svc.lb_algorithm == LBAlgorithm.UNDEF else str(svc.lb_algorithm),
        forwarding_mode=str(svc.forwarding_mode),
        proxy_delegation=svc.proxy_delegation == "delegate-if-local",
        loopback_hostport=svc.loopback_host_port,
        load_balancer_class=svc.load_balancer_class,
        l7_proxy_port=redirect.proxy_port if redirect and redirect.redirects(port) else 0,
        scale_to_zero=svc.scale_to_zero,
    )


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(_SERVICE_FIELDS, st.sampled_from([80, 443]), st.booleans(), st.booleans()),
        min_size=1,
        max_size=8,
    )
)
def test_service_spec_equals_the_fields_whatever_came_before(
    calls: list[tuple[dict[str, object], int, bool, bool]],
) -> None:
    """In any order of services (sharing settings or not, with session affinity enabled
    or not), each spec is its own service's."""
    cfg = LBConfig(node_name="n")
    made: list[Service] = []
    for i, (fields, port, affinity_enabled, again) in enumerate(calls):
        # A service made before, with the same shared part, under another name: or a new one.
        svc = (
            dataclasses.replace(made[-1], name=f"default/svc-{i}")
            if again and made
            else Service(name=f"default/svc-{i}", **fields)  # type: ignore[arg-type]
        )
        made.append(svc)
        cfg = dataclasses.replace(cfg, enable_session_affinity=affinity_enabled)
        assert service_spec(svc, svc.name, port, cfg) == _expected_service_spec(
            svc, port, affinity_enabled
        )
