"""The floor under the initial sync's CPU per service, measured beside the sync itself.

``python benchmarks/sync_floor.py --services 20000`` prints one JSON object.

The initial sync (``benchmarks/k8s.py``) must at least decode what the API server sends,
keep the rows it makes of it, and write the LB maps' entries. This benchmark measures,
in one process and one machine state, the least pure Python spends on each of those for
the same objects, and then the sync itself, so the two read side by side:

- ``floor_decode_us_per_service``: ``orjson.loads`` of the list pages (500 objects each,
  the Services' and the EndpointSlices', as the fake API server serves them), one page at a
  time as the agent lists, and freeing each page's objects once its rows are made.
- ``floor_rows_us_per_service``: from each decoded page, the rows the agent keeps per
  service (a Service, its Frontend, a Backend per endpoint with its address packed by
  ``inet_pton``, an origin per object, a status), each a plain tuple of its fields, put in
  one plain dict per index the agent keeps (services by name; frontends by address and
  by service; backends by address, and the service's tuple of them; origins by key). No
  validation, no snapshots, no change tracking: the least any hash-indexed store does.
- ``floor_maps_us_per_service``: the kernel's LB maps written with as many entries per
  service, map by map, as the agent's Ops write (counted in a small sync on in-memory
  maps first: ``map_entries_per_service``), the keys and values already packed and joined,
  one batch call per map per 1,000 services.
- ``sync_cpu_us_per_service``: ``benchmarks/k8s.py``'s initial sync (no churn), its
  process CPU per service.

``floor_us_per_service`` is the sum of the three floors; ``sync_over_floor`` the sync's
CPU over it. CPU times are ``time.thread_time`` (the floors run on one thread) and the
sync's own process CPU, so the machine's load distorts them less than wall time; still,
compare figures of one run only.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import orjson

from benchmarks.lb import service_obj, slice_obj

PAGE = 500
CHUNK = 1000


def served(obj: dict[str, Any], rv: int) -> dict[str, Any]:
    """``obj`` with the metadata the API server adds (uid, resourceVersion, timestamp)."""
    meta = dict(obj["metadata"])
    meta.update(
        uid=f"00000000-0000-4000-8000-{rv:012d}",
        resourceVersion=str(rv),
        creationTimestamp="2026-11-23T00:00:00Z",
    )
    return {**obj, "metadata": meta}


def list_pages(n: int) -> list[bytes]:
    """The Services' and then the EndpointSlices' list pages, as JSON bodies."""
    pages: list[bytes] = []
    for kind, make in (("ServiceList", service_obj), ("EndpointSliceList", slice_obj)):
        for lo in range(0, n, PAGE):
            items = [served(make(i), 2 * i + 1) for i in range(lo, min(n, lo + PAGE))]
            body = {
                "kind": kind,
                "apiVersion": "v1",
                "metadata": {"resourceVersion": str(2 * n + 1), "continue": str(lo + PAGE)},
                "items": items,
            }
            pages.append(orjson.dumps(body))
    return pages


class FloorStore:
    """The least a store keeps of the objects: a plain tuple per row, in plain dicts."""

    def __init__(self) -> None:
        self.services: dict[str, tuple[Any, ...]] = {}
        self.frontends: dict[bytes, tuple[Any, ...]] = {}
        self.frontend_of: dict[str, bytes] = {}
        self.backends: dict[bytes, tuple[Any, ...]] = {}
        self.backends_of: dict[str, tuple[bytes, ...]] = {}
        self.origins: dict[str, tuple[Any, ...]] = {}

    def add_services(self, items: list[dict[str, Any]]) -> None:
        """A Service's row, its frontend's and its origin's."""
        pton, v4, done = socket.inet_pton, socket.AF_INET, ("done", 0.0, "")
        for obj in items:
            meta = obj["metadata"]
            name = f"{meta['namespace']}/{meta['name']}"
            spec = obj["spec"]
            port = spec["ports"][0]
            self.services[name] = (name, "k8s", meta.get("labels"), None, spec.get("selector"),
                                   ("http",))
            addr = pton(v4, spec["clusterIP"]) + port["port"].to_bytes(2, "big") + b"\x06"
            self.frontends[addr] = (addr, "ClusterIP", name, port["name"], port["port"], name,
                                    (), 0, None, done)
            self.frontend_of[name] = addr
            self.origins[name] = (name, "Service", meta["uid"], meta["resourceVersion"])

    def add_slices(self, items: list[dict[str, Any]]) -> None:
        """An EndpointSlice's backend rows, its service's frontend again, its origin."""
        pton, v4 = socket.inet_pton, socket.AF_INET
        for obj in items:
            meta = obj["metadata"]
            service = f"{meta['namespace']}/{meta['labels']['kubernetes.io/service-name']}"
            port = obj["ports"][0]
            tail = port["port"].to_bytes(2, "big") + b"\x06"
            keys = []
            for ep in obj["endpoints"]:
                key = pton(v4, ep["addresses"][0]) + tail
                cond = ep["conditions"]
                self.backends[key] = (key, service, port["name"], cond["ready"], cond["serving"])
                keys.append(key)
            given = self.backends_of[service] = tuple(keys)
            fe = self.frontend_of[service]
            row = self.frontends[fe]
            self.frontends[fe] = (*row[:6], given, *row[7:])
            self.origins[f"{meta['namespace']}/{meta['name']}"] = (
                meta["name"], "EndpointSlice", meta["uid"], meta["resourceVersion"]
            )


