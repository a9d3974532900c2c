"""FrontendOps on both map backends: slot layout, sharing, wildcards, source ranges,
maglev with NodePort expansion, restart restore, prune, full maps and bad input."""

from __future__ import annotations

import dataclasses
import ipaddress
import re

import pytest

from bpf import lb
from bpfops.frontend_ops import LBOpsError, StaticNodeView
from bpfops.lb_maps import LBMaps
from bpfops.maps_dump import dump_lines, dump_text
from bpfops.model import ServiceSpec
from tests.bpfops.conftest import MapsMaker
from tests.bpfops.helpers import NO_TXN, be, fe, ip, new_ops

AFF = ServiceSpec("test/echo", session_affinity=True, affinity_timeout=42)
CIP = "ClusterIP+non-routable"


def svc_lines(lines: list[str]) -> list[str]:
    return [line for line in lines if line.startswith("SVC:")]


def test_clusterip_lifecycle_ids_move_on(lbmaps: LBMaps) -> None:
    ops = new_ops(lbmaps)
    one = fe("10.96.50.104:80", backends=(be("10.244.1.1:80"),), service=AFF)
    ops.update(NO_TXN, 1, one)
    flags = "ClusterIP+sessionAffinity+non-routable"
    assert dump_lines(lbmaps) == [
        "AFF: ID=1 BEID=1",
        "BE: ID=1 ADDR=10.244.1.1:80/TCP STATE=active",
        "REV: ID=1 ADDR=10.96.50.104:80",
        "SVC: ID=1 ADDR=10.96.50.104:80/TCP SLOT=0 LBALG=undef AFFTimeout=42 COUNT=1 QCOUNT=0 "
        f"FLAGS={flags}",
        f"SVC: ID=1 ADDR=10.96.50.104:80/TCP SLOT=1 BEID=1 COUNT=0 QCOUNT=0 FLAGS={flags}",
    ]
    ops.delete(NO_TXN, 2, one)
    assert dump_text(lbmaps) == ""
    assert ops.state_is_empty()
    ops.update(NO_TXN, 3, one)  # same frontend again: new ids (next-fit)
    assert "REV: ID=2 ADDR=10.96.50.104:80" in dump_lines(lbmaps)
    assert "BE: ID=2 ADDR=10.244.1.1:80/TCP STATE=active" in dump_lines(lbmaps)
    three = dataclasses.replace(one, backends=tuple(be(f"10.244.1.{i}:80") for i in (3, 1, 2)))
    ops.update(NO_TXN, 4, three)
    lines = dump_lines(lbmaps)
    assert [ln.split()[3] for ln in svc_lines(lines)] == ["SLOT=0", "SLOT=1", "SLOT=2", "SLOT=3"]
    assert "BEID=2" in svc_lines(lines)[1] and "BEID=3" in svc_lines(lines)[2]
    assert [ln for ln in lines if ln.startswith("AFF")] == [
        "AFF: ID=2 BEID=2",
        "AFF: ID=2 BEID=3",
        "AFF: ID=2 BEID=4",
    ]
    ops.update(NO_TXN, 5, dataclasses.replace(one, backends=()))  # shrink to nothing
    assert dump_lines(lbmaps) == [
        "REV: ID=2 ADDR=10.96.50.104:80",
        "SVC: ID=2 ADDR=10.96.50.104:80/TCP SLOT=0 LBALG=undef AFFTimeout=42 COUNT=0 QCOUNT=0 "
        f"FLAGS={flags}",
    ]
    ops.update(NO_TXN, 6, one)
    assert "BE: ID=5 ADDR=10.244.1.1:80/TCP STATE=active" in dump_lines(lbmaps)
    ops.delete(NO_TXN, 7, one)
    assert dump_lines(lbmaps) == []


