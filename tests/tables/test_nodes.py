"""The nodes table without the kernel: Node manifests, the route derivation (which nodes
get routes, and why the others do not) and the node entries of the ipcache."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import yaml

from bpf.ipcache import FLAG_HAS_TUNNEL_EP, FLAG_IPV6_TUNNEL_EP
from bpfops.ipcache_ops import ipcache_value
from sources.manifests import ManifestSource
from statedb import DB
from tables.devices import SCOPE_HOST, SCOPE_LINK, Device, DeviceAddress
from tables.endpoint_entries import EntryTables, IPCacheEntry
from tables.identities import IDENTITY_HOST, IDENTITY_REMOTE_NODE
from tables.lb_writer import LBWriter
from tables.node_routes import connected_networks, desired_routes
from tables.nodes import (
    EXTERNAL_IP,
    INTERNAL_IP,
    SOURCE_K8S,
    Node,
    NodeIP,
    NodeObjects,
    new_nodes_table,
)


def ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    return ipaddress.ip_address(text)


def net(text: str) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
    return ipaddress.ip_network(text)


def node(name: str, internal: tuple[str, ...], cidrs: tuple[str, ...],
         external: tuple[str, ...] = ()) -> Node:
    addrs = tuple(NodeIP(INTERNAL_IP, ip(a)) for a in internal)
    addrs += tuple(NodeIP(EXTERNAL_IP, ip(a)) for a in external)
    return Node(name, addrs, tuple(net(c) for c in cidrs))


def node_yaml(name: str, address: str, cidr: str) -> dict[str, object]:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name},
            "spec": {"podCIDRs": [cidr]},
            "status": {"addresses": [{"type": "InternalIP", "address": address}]}}


def test_nodes_from_manifests_with_their_own_errors(tmp_path: Path) -> None:
    db = DB()
    writer = LBWriter.create(db)
    nodes = new_nodes_table()
    db.register(nodes)
    f = tmp_path / "nodes.yaml"
    good, bad = node_yaml("b", "192.168.1.2", "10.1.0.0/24"), node_yaml("c", "x", "10.2.0.0/24")
    f.write_text(yaml.safe_dump_all([good, bad]))
    src = ManifestSource(writer, [str(tmp_path)])
    src.add_kind_handler(NodeObjects(nodes))
    src.sync()
    rows = {n.name: n for n in nodes.all(db.read_txn())}
    assert set(rows) == {"b"} and rows["b"].source == "manifests"
    (err,) = src.errors.values()
    assert "Node c" in err and "status.addresses[0].address" in err
    # fixing c applies it; b's row is not rewritten
    rev = nodes.revision(db.read_txn())
    f.write_text(yaml.safe_dump_all([good, node_yaml("c", "192.168.1.3", "10.2.0.0/24")]))
    src.sync()
    assert {n.name for n in nodes.all(db.read_txn())} == {"b", "c"} and not src.errors
    assert nodes.revision(db.read_txn()) == rev + 1
    # a deletion by another source leaves the manifests' row alone
    with db.write_txn(nodes) as txn:
        NodeObjects(nodes, SOURCE_K8S).delete(txn, good)
    assert {n.name for n in nodes.all(db.read_txn())} == {"b", "c"}
    f.unlink()
    src.sync()
    assert list(nodes.all(db.read_txn())) == []


def test_connected_networks_are_up_devices_with_global_or_link_addresses() -> None:
    devices = [
        Device(1, "lo", flags=("up", "loopback"),
               addresses=(DeviceAddress(ip("127.0.0.1"), 8, SCOPE_HOST),)),
        Device(2, "eth0", flags=("up",), addresses=(
            DeviceAddress(ip("192.168.1.1"), 24), DeviceAddress(ip("fd01::1"), 64),
            DeviceAddress(ip("fe80::1"), 64, SCOPE_LINK))),
        Device(3, "eth1", flags=(), addresses=(DeviceAddress(ip("172.16.0.1"), 16),)),
    ]
    assert connected_networks(devices) == [net("192.168.1.0/24"), net("fd01::/64"),
                                           net("fe80::/64")]


def test_desired_routes_and_the_reasons_for_none() -> None:
    connected = [net("192.168.1.0/24"), net("fd01::/64")]
    nodes = [
        node("a", ("192.168.1.1",), ("10.0.0.0/24",)),                      # this node
        node("b", ("192.168.1.2", "fd01::2"), ("10.1.0.0/24", "fd10:1::/112")),
        node("c", ("172.20.0.3",), ("10.3.0.0/24",)),                       # not connected
        node("d", ("192.168.1.4",), ("10.4.0.0/24", "fd10:4::/112")),       # no IPv6
        node("e", ("192.168.1.5",), ("10.0.0.0/25",)),                      # overlaps a's
        node("f", ("192.168.1.6",), ("10.1.0.0/24",)),                      # overlaps b's
        node("g", (), ("10.7.0.0/24",), external=("192.168.1.7",)),         # no InternalIP
    ]
    routes, problems = desired_routes(reversed(nodes), "a", connected)
    assert {str(p): (str(r.gateway), r.node) for p, r in routes.items()} == {
        "10.1.0.0/24": ("192.168.1.2", "b"),
        "fd10:1::/112": ("fd01::2", "b"),
        "10.4.0.0/24": ("192.168.1.4", "d"),
    }
    assert set(problems) == {"c", "d", "e", "f", "g"}
    assert "172.20.0.3 is not on a directly connected network" in problems["c"]
    assert "no IPv6 InternalIP for pod CIDR fd10:4::/112" in problems["d"]
    assert "overlaps this node's (a)" in problems["e"]
    assert "overlaps node b's 10.1.0.0/24" in problems["f"]
    assert "no IPv4 InternalIP" in problems["g"]


def test_node_ipcache_entries_follow_the_nodes() -> None:
    entries = EntryTables()
    db = DB(entries.endpoint_map, entries.ipcache)
    a = node("a", ("192.168.1.1",), ())
    b = node("b", ("192.168.1.2", "fd01::2"), (), external=("203.0.113.2",))
    c = node("c", ("192.168.1.3",), ())
    last: dict[str, Node] = {}
    with db.write_txn(entries.endpoint_map, entries.ipcache) as txn:
        entries.set_host(txn, [ip("192.168.1.1")], [4, 6])
        assert entries.set_nodes(txn, [a, b, c], "a", last) == 4
        # the host's entry wins over a remote node claiming the same address
        x = node("x", ("192.168.1.1",), ())
        assert entries.set_nodes(txn, [a, b, c, x], "a", last) == 0
        assert entries.set_nodes(txn, [a, b, c], "a", last) == 0
        assert set(last) == {"b", "c"}
    rows = {str(r.prefix): r for r in entries.ipcache.all(db.read_txn())}
    assert rows["192.168.1.1/32"].identity == IDENTITY_HOST
    assert rows["192.168.1.2/32"].identity == IDENTITY_REMOTE_NODE
    assert rows["192.168.1.2/32"].owner == "remote-node:b"
    assert str(rows["203.0.113.2/32"].tunnel_endpoint) == "192.168.1.2"
    assert str(rows["fd01::2/128"].tunnel_endpoint) == "fd01::2"
    rev = entries.ipcache.revision(db.read_txn())
    with db.write_txn(entries.endpoint_map, entries.ipcache) as txn:
        assert entries.set_nodes(txn, [a, b, c], "a", last) == 0  # unchanged
        assert entries.set_nodes(txn, [a, b], "a", last) == 1      # c left
        # a fresh follower (last empty) finds every entry right: nothing written
        assert entries.set_nodes(txn, [a, b], "a", {}) == 0
    assert entries.ipcache.revision(db.read_txn()) == rev + 1
    assert "192.168.1.3/32" not in {str(r.prefix) for r in entries.ipcache.all(db.read_txn())}


def test_ipcache_value_carries_the_tunnel_endpoint() -> None:
    plain = ipcache_value(IPCacheEntry(net("10.0.0.1/32"), 1, "host"))
    assert plain.flags == 0 and plain.tunnel_endpoint == bytes(16)
    v4 = ipcache_value(IPCacheEntry(net("10.0.0.2/32"), 6, "remote-node",
                                    tunnel_endpoint=ip("192.168.1.2")))
    assert v4.flags == FLAG_HAS_TUNNEL_EP
    assert v4.tunnel_endpoint == bytes([192, 168, 1, 2]) + bytes(12)
    v6 = ipcache_value(IPCacheEntry(net("fd01::2/128"), 6, "remote-node",
                                    tunnel_endpoint=ip("fd01::2")))
    assert v6.flags == FLAG_HAS_TUNNEL_EP | FLAG_IPV6_TUNNEL_EP
    assert v6.tunnel_endpoint == ip("fd01::2").packed
