"""The node-addresses table: the local node's IP addresses per device, with NodePort/Primary flags.

NodePort and HostPort surrogate frontends (``0.0.0.0:port``) are expanded by
the BPF operations over the addresses whose ``nodeport`` flag is set, of the
same IP family. On the agent the netlink source (sources/netlink.py) writes the
rows; the conformance corpus inserts them with ``db/insert node-addresses`` (YAML
fields ``addr``, ``nodeport``, ``primary``, ``devicename``).

Key: (address, device name).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from statedb import Index, Table
from statedb import keys as keycodec
from tables.l3n4 import IPAddress, parse_ip

NODE_ADDRESSES_TABLE = "node-addresses"


@dataclass(frozen=True, slots=True)
class NodeAddress:
    """An address of the local node on one device."""

    address: IPAddress
    nodeport: bool = False
    primary: bool = False
    device_name: str = ""

    @classmethod
    def from_dict(cls, obj: Mapping[str, Any], origin: str = "node address") -> NodeAddress:
        """Build from the YAML/JSON form (``addr``, ``nodeport``, ``primary``, ``devicename``);
        raise ValueError naming ``origin`` and the field."""
        if not isinstance(obj, Mapping):
            raise ValueError(f"{origin}: expected a mapping, got {type(obj).__name__}")
        raw = obj.get("addr", obj.get("address"))
        if not isinstance(raw, str):
            raise ValueError(f"{origin}: field 'addr': missing or not a string")
        try:
            addr = parse_ip(raw)
        except ValueError as e:
            raise ValueError(f"{origin}: field 'addr': {e}") from None
        flags: dict[str, bool] = {}
        for f in ("nodeport", "primary"):
            v = obj.get(f, False)
            if not isinstance(v, bool):
                raise ValueError(f"{origin}: field {f!r}: expected true/false, got {v!r}")
            flags[f] = v
        dev = obj.get("devicename", obj.get("device_name", ""))
        if not isinstance(dev, str):
            raise ValueError(f"{origin}: field 'devicename': expected a string, got {dev!r}")
        return cls(addr, flags["nodeport"], flags["primary"], dev)

    @staticmethod
    def table_header() -> list[str]:
        """Columns of ``db/show node-addresses``."""
        return ["Address", "NodePort", "Primary", "DeviceName"]

    def table_row(self) -> list[str]:
        """Cells of ``db/show node-addresses``."""
        return [
            str(self.address),
            str(self.nodeport).lower(),
            str(self.primary).lower(),
            self.device_name,
        ]

    def to_json(self) -> dict[str, Any]:
        """JSON/YAML form (the field names the corpus inserts)."""
        return {
            "addr": str(self.address),
            "nodeport": self.nodeport,
            "primary": self.primary,
            "devicename": self.device_name,
        }

    def to_yaml(self) -> dict[str, Any]:
        """YAML form (same as JSON)."""
        return self.to_json()


def _key(na: NodeAddress) -> tuple[IPAddress, str]:
    return (na.address, na.device_name)


def _parse_key(text: str) -> Any:
    addr, _, dev = text.partition(" ")
    return (ipaddress.ip_address(addr), dev)


#: Primary index: (address, device).
node_address_index: Index[NodeAddress, Any] = Index(
    "id",
    key=_key,
    encode=keycodec.tuple_of(keycodec.ip_address, keycodec.string),
    parse=_parse_key,
)

#: Secondary index: the device name.
node_address_device_index: Index[NodeAddress, str] = Index(
    "name", key=lambda n: n.device_name, encode=keycodec.string, unique=False
)


def new_node_addresses_table() -> Table[NodeAddress]:
    """Return a new, unregistered node-addresses table."""
    return Table(
        NODE_ADDRESSES_TABLE, node_address_index, node_address_device_index,
        row_type=NodeAddress,
    )