def test_slot_order_and_terminating_fallback(lbmaps: LBMaps) -> None:
    ops = new_ops(lbmaps)
    bes = (be("10.0.0.3:80"), be("10.0.0.1:80", lb.BACKEND_TERMINATING), be("10.0.0.2:80"))
    f = fe("10.96.0.1:80", backends=bes)
    ops.update(NO_TXN, 1, f)
    ids = {str(b.addr): ops.backend_id(b.addr) for b in bes}
    svc = svc_lines(dump_lines(lbmaps))
    assert "COUNT=2 QCOUNT=1" in svc[0]
    assert f"BEID={ids['10.0.0.2:80/TCP']}" in svc[1]
    assert f"BEID={ids['10.0.0.3:80/TCP']}" in svc[2]
    assert f"BEID={ids['10.0.0.1:80/TCP']}" in svc[3]
    # Only terminating backends left: they are used (counted as active).
    term = tuple(dataclasses.replace(b, state=lb.BACKEND_TERMINATING) for b in bes)
    ops.update(NO_TXN, 2, dataclasses.replace(f, backends=term))
    assert "COUNT=3 QCOUNT=0" in svc_lines(dump_lines(lbmaps))[0]
    assert sum("STATE=terminating" in ln for ln in dump_lines(lbmaps)) == 3
    # Maintenance: kept in the backends map, no slot; stale slots go.
    maint = (be("10.0.0.1:80", lb.BACKEND_MAINTENANCE), be("10.0.0.2:80"))
    ops.update(NO_TXN, 3, dataclasses.replace(f, backends=maint))
    lines = dump_lines(lbmaps)
    assert len(svc_lines(lines)) == 2 and "COUNT=1 QCOUNT=0" in svc_lines(lines)[0]
    assert any("10.0.0.1:80/TCP STATE=maintenance" in ln for ln in lines)
    assert not any("10.0.0.3" in ln for ln in lines)


def test_backends_are_shared_and_released_with_the_last_reference(lbmaps: LBMaps) -> None:
    ops = new_ops(lbmaps)
    shared = be("10.244.0.1:8080")
    a = fe("10.96.0.1:80", backends=(shared,))
    b = fe("10.96.0.2:80", backends=(shared, be("10.244.0.2:8080")))
    ops.update(NO_TXN, 1, a)
    ops.update(NO_TXN, 2, b)
    assert sum(ln.startswith("BE:") for ln in dump_lines(lbmaps)) == 2
    ops.delete(NO_TXN, 3, a)
    assert any("10.244.0.1:8080" in ln for ln in dump_lines(lbmaps) if ln.startswith("BE:"))
    ops.update(NO_TXN, 4, dataclasses.replace(b, backends=(be("10.244.0.2:8080"),)))
    assert not any("10.244.0.1" in ln for ln in dump_lines(lbmaps))
    ops.delete(NO_TXN, 5, b)
    assert dump_lines(lbmaps) == [] and ops.state_is_empty()


def test_wildcard_entries_shared_per_vip(lbmaps: LBMaps) -> None:
    ops = new_ops(lbmaps, node=StaticNodeView(local=[ip("10.0.0.9")]), wildcard_entries=True)
    http = fe("10.96.0.1:80", backends=(be("10.244.0.1:80"),))
    dns = (
        fe("10.96.0.1:53", proto="UDP", backends=(be("10.244.0.1:53", proto="UDP"),))
        if False
        else fe("10.96.0.1:53", proto="UDP")
    )
    lb_fe = fe("10.0.0.2:80", "LoadBalancer")
    local = fe("10.0.0.9:80", "LoadBalancer")
    for i, f in enumerate((http, dns, lb_fe, local)):
        ops.update(NO_TXN, i, f)
    wild = [ln for ln in dump_lines(lbmaps) if ln.startswith("SVC: ID=0 ")]
    assert wild == [
        "SVC: ID=0 ADDR=10.0.0.2:0/ANY SLOT=0 LBALG=undef AFFTimeout=0 COUNT=0 QCOUNT=0 "
        "FLAGS=LoadBalancer+non-routable",
        "SVC: ID=0 ADDR=10.96.0.1:0/ANY SLOT=0 LBALG=undef AFFTimeout=0 COUNT=0 QCOUNT=0 "
        f"FLAGS={CIP}",
    ]
    ops.delete(NO_TXN, 9, http)
    assert any("10.96.0.1:0/ANY" in ln for ln in dump_lines(lbmaps))
    ops.delete(NO_TXN, 10, dns)
    assert not any("10.96.0.1:0/ANY" in ln for ln in dump_lines(lbmaps))
    ops.prune(NO_TXN, iter([lb_fe, local]))
    assert any("10.0.0.2:0/ANY" in ln for ln in dump_lines(lbmaps))


