"""LBWriter: consistency of services/frontends/backends, conflicts, selection rules, Pending."""

from __future__ import annotations

import dataclasses
import ipaddress

import pytest

from reconciler.status import StatusKind, status_done
from statedb import DB
from tables.backends import BackendState
from tables.frontends import SVCType
from tables.lb_config import LBConfig
from tables.lb_writer import (
    CheckedBackends,
    FrontendConflictError,
    InvalidBackendError,
    LBWriter,
    LBWriterError,
    ServiceNotFoundError,
)
from tables.node_addresses import NodeAddress
from tables.services import Service, TrafficPolicy

from .helpers import addr, backend_addrs, be, fe, frontend_map, new_writer


def _mark_done(db: DB, w: LBWriter, ids: bool = True) -> None:
    """Play the reconciler: every frontend Done (and an id assigned)."""
    with w.write_txn() as t:
        for i, f in enumerate(list(w.frontends.all(t)), start=1):
            w.frontends.insert(t, dataclasses.replace(f, status=status_done(), id=f.id or i))


def _pending(db: DB, w: LBWriter) -> set[str]:
    return {a for a, f in frontend_map(db, w).items() if f.status.kind is StatusKind.PENDING}


def _setup_echo(w: LBWriter) -> None:
    with w.write_txn() as t:
        w.upsert_service_and_frontends(
            t,
            Service("test/echo", port_names=(("http", 80), ("dns", 53))),
            [
                fe("10.96.0.1:80/TCP", "test/echo", port_name="http"),
                fe("10.96.0.1:53/UDP", "test/echo", port_name="dns"),
                fe("[fd00::1]:80/TCP", "test/echo", port_name="http"),
            ],
        )
        w.set_backends(t, "test/echo", "k8s", [
            be("10.244.1.1:8080/TCP", "http", node="testnode"),
            be("10.244.1.2:8080/TCP", "http", node="other"),
            be("10.244.1.1:5353/UDP", "dns", node="testnode"),
            be("[fd00::10]:8080/TCP", "http", node="other"),
        ])


def test_frontends_select_by_port_name_and_family() -> None:
    db, w = new_writer()
    _setup_echo(w)
    fes = frontend_map(db, w)
    assert backend_addrs(fes["10.96.0.1:80/TCP"]) == ["10.244.1.1:8080/TCP", "10.244.1.2:8080/TCP"]
    assert backend_addrs(fes["10.96.0.1:53/UDP"]) == ["10.244.1.1:5353/UDP"]
    assert backend_addrs(fes["[fd00::1]:80/TCP"]) == ["[fd00::10]:8080/TCP"]
    assert all(f.status.kind is StatusKind.PENDING and f.id == 0 for f in fes.values())
    assert all(f.service is not None and f.service.name == "test/echo" for f in fes.values())


def test_unnamed_frontend_port_selects_all_backends() -> None:
    db, w = new_writer()
    with w.write_txn() as t:
        w.upsert_service_and_frontends(t, Service("a/b"), [fe("10.96.0.2:80/TCP", "a/b")])
        w.set_backends(t, "a/b", "k8s", [be("10.244.0.1:80/TCP"), be("10.244.0.2:80/TCP", "x")])
    assert len(frontend_map(db, w)["10.96.0.2:80/TCP"].backends) == 2


def test_backend_change_remarks_only_affected_frontends_and_keeps_id() -> None:
    db, w = new_writer()
    _setup_echo(w)
    with w.write_txn() as t:
        w.upsert_service_and_frontends(t, Service("x/y"), [fe("10.96.9.9:80/TCP", "x/y")])
    _mark_done(db, w)
    ids = {a: f.id for a, f in frontend_map(db, w).items()}
    assert not _pending(db, w)
    with w.write_txn() as t:
        w.upsert_backends(t, "test/echo", [be("10.244.1.3:8080/TCP", "http")])
    assert _pending(db, w) == {"10.96.0.1:80/TCP"}
    fes = frontend_map(db, w)
    assert {a: f.id for a, f in fes.items()} == ids
    assert "10.244.1.3:8080/TCP" in backend_addrs(fes["10.96.0.1:80/TCP"])
    # An identical write changes nothing and re-marks nothing.
    _mark_done(db, w)
    with w.write_txn() as t:
        w.upsert_backends(t, "test/echo", [be("10.244.1.3:8080/TCP", "http")])
    assert not _pending(db, w)


