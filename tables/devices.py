"""The devices table: the network devices of the node (or of a network namespace).

One row per link, kept up to date by the netlink source (`sources.netlink`):
its index, name, MTU, flags, hardware address, kind, master, operational
state and IP addresses (with scope and the secondary flag), plus whether the
agent *selected* it (its addresses may become NodePort/Primary node addresses)
and why or why not. The reason is there so an operator running
``statewright db show devices`` sees at once why an interface is ignored
("down", "loopback", "no global address", "excluded by config", ...).

Key: the interface index. Secondary indexes: the name (non-unique, so a
rename race between two links can never make a write fail) and ``selected``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from statedb import Index, Table
from statedb import keys as keycodec
from tables.l3n4 import IPAddress

DEVICES_TABLE = "devices"

#: Kernel address scopes (rtnetlink RT_SCOPE_*) by number, as shown in the table.
SCOPE_NAMES: dict[int, str] = {0: "universe", 200: "site", 253: "link", 254: "host", 255: "nowhere"}
SCOPE_UNIVERSE = 0
SCOPE_SITE = 200
SCOPE_LINK = 253
SCOPE_HOST = 254

#: Interface flags (IFF_*) by bit, in display order.
LINK_FLAGS: tuple[tuple[int, str], ...] = (
    (0x1, "up"),
    (0x2, "broadcast"),
    (0x8, "loopback"),
    (0x10, "pointopoint"),
    (0x40, "running"),
    (0x80, "noarp"),
    (0x100, "promisc"),
    (0x1000, "multicast"),
    (0x10000, "lower_up"),
    (0x20000, "dormant"),
)


def flag_names(flags: int) -> tuple[str, ...]:
    """Return the names of the known IFF_* bits set in ``flags``, in display order."""
    return tuple(name for bit, name in LINK_FLAGS if flags & bit)


def scope_name(scope: int) -> str:
    """Return the name of an address scope (e.g. "universe", "link"), or its number as text."""
    return SCOPE_NAMES.get(scope, str(scope))


@dataclass(frozen=True, slots=True)
class DeviceAddress:
    """One IP address of a device, as the kernel reports it."""

    address: IPAddress
    prefixlen: int
    scope: int = SCOPE_UNIVERSE
    secondary: bool = False

    @property
    def family(self) -> int:
        """4 or 6."""
        return self.address.version

    def __str__(self) -> str:
        notes = []
        if self.scope != SCOPE_UNIVERSE:
            notes.append(scope_name(self.scope))
        if self.secondary:
            notes.append("secondary")
        suffix = f" ({', '.join(notes)})" if notes else ""
        return f"{self.address}/{self.prefixlen}{suffix}"

    def to_json(self) -> dict[str, Any]:
        """JSON/YAML form."""
        return {
            "address": str(self.address),
            "prefixlen": self.prefixlen,
            "scope": scope_name(self.scope),
            "secondary": self.secondary,
        }


@dataclass(frozen=True, slots=True)
class Device:
    """A network device (link) and whether the agent selected it for node addresses."""

    index: int
    name: str
    mtu: int = 1500
    flags: tuple[str, ...] = ()
    hardware_addr: str = ""
    kind: str = ""
    master_index: int = 0
    oper_state: str = ""
    addresses: tuple[DeviceAddress, ...] = ()
    selected: bool = False
    reason: str = ""

    @property
    def up(self) -> bool:
        """True when the device is administratively up (IFF_UP)."""
        return "up" in self.flags

    @property
    def loopback(self) -> bool:
        """True for a loopback device (IFF_LOOPBACK)."""
        return "loopback" in self.flags

    @staticmethod
    def table_header() -> list[str]:
        """Columns of ``db show devices``."""
        return ["Name", "Index", "Selected", "Reason", "Kind", "MTU", "HWAddr", "Flags",
                "Addresses"]

    def table_row(self) -> list[str]:
        """Cells of ``db show devices``."""
        return [
            self.name,
            str(self.index),
            str(self.selected).lower(),
            self.reason,
            self.kind,
            str(self.mtu),
            self.hardware_addr,
            ",".join(self.flags),
            ", ".join(str(a) for a in self.addresses),
        ]

    def to_json(self) -> dict[str, Any]:
        """JSON/YAML form (addresses as mappings, scopes by name)."""
        return {
            "index": self.index,
            "name": self.name,
            "mtu": self.mtu,
            "flags": list(self.flags),
            "hardwareaddr": self.hardware_addr,
            "kind": self.kind,
            "masterindex": self.master_index,
            "operstate": self.oper_state,
            "addresses": [a.to_json() for a in self.addresses],
            "selected": self.selected,
            "reason": self.reason,
        }

    def to_yaml(self) -> dict[str, Any]:
        """YAML form (same as JSON)."""
        return self.to_json()


def _parse_index(text: str) -> int:
    return int(text, 10)


#: Primary index: the interface index.
device_index: Index[Device, int] = Index(
    "id", key=lambda d: d.index, encode=keycodec.uint32, parse=_parse_index
)

#: Secondary index: the device name (non-unique: see the module docstring).
device_name_index: Index[Device, str] = Index(
    "name", key=lambda d: d.name, encode=keycodec.string, unique=False
)


def _parse_bool(text: str) -> bool:
    t = text.strip().lower()
    if t not in ("true", "false"):
        raise ValueError(f"expected true or false, got {text!r}")
    return t == "true"


#: Secondary index: whether the device is selected.
device_selected_index: Index[Device, bool] = Index(
    "selected",
    key=lambda d: d.selected,
    encode=keycodec.boolean,
    unique=False,
    parse=_parse_bool,
)


def new_devices_table() -> Table[Device]:
    """Return a new, unregistered devices table."""
    return Table(
        DEVICES_TABLE, device_index, device_name_index, device_selected_index,
        row_type=Device,
    )

