"""Device selection and NodePort/Primary choice: cases and hypothesis invariants (no kernel)."""

from __future__ import annotations

import dataclasses
import ipaddress
import random
from collections import defaultdict

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sources.node_address_selection import (
    REASON_ALLOWED,
    REASON_DOWN,
    REASON_EXCLUDED,
    REASON_LOOPBACK,
    REASON_MASTER,
    REASON_NO_GLOBAL_ADDRESS,
    REASON_NO_GLOBAL_ROUTE,
    REASON_SELECTED,
    NodeAddressConfig,
    candidate_addresses,
    is_public,
    select_device,
    select_node_addresses,
)
from statedb import InputError
from tables.devices import SCOPE_HOST, SCOPE_LINK, SCOPE_SITE, SCOPE_UNIVERSE, Device, DeviceAddress
from tables.node_addresses import NodeAddress


def da(text: str, scope: int = SCOPE_UNIVERSE, secondary: bool = False) -> DeviceAddress:
    """A device address from ``addr/len``."""
    a, _, plen = text.partition("/")
    ip = ipaddress.ip_address(a)
    return DeviceAddress(ip, int(plen or (32 if ip.version == 4 else 128)), scope, secondary)


def dev(name: str, *addrs: DeviceAddress, up: bool = True, loopback: bool = False,
        master: int = 0, selected: bool = True, index: int = 2) -> Device:
    """A device row (selected unless told otherwise)."""
    flags = tuple(f for f, on in (("up", up), ("loopback", loopback)) if on)
    return Device(index, name, flags=flags, master_index=master, addresses=addrs,
                  selected=selected)


def flags(nas: list[NodeAddress]) -> dict[str, tuple[bool, bool]]:
    """address text -> (nodeport, primary)."""
    return {str(n.address): (n.nodeport, n.primary) for n in nas}


# ----- device selection ----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("device", "routed", "config", "expected"),
    [
        (dev("lo", da("127.0.0.1/8", SCOPE_HOST), loopback=True), True, NodeAddressConfig(),
         (False, REASON_LOOPBACK)),
        (dev("eth0", da("10.0.0.1/24"), up=False), True, NodeAddressConfig(),
         (False, REASON_DOWN)),
        (dev("eth0", da("fe80::1/64", SCOPE_LINK)), True, NodeAddressConfig(),
         (False, REASON_NO_GLOBAL_ADDRESS)),
        (dev("eth0", da("10.0.0.1/32")), False, NodeAddressConfig(),
         (False, REASON_NO_GLOBAL_ROUTE)),
        (dev("eth0", da("10.0.0.1/24")), True, NodeAddressConfig(), (True, REASON_SELECTED)),
        (dev("lxc12", da("10.0.0.1/24")), True, NodeAddressConfig(), (False, REASON_EXCLUDED)),
        (dev("cilium_host", da("10.0.0.1/24")), True, NodeAddressConfig(),
         (False, REASON_EXCLUDED)),
        (dev("eth1", da("10.0.0.1/24")), True, NodeAddressConfig(devices=("eth0",)),
         (False, REASON_EXCLUDED)),
        (dev("eth1"), False, NodeAddressConfig(devices=("eth+",)), (True, REASON_ALLOWED)),
        (dev("eth1", up=False), False, NodeAddressConfig(devices=("eth+",)),
         (False, REASON_DOWN)),
        (dev("lo", loopback=True), True, NodeAddressConfig(devices=("lo",)),
         (False, REASON_LOOPBACK)),
        (dev("lxc1"), False, NodeAddressConfig(devices=("lxc1",)), (True, REASON_ALLOWED)),
        (dev("veth0", da("10.0.0.1/24"), master=7), True, NodeAddressConfig(),
         (False, REASON_MASTER)),
    ],
)
def test_select_device(device: Device, routed: bool, config: NodeAddressConfig,
                       expected: tuple[bool, str]) -> None:
    assert select_device(device, routed, config) == expected


def test_config_validates_cidrs_and_devices() -> None:
    c = NodeAddressConfig(address_cidrs=("10.0.0.0/8", "2001:db8::/32"))  # type: ignore[arg-type]
    assert c.address_cidrs == (ipaddress.ip_network("10.0.0.0/8"),
                               ipaddress.ip_network("2001:db8::/32"))
    with pytest.raises(ValueError, match="nodeport_cidrs: invalid CIDR 'nope'"):
        NodeAddressConfig(nodeport_cidrs=("nope",))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="devices: invalid entry"):
        NodeAddressConfig(devices=("+",))