def test_service_update_remarks_its_frontends() -> None:
    db, w = new_writer()
    _setup_echo(w)
    _mark_done(db, w)
    with w.write_txn() as t:
        w.upsert_service(t, Service("test/echo", session_affinity=True,
                                    session_affinity_timeout=30))
    fes = frontend_map(db, w)
    assert _pending(db, w) == set(fes)
    assert all(f.service is not None and f.service.session_affinity for f in fes.values())


def test_upsert_service_replaces_frontend_set() -> None:
    db, w = new_writer()
    _setup_echo(w)
    with w.write_txn() as t:
        w.upsert_service_and_frontends(t, Service("test/echo"),
                                       [fe("10.96.0.1:80/TCP", "test/echo", port_name="http")])
    assert list(frontend_map(db, w)) == ["10.96.0.1:80/TCP"]


def test_conflicting_frontend_is_refused_and_changes_nothing() -> None:
    db, w = new_writer()
    _setup_echo(w)
    before = db.read_txn()
    with pytest.raises(FrontendConflictError, match=r"10\.96\.0\.1:80/TCP.*test/echo"), \
            w.write_txn() as t:
        w.upsert_service_and_frontends(
            t, Service("other/svc"),
            [fe("10.96.0.50:80/TCP", "other/svc"), fe("10.96.0.1:80/TCP", "other/svc")],
        )
    after = db.read_txn()
    for table in w.tables:
        assert list(table.all(after)) == list(table.all(before))
    # Even without aborting, the call itself wrote nothing.
    with w.write_txn() as t:
        with pytest.raises(FrontendConflictError):
            w.upsert_service_and_frontends(t, Service("other/svc"),
                                           [fe("10.96.0.1:80/TCP", "other/svc")])
        assert w.services.get(t, "other/svc") is None


def test_bad_frontend_parameters() -> None:
    _, w = new_writer()
    with w.write_txn() as t:
        with pytest.raises(LBWriterError, match="names service"):
            w.upsert_service_and_frontends(t, Service("a/b"), [fe("1.1.1.1:80/TCP", "a/c")])
        with pytest.raises(LBWriterError, match="duplicate"):
            w.upsert_service_and_frontends(
                t, Service("a/b"), [fe("1.1.1.1:80/TCP", "a/b"), fe("1.1.1.1:80/TCP", "a/b")])
        with pytest.raises(ServiceNotFoundError):
            w.upsert_frontend(t, fe("1.1.1.1:80/TCP", "no/such"))
        with pytest.raises(LBWriterError, match="port 0"):
            w.upsert_backends(t, "a/b", [be("10.0.0.1:0/TCP")])
        with pytest.raises(ValueError, match="unknown source"):
            w.set_backends(t, "a/b", "nosuch", [])
        with pytest.raises(LBWriterError, match="source"):
            w.set_backends(t, "a/b", "k8s", [be("10.0.0.1:80/TCP", source="local")])


