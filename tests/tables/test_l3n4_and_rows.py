"""L3n4Addr parsing/formatting/keys and the table columns of every LB row type."""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reconciler.status import status_done, status_error
from statedb.show import format_table, show_table
from tables.backends import Backend, BackendState
from tables.frontends import Frontend, SVCType
from tables.l3n4 import SCOPE_INTERNAL, AddressError, L3n4Addr, parse_addr_key
from tables.node_addresses import NodeAddress
from tables.services import (
    ForwardingMode,
    LBAlgorithm,
    ProxyRedirect,
    Service,
    SourceRangesPolicy,
    TrafficPolicy,
    format_duration,
    parse_cidr,
)

from .helpers import addr, be, new_writer


# ----- L3n4Addr --------------------------------------------------------------------------
@pytest.mark.parametrize(
    "text",
    ["10.0.0.1:80/TCP", "[2001::1]:443/UDP", "1.1.1.1:80/TCP/i", "0.0.0.0:30781/SCTP",
     "[::]:0/ANY", "[2001:db8::5]:8080/TCP/i"],
)
def test_parse_format_roundtrip(text: str) -> None:
    assert str(L3n4Addr.parse(text)) == text


def test_parse_defaults_and_fields() -> None:
    a = L3n4Addr.parse("10.0.0.1:80")
    assert (a.protocol, a.scope, a.port) == ("TCP", 0, 80)
    b = L3n4Addr.parse("[2001::1]:53/udp/i")
    assert b.is_ipv6 and b.protocol == "UDP" and b.scope == SCOPE_INTERNAL
    assert b.addr_port() == "[2001::1]:53"
    assert L3n4Addr.parse("0.0.0.0:1/TCP").is_unspecified


@pytest.mark.parametrize(
    "text, word",
    [("10.0.0.1:80/FOO", "protocol"), ("10.0.0.300:80/TCP", "IP"), ("10.0.0.1:99999/TCP", "port"),
     ("10.0.0.1/TCP", "ip:port"), ("2001::1:80/TCP", "ip:port"), ("[2001::1]80/TCP", "[ipv6]"),
     ("1.2.3.4:x/TCP", "port")],
)
def test_parse_errors_name_the_problem(text: str, word: str) -> None:
    with pytest.raises(AddressError, match=word):
        L3n4Addr.parse(text)


def test_key_order_is_address_port_protocol_scope() -> None:
    texts = ["10.0.0.2:80/TCP", "10.0.0.1:81/TCP", "10.0.0.1:80/UDP", "10.0.0.1:80/TCP/i",
             "10.0.0.1:80/TCP", "[::1]:1/TCP", "9.0.0.0:1/TCP"]
    ordered = sorted((L3n4Addr.parse(t) for t in texts), key=L3n4Addr.key)
    assert [str(a) for a in ordered] == [
        "[::1]:1/TCP", "9.0.0.0:1/TCP", "10.0.0.1:80/TCP", "10.0.0.1:80/TCP/i",
        "10.0.0.1:80/UDP", "10.0.0.1:81/TCP", "10.0.0.2:80/TCP",
    ]


@settings(max_examples=200, deadline=None, derandomize=True)
@given(
    st.one_of(st.ip_addresses(v=4), st.ip_addresses(v=6)),
    st.integers(0, 65535),
    st.sampled_from(["TCP", "UDP", "SCTP", "ANY"]),
    st.sampled_from([0, 1]),
)
def test_roundtrip_property(ip: ipaddress.IPv4Address | ipaddress.IPv6Address, port: int,
                            proto: str, scope: int) -> None:
    a = L3n4Addr(ip, port, proto, scope)
    assert L3n4Addr.parse(str(a)) == a


def test_ipv4_and_mapped_ipv6_are_distinct() -> None:
    a, b = L3n4Addr.parse("1.2.3.4:80/TCP"), L3n4Addr.parse("[::ffff:1.2.3.4]:80/TCP")
    assert a != b and a.key() != b.key() and len({a, b}) == 2
    assert a == L3n4Addr.make("1.2.3.4", 80, "tcp") and hash(a) == hash(L3n4Addr.parse(str(a)))


def test_parse_addr_key_accepts_cidr_and_ip() -> None:
    assert isinstance(parse_addr_key("10.0.0.0/8"), ipaddress.IPv4Network)
    assert isinstance(parse_addr_key("10.244.1.1:80/TCP"), L3n4Addr)
    assert isinstance(parse_addr_key("2001::1"), ipaddress.IPv6Address)
    with pytest.raises(AddressError):
        parse_addr_key("nonsense")


# ----- services --------------------------------------------------------------------------
def test_service_columns() -> None:
    s = Service("test/echo", port_names=(("https", 443), ("http", 80)))
    assert s.table_row() == ["test/echo", "k8s", "http=80, https=443", "Cluster", ""]
    mixed = Service("a/b", ext_traffic_policy=TrafficPolicy.LOCAL)
    assert mixed.traffic_policy_text() == "Ext=Local, Int=Cluster"
    assert Service("a/b", ext_traffic_policy=TrafficPolicy.LOCAL,
                   int_traffic_policy=TrafficPolicy.LOCAL).traffic_policy_text() == "Local"
    assert Service("a/b", port_names=(("", 8081),)).table_row()[2] == "=8081"


