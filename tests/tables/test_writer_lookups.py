"""The writer's per-service lookups: cached per transaction, skipped for unknown services."""

from __future__ import annotations

from typing import Any

import pytest

from tables.lb_writer import LBWriter
from tests.tables.helpers import backend_addrs, be, fe, frontend_map, new_writer, svc


def test_second_writer_over_filled_tables_sees_existing_rows() -> None:
    db, w1 = new_writer()
    with w1.write_txn() as txn:
        w1.upsert_service_and_frontends(txn, svc("ns/a"), [fe("10.0.0.1:80/TCP", "ns/a")])
        w1.set_backends(txn, "ns/a", "k8s", [be("10.1.0.1:8080/TCP")])
        txn.commit()
    w2 = LBWriter(
        db,
        w1.config,
        services=w1.services,
        frontends=w1.frontends,
        backends=w1.backends,
        node_addresses=w1.node_addresses,
    )
    with w2.write_txn() as txn:
        w2.set_backends(txn, "ns/a", "k8s", [be("10.1.0.2:8080/TCP")])
        txn.commit()
    f = frontend_map(db, w2)["10.0.0.1:80/TCP"]
    assert backend_addrs(f) == ["10.1.0.2:8080/TCP"]
    assert [str(b.address) for b in w2.backends.all(db.read_txn())] == ["10.1.0.2:8080/TCP"]


def test_lookups_follow_writes_within_one_txn() -> None:
    db, w = new_writer()
    with w.write_txn() as txn:
        w.set_backends(txn, "ns/a", "k8s", [be("10.1.0.1:8080/TCP"), be("10.1.0.2:8080/TCP")])
        w.upsert_service_and_frontends(txn, svc("ns/a"), [fe("10.0.0.1:80/TCP", "ns/a")])
        w.set_backends(txn, "ns/a", "k8s", [be("10.1.0.3:8080/TCP")])
        w.upsert_backends(txn, "ns/a", [be("10.1.0.4:8080/TCP", source="api")])
        w.release_backends(txn, "ns/a", "api", [be("10.1.0.4:8080/TCP").address])
        w.upsert_service_and_frontends(
            txn, svc("ns/a"), [fe("10.0.0.1:80/TCP", "ns/a"), fe("10.0.0.2:80/TCP", "ns/a")]
        )
        txn.commit()
    fes = frontend_map(db, w)
    assert sorted(fes) == ["10.0.0.1:80/TCP", "10.0.0.2:80/TCP"]
    assert [backend_addrs(f) for f in fes.values()] == [["10.1.0.3:8080/TCP"]] * 2
    with w.write_txn() as txn:
        w.delete_service_and_frontends(txn, "ns/a")
        w.release_backends_of_service(txn, "ns/a")
        txn.commit()
    snap = db.read_txn()
    assert list(w.frontends.all(snap)) == [] and list(w.backends.all(snap)) == []


def test_aborted_txn_leaves_no_stale_lookup() -> None:
    db, w = new_writer()
    with w.write_txn() as txn:
        w.upsert_service_and_frontends(txn, svc("ns/a"), [fe("10.0.0.1:80/TCP", "ns/a")])
        w.set_backends(txn, "ns/a", "k8s", [be("10.1.0.1:8080/TCP")])
        txn.abort()
    with w.write_txn() as txn:
        w.upsert_service_and_frontends(txn, svc("ns/a"), [fe("10.0.0.9:80/TCP", "ns/a")])
        txn.commit()
    fes = frontend_map(db, w)
    assert list(fes) == ["10.0.0.9:80/TCP"] and backend_addrs(fes["10.0.0.9:80/TCP"]) == []


def test_known_names_stay_bounded_under_churn() -> None:
    db, w = new_writer()
    for i in range(3000):
        name = f"ns/s{i}"
        with w.write_txn() as txn:
            w.upsert_service_and_frontends(txn, svc(name), [fe("10.0.0.1:80/TCP", name)])
            w.set_backends(txn, name, "k8s", [be("10.1.0.1:8080/TCP")])
            txn.commit()
        with w.write_txn() as txn:
            w.delete_service_and_frontends(txn, name)
            w.release_backends_of_service(txn, name)
            txn.commit()
    # Emptied services leave the hints once the writer sees the next transaction.
    assert w._fe_hint is not None and len(w._fe_hint) <= 1
    assert w._be_hint is not None and len(w._be_hint) <= 1
    with w.write_txn() as txn:  # a service with committed rows is still found after rebuilds
        w.upsert_service_and_frontends(txn, svc("ns/x"), [fe("10.0.0.1:80/TCP", "ns/x")])
        txn.commit()
    with w.write_txn() as txn:
        w.set_backends(txn, "ns/x", "k8s", [be("10.1.0.5:8080/TCP")])
        txn.commit()
    assert backend_addrs(frontend_map(db, w)["10.0.0.1:80/TCP"]) == ["10.1.0.5:8080/TCP"]


def test_service_index_views_stay_current_through_a_bulk_load(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The writer's lookups need no ordered view of the service indexes: an update
    after a bulk load builds none."""
    import statedb.ordered

    db, w = new_writer()
    for i in range(50):
        name = f"ns/s{i}"
        with w.write_txn() as txn:
            w.upsert_service_and_frontends(txn, svc(name), [fe(f"10.0.0.{i}:80/TCP", name)])
            w.set_backends(txn, name, "k8s", [be(f"10.1.0.{i}:8080/TCP")])
            txn.commit()
    builds: list[object] = []
    real = statedb.ordered.build_view

    def counting(*args: Any) -> Any:
        builds.append(args)
        return real(*args)

    monkeypatch.setattr(statedb.ordered, "build_view", counting)
    with w.write_txn() as txn:
        w.set_backends(txn, "ns/s7", "k8s", [be("10.1.9.9:8080/TCP")])
        txn.commit()
    assert builds == []
    assert backend_addrs(frontend_map(db, w)["10.0.0.7:80/TCP"]) == ["10.1.9.9:8080/TCP"]