def test_checked_backends_are_taken_as_checked_but_their_source_is_compared() -> None:
    """`CheckedBackends` (checked by their maker) give the rows a plain list gives; their
    source is still compared. A plain list is checked backend by backend."""
    bes = [be("10.0.0.1:80/TCP", "http", node="n1"), be("10.0.0.2:80/TCP", "http")]
    db1, w1 = new_writer()
    db2, w2 = new_writer()
    with w1.write_txn() as t1, w2.write_txn() as t2:
        w1.set_backends(t1, "a/b", "k8s", CheckedBackends(bes))
        w2.set_backends(t2, "a/b", "k8s", list(bes))
        with pytest.raises(LBWriterError, match="source"):
            w1.set_backends(t1, "a/c", "local", CheckedBackends(bes))
        with pytest.raises(InvalidBackendError, match="weight"):
            w2.set_backends(
                t2, "a/c", "k8s", [dataclasses.replace(bes[0], weight=70000)]
            )
        t1.commit()
        t2.commit()
    assert list(w1.backends.all(db1.read_txn())) == list(w2.backends.all(db2.read_txn()))


def test_delete_service_keeps_backends_and_readding_recomputes() -> None:
    db, w = new_writer()
    _setup_echo(w)
    with w.write_txn() as t:
        w.delete_service_and_frontends(t, "test/echo")
    r = db.read_txn()
    assert w.services.count(r) == 0 and w.frontends.count(r) == 0
    assert w.backends.count(r) == 4
    _setup_echo(w)
    assert len(frontend_map(db, w)["10.96.0.1:80/TCP"].backends) == 2


def test_set_backends_releases_unlisted_and_rows_without_instances() -> None:
    db, w = new_writer()
    _setup_echo(w)
    with w.write_txn() as t:
        w.set_backends(t, "test/echo", "k8s", [be("10.244.1.2:8080/TCP", "http")])
    r = db.read_txn()
    assert [str(b.address) for b in w.backends.all(r)] == ["10.244.1.2:8080/TCP"]
    assert backend_addrs(frontend_map(db, w)["10.96.0.1:80/TCP"]) == ["10.244.1.2:8080/TCP"]
    with w.write_txn() as t:
        w.release_backends(t, "test/echo", "k8s", [addr("10.244.1.2:8080/TCP")])
    assert w.backends.count(db.read_txn()) == 0
    assert frontend_map(db, w)["10.96.0.1:80/TCP"].backends == ()


def test_shared_backend_and_sources() -> None:
    db, w = new_writer()
    with w.write_txn() as t:
        for name, ip in (("a/one", "10.96.0.1"), ("a/two", "10.96.0.2")):
            w.upsert_service_and_frontends(t, Service(name), [fe(f"{ip}:80/TCP", name)])
            w.set_backends(t, name, "k8s", [be("10.244.0.1:80/TCP")])
        w.set_backends(t, "a/one", "local", [be("10.244.0.1:80/TCP", "p", source="local")])
    r = db.read_txn()
    (b,) = list(w.backends.all(r))
    assert b.service_names() == ["a/one", "a/two"]
    assert b.instance("a/one") is not None and b.instance("a/one").source == "local"  # type: ignore[union-attr]
    assert b.shadows_text() == "a/one [k8s]"
    by_svc = w.backends.index("service")
    assert [x.address for x in w.backends.list(r, by_svc.query("a/two"))] == [b.address]
    with w.write_txn() as t:
        w.release_backends_from_source(t, "local")
        w.release_backends_of_service(t, "a/one")
    (b,) = list(w.backends.all(db.read_txn()))
    assert b.service_names() == ["a/two"]
    assert frontend_map(db, w)["10.96.0.1:80/TCP"].backends == ()


def test_traffic_policy_local_and_internal_scope() -> None:
    db, w = new_writer(LBConfig(node_name="testnode"))
    s = Service("t/lb", ext_traffic_policy=TrafficPolicy.LOCAL)
    with w.write_txn() as t:
        w.upsert_service_and_frontends(t, s, [
            fe("10.96.0.1:80/TCP", "t/lb"),
            fe("1.2.3.4:80/TCP", "t/lb", SVCType.LOAD_BALANCER),
            fe("1.2.3.4:80/TCP/i", "t/lb", SVCType.LOAD_BALANCER),
        ])
        w.set_backends(t, "t/lb", "k8s", [be("10.244.0.1:80/TCP", node="testnode"),
                                          be("10.244.0.2:80/TCP", node="other")])
    fes = frontend_map(db, w)
    assert backend_addrs(fes["1.2.3.4:80/TCP"]) == ["10.244.0.1:80/TCP"]
    assert len(fes["1.2.3.4:80/TCP/i"].backends) == 2
    assert len(fes["10.96.0.1:80/TCP"].backends) == 2