def test_config_from_dict() -> None:
    c = NodeAddressConfig.from_dict({
        "devices": ["eth0", "ens+"],
        "address-cidrs": "10.0.0.0/8, 2001:db8::/32",
        "nodeport_cidrs": ["10.1.0.0/16"],
        "exclude-prefixes": None,
    })
    assert c.devices == ("eth0", "ens+") and c.exclude_prefixes == ()
    assert [str(n) for n in c.address_cidrs] == ["10.0.0.0/8", "2001:db8::/32"]
    assert c.device_allowed("ens5") and not c.device_allowed("eth1")
    assert NodeAddressConfig.from_dict({}) == NodeAddressConfig()
    with pytest.raises(ValueError, match=r"agent.yaml: unknown field 'device'"):
        NodeAddressConfig.from_dict({"device": ["eth0"]}, "agent.yaml")
    with pytest.raises(InputError, match=r"^cfg: devices: expected a list of strings"):
        NodeAddressConfig.from_dict({"devices": [1]}, "cfg")
    with pytest.raises(InputError, match=r"^cfg: address_cidrs: invalid CIDR '10.0.0.0/33'"):
        NodeAddressConfig.from_dict({"address-cidrs": ["10.0.0.0/33"]}, "cfg")
    with pytest.raises(ValueError, match="expected a mapping"):
        NodeAddressConfig.from_dict(["eth0"], "cfg")  # type: ignore[arg-type]


def test_public_and_private() -> None:
    for a in ("10.1.1.1", "172.16.0.1", "192.168.1.1", "100.64.0.1", "fd00::1"):
        assert not is_public(ipaddress.ip_address(a)), a
    for a in ("1.1.1.1", "203.0.113.5", "2001:db8::1", "172.32.0.1"):
        assert is_public(ipaddress.ip_address(a)), a


# ----- node address flags: cases ------------------------------------------------------------
def test_private_first_for_nodeport_public_first_for_primary() -> None:
    d = dev("eth0", da("203.0.113.5/24"), da("10.0.0.7/24"), da("10.0.0.3/24"),
            da("2001:db8::5/64"), da("fd00::9/64"), da("fe80::1/64", SCOPE_LINK))
    assert flags(select_node_addresses([d], NodeAddressConfig())) == {
        "10.0.0.3": (True, False),
        "10.0.0.7": (False, False),
        "203.0.113.5": (False, True),
        "2001:db8::5": (False, True),
        "fd00::9": (True, False),
    }


def test_only_public_or_only_private_gives_both_flags_to_one_address() -> None:
    d = dev("eth0", da("203.0.113.9/24"), da("198.51.100.1/24"), da("192.168.5.5/24"))
    d6 = dev("eth1", da("fd00::2/64"), index=3)
    got = flags(select_node_addresses([d, d6], NodeAddressConfig()))
    assert got["198.51.100.1"] == (False, True)  # lowest public is primary
    assert got["192.168.5.5"] == (True, False)
    assert got["fd00::2"] == (True, True)


def test_secondary_and_site_scope_come_last() -> None:
    d = dev("eth0", da("10.0.0.1/24", secondary=True), da("10.0.0.9/24"),
            da("10.0.0.2/24", SCOPE_SITE))
    assert [str(a.address) for a in candidate_addresses(d, NodeAddressConfig())] == [
        "10.0.0.9", "10.0.0.2", "10.0.0.1"]
    assert flags(select_node_addresses([d], NodeAddressConfig()))["10.0.0.9"] == (True, True)


def test_address_cidrs_restrict_and_nodeport_cidrs_choose() -> None:
    d = dev("eth0", da("10.0.0.1/24"), da("10.1.0.1/24"), da("203.0.113.5/24"))
    c = NodeAddressConfig(address_cidrs=(ipaddress.ip_network("10.1.0.0/16"),
                                         ipaddress.ip_network("203.0.113.0/24")))
    assert flags(select_node_addresses([d], c)) == {
        "10.1.0.1": (True, False), "203.0.113.5": (False, True)}
    c2 = NodeAddressConfig(nodeport_cidrs=(ipaddress.ip_network("0.0.0.0/0"),))
    assert all(n.nodeport for n in select_node_addresses([d], c2))
    c3 = NodeAddressConfig(nodeport_cidrs=(ipaddress.ip_network("203.0.113.0/24"),))
    assert flags(select_node_addresses([d], c3)) == {
        "10.0.0.1": (False, False), "10.1.0.1": (False, False), "203.0.113.5": (True, True)}


def test_unselected_or_down_devices_give_nothing_and_flags_are_per_device() -> None:
    a = dev("eth0", da("10.0.0.1/24"), index=2)
    b = dev("eth1", da("10.0.1.1/24"), index=3)
    assert flags(select_node_addresses([a, b], NodeAddressConfig())) == {
        "10.0.0.1": (True, True), "10.0.1.1": (True, True)}
    assert select_node_addresses([dataclasses.replace(a, selected=False)],
                                 NodeAddressConfig()) == []
    assert select_node_addresses([dataclasses.replace(a, flags=())], NodeAddressConfig()) == []