def test_service_flags_sorted() -> None:
    s = Service(
        "a/b",
        session_affinity=True,
        session_affinity_timeout=42,
        source_ranges=(parse_cidr("10.0.0.0/8"),),
        source_ranges_policy=SourceRangesPolicy.DENY,
        health_check_node_port=31000,
        lb_algorithm=LBAlgorithm.MAGLEV,
        forwarding_mode=ForwardingMode.DSR,
        traffic_distribution="PreferClose",
        load_balancer_class="io.cilium/node",
        proxy_redirect=ProxyRedirect(9000),
    )
    assert s.flags_text() == (
        "ExplicitLBAlgorithm=maglev, ForwardingMode=dsr, HealthCheckNodePort=31000, "
        "LoadBalancerClass=io.cilium/node, ProxyRedirect=9000, SessionAffinity=42s, "
        "SourceRanges=10.0.0.0/8, SourceRangesPolicy=deny, TrafficDistribution=PreferSameZone"
    )


@pytest.mark.parametrize("secs, text", [(0, "0s"), (42, "42s"), (90, "1m30s"), (10800, "3h0m0s"),
                                        (600, "10m0s")])
def test_format_duration_like_go(secs: int, text: str) -> None:
    assert format_duration(secs) == text


# ----- backends ------------------------------------------------------------------------------
def test_backend_instances_and_shadows() -> None:
    b = Backend(addr("10.0.0.1:80/TCP"))
    b = b.with_instance(("test/b", 4), be("10.0.0.1:80/TCP", "http", node="n1"))
    b = b.with_instance(("test/a", 4), be("10.0.0.1:80/TCP", "http", "web",
                                          state=BackendState.TERMINATING))
    b = b.with_instance(("test/a", 1), be("10.0.0.1:80/TCP", "p", source="local"))
    # Preferred instance of test/a is the local one (priority 1); the k8s one shadows.
    assert b.instances_text() == "test/a (p), test/b (http)"
    assert b.shadows_text() == "test/a [k8s (http web)]"
    assert b.service_names() == ["test/a", "test/b"]
    row = b.table_row()
    assert row[:4] == ["10.0.0.1:80/TCP", "test/a (p), test/b (http)", "test/a [k8s (http web)]",
                       "n1"]
    b2 = b.without_instance(("test/a", 1))
    assert b2.instances_text() == "test/a [terminating] (http web), test/b (http)"


def test_backend_unhealthy_shown() -> None:
    import dataclasses

    p = dataclasses.replace(be("10.0.0.1:80/TCP", "http"), unhealthy=True)
    b = Backend(p.address, ((("t/e", 4), p),))
    assert b.instances_text() == "t/e [unhealthy] (http)"
    assert b.table_row()[7] == "quarantined"


# ----- frontends ----------------------------------------------------------------------------
def test_frontend_backends_cut_to_five() -> None:
    bes = tuple(be(f"10.0.0.{i}:80/TCP") for i in range(1, 8))
    f = Frontend(addr("1.1.1.1:80/TCP"), SVCType.CLUSTER_IP, "a/b", "http", backends=bes,
                 status=status_done())
    row = dict(zip(Frontend.table_header(), f.table_row()))
    assert row["Backends"] == (
        "10.0.0.1:80/TCP, 10.0.0.2:80/TCP, 10.0.0.3:80/TCP, 10.0.0.4:80/TCP, 10.0.0.5:80/TCP"
        " + 2 more ..."
    )
    assert row["Status"] == "Done" and row["Error"] == "" and row["Type"] == "ClusterIP"
    assert Frontend(addr("1.1.1.1:80/TCP"), SVCType.CLUSTER_IP, "a/b",
                    backends=bes[:5]).backends_text().count(",") == 4
    err = f.with_status(status_error("map full"))
    row = dict(zip(Frontend.table_header(), err.table_row()))
    assert (row["Status"], row["Error"]) == ("Error", "map full")


def test_node_address_row_and_yaml() -> None:
    na = NodeAddress.from_dict({"addr": "1.1.1.1", "nodeport": True, "primary": True,
                                "devicename": "test"})
    assert na.table_row() == ["1.1.1.1", "true", "true", "test"]
    with pytest.raises(ValueError, match="field 'addr'"):
        NodeAddress.from_dict({"addr": "1.1.1.300"})
    with pytest.raises(ValueError, match="field 'nodeport'"):
        NodeAddress.from_dict({"addr": "1.1.1.1", "nodeport": "yes"})


def test_show_empty_tables_have_headers() -> None:
    db, _ = new_writer()
    assert show_table(db, "services") == "Name   Source   PortNames   TrafficPolicy   Flags\n"
    assert show_table(db, "node-addresses").split() == ["Address", "NodePort", "Primary",
                                                        "DeviceName"]
    assert show_table(db, "backends").split()[:4] == ["Address", "Instances", "Shadows",
                                                      "NodeName"]
    assert format_table([], columns=["Address", "Type"], row_type=Frontend).split() == [
        "Address", "Type"]