def test_terminating_backends_stay_listed() -> None:
    db, w = new_writer()
    with w.write_txn() as t:
        w.upsert_service_and_frontends(t, Service("a/b"), [fe("10.96.0.1:80/TCP", "a/b")])
        w.set_backends(t, "a/b", "k8s", [be("10.244.0.1:80/TCP", state=BackendState.TERMINATING),
                                        be("10.244.0.2:80/TCP")])
    f = frontend_map(db, w)["10.96.0.1:80/TCP"]
    assert [b.state for b in f.backends] == [BackendState.TERMINATING, BackendState.ACTIVE]


def test_topology_zone_filter_and_node_labels() -> None:
    db, w = new_writer()
    with w.write_txn() as t:
        w.set_node_labels(t, {"topology.kubernetes.io/zone": "foo"})
        w.upsert_service_and_frontends(t, Service("a/b", traffic_distribution="PreferClose"),
                                       [fe("10.96.0.1:80/TCP", "a/b")])
        w.set_backends(t, "a/b", "k8s", [be("10.244.1.1:80/TCP", for_zones=("bar", "foo")),
                                        be("10.244.2.1:80/TCP", for_zones=("quux",))])
    assert backend_addrs(frontend_map(db, w)["10.96.0.1:80/TCP"]) == ["10.244.1.1:80/TCP"]
    _mark_done(db, w)
    with w.write_txn() as t:
        w.set_node_labels(t, {"topology.kubernetes.io/zone": "baz"})
    f = frontend_map(db, w)["10.96.0.1:80/TCP"]
    assert f.backends == () and f.status.kind is StatusKind.PENDING
    with w.write_txn() as t:
        w.set_node_labels(t, {})
    assert len(frontend_map(db, w)["10.96.0.1:80/TCP"].backends) == 2


def test_prefer_same_node_uses_only_active_local() -> None:
    db, w = new_writer(LBConfig(node_name="testnode"))
    with w.write_txn() as t:
        w.upsert_service_and_frontends(t, Service("a/b", traffic_distribution="PreferSameNode"),
                                       [fe("10.96.0.1:80/TCP", "a/b")])
        w.set_backends(t, "a/b", "k8s", [be("10.244.1.1:80/TCP", node="testnode"),
                                        be("10.244.2.1:80/TCP", node="other")])
    assert backend_addrs(frontend_map(db, w)["10.96.0.1:80/TCP"]) == ["10.244.1.1:80/TCP"]
    with w.write_txn() as t:
        w.set_backends(t, "a/b", "k8s", [
            be("10.244.1.1:80/TCP", node="testnode", state=BackendState.MAINTENANCE),
            be("10.244.2.1:80/TCP", node="other")])
    assert len(frontend_map(db, w)["10.96.0.1:80/TCP"].backends) == 2


def test_proxy_delegation_node_ip_counts_as_local() -> None:
    db, w = new_writer(LBConfig(node_name="testnode"))
    s = Service("t/x", ext_traffic_policy=TrafficPolicy.LOCAL,
                int_traffic_policy=TrafficPolicy.LOCAL, proxy_delegation="delegate-if-local")
    with w.write_txn() as t:
        w.set_node_ip(t, ipaddress.ip_address("1.1.1.1"))
        w.upsert_service_and_frontends(
            t, s, [fe("172.16.1.1:80/TCP", "t/x", SVCType.LOAD_BALANCER)])
        w.set_backends(t, "t/x", "k8s", [be("1.1.1.1:80/TCP"), be("1.1.1.2:80/TCP", node="o"),
                                        be("2.2.2.2:80/TCP", node="testnode")])
    assert backend_addrs(frontend_map(db, w)["172.16.1.1:80/TCP"]) == [
        "1.1.1.1:80/TCP", "2.2.2.2:80/TCP"]


