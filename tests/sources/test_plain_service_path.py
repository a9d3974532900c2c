"""`convert_service` converts a plain ClusterIP Service (one IPv4 cluster IP, one port,
no annotations: nearly every Service) without the general field-by-field way; whatever
the Service, the result is the general way's: the same row and frontends (sharing the
same port names and shared fields), or the same error."""

from __future__ import annotations

import sys
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.lb import service_obj
from sources.k8s_convert import (
    HEADLESS_LABEL,
    SERVICE_PROXY_NAME_LABEL,
    ConversionError,
    ConvertedService,
    _convert_service,
    _plain_service,
    convert_service,
)
from tables.lb_config import LBConfig
from tables.services import service_shared_part

_ABSENT = object()  # a field the object does not have
_KEEP = object()  # a container as the plain Service has it

# Per field (a path into the object): its plain value first, then other values.
_FIELDS: dict[tuple[str | int, ...], list[Any]] = {
    ("metadata",): [_KEEP, _ABSENT, None, "bad"],
    ("metadata", "name"): ["svc", "", None, 5, _ABSENT],
    ("metadata", "namespace"): ["ns", "", None, 3, _ABSENT],
    ("metadata", "labels"): [
        _ABSENT, None, {}, {"app": "x", "tier": "web"}, {"app": 1}, {HEADLESS_LABEL: ""},
        {SERVICE_PROXY_NAME_LABEL: "x"}, "bad",
    ],
    ("metadata", "annotations"): [
        _ABSENT, None, {}, {"example.com/a": "b"}, {"service.cilium.io/type": "x"},
    ],
    ("metadata", "uid"): ["u-1", _ABSENT],
    ("spec",): [_KEEP, _ABSENT, None, "bad"],
    ("spec", "type"): ["ClusterIP", _ABSENT, None, "NodePort", "LoadBalancer", "ExternalName", 3],
    ("spec", "clusterIP"): ["10.96.0.1", _ABSENT, "None", "", "fd00::1", "010.1.1.1", 5, None],
    ("spec", "clusterIPs"): [
        ["10.96.0.1"], _ABSENT, ["10.96.0.2"], ["None"], [""], ["fd00::1"],
        ["10.96.0.1", "fd00::1"], [], [5], None, "10.96.0.1", ["1.2.3"],
    ],
    ("spec", "ports"): [
        [{}], _ABSENT, None, "bad", [], [5], [{}, {"name": "dns", "port": 53}],
        [{}, {"port": 53}],
    ],
    ("spec", "ports", 0, "name"): ["http", _ABSENT, None, "", 3],
    ("spec", "ports", 0, "port"): [80, _ABSENT, 0, 65535, 65536, -1, True, "80", None],
    ("spec", "ports", 0, "protocol"): ["TCP", _ABSENT, None, "UDP", "SCTP", "tcp", 6],
    ("spec", "ports", 0, "nodePort"): [_ABSENT, None, 30080, 0, 70000, "x"],
    ("spec", "ports", 0, "targetPort"): [8080, _ABSENT],
    ("spec", "selector"): [{"app": "x"}, _ABSENT, None, {}, {"app": 1}, {"app": None}, "x"],
    ("spec", "ipFamilies"): [
        ["IPv4"], _ABSENT, None, ["IPv6"], ["IPv4", "IPv4"], ["IPv4", "IPv6"], "IPv4", [],
    ],
    ("spec", "ipFamilyPolicy"): ["SingleStack", _ABSENT, "PreferDualStack"],
    ("spec", "sessionAffinity"): ["None", _ABSENT, None, "ClientIP", 3, ""],
    ("spec", "internalTrafficPolicy"): ["Cluster", _ABSENT, None, "Local", "bogus", ""],
    ("spec", "externalTrafficPolicy"): [_ABSENT, "Local", "Cluster", None],
    ("spec", "externalIPs"): [_ABSENT, ["1.2.3.4"], []],
    ("spec", "loadBalancerSourceRanges"): [_ABSENT, None, ["10.0.0.0/8"]],
    ("spec", "healthCheckNodePort"): [_ABSENT, None, 0],
    ("spec", "trafficDistribution"): [_ABSENT, None, "PreferClose"],
    ("spec", "publishNotReadyAddresses"): [_ABSENT, True],
    ("status",): [_ABSENT, None, {}, {"loadBalancer": {}},
                  {"loadBalancer": {"ingress": [{"ip": "1.2.3.4"}]}}, {"loadBalancer": None},
                  {"loadBalancer": {}, "conditions": []}, "bad"],
}
_config = st.sampled_from([
    LBConfig(), LBConfig(), LBConfig(enable_ipv4=False),
    LBConfig(enable_internal_traffic_policy=False),
])