def test_source_ranges_and_deny(lbmaps: LBMaps) -> None:
    ops = new_ops(lbmaps)
    svc = ServiceSpec("test/echo", source_ranges=(ipaddress.ip_network("10.0.0.0/8"),))
    cip = fe("10.0.0.1:80", backends=(be("10.244.1.1:80"),), service=svc)
    lbf = fe("10.0.0.2:80", "LoadBalancer", backends=(be("10.244.1.1:80"),), service=svc)
    ops.update(NO_TXN, 1, cip)
    ops.update(NO_TXN, 2, lbf)
    lines = dump_lines(lbmaps)
    # Entries for every frontend of the service; the check only where the type asks.
    assert [ln for ln in lines if ln.startswith("SRCRANGE")] == [
        "SRCRANGE: ID=1 CIDR=10.0.0.0/8",
        "SRCRANGE: ID=2 CIDR=10.0.0.0/8",
    ]
    assert lines[-2].endswith(
        "SLOT=0 LBALG=undef AFFTimeout=0 COUNT=1 QCOUNT=0 FLAGS=LoadBalancer+check source-range"
    )
    assert lines[-1].endswith("SLOT=1 BEID=1 COUNT=0 QCOUNT=0 FLAGS=LoadBalancer")  # master only
    assert svc_lines(lines)[0].endswith(f"FLAGS={CIP}")
    deny = dataclasses.replace(svc, source_ranges_deny=True)
    ops.update(NO_TXN, 3, dataclasses.replace(lbf, service=deny))
    assert dump_lines(lbmaps)[-2].endswith("+check source-range+deny")
    ops.update(NO_TXN, 4, dataclasses.replace(lbf, service=ServiceSpec("test/echo")))
    assert [ln for ln in dump_lines(lbmaps) if ln.startswith("SRCRANGE")] == [
        "SRCRANGE: ID=1 CIDR=10.0.0.0/8"
    ]
    all_types = new_ops(lbmaps, source_range_all_types=True)
    all_types.update(NO_TXN, 5, fe("10.0.0.3:80", service=svc))
    assert any(
        ln.startswith("SVC: ID=3 ") and ln.endswith("non-routable+check source-range")
        for ln in dump_lines(lbmaps)
    )


def test_nodeport_expansion_and_maglev(lbmaps: LBMaps) -> None:
    node = StaticNodeView(nodeport=[ip("1.1.1.1"), ip("2001::1")])
    ops = new_ops(lbmaps, node=node, algorithm="maglev")
    bes = (be("10.244.1.54:80"), be("10.244.2.9:80"))
    np = fe("0.0.0.0:30181", "NodePort", backends=bes)
    ops.update(NO_TXN, 1, np)
    lines = dump_lines(lbmaps)
    assert "REV: ID=1 ADDR=0.0.0.0:30181" in lines and "REV: ID=2 ADDR=1.1.1.1:30181" in lines
    assert [ln for ln in lines if ln.startswith("MAGLEV")] == [
        "MAGLEV: ID=2 INNER=[1(511), 2(510)]"
    ]
    assert any(
        ln.endswith("SLOT=0 LBALG=undef AFFTimeout=0 COUNT=2 QCOUNT=0 FLAGS=NodePort")
        for ln in lines
    )
    assert any(
        "0.0.0.0:30181/TCP SLOT=0" in ln and ln.endswith("NodePort+non-routable") for ln in lines
    )
    # The node address goes away: its expansion is withdrawn on the next update.
    node.nodeport = []
    ops.update(NO_TXN, 2, np)
    assert not any("1.1.1.1" in ln or ln.startswith("MAGLEV") for ln in dump_lines(lbmaps))
    node.nodeport = [ip("1.1.1.1")]
    ops.update(NO_TXN, 3, np)
    ops.delete(NO_TXN, 4, np)
    assert dump_lines(lbmaps) == [] and ops.state_is_empty()


