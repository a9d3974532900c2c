"""Service rows keep the value semantics of the frozen dataclass they were.

A Service holds its per-service fields in slots and the others in one shared tuple; it
still behaves as a frozen dataclass of its twenty-three fields. Backend rows in their
two-slot form, and the `statedb.rows.FrozenValue` base, are checked here too.
"""

from __future__ import annotations

import copy
import dataclasses
import ipaddress
import pickle
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from statedb.rows import FrozenValue, slot_setters
from tables.backends import Backend, BackendParams
from tables.l3n4 import L3n4Addr
from tables.services import (
    ForwardingMode,
    LBAlgorithm,
    ProxyRedirect,
    Service,
    SourceRangesPolicy,
    TrafficPolicy,
    new_service,
)


@dataclasses.dataclass(frozen=True, slots=True)
class RefService:
    """The reference: the row's former field list (a frozen dataclass)."""

    name: str
    source: str = "k8s"
    labels: tuple[tuple[str, str], ...] = ()
    annotations: tuple[tuple[str, str], ...] = ()
    selector: tuple[tuple[str, str], ...] = ()
    nat_policy: str = ""
    ext_traffic_policy: TrafficPolicy = TrafficPolicy.CLUSTER
    int_traffic_policy: TrafficPolicy = TrafficPolicy.CLUSTER
    forwarding_mode: ForwardingMode = ForwardingMode.UNDEF
    session_affinity: bool = False
    session_affinity_timeout: int = 0
    load_balancer_class: str | None = None
    proxy_redirect: ProxyRedirect | None = None
    health_check_node_port: int = 0
    loopback_host_port: bool = False
    source_ranges: tuple[Any, ...] = ()
    source_ranges_policy: SourceRangesPolicy = SourceRangesPolicy.ALLOW
    port_names: tuple[tuple[str, int], ...] = ()
    traffic_distribution: str = ""
    lb_algorithm: LBAlgorithm = LBAlgorithm.UNDEF
    internal_scope_enabled: bool = True
    proxy_delegation: str = ""
    scale_to_zero: bool = False


RefService.__qualname__ = "Service"  # its repr then reads like the row's

pairs = st.lists(st.tuples(st.sampled_from(["a", "b"]), st.sampled_from(["x", "y"])),
                 max_size=2, unique_by=lambda p: p[0]).map(tuple)
field_values: dict[str, Any] = {
    "name": st.sampled_from(["ns/a", "ns/b"]),
    "source": st.sampled_from(["k8s", "api"]),
    "labels": pairs,
    "annotations": pairs,
    "selector": pairs,
    "ext_traffic_policy": st.sampled_from(list(TrafficPolicy)),
    "int_traffic_policy": st.sampled_from(list(TrafficPolicy)),
    "session_affinity": st.booleans(),
    "session_affinity_timeout": st.sampled_from([0, 30]),
    "load_balancer_class": st.sampled_from([None, "c"]),
    "proxy_redirect": st.sampled_from([None, ProxyRedirect(8080, (80,))]),
    "source_ranges": st.sampled_from([(), (ipaddress.ip_network("10.0.0.0/8"),)]),
    "port_names": st.sampled_from([(), (("http", 80),)]),
    "traffic_distribution": st.sampled_from(["", "PreferSameZone"]),
    "lb_algorithm": st.sampled_from(list(LBAlgorithm)),
    "scale_to_zero": st.booleans(),
}
services = st.fixed_dictionaries({"name": field_values["name"]}, optional={
    k: v for k, v in field_values.items() if k != "name"
})