def test_node_address_changes_remark_nodeport_frontends() -> None:
    db, w = new_writer()
    with w.write_txn() as t:
        w.upsert_service_and_frontends(t, Service("a/np"), [
            fe("0.0.0.0:30001/TCP", "a/np", SVCType.NODE_PORT, service_port=80),
            fe("10.96.0.1:80/TCP", "a/np")])
    _mark_done(db, w)
    na = NodeAddress(ipaddress.ip_address("1.1.1.1"), True, True, "eth0")
    with w.write_txn() as t:
        w.upsert_node_address(t, na)
    assert _pending(db, w) == {"0.0.0.0:30001/TCP"}
    _mark_done(db, w)
    with w.write_txn() as t:
        w.upsert_node_address(t, na)  # unchanged: nothing to do
    assert not _pending(db, w)
    with w.write_txn() as t:
        w.delete_node_address(t, na)
    assert _pending(db, w) == {"0.0.0.0:30001/TCP"}
    assert w.node_addresses.count(db.read_txn()) == 0


def test_lb_frontend_on_node_address_in_nodeport_range_is_skipped() -> None:
    db, w = new_writer()
    with w.write_txn() as t:
        w.upsert_node_address(t, NodeAddress(ipaddress.ip_address("1.1.1.1"), True, True, "x"))
        w.upsert_service_and_frontends(t, Service("t/lb"), [
            fe("1.1.1.1:30781/TCP", "t/lb", SVCType.LOAD_BALANCER),
            fe("1.1.1.1:80/TCP", "t/lb", SVCType.LOAD_BALANCER),
            fe("10.96.0.1:30781/TCP", "t/lb")])
    assert sorted(frontend_map(db, w)) == ["1.1.1.1:80/TCP", "10.96.0.1:30781/TCP"]


def test_backend_health_and_redirect() -> None:
    db, w = new_writer()
    _setup_echo(w)
    with w.write_txn() as t:
        assert w.set_backend_health(t, "test/echo", addr("10.244.1.2:8080/TCP"), False, now=5.0)
        assert not w.set_backend_health(t, "test/echo", addr("10.244.1.2:8080/TCP"), False)
        assert not w.set_backend_health(t, "test/echo", addr("10.9.9.9:1/TCP"), False)
        # The first report on a backend counts even when it says "healthy" (the default):
        # health becomes known, which ends a quarantine restored from the maps.
        assert w.set_backend_health(t, "test/echo", addr("10.244.1.1:8080/TCP"), True, now=6.0)
        assert not w.set_backend_health(t, "test/echo", addr("10.244.1.1:8080/TCP"), True)
    f = frontend_map(db, w)["10.96.0.1:80/TCP"]
    assert [b.effective_state for b in f.backends] == [BackendState.ACTIVE,
                                                      BackendState.QUARANTINED]
    with w.write_txn() as t:
        w.upsert_service_and_frontends(t, Service("r/local"), [fe("10.96.5.5:80/TCP", "r/local")])
        w.set_backends(t, "r/local", "k8s", [be("10.244.9.9:80/TCP", "http")])
        w.set_redirect(t, addr("10.96.0.1:80/TCP"), "r/local")
    f = frontend_map(db, w)["10.96.0.1:80/TCP"]
    assert f.redirect_to == "r/local" and backend_addrs(f) == ["10.244.9.9:80/TCP"]
    _mark_done(db, w)
    with w.write_txn() as t:
        w.upsert_backends(t, "r/local", [be("10.244.9.10:80/TCP", "http")])
    assert "10.96.0.1:80/TCP" in _pending(db, w)
    with w.write_txn() as t:
        w.set_redirect(t, addr("10.96.0.1:80/TCP"), None)
        with pytest.raises(LBWriterError):
            w.set_redirect(t, addr("9.9.9.9:1/TCP"), None)
    assert len(frontend_map(db, w)["10.96.0.1:80/TCP"].backends) == 2


