"""The converter says when a plain slice's backends are in address order
(`OrderedBackends`, asked with ``mark_order``): what it says holds of the tuple, as
`tables.backends.given_in_order` finds it, and the backends are those it gives unasked.
A Service after its slice (in a later transaction) then selects them as it would.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from sources.k8s_convert import ConversionError, K8sConverter, convert_endpoint_slice
from statedb import DB
from tables.backends import given_in_order
from tables.lb_config import LBConfig
from tables.lb_writer import CheckedBackends, LBWriter, OrderedBackends

_PORTS = [
    [{"name": "http", "port": 8080, "protocol": "TCP"}],
    [{"port": 53, "protocol": "UDP"}],
    [{"name": "http", "port": 8080}, {"name": "metrics", "port": 9090}],
]


def _slice(last_bytes: list[int], ports: list[dict[str, Any]], node: Any) -> dict[str, Any]:
    endpoints: list[dict[str, Any]] = []
    for i, b in enumerate(last_bytes):
        ep: dict[str, Any] = {"addresses": [f"10.0.{b // 256}.{b % 256}"],
                              "conditions": {"ready": True}}
        if node is not None:
            ep["nodeName"] = f"{node}-{i % 2}"
        endpoints.append(ep)
    return {
        "kind": "EndpointSlice",
        "metadata": {"name": "echo-abcde", "namespace": "default",
                     "labels": {"kubernetes.io/service-name": "echo"}},
        "addressType": "IPv4",
        "endpoints": endpoints,
        "ports": ports,
    }


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(1, 600), max_size=6), st.sampled_from(_PORTS),
       st.sampled_from([None, "node"]))
def test_ordered_backends_are_in_order(last_bytes: list[int], ports: Any, node: Any) -> None:
    obj = _slice(last_bytes, ports, node)
    try:
        unasked = convert_endpoint_slice(obj).backends
    except ConversionError:
        return
    asked = convert_endpoint_slice(obj, mark_order=True).backends
    assert type(unasked) is CheckedBackends
    assert asked == unasked
    if type(asked) is OrderedBackends:
        assert last_bytes == sorted(set(last_bytes))
        first = asked[0] if asked else None
        for family in (4, 6):
            for port_name in ("", "http", "metrics"):
                said = first is not None and first.address[20] == family and (
                    not port_name or port_name in first.port_names
                )
                assert said == given_in_order(asked, family, port_name) or not asked
    else:
        assert type(asked) is CheckedBackends
        # Only a plain slice of one port is said to be in order, when it is.
        assert len(ports) != 1 or last_bytes != sorted(set(last_bytes))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 600), min_size=1, max_size=6), st.sampled_from(_PORTS[:2]))
def test_a_service_after_its_slice_selects_them_all(last_bytes: list[int], ports: Any) -> None:
    """The Service's frontend, written in the transaction after its slice's, selects the
    slice's backends (the very tuple, when it selects all of them)."""
    cfg = LBConfig()
    db = DB()
    writer = LBWriter.create(db, cfg)
    conv = K8sConverter(writer, cfg)
    service = {
        "kind": "Service",
        "metadata": {"name": "echo", "namespace": "default"},
        "spec": {"clusterIP": "10.96.0.1",
                 "ports": [{"name": ports[0].get("name", ""), "port": 80,
                            "protocol": ports[0]["protocol"]}]},
    }
    for obj in (_slice(last_bytes, ports, None), service):
        with writer.write_txn() as txn:
            conv.upsert(txn, obj)
            txn.commit()
    rtxn = db.read_txn()
    (fe,) = writer.frontends.all(rtxn)
    rows = sorted(writer.backends.all(rtxn), key=lambda b: b.address)
    assert list(fe.backends) == [b.instances[0][1] for b in rows]
    # The slice's tuple itself when it came in order (else a selection in address order).
    assert (type(fe.backends) is OrderedBackends) == (last_bytes == sorted(set(last_bytes)))
