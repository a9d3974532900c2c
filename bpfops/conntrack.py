"""The agent's side of connection tracking: the CT maps' garbage collection, listing and
flushing, and the drop counters (bpf/include/ct.h; the tc programs of bpf/lxc.c write the
entries).

`CTMaps.gc` is Cilium's ctmap GC: every entry whose ``lifetime`` (seconds of
CLOCK_MONOTONIC, the clock of ``bpf_ktime_get_ns``) is in the past is deleted. It reads
the maps in kernel batches and looks only at the lifetime word of each value, so a
million entries cost a few batch syscalls and one pass over an array of integers, not a
million decoded objects; a worker thread deletes one batch's expired keys while the next
batch is read. Entries deleted by someone else meanwhile (LRU eviction, a
flush) are skipped.
"""

from __future__ import annotations

import errno
import ipaddress
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from bpf import ct
from bpf.backend import MapBackend
from bpf.errors import BatchError
from bpf.typed_map import TypedMap

#: Entries read per batch syscall.
BATCH = 8192
#: Entries deleted per batch syscall.
DELETE_BATCH = 4096


def monotonic_now() -> int:
    """Seconds of CLOCK_MONOTONIC, the clock the tc programs stamp lifetimes with."""
    return int(time.clock_gettime(time.CLOCK_MONOTONIC))


@dataclass(slots=True)
class CTMetrics:
    """What the GC reports: runs, entries removed, entries left per map, last duration."""

    gc_runs: int = 0
    removed_total: int = 0
    last_removed: int = 0
    last_duration_s: float = 0.0
    entries: dict[str, int] = field(default_factory=dict)
    errors_total: int = 0
    last_error: str = ""

    def to_json(self) -> dict[str, Any]:
        """JSON form (``GET /ct/stats``)."""
        return {
            "gc_runs": self.gc_runs,
            "removed_total": self.removed_total,
            "last_removed": self.last_removed,
            "last_duration_s": round(self.last_duration_s, 6),
            "entries": dict(self.entries),
            "errors_total": self.errors_total,
            "last_error": self.last_error,
        }