def _build(changes: dict[tuple[str | int, ...], Any]) -> dict[str, Any]:
    """The plain Service with ``changes`` (path -> value; `_ABSENT`: removed)."""
    values = {path: values[0] for path, values in _FIELDS.items()}
    values.update(changes)
    obj: dict[str, Any] = {"apiVersion": "v1", "kind": "Service", "metadata": {}, "spec": {}}
    for path in sorted(values, key=len):  # the containers before what they hold
        parent: Any = obj
        for key in path[:-1]:
            parent = _child(parent, key)
        if type(parent) is not dict or values[path] is _KEEP:
            continue
        if values[path] is _ABSENT:
            parent.pop(path[-1], None)
        else:
            value = values[path]
            parent[path[-1]] = [dict(p) if type(p) is dict else p for p in value] if (
                type(value) is list
            ) else dict(value) if type(value) is dict else value
    return obj


def _child(parent: Any, key: str | int) -> Any:
    """``parent[key]`` when it is a dict or list (of a dict, or a list by index), else
    None."""
    if type(parent) is dict:
        child = parent.get(key)
    elif type(parent) is list and type(key) is int and key < len(parent):
        child = parent[key]
    else:
        return None
    return child if type(child) in (dict, list) else None


# Most examples change one to three fields of a plain Service.
_changes = st.dictionaries(
    st.sampled_from(sorted(_FIELDS, key=str)), st.integers(0, 20), max_size=3
).map(lambda d: {path: _FIELDS[path][i % len(_FIELDS[path])] for path, i in d.items()})


def _convert(f: Any, *args: Any) -> ConvertedService | str:
    try:
        converted: ConvertedService = f(*args)
        return converted
    except ConversionError as e:
        return f"{type(e).__name__}: {e}"


def _same(obj: dict[str, Any], cfg: LBConfig) -> bool:
    """Assert that `convert_service` gives what the general way gives; True when the plain
    way took it."""
    plain = _plain_service(obj, cfg, "k8s")
    got = _convert(convert_service, obj, cfg, {}, "k8s")
    want = _convert(_convert_service, obj, cfg, {}, "k8s")
    assert got == want
    if plain is not None:
        # It shares what the general way's row shares.
        assert isinstance(got, ConvertedService) and isinstance(want, ConvertedService)
        assert got.service.port_names is want.service.port_names
        assert service_shared_part(got.service) is service_shared_part(want.service)
        assert sys.intern(got.service.name) is got.service.name
        for a, b in zip(got.frontends, want.frontends, strict=True):
            assert a.port_name is b.port_name
            assert a.service_name is got.service.name
    return plain is not None


@settings(max_examples=1500, deadline=None, derandomize=True)
@given(_changes, _config)
def test_any_service_converts_as_the_general_way_does(
    changes: dict[tuple[str | int, ...], Any], cfg: LBConfig
) -> None:
    _same(_build(changes), cfg)


def test_plain_services_take_the_plain_way() -> None:
    plain = [
        service_obj(7),
        {"metadata": {"name": "a", "namespace": "ns", "labels": {"app": "a"}},
         "spec": {"type": "ClusterIP", "clusterIP": "10.96.0.9", "selector": {"app": "a"},
                  "ports": [{"port": 53, "protocol": "UDP"}], "ipFamilies": ["IPv4"],
                  "ipFamilyPolicy": "SingleStack", "sessionAffinity": "None",
                  "internalTrafficPolicy": "Cluster"},
         "status": {"loadBalancer": {}}},
    ]
    for obj in plain:
        for cfg in (LBConfig(), LBConfig(enable_ipv4=False)):
            assert _same(obj, cfg)
    assert len(convert_service(plain[1]).frontends) == 1