def test_indexes_and_queries() -> None:
    db, w = new_writer()
    _setup_echo(w)
    r = db.read_txn()
    by_service = w.frontends.index("service")
    assert len(list(w.frontends.list(r, by_service.query("test/echo")))) == 3
    prefix = w.backends.primary.query_str("10.244.0.0/16")
    assert len(list(w.backends.prefix(r, prefix))) == 3
    assert list(w.backends.prefix(r, w.backends.primary.query_str("192.0.0.0/8"))) == []
    got = w.frontends.get(r, w.frontends.primary.query_str("10.96.0.1:53/UDP"))
    assert got is not None and got.port_name == "dns"
    assert w.services.get(r, "test/echo") is not None


def test_unchanged_service_upsert_rewrites_nothing() -> None:
    db, w = new_writer()
    _setup_echo(w)
    _mark_done(db, w)
    params = [fe("10.96.0.1:80/TCP", "test/echo", port_name="http"),
              fe("10.96.0.1:53/UDP", "test/echo", port_name="dns"),
              fe("[fd00::1]:80/TCP", "test/echo", port_name="http")]
    same = Service("test/echo", port_names=(("http", 80), ("dns", 53)))
    with w.write_txn() as t:
        w.upsert_service_and_frontends(t, same, params)
        w.upsert_service(t, same)
    assert not _pending(db, w)
    # One changed frontend: only it is rewritten.
    params[1] = fe("10.96.0.1:53/UDP", "test/echo", port_name="http")
    with w.write_txn() as t:
        w.upsert_service_and_frontends(t, same, params)
    assert _pending(db, w) == {"10.96.0.1:53/UDP"}
    # Re-inserting the stored row object is harmless.
    stored = w.services.get(db.read_txn(), "test/echo")
    assert stored is not None
    with w.write_txn() as t:
        w.upsert_service(t, stored)


def test_frontends_written_in_address_order() -> None:
    db, w = new_writer()
    with w.write_txn() as t:
        changes = w.frontends.changes(t)
    with w.write_txn() as t:
        w.upsert_service_and_frontends(t, Service("a/b"), [
            fe("10.96.0.1:80/TCP", "a/b"), fe("0.0.0.0:30001/TCP", "a/b", SVCType.NODE_PORT),
            fe("[fd00::1]:80/TCP", "a/b"), fe("1.1.1.1:80/TCP", "a/b", SVCType.LOAD_BALANCER)])
    order = [str(c.obj.address) for c in changes.next(db.read_txn())[0]]
    assert order == ["0.0.0.0:30001/TCP", "1.1.1.1:80/TCP", "10.96.0.1:80/TCP",
                     "[fd00::1]:80/TCP"]


def test_prefer_same_zone_is_kept_and_filters_like_prefer_close() -> None:
    """Kubernetes' newer name selects by zone too, and the service keeps its spelling."""
    db, w = new_writer()
    with w.write_txn() as t:
        w.set_node_labels(t, {"topology.kubernetes.io/zone": "foo"})
        w.upsert_service_and_frontends(t, Service("a/b", traffic_distribution="PreferSameZone"),
                                       [fe("10.96.0.1:80/TCP", "a/b")])
        w.set_backends(t, "a/b", "k8s", [be("10.244.1.1:80/TCP", for_zones=("foo",)),
                                        be("10.244.2.1:80/TCP", for_zones=("quux",))])
    f = frontend_map(db, w)["10.96.0.1:80/TCP"]
    assert backend_addrs(f) == ["10.244.1.1:80/TCP"]
    assert f.service is not None and f.service.traffic_distribution == "PreferSameZone"
    # A zone change re-selects for PreferSameZone services as well.
    with w.write_txn() as t:
        w.set_node_labels(t, {"topology.kubernetes.io/zone": "quux"})
    assert backend_addrs(frontend_map(db, w)["10.96.0.1:80/TCP"]) == ["10.244.2.1:80/TCP"]