def expired_in_chunk(kraw: bytes, vraw: bytes, ksize: int, now: int,
                     word: int = ct.LIFETIME_WORD,
                     stride: int = ct.CT_ENTRY.size // 4) -> list[bytes]:
    """The keys (``ksize`` bytes each) of one batch of a CT map whose lifetime is before
    ``now``; only the lifetime word of each value is read (32-bit word ``word`` of values
    ``stride`` words long: a ct_entry unless told otherwise)."""
    lifetimes = memoryview(vraw).cast("I")[word::stride]
    return [kraw[i * ksize : (i + 1) * ksize]
            for i, lifetime in enumerate(lifetimes) if lifetime < now]


def collect(backend: MapBackend, ksize: int, now: int, word: int = ct.LIFETIME_WORD,
            stride: int = ct.CT_ENTRY.size // 4) -> tuple[int, int]:
    """Delete the expired entries of ``backend``, a CT map (or another map whose values
    have a lifetime at ``word``, ``stride`` words each); (entries read, removed).

    Reading and deleting overlap: each batch's expired keys are deleted by a worker thread
    while the next batch is read (both are syscalls, which release the GIL). Deleting an
    entry of a batch already read does not disturb the kernel's batch iteration."""
    total = 0
    with ThreadPoolExecutor(1, thread_name_prefix="ct-gc") as pool:
        pending = []
        for kraw, vraw in backend.dump_chunks(BATCH):
            total += len(kraw) // ksize
            keys = expired_in_chunk(kraw, vraw, ksize, now, word, stride)
            if keys:
                pending.append(pool.submit(delete_keys, backend, keys))
        removed = sum(f.result() for f in pending)
    return total, removed


def delete_keys(backend: MapBackend, keys: list[bytes]) -> int:
    """Delete ``keys`` in batches, skipping keys already gone; returns how many went."""
    removed = 0
    i = 0
    while i < len(keys):
        chunk = keys[i : i + DELETE_BATCH]
        try:
            backend.delete_batch(chunk)
            removed += len(chunk)
            i += len(chunk)
        except BatchError as e:
            if e.errno != errno.ENOENT:
                raise
            removed += e.done
            i += e.done + 1  # the missing key: someone else removed it
    return removed


class CTMaps:
    """Both CT maps of the node (``ct4_global``, ``ct6_global``) and the drop counters."""

    def __init__(
        self,
        ct4: TypedMap[ct.CTTuple4, ct.CTEntry],
        ct6: TypedMap[ct.CTTuple6, ct.CTEntry],
        metrics: TypedMap[ct.MetricsKey, ct.MetricsValue] | None = None,
    ) -> None:
        self.ct4, self.ct6, self.metrics_map = ct4, ct6, metrics
        self.metrics = CTMetrics()

    def maps(self) -> list[TypedMap[Any, ct.CTEntry]]:
        """The two CT maps."""
        return [self.ct4, self.ct6]

    def gc(self, now: int | None = None) -> int:
        """Delete every expired entry; returns how many were removed (metrics updated)."""
        now = monotonic_now() if now is None else now
        start = time.perf_counter()
        removed = 0
        entries: dict[str, int] = {}
        try:
            for m in self.maps():
                total, gone = collect(m.backend, m.spec.key_size, now)
                removed += gone
                entries[m.name] = total - gone
        except OSError as e:
            self.metrics.errors_total += 1
            self.metrics.last_error = str(e)
            raise
        finally:
            self.metrics.gc_runs += 1
            self.metrics.last_duration_s = time.perf_counter() - start
        self.metrics.removed_total += removed
        self.metrics.last_removed = removed
        self.metrics.entries = entries
        return removed

    def flush(self) -> int:
        """Delete every entry of both maps; returns how many."""
        removed = 0
        for m in self.maps():
            keys = [k for kraw, _ in m.backend.dump_chunks(BATCH)
                    for k in _split(kraw, m.spec.key_size)]
            removed += delete_keys(m.backend, keys)
        return removed

    def entries(self, now: int | None = None, limit: int = 0) -> Iterator[dict[str, Any]]:
        """Every entry as JSON (``statewright ct list``), at most ``limit`` when set."""
        now = monotonic_now() if now is None else now
        n = 0
        for m in self.maps():
            for key, value in m.items():
                yield entry_json(key, value, now)
                n += 1
                if limit and n >= limit:
                    return

    def drops(self) -> list[dict[str, Any]]:
        """The drop counters by reason and direction."""
        if self.metrics_map is None:
            return []
        out = []
        for key, value in sorted(self.metrics_map.items()):
            out.append({
                "reason": key.reason,
                "description": ct.DROP_REASONS.get(key.reason, "unknown"),
                "direction": ct.METRIC_DIRECTIONS.get(key.dir, str(key.dir)),
                "packets": value.count,
                "bytes": value.bytes,
            })
        return out


def _split(buf: bytes, size: int) -> list[bytes]:
    return [buf[i : i + size] for i in range(0, len(buf), size)]


def _endpoint(raw: bytes, port: int) -> str:
    ip = ipaddress.ip_address(raw)
    return f"[{ip}]:{port}" if ip.version == 6 else f"{ip}:{port}"


def entry_json(key: ct.CTTuple4 | ct.CTTuple6, value: ct.CTEntry, now: int) -> dict[str, Any]:
    """One entry: the flow as its first packet carried it, its state and counters."""
    flags = [name for bit, name in ((ct.RX_CLOSING, "rx_closing"), (ct.TX_CLOSING, "tx_closing"),
                                    (ct.SEEN_NON_SYN, "seen_non_syn"),
                                    (ct.NODE_PORT, "node_port")) if value.flags & bit]
    return {
        "family": 4 if isinstance(key, ct.CTTuple4) else 6,
        "protocol": ct.PROTOCOLS.get(key.nexthdr, str(key.nexthdr)),
        "source": _endpoint(key.saddr, key.sport),
        "destination": _endpoint(key.daddr, key.dport),
        "direction": ct.DIRECTIONS.get(key.flags, str(key.flags)),
        "expires_in": int(value.lifetime) - now,
        "packets": value.packets,
        "bytes": value.bytes,
        "flags": flags,
        "source_identity": value.src_sec_id,
    }