def decode_and_rows_floor(pages: list[bytes]) -> tuple[float, float, FloorStore]:
    """Page by page, as the agent lists: CPU seconds of decoding a page and freeing its
    objects once their rows are made, and of making the rows; the store they are in."""
    loads = orjson.loads
    store = FloorStore()
    decode = rows = 0.0
    clock = time.thread_time
    for page in pages:
        t0 = clock()
        body = loads(page)
        t1 = clock()
        if body["kind"] == "ServiceList":
            store.add_services(body["items"])
        else:
            store.add_slices(body["items"])
        t2 = clock()
        del body
        decode += (t1 - t0) + (clock() - t2)
        rows += t2 - t1
    return decode, rows, store


def entries_per_service(services: int = 200) -> dict[str, float]:
    """Entries per service in each LB map after a sync of ``services`` on in-memory maps."""
    from bpfops.adapter import frontend_ops_for
    from bpfops.lb_maps import LBMaps
    from reconciler.operations import BatchEntry
    from sources.k8s_convert import K8sConverter
    from statedb import DB
    from tables.lb_config import LBConfig
    from tables.lb_writer import LBWriter

    cfg = LBConfig()
    writer = LBWriter.create(DB(), cfg)
    conv = K8sConverter(writer, cfg)
    with writer.write_txn() as txn:
        for i in range(services):
            conv.upsert(txn, service_obj(i))
            conv.upsert(txn, slice_obj(i))
        txn.commit()
    maps = LBMaps.in_memory()
    ops = frontend_ops_for(writer, maps, cfg, restore=False)
    rtxn = writer.db.read_txn()
    batch = [BatchEntry(fe, 0) for fe in writer.frontends.all(rtxn)]
    ops.update_batch(rtxn, batch)
    if any(e.result is not None for e in batch):
        raise RuntimeError(f"the LB Ops refused a frontend: {batch}")
    counts = {name: m.count() / services for name, m in maps.maps.items()}
    return {name: c for name, c in counts.items() if c}


def maps_floor(n: int, per_service: dict[str, float]) -> float:
    """CPU seconds of writing ``per_service`` entries per service into fresh kernel maps."""
    from bpf.catalog import LBMapSizes, lb_specs
    from bpf.kernel_map import KernelMap

    entries = 1 << max(16, (n * 24).bit_length())
    specs = {s.name: s for s in lb_specs(sizes=LBMapSizes.uniform(entries))}
    cpu = 0.0
    for name, count in per_service.items():
        spec = specs[name]
        total = round(count * n)
        ks, vs = spec.key.size, spec.value.size
        kmap = KernelMap.create(spec)
        try:
            # Distinct keys (an index in the key's first bytes), zero values, joined.
            step = max(1, round(count * CHUNK))
            chunks = [
                (
                    b"".join(i.to_bytes(min(ks, 8), "little").ljust(ks, b"\1")
                             for i in range(lo, min(total, lo + step))),
                    bytes(vs * (min(total, lo + step) - lo)),
                )
                for lo in range(0, total, step)
            ]
            t0 = time.thread_time()
            for keys, values in chunks:
                kmap.update_batch(keys, values)
            cpu += time.thread_time() - t0
        finally:
            kmap.close()
    return cpu


def main(argv: list[str] | None = None) -> int:
    """Measure the floors and the sync; print the JSON figures."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--services", type=int, default=20_000)
    args = p.parse_args(argv)
    n = args.services
    out: dict[str, Any] = {"services": n, "load_avg_1m_at_start": round(os.getloadavg()[0], 2)}
    pages = list_pages(n)
    decode_s, rows_s, _ = decode_and_rows_floor(pages)
    del pages
    per_service = entries_per_service()
    maps_s = maps_floor(n, per_service)
    out["map_entries_per_service"] = per_service
    floors = {"decode": decode_s, "rows": rows_s, "maps": maps_s}
    for name, cpu in floors.items():
        out[f"floor_{name}_us_per_service"] = round(cpu / n * 1e6, 1)
    floor = sum(floors.values()) / n * 1e6
    out["floor_us_per_service"] = round(floor, 1)

    import anyio

    from benchmarks import k8s

    res = anyio.run(functools.partial(k8s.run, n, 1000.0, 0.0))
    sync = res["initial_sync_cpu_s"] / n * 1e6
    out["sync_s"] = res["initial_sync_s"]
    out["sync_cpu_s"] = res["initial_sync_cpu_s"]
    out["sync_cpu_us_per_service"] = round(sync, 1)
    out["sync_over_floor"] = round(sync / floor, 2)
    out["load_avg_1m_at_end"] = round(os.getloadavg()[0], 2)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
