"""The socket load balancer end to end: a client in the test cgroup and namespace connects
to service addresses that exist nowhere, and reaches the backends FrontendOps wrote into
the pinned LB maps (see conftest.py for the set-up)."""

from __future__ import annotations

import errno
import os
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from bpf import lb
from bpf.datapath import DatapathConfig, DatapathError, SockLB, cgroup2_mount, cgroup_id
from bpfops.frontend_ops import FrontendOps
from bpfops.lb_maps import LBMaps, LBMapsConfig
from bpfops.model import Addr, BackendSpec, FrontendSpec, LBOpsConfig, ServiceSpec

from .conftest import BACKEND_PORT, BACKENDS4, BACKENDS6, CLIENT_SOURCES, LOOPBACK_BACKENDS, Env

pytestmark = pytest.mark.kernel

NO_TXN: Any = None


def ident(host: str, port: int = BACKEND_PORT) -> str:
    """How a backend server names itself."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


@contextmanager
def service(
    env: Env,
    vip: str,
    port: int,
    backends: tuple[str, ...],
    proto: str = "TCP",
    **settings: Any,
) -> Iterator[FrontendSpec]:
    """A ClusterIP frontend written by FrontendOps, deleted afterwards."""
    fe = FrontendSpec(
        Addr.of(vip, port, proto),
        "ClusterIP",
        ServiceSpec(f"test/{vip}-{port}", **settings),
        tuple(BackendSpec(Addr.of(b, BACKEND_PORT, proto)) for b in backends),
    )
    env.ops.update_spec(NO_TXN, fe)
    try:
        yield fe
    finally:
        env.ops.delete_spec(NO_TXN, fe)


def ids(results: list[dict[str, Any]]) -> list[str]:
    """Backend identities of successful results (fails on any error)."""
    errors = [r for r in results if "errno" in r]
    assert not errors, errors
    return [r["id"] for r in results]


def test_random_uses_every_backend_and_only_them(env: Env) -> None:
    with service(env, "10.96.0.10", 80, BACKENDS4):
        results = env.client.tcp("10.96.0.10", 80, count=90)
        seen = Counter(ids(results))
        assert set(seen) == {ident(b) for b in BACKENDS4}
        # 30 expected each; fewer than 10 has a probability far below 1e-4.
        assert min(seen.values()) >= 10, seen
        assert {tuple(r["peer"]) for r in results} == {("10.96.0.10", 80)}


def test_loopback_backends(env: Env) -> None:
    with service(env, "10.96.0.11", 80, LOOPBACK_BACKENDS):
        seen = set(ids(env.client.tcp("10.96.0.11", 80, count=30)))
        assert seen == {ident(b) for b in LOOPBACK_BACKENDS}


def test_backend_set_changes_take_effect(env: Env) -> None:
    with service(env, "10.96.0.12", 80, BACKENDS4) as fe:
        narrowed = FrontendSpec(fe.addr, fe.type, fe.service, fe.backends[:1])
        env.ops.update_spec(NO_TXN, narrowed)
        assert set(ids(env.client.tcp("10.96.0.12", 80, count=20))) == {ident(BACKENDS4[0])}


def test_only_active_backends_get_new_connections(env: Env) -> None:
    a, b, c = BACKENDS4
    states = {a: lb.BACKEND_ACTIVE, b: lb.BACKEND_TERMINATING, c: lb.BACKEND_MAINTENANCE}
    fe = FrontendSpec(
        Addr.of("10.96.0.25", 80),
        "ClusterIP",
        ServiceSpec("test/states"),
        tuple(BackendSpec(Addr.of(ip, BACKEND_PORT), st) for ip, st in states.items()),
    )
    env.ops.update_spec(NO_TXN, fe)
    try:
        assert set(ids(env.client.tcp("10.96.0.25", 80, count=20))) == {ident(a)}
        # With no active backend left, terminating ones still serve.
        only_terminating = FrontendSpec(fe.addr, fe.type, fe.service, fe.backends[1:])
        env.ops.update_spec(NO_TXN, only_terminating)
        assert set(ids(env.client.tcp("10.96.0.25", 80, count=10))) == {ident(b)}
    finally:
        env.ops.delete_spec(NO_TXN, fe)


def test_maglev_keeps_a_client_on_one_backend(env: Env) -> None:
    with service(env, "10.96.0.13", 80, BACKENDS4, lb_algorithm="maglev") as fe:
        v6 = False
        rev_nat = env.ops.service_id(fe.addr)
        assert rev_nat is not None
        assert any(key == rev_nat for key, _ in env.maps.maglev_tables(v6))
        chosen = {}
        for src in CLIENT_SOURCES:
            seen = set(ids(env.client.tcp("10.96.0.13", 80, count=5, bind=src)))
            assert len(seen) == 1, (src, seen)
            chosen[src] = seen.pop()
        # Different clients hash to different backends (deterministic for these inputs).
        assert len(set(chosen.values())) > 1, chosen


def _affinity_key(env: Env, rev_nat: int) -> lb.Affinity4Key:
    return lb.Affinity4Key(env.client.netns_cookie(), rev_nat, 1)


def test_session_affinity_holds_within_timeout(env: Env) -> None:
    with service(
        env, "10.96.0.14", 80, BACKENDS4, session_affinity=True, affinity_timeout=60
    ) as fe:
        seen = set(ids(env.client.tcp("10.96.0.14", 80, count=30)))
        assert len(seen) == 1
        rev_nat = env.ops.service_id(fe.addr)
        assert rev_nat is not None
        aff = env.maps.maps["lb4_affinity"]
        key = _affinity_key(env, rev_nat)
        entry = aff.lookup(key)
        assert entry is not None, list(aff.items())
        # The entry is what the datapath follows: point it at another backend.
        other = next(b for b in BACKENDS4 if ident(b) not in seen)
        other_id = env.ops.backend_id(Addr.of(other, BACKEND_PORT, "TCP"))
        assert other_id is not None
        now = time.monotonic_ns() // 1_000_000_000
        aff.update(key, lb.AffinityValue(now, other_id))
        assert set(ids(env.client.tcp("10.96.0.14", 80, count=10))) == {ident(other)}


def test_session_affinity_expires_after_timeout(env: Env) -> None:
    with service(env, "10.96.0.15", 80, BACKENDS4, session_affinity=True, affinity_timeout=5) as fe:
        ids(env.client.tcp("10.96.0.15", 80))
        rev_nat = env.ops.service_id(fe.addr)
        assert rev_nat is not None
        aff = env.maps.maps["lb4_affinity"]
        key = _affinity_key(env, rev_nat)
        pinned_id = env.ops.backend_id(Addr.of(BACKENDS4[0], BACKEND_PORT, "TCP"))
        assert pinned_id is not None
        seen: set[str] = set()
        for _ in range(15):
            now = time.monotonic_ns() // 1_000_000_000
            # Last used 6 s ago with a 5 s timeout: expired, the datapath picks anew.
            aff.update(key, lb.AffinityValue(now - 6, pinned_id))
            seen.update(ids(env.client.tcp("10.96.0.15", 80)))
            fresh = aff.lookup(key)
            assert fresh is not None and fresh.last_used >= now - 1
        # With 3 backends, 15 fresh picks all landing on the stale one has p = 3**-15.
        assert len(seen) > 1, seen


def test_service_without_backends_is_refused(env: Env) -> None:
    with service(env, "10.96.0.16", 80, ()):
        results = env.client.tcp("10.96.0.16", 80, count=3)
        assert [r.get("errno") for r in results] == [errno.ECONNREFUSED] * 3
    with service(env, "10.96.0.16", 53, (), proto="UDP"):
        results = env.client.udp("10.96.0.16", 53)
        assert results[0].get("errno") == errno.ECONNREFUSED


def test_unknown_port_of_a_service_address_is_refused(env: Env) -> None:
    # FrontendOps writes the VIP's wildcard entry <vip>:0/ANY, which has no backends.
    with service(env, "10.96.0.17", 80, BACKENDS4):
        assert ids(env.client.tcp("10.96.0.17", 80))
        results = env.client.tcp("10.96.0.17", 81)
        assert results[0].get("errno") == errno.ECONNREFUSED


def test_udp_unconnected_reply_comes_from_the_service(env: Env) -> None:
    with service(env, "10.96.0.18", 53, BACKENDS4, proto="UDP"):
        results = env.client.udp("10.96.0.18", 53, count=30)
        assert set(ids(results)) == {ident(b) for b in BACKENDS4}
        assert {tuple(r["src"]) for r in results} == {("10.96.0.18", 53)}


def test_udp_connected_peer_is_the_service(env: Env) -> None:
    with service(env, "10.96.0.19", 53, BACKENDS4, proto="UDP"):
        results = env.client.udp("10.96.0.19", 53, count=10, connected=True)
        assert set(ids(results)) <= {ident(b) for b in BACKENDS4}
        assert {tuple(r["peer"]) for r in results} == {("10.96.0.19", 53)}
        assert {tuple(r["src"]) for r in results} == {("10.96.0.19", 53)}


def test_ipv6_tcp_and_udp(env: Env) -> None:
    with service(env, "fd00:96::10", 80, BACKENDS6):
        results = env.client.tcp("fd00:96::10", 80, count=45)
        assert set(ids(results)) == {ident(b) for b in BACKENDS6}
        assert {r["peer"][0] for r in results} == {"fd00:96::10"}
        assert {r["peer"][1] for r in results} == {80}
    with service(env, "fd00:96::10", 53, BACKENDS6, proto="UDP"):
        results = env.client.udp("fd00:96::10", 53, count=20)
        assert set(ids(results)) <= {ident(b) for b in BACKENDS6}
        assert {(r["src"][0], r["src"][1]) for r in results} == {("fd00:96::10", 53)}


def test_ipv4_mapped_destinations_of_dual_stack_sockets(env: Env) -> None:
    with service(env, "10.96.0.23", 80, BACKENDS4):
        results = env.client.tcp("::ffff:10.96.0.23", 80, count=30)
        assert set(ids(results)) == {ident(b) for b in BACKENDS4}
        assert {(r["peer"][0], r["peer"][1]) for r in results} == {("::ffff:10.96.0.23", 80)}
    with service(env, "10.96.0.23", 53, BACKENDS4, proto="UDP"):
        results = env.client.udp("::ffff:10.96.0.23", 53, count=10)
        assert set(ids(results)) <= {ident(b) for b in BACKENDS4}
        assert {(r["src"][0], r["src"][1]) for r in results} == {("::ffff:10.96.0.23", 53)}
        results = env.client.udp("::ffff:10.96.0.23", 53, count=5, connected=True)
        assert set(ids(results)) <= {ident(b) for b in BACKENDS4}
        assert {(r["peer"][0], r["peer"][1]) for r in results} == {("::ffff:10.96.0.23", 53)}
        assert {(r["src"][0], r["src"][1]) for r in results} == {("::ffff:10.96.0.23", 53)}
    with service(env, "10.96.0.24", 80, ()):
        assert env.client.tcp("::ffff:10.96.0.24", 80)[0].get("errno") == errno.ECONNREFUSED


def test_other_destinations_are_untouched(env: Env) -> None:
    results = env.client.tcp(BACKENDS4[1], BACKEND_PORT, count=3)
    assert ids(results) == [ident(BACKENDS4[1])] * 3
    assert {tuple(r["peer"]) for r in results} == {(BACKENDS4[1], BACKEND_PORT)}
    # A service address the maps do not know has no route in the namespace.
    assert env.client.tcp("10.96.0.99", 80)[0].get("errno") == errno.ENETUNREACH


def test_reattach_adopts_the_pinned_links(env: Env) -> None:
    before = {p.name: p.link_id for p in env.dp.attached.values()}
    second = SockLB(DatapathConfig(cgroup=env.cgroup, pin_dir=env.pin_dir))
    try:
        attached = second.attach()
        assert all(p.adopted for p in attached)
        assert {p.name: p.link_id for p in attached} == before
    finally:
        second.close()  # keeps the pinned links
    with service(env, "10.96.0.20", 80, BACKENDS4):
        assert len(ids(env.client.tcp("10.96.0.20", 80, count=5))) == 5


def test_datapath_survives_the_loader_and_detach_stops_it(env: Env) -> None:
    with service(env, "10.96.0.21", 80, BACKENDS4):
        env.dp.close()  # the agent's handles are gone; the pinned links stay
        assert len(ids(env.client.tcp("10.96.0.21", 80, count=5))) == 5
        env.dp.detach()
        assert not os.listdir(os.path.join(env.pin_dir, "sock_lb", "links"))
        assert env.client.tcp("10.96.0.21", 80)[0].get("errno") == errno.ENETUNREACH
        env.dp.attach()
        assert len(ids(env.client.tcp("10.96.0.21", 80, count=5))) == 5


def test_maglev_with_a_configured_table_size(env: Env) -> None:
    """The agent may size maglev tables (bpf-lb-maglev-table-size): the loader passes the
    size to the program, which indexes the smaller tables within bounds."""
    pin_dir = env.pin_dir + "-m1021"
    maps = LBMaps.open(LBMapsConfig(backend="kernel", pin_dir=pin_dir, maglev_table_size=1021))
    dp = SockLB(DatapathConfig(cgroup=env.cgroup, pin_dir=pin_dir, maglev_table_size=1021))
    env.dp.detach()
    try:
        ops: FrontendOps[Any] = FrontendOps(
            maps, LBOpsConfig(algorithm_annotation=True, maglev_table_size=1021)
        )
        dp.attach()
        fe = FrontendSpec(
            Addr.of("10.96.0.22", 80),
            "ClusterIP",
            ServiceSpec("test/maglev-1021", lb_algorithm="maglev"),
            tuple(BackendSpec(Addr.of(b, BACKEND_PORT)) for b in BACKENDS4),
        )
        ops.update_spec(NO_TXN, fe)
        chosen = set()
        for src in CLIENT_SOURCES:
            seen = set(ids(env.client.tcp("10.96.0.22", 80, count=3, bind=src)))
            assert len(seen) == 1, (src, seen)
            chosen |= seen
        assert len(chosen) > 1
    finally:
        try:
            dp.detach()
            SockLB.cleanup(pin_dir)
        finally:
            maps.unpin()
            maps.close()
            os.rmdir(pin_dir)
            env.dp.attach()


def test_datapath_runs_on_maps_of_other_sizes(env: Env) -> None:
    """Maps sized by the --bpf-lb-*-map-max flags (each group its own size): the program
    reuses the pinned maps as they are and balances over them."""
    from bpf.catalog import LBMapSizes

    pin_dir = env.pin_dir + "-sized"
    sizes = LBMapSizes(
        services=1024, backends=512, rev_nat=256, affinity=128, source_range=64, maglev=32
    )
    maps = LBMaps.open(LBMapsConfig(backend="kernel", pin_dir=pin_dir, sizes=sizes))
    dp = SockLB(DatapathConfig(cgroup=env.cgroup, pin_dir=pin_dir))
    env.dp.detach()
    try:
        assert maps.be4.backend.info().max_entries == 512
        ops: FrontendOps[Any] = FrontendOps(maps, LBOpsConfig())
        dp.attach()
        fe = FrontendSpec(
            Addr.of("10.96.0.23", 80),
            "ClusterIP",
            ServiceSpec("test/sized"),
            tuple(BackendSpec(Addr.of(b, BACKEND_PORT)) for b in BACKENDS4),
        )
        ops.update_spec(NO_TXN, fe)
        seen = set(ids(env.client.tcp("10.96.0.23", 80, count=30)))
        assert seen == {ident(b) for b in BACKENDS4}
    finally:
        try:
            dp.detach()
            SockLB.cleanup(pin_dir)
        finally:
            maps.unpin()
            maps.close()
            os.rmdir(pin_dir)
            env.dp.attach()


def test_links_of_a_removed_cgroup_are_pruned(env: Env) -> None:
    sub = os.path.join(env.cgroup, "sub")
    os.mkdir(sub)
    try:
        dp = SockLB(DatapathConfig(cgroup=sub, pin_dir=env.pin_dir))
        dp.attach()
        dp.close()  # pinned links stay behind, as after an agent crash
        sub_id = cgroup_id(sub)
        assert sum(1 for p in SockLB.pinned(env.pin_dir) if p.cgroup_id == sub_id) == 8
    finally:
        os.rmdir(sub)
    deadline = time.monotonic() + 5
    stale = os.path.join(env.pin_dir, "sock_lb", "links", f"cg{sub_id}")
    while any(p.pin.startswith(stale) and p.cgroup_id != 0 for p in SockLB.pinned(env.pin_dir)):
        assert time.monotonic() < deadline, "the kernel did not release the removed cgroup's links"
        time.sleep(0.05)
    env.dp.attach()  # adopts its own links and prunes the stale ones
    assert not os.path.exists(stale)
    mine = cgroup_id(env.cgroup)
    assert {p.cgroup_id for p in SockLB.pinned(env.pin_dir)} == {mine}
    assert len(SockLB.pinned(env.pin_dir)) == 8


def test_root_cgroup_refused_unless_asked(env: Env) -> None:
    dp = SockLB(DatapathConfig(cgroup=cgroup2_mount(), pin_dir=env.pin_dir))
    with pytest.raises(DatapathError) as err:
        dp.attach()
    assert err.value.errno == errno.EPERM
    assert "root cgroup" in str(err.value)


def test_cgroup_errors_name_the_cgroup(env: Env) -> None:
    missing = os.path.join(env.cgroup, "missing")
    with pytest.raises(DatapathError) as err:
        SockLB(DatapathConfig(cgroup=missing, pin_dir=env.pin_dir)).attach()
    assert err.value.errno == errno.ENOENT and missing in str(err.value)
    with pytest.raises(DatapathError) as err:
        SockLB(DatapathConfig(cgroup="/tmp", pin_dir=env.pin_dir)).attach()
    assert err.value.errno == errno.EINVAL and "cgroup2 mount" in str(err.value)


def test_missing_lb_maps_are_named(env: Env) -> None:
    pin_dir = env.pin_dir + "-empty"
    os.mkdir(pin_dir)
    try:
        with pytest.raises(DatapathError) as err:
            SockLB(DatapathConfig(cgroup=env.cgroup, pin_dir=pin_dir)).attach()
        assert err.value.errno == errno.ENOENT
        assert "lb4_services" in str(err.value) and pin_dir in str(err.value)
    finally:
        SockLB.cleanup(pin_dir)
        os.rmdir(pin_dir)
