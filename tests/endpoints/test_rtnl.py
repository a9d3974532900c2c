"""statewright/rtnl.py (the CNI plugin's rtnetlink client) in a network namespace of the
test's own: links, veth, addresses, neighbours, routes, another namespace's socket, and
errors carrying the errno; compared with what ``ip`` reports."""

from __future__ import annotations

import errno
import json
import os
import socket
import subprocess
import uuid
from collections.abc import Iterator

import pytest

from statedb.errors import StatewrightError
from statewright.rtnl import RT_SCOPE_LINK, Rtnl, RtnlError, _attr, _attrs


def test_attributes_round_trip() -> None:
    data = _attr(3, b"eth0\0") + _attr(4, (1400).to_bytes(4, "little")) + _attr(1, b"\x01" * 6)
    assert len(data) % 4 == 0
    assert _attrs(data) == {3: b"eth0\0", 4: (1400).to_bytes(4, "little"), 1: b"\x01" * 6}
    assert issubclass(RtnlError, StatewrightError) and issubclass(RtnlError, OSError)


@pytest.fixture
def two_netns() -> Iterator[tuple[str, str]]:
    """Two new namespaces (unique names), deleted afterwards."""
    tag = f"{os.getpid()}-{uuid.uuid4().hex[:4]}"
    names = (f"swrt-a-{tag}", f"swrt-b-{tag}")
    try:
        for n in names:
            subprocess.run(["ip", "netns", "add", n], check=True, capture_output=True)
        yield names
    finally:
        for n in names:
            subprocess.run(["ip", "netns", "del", n], capture_output=True)


def ip_json(ns: str, *args: str) -> list[dict[str, object]]:
    out = subprocess.run(["ip", "-n", ns, "-j", *args], capture_output=True, text=True,
                         check=True)
    return json.loads(out.stdout) if out.stdout.strip() else []  # type: ignore[no-any-return]


@pytest.mark.kernel
def test_requests_match_what_ip_reports(two_netns: tuple[str, str]) -> None:
    a, b = two_netns
    with Rtnl(f"/var/run/netns/{a}") as nl:
        assert nl.link("nonexistent0") is None
        lo = nl.link("lo")
        assert lo is not None and lo.index == 1
        nl.add_veth("swv0", "swv1")
        with pytest.raises(RtnlError) as ei:
            nl.add_veth("swv0", "swv2")
        assert ei.value.errno == errno.EEXIST and "swv0" in str(ei.value)
        v0, v1 = nl.link("swv0"), nl.link("swv1")
        assert v0 is not None and v1 is not None and len(v0.mac) == 17
        assert nl.link(index=v0.index) == v0
        fd = os.open(f"/var/run/netns/{b}", os.O_RDONLY)
        try:
            nl.set_link(v1.index, netns_fd=fd)
        finally:
            os.close(fd)
        assert nl.link("swv1") is None
        nl.set_link(v0.index, mtu=1400, up=True)
        nl.add_address(v0.index, "10.9.0.1", 32)
        nl.add_address(v0.index, "fd00:9::1", 128, nodad=True)
        nl.add_route("10.9.1.0", 24, v0.index, scope=RT_SCOPE_LINK)
        assert {"10.9.0.1", "fd00:9::1"} <= set(nl.addresses(v0.index))
        assert nl.addresses(v0.index, socket.AF_INET) == ["10.9.0.1"]
    link = ip_json(a, "link", "show", "swv0")[0]
    assert link["mtu"] == 1400 and "UP" in link["flags"]  # type: ignore[operator]
    addrs = ip_json(a, "addr", "show", "swv0")[0]["addr_info"]
    v6 = next(x for x in addrs if x["local"] == "fd00:9::1")  # type: ignore[union-attr, index]
    assert v6.get("nodad") is True and not v6.get("tentative")  # type: ignore[union-attr]
    assert ip_json(a, "route", "show", "10.9.1.0/24")[0]["dev"] == "swv0"
    with Rtnl(f"/var/run/netns/{b}") as nl:
        peer = nl.link("swv1")
        assert peer is not None
        nl.set_link(peer.index, name="eth0")
        nl.set_link(peer.index, up=True)
        nl.add_address(peer.index, "10.9.0.2", 32)
        nl.add_neighbour(peer.index, "10.9.0.1", v0.mac)
        nl.add_route("10.9.0.1", 32, peer.index, scope=RT_SCOPE_LINK)
        nl.add_route("0.0.0.0", 0, peer.index, gateway="10.9.0.1")
        with pytest.raises(RtnlError) as ei:
            nl.add_route("0.0.0.0", 0, peer.index, gateway="10.9.0.1")
        assert ei.value.errno == errno.EEXIST
    neigh = ip_json(b, "neigh", "show", "dev", "eth0")[0]
    assert neigh["lladdr"] == v0.mac and "PERMANENT" in neigh["state"]  # type: ignore[operator]
    assert ip_json(b, "route", "show", "default")[0]["gateway"] == "10.9.0.1"
    with Rtnl(f"/var/run/netns/{a}") as nl:
        nl.delete_link(v0.index)
        assert nl.link("swv0") is None
        with pytest.raises(RtnlError) as ei:
            nl.delete_link(v0.index)
        assert ei.value.errno == errno.ENODEV
    gone = subprocess.run(["ip", "-n", b, "link", "show", "eth0"], capture_output=True)
    assert gone.returncode != 0  # the peer went with it