def test_algorithm_annotation_and_dsr(lbmaps: LBMaps) -> None:
    ops = new_ops(lbmaps, algorithm_annotation=True, lb_mode="hybrid")
    mag = ServiceSpec("test/echo", lb_algorithm="maglev")
    ops.update(NO_TXN, 1, fe("10.0.0.2:80", "LoadBalancer", (be("10.1.0.1:80"),), mag))
    ops.update(NO_TXN, 2, fe("10.0.0.2:53", "LoadBalancer", (be("10.1.0.1:53"),), proto="UDP"))
    lines = dump_lines(lbmaps)
    assert "MAGLEV: ID=1 INNER=[1(1021)]" in lines
    masters = [ln for ln in svc_lines(lines) if "SLOT=0" in ln]
    assert "LBALG=maglev" in masters[0] and masters[0].endswith("LoadBalancer+dsr")
    assert "LBALG=undef" in masters[1] and masters[1].endswith("FLAGS=LoadBalancer")
    ops.update(NO_TXN, 3, fe("10.0.0.2:80", "LoadBalancer", (be("10.1.0.1:80"),)))
    assert not any(ln.startswith("MAGLEV") for ln in dump_lines(lbmaps))


def test_restart_restores_ids_and_prune_releases_the_rest(make_maps: MapsMaker) -> None:
    first = make_maps()
    ops = new_ops(first)
    fes = [fe(f"10.96.0.{i}:80", backends=(be(f"10.244.0.{i}:80"),)) for i in range(1, 5)]
    for i, f in enumerate(fes):
        ops.update(NO_TXN, i, f)
    ops.delete(NO_TXN, 9, fes[0])
    ops.update(NO_TXN, 10, fes[0])  # ids 5 and 5 now
    before = dump_lines(first)
    first.close()

    second = make_maps()  # same pins: the previous run's entries
    ops2 = new_ops(second)
    assert "restoredServiceIDs: 4" in ops2.state_summary()
    for i, f in enumerate(reversed(fes[1:])):  # a different order, one frontend gone
        ops2.update(NO_TXN, i, f)
    assert [
        ln for ln in dump_lines(second) if "10.96.0.1" not in ln and "10.244.0.1" not in ln
    ] == [ln for ln in before if "10.96.0.1" not in ln and "10.244.0.1" not in ln]
    ops2.update(NO_TXN, 5, fe("10.96.0.9:80"))
    assert ops2.service_id(fe("10.96.0.9:80").addr) == 6  # after the highest restored id
    ops2.prune(NO_TXN, iter([*fes[1:], fe("10.96.0.9:80")]))
    after = dump_lines(second)
    assert not any("10.96.0.1" in ln or "10.244.0.1:" in ln for ln in after)
    assert "restoredServiceIDs: 0" in ops2.state_summary()
    assert "restoredBackendIDs: 0" in ops2.state_summary()
    for f in [*fes[1:], fe("10.96.0.9:80")]:
        ops2.delete(NO_TXN, 20, f)
    assert dump_lines(second) == [] and ops2.state_is_empty()


def test_prune_removes_everything_unexplained(lbmaps: LBMaps) -> None:
    ops = new_ops(lbmaps)
    keep = fe("10.96.0.1:80", backends=(be("10.244.0.1:80"),), service=AFF)
    ops.update(NO_TXN, 1, keep)
    # The first prune on maps created empty has nothing to look for (test_first_prune.py);
    # entries written behind the agent's back go at every later one.
    ops.prune(NO_TXN, iter([keep]))
    good = dump_lines(lbmaps)
    a4 = ipaddress.ip_address("10.9.9.9").packed
    lbmaps.svc4.update(lb.Service4Key(a4, 80, 0, 6, 0), lb.ServiceValue(0, 0, 77, 0, 0, 0))
    lbmaps.svc4.update(
        lb.Service4Key(ipaddress.ip_address("10.96.0.1").packed, 80, 5, 6, 0),
        lb.ServiceValue(1, 0, 1, 0, 0, 0),
    )
    lbmaps.svc4.update(lb.Service4Key(a4, 0, 0, 0, 0), lb.ServiceValue())
    lbmaps.be4.update(99, lb.Backend4(a4, 80, 6))
    lbmaps.rev4.update(77, lb.RevNat4(a4, 80))
    lbmaps.aff_match.update(lb.AffinityMatchKey(99, 77), 0)
    lbmaps.src4.update(lb.SourceRange4Key.for_cidr(77, a4, 32), 0)
    lbmaps.set_maglev(77, [99] * lbmaps.maglev_table_size, False)
    assert len(dump_lines(lbmaps)) == len(good) + 8
    ops.prune(NO_TXN, iter([keep]))
    assert dump_lines(lbmaps) == good
    ops.prune(NO_TXN, iter([]))  # the table no longer has it
    assert dump_lines(lbmaps) == [] and ops.state_is_empty()


