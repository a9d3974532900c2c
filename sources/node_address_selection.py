"""Choosing devices and node addresses: pure functions from device rows to selection results.

The netlink source (`sources.netlink`) calls these on every change; keeping them
free of I/O makes the rules unit- and property-testable.

Device selection (`select_device`), first matching rule wins:

1. an allow-list is configured and the name is not on it: "excluded by config";
   without an allow-list, a name starting with an excluded prefix (``cilium_``,
   ``lxc`` by default, the agent's own devices): "excluded by config";
2. a loopback device: "loopback";
3. not administratively up: "down";
4. on the allow-list: selected ("allowed by config"), no further checks;
5. a port of a bridge or bond (has a master): "has master device";
6. no global unicast address of scope universe or site: "no global address";
7. no route through it to a global unicast destination (or default) outside the
   local table: "no global route";
8. otherwise selected ("global address and route").

Node addresses (`select_node_addresses`) come only from selected devices. The
candidates of a device are its addresses of scope universe or site that are
global unicast (not loopback, link-local, multicast or unspecified) and, when
``address_cidrs`` is configured, inside one of them. They are ordered by
(secondary last, narrower scope last, address), so the choice does not depend
on the order in which the kernel reported them. Per device and IP family:

* NodePort: when ``nodeport_cidrs`` is configured, every candidate inside one
  of them; otherwise one address, the first private candidate, else the first
  public one (NodePort traffic normally arrives on the node's internal network);
* Primary: one address, the first public candidate, else the first private one
  (the node's identity as seen from outside).

"Private" is the explicit list `PRIVATE_NETWORKS` (RFC 1918, RFC 6598 shared
space, IPv6 unique local, plus loopback and link-local), not Python's
``is_private``, which also counts documentation ranges as private.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from statedb import InputError
from tables.devices import SCOPE_LINK, Device, DeviceAddress
from tables.l3n4 import IPAddress, IPNetwork
from tables.node_addresses import NodeAddress

#: Networks whose addresses count as private (preferred for NodePort, avoided for Primary).
PRIVATE_NETWORKS: tuple[IPNetwork, ...] = tuple(
    ipaddress.ip_network(n)
    for n in (
        "10.0.0.0/8",
        "172.16.0.0/12",
        "192.168.0.0/16",
        "100.64.0.0/10",
        "127.0.0.0/8",
        "169.254.0.0/16",
        "fc00::/7",
        "fe80::/10",
        "::1/128",
    )
)

#: Device name prefixes excluded by default (the agent's own devices, pods' veth ends).
DEFAULT_EXCLUDE_PREFIXES: tuple[str, ...] = ("cilium_", "lxc")

REASON_EXCLUDED = "excluded by config"
REASON_LOOPBACK = "loopback"
REASON_DOWN = "down"
REASON_MASTER = "has master device"
REASON_NO_GLOBAL_ADDRESS = "no global address"
REASON_NO_GLOBAL_ROUTE = "no global route"
REASON_ALLOWED = "allowed by config"
REASON_SELECTED = "global address and route"


def _parse_cidrs(field_name: str, values: Iterable[IPNetwork | str]) -> tuple[IPNetwork, ...]:
    out: list[IPNetwork] = []
    for v in values:
        if isinstance(v, ipaddress.IPv4Network | ipaddress.IPv6Network):
            out.append(v)
            continue
        try:
            out.append(ipaddress.ip_network(str(v).strip(), strict=False))
        except ValueError as e:
            raise InputError(f"invalid CIDR {v!r}: {e}", obj=_CONFIG, field=field_name) from None
    return tuple(out)


#: How errors name a NodeAddressConfig built directly (from_dict names its origin).
_CONFIG = "node address config"


@dataclass(frozen=True, slots=True)
class NodeAddressConfig:
    """Which devices and addresses may become node addresses.

    ``devices``: allow-list of device names; an entry ending in ``+`` matches every
    name with that prefix (``eth+``), as in Cilium's ``--devices``. Empty: automatic
    selection (rules above). ``exclude_prefixes``: names never chosen automatically.
    ``address_cidrs``: when non-empty, only addresses inside these become node
    addresses. ``nodeport_cidrs``: when non-empty, exactly the node addresses inside
    these get the NodePort flag (instead of one private-first address per device and
    family). CIDRs may be given as text; they are parsed (and rejected with the field
    name) on construction.
    """

    devices: tuple[str, ...] = ()
    exclude_prefixes: tuple[str, ...] = DEFAULT_EXCLUDE_PREFIXES
    address_cidrs: tuple[IPNetwork, ...] = field(default=())
    nodeport_cidrs: tuple[IPNetwork, ...] = field(default=())

    def __post_init__(self) -> None:
        object.__setattr__(self, "devices", tuple(self.devices))
        object.__setattr__(self, "exclude_prefixes", tuple(self.exclude_prefixes))
        for name in ("address_cidrs", "nodeport_cidrs"):
            object.__setattr__(self, name, _parse_cidrs(name, getattr(self, name)))
        for d in self.devices:
            if not d or d == "+":
                raise InputError(f"invalid entry {d!r}", obj=_CONFIG, field="devices")

    @classmethod
    def from_dict(
        cls, obj: Mapping[str, Any], origin: str = "node address config"
    ) -> NodeAddressConfig:
        """Build from configuration (YAML/JSON): keys ``devices``, ``exclude-prefixes``,
        ``address-cidrs``, ``nodeport-cidrs`` (``_`` also accepted), each a list of strings
        or one comma-separated string (as a command-line override gives it). Raise
        InputError naming ``origin`` and the field; unknown keys are refused so a typo is
        not silently ignored."""
        if not isinstance(obj, Mapping):
            raise InputError(f"expected a mapping, got {type(obj).__name__}", obj=origin)
        fields = {"devices", "exclude_prefixes", "address_cidrs", "nodeport_cidrs"}
        values: dict[str, tuple[str, ...]] = {}
        for key, raw in obj.items():
            name = str(key).replace("-", "_")
            if name not in fields:
                raise InputError(
                    f"unknown field {key!r} (expected one of "
                    f"{', '.join(sorted(f.replace('_', '-') for f in fields))})",
                    obj=origin,
                )
            if isinstance(raw, str):
                items = [x.strip() for x in raw.split(",") if x.strip()]
            elif isinstance(raw, list | tuple) and all(isinstance(x, str) for x in raw):
                items = [x.strip() for x in raw]
            elif raw is None:
                items = []
            else:
                raise InputError(
                    f"expected a list of strings, got {raw!r}", obj=origin, field=str(key)
                )
            values[name] = tuple(items)
        try:
            return cls(**values)  # type: ignore[arg-type]
        except InputError as e:
            raise InputError(e.message, obj=origin, field=e.field) from None

    def device_allowed(self, name: str) -> bool:
        """True when ``name`` is on the allow-list (exact, or by ``prefix+``)."""
        return any(name.startswith(d[:-1]) if d.endswith("+") else name == d for d in self.devices)


def is_public(addr: IPAddress) -> bool:
    """True when ``addr`` is outside every network of `PRIVATE_NETWORKS`."""
    return not any(addr.version == n.version and addr in n for n in PRIVATE_NETWORKS)


def is_global_unicast(addr: IPAddress) -> bool:
    """True for a unicast address usable beyond the link (not loopback, link-local,
    multicast, unspecified or the IPv4 limited broadcast)."""
    if addr.is_loopback or addr.is_link_local or addr.is_multicast or addr.is_unspecified:
        return False
    return not (addr.version == 4 and addr == ipaddress.IPv4Address("255.255.255.255"))


def is_global_address(a: DeviceAddress) -> bool:
    """True for a device address that counts as global: scope universe or site (narrower
    than link) and global unicast."""
    return a.scope < SCOPE_LINK and is_global_unicast(a.address)


def select_device(
    dev: Device, has_global_route: bool, config: NodeAddressConfig
) -> tuple[bool, str]:
    """Return (selected, reason) for ``dev`` by the rules in the module docstring.

    ``has_global_route``: whether a route to a global unicast destination (or the
    default route) goes through ``dev`` in a table other than the local one.
    """
    if config.devices:
        allowed = config.device_allowed(dev.name)
        if not allowed:
            return False, REASON_EXCLUDED
    else:
        allowed = False
        if any(dev.name.startswith(p) for p in config.exclude_prefixes):
            return False, REASON_EXCLUDED
    if dev.loopback:
        return False, REASON_LOOPBACK
    if not dev.up:
        return False, REASON_DOWN
    if allowed:
        return True, REASON_ALLOWED
    if dev.master_index:
        return False, REASON_MASTER
    if not any(is_global_address(a) for a in dev.addresses):
        return False, REASON_NO_GLOBAL_ADDRESS
    if not has_global_route:
        return False, REASON_NO_GLOBAL_ROUTE
    return True, REASON_SELECTED


def _in_any(addr: IPAddress, nets: Sequence[IPNetwork]) -> bool:
    return any(addr.version == n.version and addr in n for n in nets)


def _candidate_order(a: DeviceAddress) -> tuple[bool, int, int]:
    return (a.secondary, a.scope, int(a.address))


def candidate_addresses(dev: Device, config: NodeAddressConfig) -> list[DeviceAddress]:
    """The addresses of ``dev`` that may become node addresses, in preference order
    (primary before secondary, wider scope first, then by address)."""
    cands = [
        a
        for a in dev.addresses
        if is_global_address(a)
        and (not config.address_cidrs or _in_any(a.address, config.address_cidrs))
    ]
    cands.sort(key=_candidate_order)
    return cands


def _first(cands: Sequence[DeviceAddress], public: bool) -> DeviceAddress | None:
    for a in cands:
        if is_public(a.address) == public:
            return a
    return None


def device_node_addresses(dev: Device, config: NodeAddressConfig) -> list[NodeAddress]:
    """The node addresses of one device (none unless it is selected and up), with
    NodePort and Primary flags chosen per IP family."""
    if not dev.selected or not dev.up:
        return []
    out: list[NodeAddress] = []
    cands_all = candidate_addresses(dev, config)
    for family in (4, 6):
        cands = [a for a in cands_all if a.family == family]
        if not cands:
            continue
        primary = _first(cands, public=True) or cands[0]
        if config.nodeport_cidrs:
            nodeport = {a.address for a in cands if _in_any(a.address, config.nodeport_cidrs)}
        else:
            np = _first(cands, public=False) or cands[0]
            nodeport = {np.address}
        seen: set[IPAddress] = set()
        for a in cands:
            if a.address in seen:  # the same address twice (other prefix): keep the first
                continue
            seen.add(a.address)
            out.append(
                NodeAddress(
                    address=a.address,
                    nodeport=a.address in nodeport,
                    primary=a is primary,
                    device_name=dev.name,
                )
            )
    return out


def select_node_addresses(
    devices: Iterable[Device], config: NodeAddressConfig
) -> list[NodeAddress]:
    """The node addresses of every selected device, ordered by (device, family, address)."""
    out: list[NodeAddress] = []
    for dev in devices:
        out.extend(device_node_addresses(dev, config))
    out.sort(key=lambda n: (n.device_name, n.address.version, int(n.address)))
    return out