@settings(max_examples=200, deadline=None)
@given(services, services)
def test_service_like_the_dataclass(a: dict[str, Any], b: dict[str, Any]) -> None:
    x, y, rx, ry = Service(**a), Service(**b), RefService(**a), RefService(**b)
    for f in dataclasses.fields(RefService):
        assert getattr(x, f.name) == getattr(rx, f.name)
        assert type(getattr(x, f.name)) is type(getattr(rx, f.name))
    assert [f.name for f in dataclasses.fields(Service)] == [
        f.name for f in dataclasses.fields(RefService)
    ]
    assert (x == y) == (rx == ry) and (x != y) == (rx != ry)
    assert (x == y) <= (hash(x) == hash(y))
    assert repr(x) == repr(rx)
    assert pickle.loads(pickle.dumps(x)) == x and copy.deepcopy(x) == x
    assert dataclasses.asdict(x) == dataclasses.asdict(rx)
    assert dataclasses.replace(x, **b) == Service(**{**a, **b})
    assert new_service(*[getattr(x, f.name) for f in dataclasses.fields(Service)]) == x


def test_service_alias_and_immutability() -> None:
    svc = Service("ns/a", traffic_distribution="PreferClose")
    assert svc.traffic_distribution == "PreferSameZone"
    with pytest.raises(dataclasses.FrozenInstanceError):
        svc.name = "ns/b"
    with pytest.raises(dataclasses.FrozenInstanceError):
        svc.session_affinity = True
    with pytest.raises(dataclasses.FrozenInstanceError):
        del svc.labels


def test_service_shared_tuple_keeps_field_types() -> None:
    # An equal value of another type (a str for an enum member, 0 for False) is never
    # read back from a tuple another service shared.
    a = Service("ns/a", ext_traffic_policy=TrafficPolicy.LOCAL)
    b = Service("ns/b", ext_traffic_policy="Local")  # type: ignore[arg-type]
    assert a.ext_traffic_policy is TrafficPolicy.LOCAL
    assert type(b.ext_traffic_policy) is str
    c = Service("ns/c", loopback_host_port=0)  # type: ignore[arg-type]
    assert Service("ns/d").loopback_host_port is False and c.loopback_host_port == 0
    # Services with the very same settings share one tuple: 80 bytes each.
    assert Service("ns/e")._rest is Service("ns/f")._rest


ADDR = L3n4Addr.parse("10.0.0.1:80/TCP")
OTHER = L3n4Addr.parse("10.0.0.2:80/TCP")


def test_backend_with_an_instance_of_another_address() -> None:
    # The two-slot form needs the instance's address to be the backend's; any other
    # backend keeps its address and pairs, with the same value semantics.
    key = ("ns/a", 4)
    p = BackendParams(OTHER)
    b = Backend(ADDR, ((key, p),))
    assert b.address is ADDR and b.instances == ((key, p),)
    assert b.instance("ns/a") is p and b.service_names() == ["ns/a"]
    assert Backend.single(ADDR, key, p) == b and hash(Backend.single(ADDR, key, p)) == hash(b)
    assert b != Backend(OTHER, ((key, p),))
    same = Backend.single(OTHER, key, p)
    assert same.address is OTHER and same.instances == ((key, p),)
    assert pickle.loads(pickle.dumps(b)) == b and repr(b).startswith("Backend(address=")


class _Pair(FrozenValue):
    __slots__ = ("a", "b")
    __match_args__ = ("a", "b")
    a: int
    b: int

    def __init__(self, a: int, b: int) -> None:
        _set_a(self, a)
        _set_b(self, b)

    def _fields(self) -> tuple[Any, ...]:
        return (self.a, self.b)


_set_a, _set_b = slot_setters(_Pair, "a", "b")


def test_frozen_value_base() -> None:
    p = _Pair(1, 2)
    assert p == _Pair(1, 2) and p != _Pair(2, 1) and hash(p) == hash(_Pair(1, 2))
    assert repr(p) == "_Pair(a=1, b=2)" and pickle.loads(pickle.dumps(p)) == p
    assert p.__eq__(object()) is NotImplemented
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.a = 3
    with pytest.raises(dataclasses.FrozenInstanceError):
        del p.b