def test_full_map_reports_the_frontend_and_recovers(make_maps: MapsMaker) -> None:
    maps = make_maps(max_entries=8)
    ops = new_ops(maps)
    small = fe("10.96.0.1:80", backends=(be("10.244.0.1:80"),))
    ops.update(NO_TXN, 1, small)
    big = fe("10.96.0.2:80", backends=tuple(be(f"10.244.1.{i}:80") for i in range(1, 12)))
    with pytest.raises(LBOpsError, match=r"10\.96\.0\.2:80/TCP.*E2BIG"):
        ops.update(NO_TXN, 2, big)
    assert any("10.96.0.1:80/TCP SLOT=1" in ln for ln in dump_lines(maps))
    fewer = dataclasses.replace(big, backends=big.backends[:3])
    ops.update(NO_TXN, 3, fewer)
    lines = dump_lines(maps)
    assert sum(ln.startswith("BE:") for ln in lines) == 4
    assert sum("10.96.0.2:80/TCP" in ln for ln in lines) == 4
    ops.prune(NO_TXN, iter([small, fewer]))
    assert dump_lines(maps) == lines


def test_bad_input_names_the_frontend(lbmaps: LBMaps) -> None:
    ops = new_ops(lbmaps)
    with pytest.raises(LBOpsError, match=r"10\.96\.0\.1:0/TCP.*port 0"):
        ops.update(NO_TXN, 1, fe("10.96.0.1:0"))
    with pytest.raises(LBOpsError, match=r"backend 10\.1\.0\.1:0/TCP: port 0"):
        ops.update(NO_TXN, 2, fe("10.96.0.2:80", backends=(be("10.1.0.1:0"),)))
    ops.prune(NO_TXN, iter([]))
    assert dump_lines(lbmaps) == []


def test_backend_moving_to_a_later_frontend_keeps_its_id(lbmaps: LBMaps) -> None:
    node = StaticNodeView()
    ops = new_ops(lbmaps, node=node)
    backend = be("10.244.1.114:80")
    ops.update(NO_TXN, 1, fe("10.96.0.1:80", backends=(be("10.244.1.1:80"),)))
    old = fe("0.0.0.0:4444", "HostPort", backends=(backend,))
    new = fe("0.0.0.0:5555", "HostPort", backends=(backend,))
    ops.update(NO_TXN, 2, old)
    be_id = ops.backend_id(backend.addr)
    # The reconciler deletes the old frontend before it writes the new one of the round.
    node.referenced = {backend.addr}
    ops.delete(NO_TXN, 3, old)
    assert f"BE: ID={be_id} ADDR=10.244.1.114:80/TCP STATE=active" in dump_lines(lbmaps)
    ops.update(NO_TXN, 4, new)
    assert ops.backend_id(backend.addr) == be_id
    # Without a taker, prune drops the kept entry.
    node.referenced = {backend.addr}
    ops.delete(NO_TXN, 5, new)
    ops.prune(NO_TXN, iter([fe("10.96.0.1:80", backends=(be("10.244.1.1:80"),))]))
    assert not any("10.244.1.114" in ln for ln in dump_lines(lbmaps))


