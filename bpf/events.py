"""Datapath events (bpf/include/events.h): the maps the programs report through, the
event layout, and a reader of the ring buffer.

`EventMaps.open(pin_dir)` creates the four maps pinned under ``pin_dir`` (or adopts them
when a previous agent pinned them: programs that stay attached keep reporting into the
same ring): ``sw_events`` (ring buffer), ``sw_events_config`` (on/off, rate, burst),
``sw_events_limit`` (the per-CPU token buckets) and ``sw_events_lost`` (per-CPU counts of
events refused by the rate limit or a full ring). bpf/lxc.py and the socket program reuse
them from their pins when they load.

`RingReader` reads the ring through libbpf's ``ring_buffer__poll`` in the caller's
thread; `decode` turns one record into a `RawEvent`.
"""

from __future__ import annotations

import ctypes
import errno
import ipaddress
import os
import struct
from collections.abc import Callable
from dataclasses import dataclass

from bpf import libbpf
from bpf.errors import MapError

RING_MAP = "sw_events"
CONFIG_MAP = "sw_events_config"
LIMIT_MAP = "sw_events_limit"
LOST_MAP = "sw_events_lost"
#: Every event map, as the programs name them (reused from their pins).
EVENT_MAPS = (RING_MAP, CONFIG_MAP, LIMIT_MAP, LOST_MAP)

RING_SIZE = 256 * 1024

_MAP_ARRAY = 2
_MAP_PERCPU_ARRAY = 6
_MAP_RINGBUF = 27

EVENT_DROP = 1
EVENT_POLICY = 2
EVENT_TRACE = 3
VERDICT_FORWARDED = 1
VERDICT_DROPPED = 2
#: Where an event was seen (``source``): an endpoint's tc program, the socket program,
#: the north-south program on an external device.
SOURCE_LXC, SOURCE_SOCKET, SOURCE_NODEPORT = 1, 2, 3
SOURCE_NAMES = {SOURCE_LXC: "lxc", SOURCE_SOCKET: "socket", SOURCE_NODEPORT: "nodeport"}
NO_LPM = 0xFF

# struct sw_event: u64 ts; u8 x8; u32 src, dst; u16 ep; be16 sport, dport, orig_dport;
# 16 x3 addresses.
_EVENT = struct.Struct("<Q8BIIH2s2s2s16s16s16s")
EVENT_SIZE = _EVENT.size
_CONFIG = struct.Struct("<IIII")


@dataclass(frozen=True, slots=True)
class RawEvent:
    """One event as the datapath wrote it (addresses as IP objects, ports host order)."""

    ts_ns: int
    type: int
    verdict: int
    reason: int
    direction: int  # 1 ingress, 2 egress
    family: int
    proto: int
    lpm: int  # NO_LPM: no policy entry decided
    source: int
    src_identity: int
    dst_identity: int
    endpoint_id: int
    sport: int
    dport: int
    orig_dport: int
    saddr: ipaddress.IPv4Address | ipaddress.IPv6Address
    daddr: ipaddress.IPv4Address | ipaddress.IPv6Address
    orig_daddr: ipaddress.IPv4Address | ipaddress.IPv6Address


def _ip(raw: bytes, family: int) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    return ipaddress.IPv4Address(raw[:4]) if family == 4 else ipaddress.IPv6Address(raw)


def decode(data: bytes) -> RawEvent:
    """A `RawEvent` from one ring-buffer record (ValueError when it is too short)."""
    if len(data) < EVENT_SIZE:
        raise ValueError(f"event of {len(data)} bytes, expected {EVENT_SIZE}")
    (ts, etype, verdict, reason, direction, family, proto, lpm, source, src, dst, ep,
     sport, dport, odport, saddr, daddr, odaddr) = _EVENT.unpack_from(data)
    fam = 6 if family == 6 else 4
    return RawEvent(
        ts, etype, verdict, reason, direction, fam, proto, lpm, source, src, dst, ep,
        int.from_bytes(sport, "big"), int.from_bytes(dport, "big"),
        int.from_bytes(odport, "big"), _ip(saddr, fam), _ip(daddr, fam), _ip(odaddr, fam),
    )