def test_zone_falls_back_when_no_in_zone_backend_is_usable() -> None:
    """In-zone endpoints exist but none serves this port or is ready: all candidates."""
    db, w = new_writer()
    with w.write_txn() as t:
        w.set_node_labels(t, {"topology.kubernetes.io/zone": "foo"})
        w.upsert_service_and_frontends(
            t, Service("a/b", traffic_distribution="PreferClose"),
            [fe("10.96.0.1:80/TCP", "a/b", port_name="http")])
        w.set_backends(t, "a/b", "k8s", [
            be("10.244.1.1:80/TCP", "metrics", for_zones=("foo",)),
            be("10.244.2.1:80/TCP", "http", for_zones=("quux",)),
            be("10.244.3.1:80/TCP", "http", for_zones=("bar",))])
    assert backend_addrs(frontend_map(db, w)["10.96.0.1:80/TCP"]) == [
        "10.244.2.1:80/TCP", "10.244.3.1:80/TCP"]
    # The in-zone endpoint serves the port but is not ready (maintenance): still all.
    with w.write_txn() as t:
        w.set_backends(t, "a/b", "k8s", [
            be("10.244.1.1:80/TCP", "http", for_zones=("foo",),
               state=BackendState.MAINTENANCE),
            be("10.244.2.1:80/TCP", "http", for_zones=("quux",))])
    assert backend_addrs(frontend_map(db, w)["10.96.0.1:80/TCP"]) == [
        "10.244.1.1:80/TCP", "10.244.2.1:80/TCP"]
    # Ready again: only the in-zone one.
    with w.write_txn() as t:
        w.set_backends(t, "a/b", "k8s", [
            be("10.244.1.1:80/TCP", "http", for_zones=("foo",)),
            be("10.244.2.1:80/TCP", "http", for_zones=("quux",))])
    assert backend_addrs(frontend_map(db, w)["10.96.0.1:80/TCP"]) == ["10.244.1.1:80/TCP"]


def test_terminating_endpoints_do_not_count_in_the_zone_safeguard() -> None:
    """A terminating endpoint without hints does not switch the hints off (an active one
    without hints does); it stays selected as the last resort."""
    db, w = new_writer()
    with w.write_txn() as t:
        w.set_node_labels(t, {"topology.kubernetes.io/zone": "foo"})
        w.upsert_service_and_frontends(t, Service("a/b", traffic_distribution="PreferClose"),
                                       [fe("10.96.0.1:80/TCP", "a/b")])
        w.set_backends(t, "a/b", "k8s", [
            be("10.244.1.1:80/TCP", for_zones=("foo",)),
            be("10.244.2.1:80/TCP", for_zones=("quux",)),
            be("10.244.9.1:80/TCP", state=BackendState.TERMINATING)])
    assert backend_addrs(frontend_map(db, w)["10.96.0.1:80/TCP"]) == [
        "10.244.1.1:80/TCP", "10.244.9.1:80/TCP"]
    with w.write_txn() as t:
        w.set_backends(t, "a/b", "k8s", [
            be("10.244.1.1:80/TCP", for_zones=("foo",)),
            be("10.244.2.1:80/TCP", for_zones=("quux",)),
            be("10.244.9.1:80/TCP")])  # active and unhinted: hints unusable
    assert len(frontend_map(db, w)["10.96.0.1:80/TCP"].backends) == 3
