"""Throughput of the BPF map layer: typed (codec + backend) operations on 1M-entry hash maps.

Prints one JSON object. ``kernel_*``/``memory_*`` are typed operations (dataclasses through
the codecs and the backend) on the lb4_services layout. Kernel figures need CAP_BPF;
without it they are null and "kernel_unavailable" says why. For comparison, in the same
run: ``raw_libbpf_*`` (pre-encoded bytes, direct ctypes calls into libbpf) and
``kernel_backend_bytes_*`` (pre-encoded bytes through KernelMap, i.e. without codecs).
``--quick`` inserts 100k instead of 1M entries (maps still sized for 1M).

Garbage collector (the naming rule of every benchmark): a plain key is measured with the
agent's collector configuration (``statedb.gc_tuning.tune_gc()``); the same key with the
suffix ``_default_gc`` with CPython's default collector (skipped with ``--no-default-gc``).
``kernel_batch_to_raw_ratio`` is kernel_batch_update_per_s / raw_libbpf_batch_update_per_s
of the same configuration (target: >= 0.5, i.e. the typed batch within 2x of raw libbpf).
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

# The repository root, ahead of benchmarks/ (whose statedb.py would shadow the package).
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bpf import catalog, lb, libbpf
from bpf.backend import MapBackend
from bpf.kernel_map import KernelMap
from bpf.memory_map import MemoryMap
from bpf.probe import kernel_support
from bpf.typed_map import TypedMap
from statedb.gc_tuning import tune_gc

MAP_ENTRIES = 1 << 20
BATCH = 8192


REPEATS = 3


def _best_rate(n: int, setup: Callable[[], Any], run: Callable[[Any], Any]) -> float:
    """Best of REPEATS runs, each on fresh state from ``setup`` (closed afterwards if it can)."""
    best = 0.0
    for _ in range(REPEATS):
        state = setup()
        try:
            start = time.perf_counter()
            run(state)
            best = max(best, n / (time.perf_counter() - start))
        finally:
            close = getattr(state, "close", None)
            if close is not None:
                close()
    return best


def _entries(n: int) -> tuple[list[lb.Service4Key], list[lb.ServiceValue]]:
    keys = [
        lb.Service4Key(
            bytes((10, (i >> 16) & 255, (i >> 8) & 255, i & 255)), 80 + (i & 7), i & 3, 6
        )
        for i in range(n)
    ]
    values = [lb.ServiceValue(i, i & 15, i & 0xFFFF, 0, 0, 0) for i in range(n)]
    return keys, values


def _single_updates(m: TypedMap[Any, Any], keys: list[Any], values: list[Any]) -> None:
    update = m.update
    for k, v in zip(keys, values):
        update(k, v)


def _batch_updates(m: TypedMap[Any, Any], keys: list[Any], values: list[Any]) -> None:
    for i in range(0, len(keys), BATCH):
        m.update_batch(keys[i : i + BATCH], values[i : i + BATCH])


def _lookups(m: TypedMap[Any, Any], keys: list[Any]) -> None:
    lookup = m.lookup
    for k in keys:
        if lookup(k) is None:
            raise AssertionError("benchmark key missing")


def _typed_rates(create: Callable[[], MapBackend], spec: Any, n: int) -> dict[str, float]:
    keys, values = _entries(n)

    def fresh() -> TypedMap[Any, Any]:
        return TypedMap(spec, create())

    def filled() -> TypedMap[Any, Any]:
        m = fresh()
        _batch_updates(m, keys, values)
        return m

    return {
        "update_per_s": _best_rate(n, fresh, lambda m: _single_updates(m, keys, values)),
        "batch_update_per_s": _best_rate(n, fresh, lambda m: _batch_updates(m, keys, values)),
        "lookup_per_s": _best_rate(n, filled, lambda m: _lookups(m, keys)),
        "dump_rows_per_s": _best_rate(n, filled, lambda m: m.dump()),
    }


def _raw_rates(spec: Any, n: int) -> dict[str, float]:
    """Reference: pre-encoded bytes straight into libbpf through ctypes, single and batch."""
    keys, values = _entries(n)
    kb = [spec.key.encode(k) for k in keys]
    vb = [spec.value.encode(v) for v in values]
    fn = libbpf.lib().update_elem
    call = libbpf.BatchCall()
    kjoined = [b"".join(kb[i : i + BATCH]) for i in range(0, n, BATCH)]
    vjoined = [b"".join(vb[i : i + BATCH]) for i in range(0, n, BATCH)]

    flags = libbpf.update_flags(0)

    def single(m: KernelMap) -> None:
        fd = m.fd
        for k, v in zip(kb, vb):
            fn(fd, k, v, flags)

    def batch(m: KernelMap) -> None:
        fd = m.fd
        for k, v in zip(kjoined, vjoined):
            call.update(fd, k, v, len(k) // spec.key_size, 0)

    def backend_single(m: KernelMap) -> None:
        update = m.update
        for k, v in zip(kb, vb):
            update(k, v)

    def backend_batch(m: KernelMap) -> None:
        for k, v in zip(kjoined, vjoined):
            m.update_batch(k, v)

    create = lambda: KernelMap.create(spec)  # noqa: E731
    return {
        "update_per_s": _best_rate(n, create, single),
        "batch_update_per_s": _best_rate(n, create, batch),
        "backend_update_per_s": _best_rate(n, create, backend_single),
        "backend_batch_update_per_s": _best_rate(n, create, backend_batch),
    }


def _measure(spec: Any, n: int) -> dict[str, Any]:
    """Every rate of one collector configuration (key names without a suffix)."""
    result: dict[str, Any] = {}
    support = kernel_support()
    if support.ok:
        k = _typed_rates(lambda: KernelMap.create(spec), spec, n)
        raw = _raw_rates(spec, n)
        result.update(
            kernel_update_per_s=k["update_per_s"],
            kernel_batch_update_per_s=k["batch_update_per_s"],
            kernel_lookup_per_s=k["lookup_per_s"],
            kernel_dump_rows_per_s=k["dump_rows_per_s"],
            raw_libbpf_update_per_s=raw["update_per_s"],
            raw_libbpf_batch_update_per_s=raw["batch_update_per_s"],
            kernel_backend_bytes_update_per_s=raw["backend_update_per_s"],
            kernel_backend_bytes_batch_update_per_s=raw["backend_batch_update_per_s"],
            kernel_batch_to_raw_ratio=round(
                k["batch_update_per_s"] / raw["batch_update_per_s"], 3
            ),
        )
    else:
        result.update(
            kernel_update_per_s=None,
            kernel_batch_update_per_s=None,
            kernel_lookup_per_s=None,
            kernel_dump_rows_per_s=None,
        )
    mem = _typed_rates(lambda: MemoryMap.create(spec), spec, n)
    result.update(
        memory_update_per_s=mem["update_per_s"],
        memory_lookup_per_s=mem["lookup_per_s"],
        memory_batch_update_per_s=mem["batch_update_per_s"],
        memory_dump_rows_per_s=mem["dump_rows_per_s"],
    )
    for key, value in result.items():
        if isinstance(value, float) and not key.endswith("_ratio"):
            result[key] = round(value)
    return result


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print the JSON object."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer operations (< 60 s)")
    parser.add_argument(
        "--no-default-gc",
        action="store_true",
        help="skip the repeat with CPython's default collector (the *_default_gc keys)",
    )
    args = parser.parse_args(argv)
    n = 100_000 if args.quick else MAP_ENTRIES
    spec = catalog.all_specs()["lb4_services"].resized(MAP_ENTRIES)
    result: dict[str, Any] = {
        "map": f"{spec.name} (hash, {spec.key_size}B key, {spec.value_size}B value, "
        f"max_entries {MAP_ENTRIES})",
        "operations": n,
        "batch_size": BATCH,
        "repeats": f"best of {REPEATS}, fresh map each",
        "machine": f"{platform.node()} {platform.machine()} Linux {platform.release()}",
    }
    support = kernel_support()
    if not support.ok:
        result["kernel_unavailable"] = support.reason
    previous = gc.get_threshold()
    try:
        tune_gc()
        result.update(_measure(spec, n))
    finally:
        gc.unfreeze()
        gc.set_threshold(*previous)
    if not args.no_default_gc:
        for key, value in _measure(spec, n).items():
            result[key + "_default_gc"] = value
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