def encode(ev: RawEvent) -> bytes:
    """The record of ``ev`` (tests and benchmarks feed the reader with it)."""
    def addr(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bytes:
        return ip.packed.ljust(16, b"\0")

    return _EVENT.pack(
        ev.ts_ns, ev.type, ev.verdict, ev.reason, ev.direction, ev.family, ev.proto, ev.lpm,
        ev.source, ev.src_identity, ev.dst_identity, ev.endpoint_id,
        ev.sport.to_bytes(2, "big"), ev.dport.to_bytes(2, "big"),
        ev.orig_dport.to_bytes(2, "big"), addr(ev.saddr), addr(ev.daddr), addr(ev.orig_daddr),
    )


def possible_cpus() -> int:
    """The kernel's possible CPUs (the value count of a per-CPU map)."""
    try:
        with open("/sys/devices/system/cpu/possible") as f:
            text = f.read().strip()
    except OSError:
        return os.cpu_count() or 1
    n = 0
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        n += (int(hi) - int(lo) + 1) if hi else 1
    return n


def _map_error(name: str, op: str, err: int) -> MapError:
    return MapError(name, op, err)


class EventMaps:
    """The four event maps, pinned (or only created, without a pin directory)."""

    def __init__(self, fds: dict[str, int], pin_dir: str | None) -> None:
        self.fds = fds
        self.pin_dir = pin_dir
        self.cpus = possible_cpus()

    @classmethod
    def open(cls, pin_dir: str | None) -> EventMaps:
        """Adopt the pinned maps under ``pin_dir`` or create and pin them."""
        specs = {
            RING_MAP: (_MAP_RINGBUF, 0, 0, RING_SIZE),
            CONFIG_MAP: (_MAP_ARRAY, 4, _CONFIG.size, 1),
            LIMIT_MAP: (_MAP_PERCPU_ARRAY, 4, 16, 1),
            LOST_MAP: (_MAP_PERCPU_ARRAY, 4, 8, 2),
        }
        fds: dict[str, int] = {}
        if pin_dir:
            os.makedirs(pin_dir, exist_ok=True)
        try:
            for name, (mtype, ksize, vsize, entries) in specs.items():
                pin = os.path.join(pin_dir, name) if pin_dir else ""
                fd = libbpf.obj_get(pin) if pin and os.path.exists(pin) else -errno.ENOENT
                if fd < 0:
                    fd = libbpf.map_create(mtype, name, ksize, vsize, entries, 0)
                    if fd < 0:
                        raise _map_error(name, "create", -fd)
                    if pin:
                        ret = libbpf.obj_pin(fd, pin)
                        if ret < 0:
                            os.close(fd)
                            raise _map_error(name, f"pin at {pin}", -ret)
                fds[name] = fd
        except BaseException:
            for fd in fds.values():
                os.close(fd)
            raise
        return cls(fds, pin_dir)

    def close(self) -> None:
        """Close the descriptors (the pins stay)."""
        for fd in self.fds.values():
            os.close(fd)
        self.fds = {}

    @staticmethod
    def unpin(pin_dir: str) -> list[str]:
        """Remove the pins under ``pin_dir``; the removed paths."""
        out = []
        for name in EVENT_MAPS:
            path = os.path.join(pin_dir, name)
            if os.path.exists(path):
                os.unlink(path)
                out.append(path)
        return out

    def configure(self, enabled: bool, rate: int, burst: int) -> None:
        """Turn events on or off and set the per-CPU rate (events/s) and burst."""
        key = (0).to_bytes(4, "little")
        value = _CONFIG.pack(1 if enabled else 0, rate, burst, 0)
        ret = libbpf.lib().update_elem(self.fds[CONFIG_MAP], key, value, libbpf.update_flags(0))
        if ret < 0:
            raise _map_error(CONFIG_MAP, "update", -ret)

    def lost(self) -> dict[str, int]:
        """Events lost so far, summed over the CPUs: ``rate_limit`` and ``ring_full``."""
        out = {}
        for idx, label in ((0, "rate_limit"), (1, "ring_full")):
            buf = libbpf.new_buffer(8 * self.cpus)
            key = idx.to_bytes(4, "little")
            ret = libbpf.lib().lookup_elem(self.fds[LOST_MAP], key, buf)
            if ret < 0:
                raise _map_error(LOST_MAP, "lookup", -ret)
            out[label] = sum(struct.unpack_from(f"<{self.cpus}Q", buf.raw))
        return out


_SAMPLE_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)


class RingReader:
    """Reads ``sw_events`` with libbpf; ``on_event(bytes)`` is called for each record
    from `poll` (in the calling thread)."""

    def __init__(self, ring_fd: int, on_event: Callable[[bytes], None]) -> None:
        lib = libbpf.lib().lib
        self._new = lib.ring_buffer__new
        self._new.restype = ctypes.c_void_p
        self._new.argtypes = [ctypes.c_int, _SAMPLE_FN, ctypes.c_void_p, ctypes.c_void_p]
        self._poll = lib.ring_buffer__poll
        self._poll.restype = ctypes.c_int
        self._poll.argtypes = [ctypes.c_void_p, ctypes.c_int]
        self._free = lib.ring_buffer__free
        self._free.restype = None
        self._free.argtypes = [ctypes.c_void_p]
        self.on_event = on_event

        def sample(_ctx: int, data: int, size: int) -> int:
            self.on_event(ctypes.string_at(data, size))
            return 0

        self._callback = _SAMPLE_FN(sample)  # kept alive as long as the ring
        rb = self._new(ring_fd, self._callback, None, None)
        if not rb:
            raise MapError(RING_MAP, "ring_buffer__new", ctypes.get_errno() or errno.EINVAL)
        self._rb: int | None = rb

    def poll(self, timeout_ms: int) -> int:
        """Wait up to ``timeout_ms`` for records and deliver them; how many (or -errno)."""
        if self._rb is None:
            return -errno.EBADF
        n: int = self._poll(self._rb, timeout_ms)
        return n

    def close(self) -> None:
        """Free the ring's mappings."""
        if self._rb is not None:
            self._free(self._rb)
            self._rb = None