# ----- node address flags: invariants ---------------------------------------------------------
_v4 = st.sampled_from(["10.0.0.0/24", "192.168.7.0/24", "100.64.1.0/24", "203.0.113.0/24",
                       "198.51.100.0/24", "127.0.0.0/24", "169.254.1.0/24", "224.0.0.0/24"])
_v6 = st.sampled_from(["fd00::/120", "2001:db8::/120", "fe80::/120", "ff02::/120"])


@st.composite
def device_addresses(draw: st.DrawFn) -> DeviceAddress:
    net = ipaddress.ip_network(draw(st.one_of(_v4, _v6)))
    host = draw(st.integers(1, 200))
    return DeviceAddress(
        net.network_address + host,
        draw(st.sampled_from([net.prefixlen, net.max_prefixlen])),
        draw(st.sampled_from([SCOPE_UNIVERSE, SCOPE_SITE, SCOPE_LINK, SCOPE_HOST])),
        draw(st.booleans()),
    )


@st.composite
def devices(draw: st.DrawFn) -> list[Device]:
    n = draw(st.integers(0, 4))
    out = []
    for i in range(n):
        out.append(Device(
            index=i + 1,
            name=f"eth{i}",
            flags=("up",) if draw(st.booleans()) or i == 0 else (),
            addresses=tuple(draw(st.lists(device_addresses(), max_size=8))),
            selected=draw(st.booleans()),
        ))
    return out


_cidr_sets = st.lists(st.sampled_from(
    ["10.0.0.0/8", "203.0.113.0/24", "0.0.0.0/0", "2001:db8::/32", "fd00::/8", "::/0"]),
    max_size=3, unique=True)


@settings(max_examples=200, deadline=None)
@given(devs=devices(), address_cidrs=_cidr_sets, nodeport_cidrs=_cidr_sets,
       perm=st.randoms(use_true_random=False))
def test_selection_invariants(devs: list[Device], address_cidrs: list[str],
                              nodeport_cidrs: list[str], perm: object) -> None:
    config = NodeAddressConfig(address_cidrs=address_cidrs,  # type: ignore[arg-type]
                               nodeport_cidrs=nodeport_cidrs)  # type: ignore[arg-type]
    got = select_node_addresses(devs, config)
    by_name = {d.name: d for d in devs}

    # Keys are unique; output is in (device, family, address) order.
    keys = [(n.address, n.device_name) for n in got]
    assert len(set(keys)) == len(keys)
    assert got == sorted(got, key=lambda n: (n.device_name, n.address.version, int(n.address)))

    groups: dict[tuple[str, int], list[NodeAddress]] = defaultdict(list)
    for n in got:
        d = by_name[n.device_name]
        # Only from selected, up devices; only eligible addresses of that device.
        assert d.selected and d.up
        assert n.address in {a.address for a in candidate_addresses(d, config)}
        if config.address_cidrs:
            assert any(
                n.address in c for c in config.address_cidrs if c.version == n.address.version)
        groups[(n.device_name, n.address.version)].append(n)

    for d in devs:
        for fam in (4, 6):
            cands = [a for a in candidate_addresses(d, config) if a.family == fam]
            grp = groups.get((d.name, fam), [])
            if not (d.selected and d.up):
                assert not grp
                continue
            assert {n.address for n in grp} == {a.address for a in cands}
            if not cands:
                continue
            # Exactly one primary; public when any candidate is public.
            primaries = [n for n in grp if n.primary]
            assert len(primaries) == 1
            if any(is_public(a.address) for a in cands):
                assert is_public(primaries[0].address)
            nodeports = [n for n in grp if n.nodeport]
            if config.nodeport_cidrs:
                for n in grp:
                    assert n.nodeport == any(
                        n.address in c for c in config.nodeport_cidrs
                        if c.version == n.address.version)
            else:
                # Exactly one NodePort address; private when any candidate is private.
                assert len(nodeports) == 1
                if any(not is_public(a.address) for a in cands):
                    assert not is_public(nodeports[0].address)

    # The result does not depend on the order in which the kernel listed addresses.
    assert isinstance(perm, random.Random)
    shuffled = []
    for d in devs:
        addrs = list(d.addresses)
        perm.shuffle(addrs)
        shuffled.append(dataclasses.replace(d, addresses=tuple(addrs)))
    perm.shuffle(shuffled)
    assert select_node_addresses(shuffled, config) == got
