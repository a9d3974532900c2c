"""The converter's loop for plain EndpointSlices gives what its general loop gives.

`convert_endpoint_slice` takes a slice of one IPv4 port whose endpoints are all plain
(ready, one address, no hints, distinct addresses) through a loop of its own and any
other through the general one. ``hints: {}`` on an endpoint means no hints, but only the
general loop takes it: so a slice and its copy with ``hints: {}`` on every endpoint,
converted, compare the two loops, plain or not, with and without the backends an earlier
version of the slice gave (``previous``).
"""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from sources.k8s_convert import ConversionError, K8sConverter, convert_endpoint_slice
from statedb import DB
from tables.backends import backend_shared_part
from tables.lb_config import LBConfig
from tables.lb_writer import LBWriter

_ADDRESSES = ["10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.256", "::1", "", 7, None,
              b"10.0.0.1", "10.0.0.1\x00"]
_CONDITIONS: list[Any] = [
    {"ready": True, "serving": True},
    {"ready": True},
    {"ready": True, "serving": True, "terminating": False},
    {"ready": False, "serving": True, "terminating": True},
    {"ready": True, "terminating": True},
    {},
    None,
    {"ready": "yes"},
    # Equal to plain conditions, but not booleans: the general loop refuses them.
    {"ready": 1, "serving": True},
    {"ready": True, "serving": 1.0},
    {"ready": True, "terminating": 0},
]

endpoint = st.fixed_dictionaries(
    {
        "addresses": st.one_of(
            st.lists(st.sampled_from(_ADDRESSES[:3]), min_size=1, max_size=1),
            st.lists(st.sampled_from(_ADDRESSES), max_size=2),
        ),
        "conditions": st.sampled_from(_CONDITIONS),
    },
    optional={
        "nodeName": st.sampled_from(["node-a", "node-b", "", None, 3]),
        "zone": st.sampled_from(["zone-a", "", None]),
    },
)
slices = st.fixed_dictionaries(
    {
        "endpoints": st.lists(endpoint, max_size=4),
        "ports": st.sampled_from(
            [
                [{"name": "http", "port": 8080, "protocol": "TCP"}],
                [{"port": 53, "protocol": "UDP"}],
                [{"name": "http", "port": 8080}, {"name": "metrics", "port": 9090}],
            ]
        ),
        "weight": st.sampled_from([None, "100", "7", "0"]),
    }
)


def _slice(spec: dict[str, Any], hinted: bool) -> dict[str, Any]:
    endpoints = copy.deepcopy(spec["endpoints"])
    if hinted:
        for ep in endpoints:
            ep["hints"] = {}
    meta: dict[str, Any] = {
        "name": "echo-abcde",
        "namespace": "default",
        "labels": {"kubernetes.io/service-name": "echo"},
    }
    if spec["weight"] is not None:
        meta["annotations"] = {"service.cilium.io/weight": spec["weight"]}
    return {
        "kind": "EndpointSlice",
        "metadata": meta,
        "addressType": "IPv4",
        "endpoints": endpoints,
        "ports": spec["ports"],
    }


def _convert(obj: dict[str, Any], previous: Any) -> tuple[Any, ...] | str:
    try:
        conv = convert_endpoint_slice(obj, previous=previous)
    except ConversionError as e:
        return str(e)
    return conv.backends


@settings(max_examples=300, deadline=None)
@given(slices, slices)
def test_plain_and_general_loops_agree(spec: dict[str, Any], before: dict[str, Any]) -> None:
    earlier = _convert(_slice(before, False), None)
    previous = {b.address: b for b in earlier} if isinstance(earlier, tuple) else None
    for prev in (None, previous):
        plain = _convert(_slice(spec, False), prev)
        general = _convert(_slice(spec, True), prev)
        assert plain == general
        if isinstance(plain, tuple) and isinstance(general, tuple):
            # The same objects where an earlier backend was given back, and the same
            # shared parts (the writer and the LB Ops compare them by identity).
            given_back = prev or {}
            assert [b is given_back.get(b.address) for b in plain] == [
                b is given_back.get(b.address) for b in general
            ]
            assert all(
                backend_shared_part(p) is backend_shared_part(g)
                for p, g in zip(plain, general, strict=True)
            )


def test_a_slice_emptied_later_empties_its_frontend() -> None:
    """The writer's path for a service's first backends is not taken for a service whose
    backends a slice update all released (its rows are gone by then, its frontend not)."""
    cfg = LBConfig()
    db = DB()
    writer = LBWriter.create(db, cfg)
    conv = K8sConverter(writer, cfg)
    service = {
        "kind": "Service",
        "metadata": {"name": "echo", "namespace": "default"},
        "spec": {"clusterIP": "10.96.0.1", "ports": [{"name": "http", "port": 80}]},
    }
    spec = {
        "endpoints": [{"addresses": [f"10.0.0.{i}"], "conditions": {"ready": True}}
                      for i in (1, 2)],
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
        "weight": None,
    }
    for objs in ([service, _slice(spec, False)], [_slice(dict(spec, endpoints=[]), False)]):
        with writer.write_txn() as txn:
            for obj in objs:
                conv.upsert(txn, obj)
            txn.commit()
        (fe,) = writer.frontends.all(db.read_txn())
        assert len(fe.backends) == (2 if len(objs) == 2 else 0)
    assert list(writer.backends.all(db.read_txn())) == []