def test_any_protocol_entries_migrate_keeping_ids(lbmaps: LBMaps) -> None:
    # Entries written by an older version with protocol ANY (0).
    vip = ipaddress.ip_address("10.96.0.1").packed
    bip = ipaddress.ip_address("10.244.0.1").packed
    lbmaps.svc4.update(lb.Service4Key(vip, 80, 0, 0, 0), lb.ServiceValue(0, 1, 7, 0, 0, 0))
    lbmaps.svc4.update(lb.Service4Key(vip, 80, 1, 0, 0), lb.ServiceValue(9, 0, 7, 0, 0, 0))
    lbmaps.be4.update(9, lb.Backend4(bip, 8080, 0))
    lbmaps.rev4.update(7, lb.RevNat4(vip, 80))
    ops = new_ops(lbmaps)
    assert "restoredServiceIDs: 3" in ops.state_summary()  # TCP, UDP and SCTP aliases
    f = fe("10.96.0.1:80", backends=(be("10.244.0.1:8080"),))
    ops.update(NO_TXN, 1, f)
    ops.prune(NO_TXN, iter([f]))
    assert dump_lines(lbmaps) == [
        "BE: ID=9 ADDR=10.244.0.1:8080/TCP STATE=active",
        "REV: ID=7 ADDR=10.96.0.1:80",
        f"SVC: ID=7 ADDR=10.96.0.1:80/TCP SLOT=0 LBALG=undef AFFTimeout=0 COUNT=1 QCOUNT=0 "
        f"FLAGS={CIP}",
        f"SVC: ID=7 ADDR=10.96.0.1:80/TCP SLOT=1 BEID=9 COUNT=0 QCOUNT=0 FLAGS={CIP}",
    ]


def test_quarantine_survives_a_restart_until_health_is_known(make_maps: MapsMaker) -> None:
    maps = make_maps()
    ops = new_ops(maps)
    healthy, sick = be("10.244.0.1:80"), be("10.244.0.2:80", unhealthy=True)
    f = fe("10.96.0.1:80", backends=(healthy, sick))
    ops.update(NO_TXN, 1, f)
    assert "COUNT=1 QCOUNT=1" in svc_lines(dump_lines(maps))[0]
    maps.close()
    maps2 = make_maps()
    ops2 = new_ops(maps2)
    assert "restoredQuarantines: 1" in ops2.state_summary()
    # The tables no longer know the health (fresh start): the restored quarantine holds.
    unknown = dataclasses.replace(f, backends=(healthy, be("10.244.0.2:80")))
    ops2.update(NO_TXN, 2, unknown)
    assert "COUNT=1 QCOUNT=1" in svc_lines(dump_lines(maps2))[0]
    # A health check reports the backend healthy: it is used again.
    known = dataclasses.replace(f, backends=(healthy, be("10.244.0.2:80", health_known=True)))
    ops2.update(NO_TXN, 3, known)
    assert "COUNT=2 QCOUNT=0" in svc_lines(dump_lines(maps2))[0]
    assert "restoredQuarantines: 0" in ops2.state_summary()


def test_ipv6_local_redirect_and_kpr_off(lbmaps: LBMaps) -> None:
    ops = new_ops(lbmaps, kube_proxy_replacement=False)
    v6 = fe("[fd00::10]:53", backends=(be("[fd00:244::1]:53"),), proto="UDP")
    redirect = fe("169.254.0.1:53", "LocalRedirect", (be("10.244.0.9:53"),), proto="UDP")
    nodeport = fe("0.0.0.0:30053", "NodePort", (be("10.244.0.9:53"),))
    for i, f in enumerate((v6, redirect, nodeport)):
        ops.update(NO_TXN, i, f)
    lines = dump_lines(lbmaps)
    assert "REV: ID=1 ADDR=[fd00::10]:53" in lines
    assert "BE: ID=1 ADDR=[fd00:244::1]:53/TCP STATE=active" in lines
    assert any(
        ln.startswith("SVC: ID=2 ADDR=169.254.0.1:53/UDP SLOT=0")
        and ln.endswith("FLAGS=LocalRedirect")
        for ln in lines
    )
    assert not any("30053" in ln for ln in lines)  # no NodePort without kube-proxy replacement


def test_maglev_weights_in_the_table(lbmaps: LBMaps) -> None:
    ops = new_ops(lbmaps, algorithm="maglev", external_clusterip=True)
    bes = (be("10.244.0.1:80", weight=300), be("10.244.0.2:80", weight=100))
    ops.update(NO_TXN, 1, fe("10.96.0.1:80", backends=bes))
    (line,) = [ln for ln in dump_lines(lbmaps) if ln.startswith("MAGLEV")]
    counts = [int(n) for n in re.findall(r"\((\d+)\)", line)]
    assert sum(counts) == 1021 and counts[0] > 2.5 * counts[1]
    assert not any(ln.endswith("non-routable") for ln in svc_lines(dump_lines(lbmaps)))
