"""A new frontend of a service whose backends a source gave as `CheckedBackends` (the
usual order of a load: the EndpointSlice before its Service) selects exactly what the
selection rules give (`LBWriter.select_backends`), whatever the tuple's order, families,
port names, the service's policies, other sources' or services' instances at its
addresses and aborted or earlier transactions; when it selects all of the tuple, as
first given (its rows hold its very items), it stores that very tuple."""

from __future__ import annotations

import dataclasses
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tables.backends import BackendState
from tables.frontends import SVCType
from tables.lb_config import LBConfig
from tables.lb_writer import CheckedBackends, LBWriter
from tables.services import PREFER_SAME_NODE, Service, TrafficPolicy

from .helpers import be, fe, new_writer

NAME = "ns/svc"
OTHER = "ns/other"
V4 = ["10.244.0.1", "10.244.0.2", "10.244.0.3", "10.244.0.4", "10.244.0.5"]
V6 = ["fd00::1", "fd00::2", "fd00::3", "fd00::4", "fd00::5"]


class _Abort(Exception):
    pass


# A frontend selects all of the tuple (the case the writer checks without selecting)
# only when every choice is the usual one: each lists its usual value more than once,
# and the unusual ones apply to one backend or to all of them.
_case = st.fixed_dictionaries({
    "ips": st.lists(st.integers(0, 4), min_size=1, max_size=5, unique=True),
    "v6": st.sampled_from(["none", "none", "none", "first", "all"]),
    "port_names": st.sampled_from([("http",), ("http",), ("http", "dns"), ()]),
    "odd": st.sampled_from(["", "", "", "names", "node", "terminating"]),  # the first's
    "sort": st.sampled_from([True, True, False]),  # in address order, as converted
    "when": st.sampled_from(
        ["same txn", "next txn", "same txn", "next txn", "after an aborted txn",
         "after an aborted change", "re-set"]
    ),
    "extra": st.sampled_from(["", "", "", "local instance", "other service", "plain set"]),
    "frontend": st.sampled_from(["10.96.0.1", "10.96.0.1", "fd00::96"]),
    "port_name": st.sampled_from(["", "http", "http", "dns"]),
    "policy": st.sampled_from(["Cluster", "Cluster", "Local", "Local internal", "same node"]),
})


def _service(policy: str) -> Service:
    local, cluster = TrafficPolicy.LOCAL, TrafficPolicy.CLUSTER
    if policy == "Local":
        return Service(NAME, ext_traffic_policy=local, int_traffic_policy=local)
    if policy == "Local internal":
        return Service(NAME, ext_traffic_policy=cluster, int_traffic_policy=local)
    if policy == "same node":
        return Service(NAME, traffic_distribution=PREFER_SAME_NODE)
    return Service(NAME)


def _set(w: LBWriter, t: object, c: dict[str, Any]) -> CheckedBackends:
    bes = []
    for i, ip in enumerate(c["ips"]):
        v6 = c["v6"] == "all" or (c["v6"] == "first" and i == 0)
        names = c["port_names"]
        node, state = "node-a", BackendState.ACTIVE
        if i == 0:
            if c["odd"] == "names":
                names = ("dns",)
            elif c["odd"] == "node":
                node = "node-b"
            elif c["odd"] == "terminating":
                state = BackendState.TERMINATING
        address = f"[{V6[ip]}]:8080/TCP" if v6 else f"{V4[ip]}:8080/TCP"
        bes.append(be(address, *names, node=node, state=state))
    if c["sort"]:
        bes.sort(key=lambda b: b.address)
    given = CheckedBackends(bes)
    w.set_backends(t, NAME, "k8s", given)  # type: ignore[arg-type]
    first = bes[0].address
    if c["extra"] == "local instance":
        w.upsert_backends(t, NAME, [be(str(first), "http", source="local")])  # type: ignore[arg-type]
    elif c["extra"] == "other service":
        w.set_backends(t, OTHER, "k8s", [be(str(first), "http")])  # type: ignore[arg-type]
    elif c["extra"] == "plain set":
        w.set_backends(t, NAME, "k8s", list(given))  # type: ignore[arg-type]
    return given


@settings(max_examples=400, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(_case)
def test_a_new_frontend_selects_by_the_rules(c: dict[str, Any]) -> None:
    _db, w = new_writer(LBConfig(node_name="node-a"))
    svc = _service(c["policy"])  # type: ignore[arg-type]
    ip = c["frontend"]
    address = f"[{ip}]:80/TCP" if ":" in ip else f"{ip}:80/TCP"  # type: ignore[operator]
    params = [
        fe(address, NAME, port_name=c["port_name"]),  # type: ignore[arg-type]
        fe(address.replace(":80/", ":30080/"), NAME, SVCType.EXTERNAL_IPS,
           port_name=c["port_name"]),  # type: ignore[arg-type]
    ]
    when = c["when"]
    with w.write_txn() as t:
        given_bes = _set(w, t, c)
        if when == "same txn":
            w.upsert_service_and_frontends(t, svc, params)
    if when.startswith("after an aborted"):
        # Another address, or the same ones in another state (the rows keep the first).
        changed = (
            [be("10.244.9.9:8080/TCP", "http")] if when == "after an aborted txn"
            else [dataclasses.replace(b, state=BackendState.TERMINATING) for b in given_bes]
        )
        try:
            with w.write_txn() as t:
                w.set_backends(t, NAME, "k8s", CheckedBackends(changed))  # type: ignore[arg-type]
                raise _Abort
        except _Abort:
            pass
    if when == "re-set":
        with w.write_txn() as t:
            given_bes = _set(w, t, c)
            w.upsert_service_and_frontends(t, svc, params)
    elif when != "same txn":
        with w.write_txn() as t:
            w.upsert_service_and_frontends(t, svc, params)
    with w.write_txn() as t:
        rows = list(w.frontends.all(t))
        assert len(rows) == 2
        for row in rows:
            assert row.backends == w.select_backends(t, row)
            if row.backends == given_bes and not c["extra"] and when in ("same txn", "next txn"):
                assert row.backends is given_bes
        t.abort()
