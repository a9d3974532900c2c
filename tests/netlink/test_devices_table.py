"""The devices table: indexes and what ``db show devices`` prints (no kernel)."""

from __future__ import annotations

import ipaddress
import json

import yaml

from statedb import DB
from statedb.show import format_rows, row_type_of
from tables.devices import (
    SCOPE_LINK,
    Device,
    DeviceAddress,
    flag_names,
    new_devices_table,
)


def _rows() -> list[Device]:
    eth0 = Device(
        index=2, name="eth0", mtu=1500, flags=flag_names(0x1 | 0x2 | 0x1000 | 0x40),
        hardware_addr="02:00:00:00:00:01", kind="veth",
        addresses=(DeviceAddress(ipaddress.ip_address("10.0.0.1"), 24),
                   DeviceAddress(ipaddress.ip_address("10.0.0.2"), 24, secondary=True),
                   DeviceAddress(ipaddress.ip_address("fe80::1"), 64, SCOPE_LINK)),
        selected=True, reason="global address and route")
    lo = Device(index=1, name="lo", mtu=65536, flags=("up", "loopback"), reason="loopback")
    return [eth0, lo]


def test_indexes() -> None:
    t = new_devices_table()
    db = DB(t)
    with db.write_txn(t) as txn:
        for d in _rows():
            t.insert(txn, d)
    r = db.read_txn()
    assert [d.name for d in t.all(r)] == ["lo", "eth0"]  # by index
    eth0 = t.get(r, 2)
    assert eth0 is not None and eth0.name == "eth0"
    assert [d.index for d in t.list(r, t.index("name").query("eth0"))] == [2]
    assert [d.name for d in t.list(r, t.index("selected").query_str("true"))] == ["eth0"]
    assert [d.name for d in t.list(r, t.index("id").query_str("1"))] == ["lo"]


def test_show_formats() -> None:
    t = new_devices_table()
    rows = _rows()
    text = format_rows(rows, "table", row_type=row_type_of(t))
    lines = text.splitlines()
    assert lines[0].split() == ["Name", "Index", "Selected", "Reason", "Kind", "MTU", "HWAddr",
                                "Flags", "Addresses"]
    assert "10.0.0.1/24, 10.0.0.2/24 (secondary), fe80::1/64 (link)" in lines[1]
    assert "up,broadcast,running,multicast" in lines[1]
    assert lines[2].startswith("lo") and "loopback" in lines[2]
    first = json.loads(format_rows(rows[:1], "json"))
    assert first["addresses"][1] == {"address": "10.0.0.2", "prefixlen": 24,
                                     "scope": "universe", "secondary": True}
    assert first["selected"] is True and first["reason"] == "global address and route"
    ydocs = list(yaml.safe_load_all(format_rows(rows, "yaml")))
    assert [d["name"] for d in ydocs] == ["eth0", "lo"]
    assert ydocs[0]["addresses"][2]["scope"] == "link"
    # The empty table still has a header.
    assert format_rows([], "table", row_type=row_type_of(t)).startswith("Name")
