"""The agent's side of the north-south NAT maps (bpf/include/nat.h, bpf/nat.py; the tc
programs of bpf/nodeport.c write the entries): garbage collection of expired entries (the
CT GC's batched reader on the NAT values' lifetime word), listing and the external
devices' SNAT addresses in ``nodeport_devices``."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from bpf import ct, nat
from bpf.typed_map import TypedMap
from bpfops.conntrack import collect, monotonic_now


@dataclass(slots=True)
class NATMetrics:
    """GC runs, entries removed, entries left per map."""

    gc_runs: int = 0
    removed_total: int = 0
    entries: dict[str, int] = field(default_factory=dict)
    last_error: str = ""


class NATMaps:
    """``nodeport_nat4``, ``nodeport_nat6`` and ``nodeport_devices``."""

    def __init__(self, nat4: TypedMap[ct.CTTuple4, nat.NatEntry4],
                 nat6: TypedMap[ct.CTTuple6, nat.NatEntry6],
                 devices: TypedMap[int, nat.NodePortDevice]) -> None:
        self.nat4, self.nat6, self.devices = nat4, nat6, devices
        self.metrics = NATMetrics()

    def gc(self, now: int | None = None) -> int:
        """Delete every expired NAT entry; returns how many went."""
        now = monotonic_now() if now is None else now
        removed = 0
        for m, word, codec in ((self.nat4, nat.LIFETIME_WORD4, nat.NAT_ENTRY4),
                               (self.nat6, nat.LIFETIME_WORD6, nat.NAT_ENTRY6)):
            try:
                total, gone = collect(m.backend, m.spec.key_size, now, word, codec.size // 4)
            except OSError as e:
                self.metrics.last_error = str(e)
                raise
            removed += gone
            self.metrics.entries[m.name] = total - gone
        self.metrics.gc_runs += 1
        self.metrics.removed_total += removed
        return removed

    def entries(self, now: int | None = None) -> Iterator[dict[str, Any]]:
        """Every NAT entry as JSON: the packet it matches, what it rewrites to."""
        now = monotonic_now() if now is None else now
        for m in (self.nat4, self.nat6):
            for key, value in m.items():
                yield {
                    "kind": nat.KINDS.get(key.flags, str(key.flags)),
                    "protocol": ct.PROTOCOLS.get(key.nexthdr, str(key.nexthdr)),
                    "source": _endpoint(key.saddr, key.sport),
                    "destination": _endpoint(key.daddr, key.dport),
                    "to": _endpoint(value.to_addr, value.to_port),
                    "expires_in": int(value.lifetime) - now,
                    "needs_snat": bool(value.flags & nat.E_NEEDS_SNAT),
                }

    def set_devices(self, want: Mapping[int, nat.NodePortDevice]) -> None:
        """Make ``nodeport_devices`` exactly ``want``."""
        have = dict(self.devices.items())
        for ifindex, dev in want.items():
            if have.get(ifindex) != dev:
                self.devices.update(ifindex, dev)
        for ifindex in have:
            if ifindex not in want:
                self.devices.delete(ifindex)

    def close(self) -> None:
        """Close the three maps (their pins stay)."""
        for m in (self.nat4, self.nat6, self.devices):
            m.close()


def device_entry(ip4: str | None, ip6: str | None) -> nat.NodePortDevice:
    """A ``nodeport_devices`` value for a device's SNAT addresses (None: not that family)."""
    flags = (nat.DEV_IPV4 if ip4 else 0) | (nat.DEV_IPV6 if ip6 else 0)
    return nat.NodePortDevice(
        ipaddress.IPv4Address(ip4).packed if ip4 else bytes(4),
        ipaddress.IPv6Address(ip6).packed if ip6 else bytes(16),
        flags,
    )


def _endpoint(raw: bytes, port: int) -> str:
    ip = ipaddress.ip_address(raw)
    return f"[{ip}]:{port}" if ip.version == 6 else f"{ip}:{port}"

