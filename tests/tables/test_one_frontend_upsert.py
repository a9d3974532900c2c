"""`LBWriter.upsert_service_and_frontends` of one frontend (a tuple of one, most
services) takes a shorter way than several (any other iterable), as does
`LBWriter.upsert_service_and_frontend` of one: all give the same rows and the same errors,
whatever the service's earlier frontends, other services' addresses and changes of the
service row."""

from __future__ import annotations

import ipaddress
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tables.frontends import SVCType
from tables.lb_writer import LBWriter, LBWriterError
from tables.node_addresses import NodeAddress
from tables.services import Service, TrafficPolicy

from .helpers import be, fe, new_writer

NAMES = ["ns/a", "ns/b"]
ADDRESSES = ["10.96.0.1:80/TCP", "10.96.0.2:80/TCP", "10.96.0.1:53/UDP"]

_op = st.tuples(
    st.sampled_from(NAMES),  # the service
    st.sampled_from(NAMES + NAMES[:1]),  # the service its frontend names
    st.lists(st.sampled_from(ADDRESSES), min_size=1, max_size=2),  # the frontends
    st.sampled_from([SVCType.CLUSTER_IP, SVCType.CLUSTER_IP, SVCType.NODE_PORT]),
    st.sampled_from(["", "http"]),  # port name
    st.booleans(),  # Local traffic policy
)


def _apply(w: LBWriter, op: tuple[Any, ...], as_tuple: bool, single: bool = False) -> str:
    name, fe_name, addresses, type_, port_name, local = op
    policy = TrafficPolicy.LOCAL if local else TrafficPolicy.CLUSTER
    svc = Service(name, ext_traffic_policy=policy, int_traffic_policy=policy)
    params = [fe(a, fe_name, type_, port_name=port_name) for a in addresses]
    try:
        with w.write_txn() as t:
            if single and len(params) == 1:
                w.upsert_service_and_frontend(t, svc, params[0])
            else:
                w.upsert_service_and_frontends(
                    t, svc, tuple(params) if as_tuple else iter(params)
                )
    except LBWriterError as e:
        return f"{type(e).__name__}: {e}"
    return ""


def _rows(w: LBWriter) -> list[Any]:
    t = w.db.read_txn()
    return [
        sorted((str(f.address), f.type, f.service_name, f.port_name, f.backends,
                f.service) for f in w.frontends.all(t)),
        sorted(s.name for s in w.services.all(t)),
    ]


@settings(max_examples=300, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_op, min_size=1, max_size=6))
def test_one_frontend_writes_as_several_do(ops: list[tuple[Any, ...]]) -> None:
    writers = []
    for _ in range(2):
        _db, w = new_writer()
        with w.write_txn() as t:
            w.set_backends(t, NAMES[0], "k8s", [be("10.244.0.1:8080/TCP", "http")])
        writers.append(w)
    one, several = writers
    for op in ops:
        assert _apply(one, op, True) == _apply(several, op, False)
        assert _rows(one) == _rows(several)


#: With a node address's NodePort-range port, which a LoadBalancer or ExternalIPs frontend
#: there would shadow (the writer skips it).
_ANY_ADDRESSES = [*ADDRESSES, "192.168.0.1:30080/TCP"]
_op_any_type = st.tuples(
    st.sampled_from(NAMES),
    st.sampled_from(NAMES + NAMES[:1]),
    st.lists(st.sampled_from(_ANY_ADDRESSES), min_size=1, max_size=2),
    st.sampled_from([SVCType.CLUSTER_IP, SVCType.NODE_PORT, SVCType.LOAD_BALANCER,
                     SVCType.EXTERNAL_IPS]),
    st.sampled_from(["", "http"]),
    st.booleans(),
)


@settings(max_examples=300, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_op_any_type, min_size=1, max_size=6))
def test_upsert_service_and_frontend_writes_as_several_do(ops: list[tuple[Any, ...]]) -> None:
    writers = []
    for _ in range(2):
        _db, w = new_writer()
        with w.write_txn() as t:
            w.set_backends(t, NAMES[0], "k8s", [be("10.244.0.1:8080/TCP", "http")])
            w.upsert_node_address(
                t, NodeAddress(ipaddress.ip_address("192.168.0.1"), True, True, "eth0")
            )
        writers.append(w)
    one, several = writers
    for op in ops:
        assert _apply(one, op, True, single=True) == _apply(several, op, False)
        assert _rows(one) == _rows(several)
