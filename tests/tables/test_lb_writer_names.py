"""LBWriter's names of services with rows: replacing endpoints does not bring a rebuild,
emptying services does, and the names stay a superset of the services with rows."""

from __future__ import annotations

from tables.lb_writer import LBWriter
from tables.services import Service

from .helpers import be, fe, new_writer


def _service(w: LBWriter, i: int) -> None:
    name = f"ns/svc-{i}"
    with w.write_txn() as t:
        w.upsert_service_and_frontends(
            t, Service(name, port_names=(("http", 80),)),
            [fe(f"10.96.{i // 250}.{i % 250 + 1}:80/TCP", name, port_name="http")],
        )
        w.set_backends(t, name, "k8s", [be(f"10.244.{i}.{j}:8080/TCP", "http") for j in (1, 2)])


def test_replaced_endpoints_do_not_count_as_removals() -> None:
    _db, w = new_writer()
    for i in range(20):
        _service(w, i)
    with w.write_txn() as t:  # builds the names
        assert w._may_have_rows(t, "ns/svc-0")
    for gen in range(3, 50):
        i = gen % 20
        with w.write_txn() as t:  # one endpoint replaced: the old backend row is deleted
            w.set_backends(t, f"ns/svc-{i}", "k8s", [
                be(f"10.244.{i}.1:8080/TCP", "http"), be(f"10.244.{i}.{gen}:8080/TCP", "http"),
            ])
    assert w._names_removals == 0


def test_emptied_services_count_and_names_stay_a_superset() -> None:
    _db, w = new_writer()
    for i in range(4):
        _service(w, i)
    with w.write_txn() as t:
        assert w._may_have_rows(t, "ns/svc-3")
    with w.write_txn() as t:
        w.set_backends(t, "ns/svc-3", "k8s", [])
        w.delete_service_and_frontends(t, "ns/svc-3")
    assert w._names_removals >= 1
    with w.write_txn() as t:
        for i in range(3):
            assert w._may_have_rows(t, f"ns/svc-{i}")
