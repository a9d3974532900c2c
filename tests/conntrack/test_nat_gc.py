"""The north-south NAT maps' GC, listing and devices (bpfops/nat.py) on memory and kernel
maps: the CT GC's batched reader on the NAT values' own lifetime word."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack

import pytest

from bpf import ct, nat
from bpf.catalog import nat_specs, nodeport_devices_spec
from bpf.pinning import MapOpener
from bpfops.nat import NATMaps, device_entry
from tests.bpf.helpers import open_typed

NOW = 1_000_000


@pytest.fixture
def maps(opener: MapOpener) -> Iterator[NATMaps]:
    with ExitStack() as stack:
        nat4, nat6 = (stack.enter_context(open_typed(opener, s)) for s in nat_specs(1024))
        devices = stack.enter_context(open_typed(opener, nodeport_devices_spec()))
        yield NATMaps(nat4, nat6, devices)


def key4(i: int, kind: int = nat.F_SNAT) -> ct.CTTuple4:
    return ct.CTTuple4(bytes([10, 248, 2, 2]), bytes([192, 168, 201, 2]), 8080, 40000 + i,
                       6, kind)


def key6(i: int, kind: int = nat.F_REV_DNAT) -> ct.CTTuple6:
    return ct.CTTuple6(bytes(15) + b"\x02", bytes(15) + bytes([i]), 40000, 8080, 17, kind)


def test_gc_removes_exactly_the_expired_entries(maps: NATMaps) -> None:
    to4, to6 = bytes([192, 168, 200, 1]), bytes(15) + b"\x01"
    for i in range(40):
        maps.nat4.update(key4(i), nat.NatEntry4(to4, 32768 + i, 3, NOW - 1 if i < 30 else NOW))
    for i in range(5):
        maps.nat6.update(key6(i), nat.NatEntry6(to6, 80, 3, NOW + 5 if i else NOW - 2,
                                                nat.E_NEEDS_SNAT))
    assert maps.gc(NOW) == 31
    assert {k for k, _ in maps.nat4.items()} == {key4(i) for i in range(30, 40)}
    assert {k for k, _ in maps.nat6.items()} == {key6(i) for i in range(1, 5)}
    assert maps.metrics.entries == {"nodeport_nat4": 10, "nodeport_nat6": 4}
    assert (maps.metrics.gc_runs, maps.metrics.removed_total) == (1, 31)
    assert maps.gc(NOW) == 0


def test_entries_say_what_they_rewrite(maps: NATMaps) -> None:
    maps.nat4.update(key4(1, nat.F_REV_SNAT), nat.NatEntry4(bytes([192, 168, 201, 2]), 40001,
                                                            3, NOW + 60))
    maps.nat6.update(key6(7), nat.NatEntry6(bytes(15) + b"\x09", 80, 3, NOW + 10,
                                            nat.E_NEEDS_SNAT))
    got = sorted(maps.entries(NOW), key=lambda e: e["kind"])
    assert got == [
        {"kind": "rev-dnat", "protocol": "UDP", "source": "[::7]:8080",
         "destination": "[::2]:40000", "to": "[::9]:80", "expires_in": 10, "needs_snat": True},
        {"kind": "rev-snat", "protocol": "TCP", "source": "192.168.201.2:40001",
         "destination": "10.248.2.2:8080", "to": "192.168.201.2:40001", "expires_in": 60,
         "needs_snat": False},
    ]


def test_devices_follow_the_wanted_set(maps: NATMaps) -> None:
    a = device_entry("192.168.200.1", "fd20:200::1")
    assert (a.flags, a.ip4) == (nat.DEV_IPV4 | nat.DEV_IPV6, bytes([192, 168, 200, 1]))
    b = device_entry("192.168.201.1", None)
    assert (b.flags, b.ip6) == (nat.DEV_IPV4, bytes(16))
    maps.set_devices({2: a, 5: b})
    maps.set_devices({5: device_entry(None, "fd20:201::1")})
    assert dict(maps.devices.items()) == {5: nat.NodePortDevice(bytes(4),
                                                                bytes.fromhex("fd20020100000000"
                                                                              "0000000000000001"),
                                                                nat.DEV_IPV6)}
