"""Property: whatever is wrong with a Kubernetes object, converting and applying it raises
`InputError` or nothing. The sources catch only `InputError` (anything else is a bug and
propagates), so a malformed object that made the converter raise TypeError, KeyError or a
bare ValueError would stop a source instead of being reported."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from sources.k8s_convert import K8sConverter, convert_endpoint_slice
from statedb import DB, InputError
from tables.lb_writer import CheckedBackends, LBWriter

from .test_k8s_convert import endpoint, eps, pod, service


def _lb_service() -> dict[str, Any]:
    return service(
        type="LoadBalancer",
        status={"loadBalancer": {"ingress": [{"ip": "172.16.0.1"}]}},
        annotations={"service.cilium.io/type": "ClusterIP,LoadBalancer"},
        externalIPs=["192.0.2.1"],
        loadBalancerSourceRanges=["10.0.0.0/8"],
        sessionAffinity="ClientIP",
        sessionAffinityConfig={"clientIP": {"timeoutSeconds": 10}},
        ports=[{"name": "a", "port": 80, "nodePort": 30080}, {"name": "b", "port": 53,
                                                              "protocol": "UDP"}],
    )


def _slice() -> dict[str, Any]:
    ep = endpoint("10.244.0.1", "n1", ready=True, serving=True, terminating=False)
    ep["hints"] = {"forZones": [{"name": "a"}]}
    return eps(endpoints=[ep, endpoint("10.244.0.2")])


BASES: list[Callable[[], dict[str, Any]]] = [_lb_service, _slice, pod]

_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-2, 70000),
    st.floats(allow_nan=False, width=16),
    st.text(max_size=4),
    st.sampled_from(["10.0.0.1", "fd00::1", "None", "TCP", "Local", "NodePort", "FQDN",
                     "IPv6", "10.0.0.0/33", "ClientIP", "PreferClose", "true"]),
)
_values = st.recursive(
    _scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=3),
                            st.dictionaries(st.text(max_size=4), inner, max_size=3)),
    max_leaves=6,
)


def _paths(obj: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    if prefix:
        yield prefix
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _paths(v, (*prefix, i))


def _set(obj: Any, path: tuple[Any, ...], value: Any) -> None:
    for k in path[:-1]:
        obj = obj[k]
    obj[path[-1]] = value


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.sampled_from(BASES),
       st.lists(st.tuples(st.integers(0, 10_000), _values), min_size=1, max_size=3))
def test_malformed_objects_raise_only_input_errors(
    base: Callable[[], dict[str, Any]], mutations: list[tuple[int, Any]]
) -> None:
    obj = base()
    for where, value in mutations:
        paths = list(_paths(obj))
        if paths:
            _set(obj, paths[where % len(paths)], copy.deepcopy(value))
    writer = LBWriter.create(DB())
    conv = K8sConverter(writer)
    try:
        conv.check(obj)
        with writer.write_txn() as txn:
            conv.upsert(txn, obj)
            conv.delete(txn, obj)
    except InputError:
        pass


def _weighted_slice() -> dict[str, Any]:
    """A slice of two ports, a weight annotation and endpoints in several states."""
    obj = _slice()
    obj["metadata"]["annotations"] = {"service.cilium.io/weight": "7"}
    obj["endpoints"].append(endpoint("10.244.0.3", "n2", ready=False, terminating=True))
    obj["ports"].append({"name": "dns", "port": 53, "protocol": "UDP"})
    return obj


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.sampled_from([_slice, _weighted_slice]),
       st.lists(st.tuples(st.integers(0, 10_000), _values), min_size=1, max_size=3))
def test_converted_backends_pass_the_writers_checks(
    base: Callable[[], dict[str, Any]], mutations: list[tuple[int, Any]]
) -> None:
    """The converter hands the writer `CheckedBackends`, which `set_backends` does not check
    again: whatever an EndpointSlice converts to must pass those checks (given as a plain
    list, which the writer checks backend by backend)."""
    obj = base()
    for where, value in mutations:
        paths = list(_paths(obj))
        _set(obj, paths[where % len(paths)], copy.deepcopy(value))
    try:
        conv = convert_endpoint_slice(obj)
    except InputError:
        return
    assert type(conv.backends) is CheckedBackends
    writer = LBWriter.create(DB())
    with writer.write_txn() as txn:
        writer.set_backends(txn, conv.service_name, "k8s", list(conv.backends))
