"""Throughput of the policy datapath writer: the ``policy-entries`` reconciler (PolicyOps)
writing per-endpoint Cilium policy maps, on memory and kernel maps.

Prints one JSON object, per backend (``memory_*``, ``kernel_*``; kernel figures are null
without CAP_BPF and ``kernel_unavailable`` says why):

* ``*_full_write_s`` / ``*_entries_per_s``: ENDPOINTS endpoints x ENTRIES entries
  committed in one transaction, from the commit until every entry is in its map (maps
  created, installed in policy_maps, entries written; the statuses are checked after);
* ``*_change_ms``: a new identity allowed on one port by 10 % of the endpoints (one entry
  each), from the commit until those rows are Done (a new identity to every affected map
  updated); ``*_change_txn_ms``: the statedb write transaction inserting those rows,
  before the commit (not the datapath's part, reported because it grows with the table);
  ``*_change_entries_written``: the map writes it cost (PolicyOps.writes before and
  after), which must equal the endpoints it touched.

``--quick``: 100 endpoints x 50 entries (under 60 s); otherwise 1000 x 100. Maps are
unpinned (nothing is left on bpffs).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import anyio

# The repository root, ahead of benchmarks/ (whose statedb.py would shadow the package).
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bpf.catalog import policy_maps_spec
from bpf.kernel_map import KernelMap
from bpf.memory_map import MemoryMap
from bpf.pinning import MapOpener
from bpf.probe import kernel_support
from bpf.typed_map import TypedMap
from bpfops.policy_ops import PolicyMapSet, PolicyOps
from reconciler import Config, Reconciler
from reconciler.status import StatusKind
from reconciler.testing import wait_until_done
from statedb import DB, Table
from tables.policy_entries import PolicyEntry, PolicyKey, new_policy_entries_table


def _rows(endpoints: int, entries: int) -> list[PolicyEntry]:
    return [
        PolicyEntry(PolicyKey(ep, 1000 + i, True, 6, 1024 + i, 16), rules=("bench/r",))
        for ep in range(1, endpoints + 1)
        for i in range(entries)
    ]


async def _until_done(db: DB, table: Table[PolicyEntry], rows: list[PolicyEntry]) -> None:
    """Wait until every row of ``rows`` is Done (looked up by key: no table scan)."""
    with anyio.fail_after(60):
        while True:
            txn = db.read_txn()
            got = [table.get(txn, r.key) for r in rows]
            if all(g is not None and g.status.kind is StatusKind.DONE for g in got):
                return
            await anyio.sleep(0.0005)


async def _run(opener: MapOpener, endpoints: int, entries: int) -> dict[str, Any]:
    db = DB()
    table = new_policy_entries_table()
    db.register(table)
    spec = policy_maps_spec(max_entries=4096, policy_max_entries=max(1024, entries * 2))
    outer = TypedMap(spec, opener.create(spec))
    maps = PolicyMapSet(outer, opener, None)
    ops = PolicyOps(table, maps)
    rec = Reconciler(
        db,
        Config(
            table=table,
            operations=ops,
            get_object_status=lambda r: r.status,
            set_object_status=lambda r, s: replace(r, status=s),
            name="policy-entries",
            rate_limit=None,
        ),
    )
    out: dict[str, Any] = {}
    try:
        async with anyio.create_task_group() as tg:
            await tg.start(rec.run)
            rows = _rows(endpoints, entries)
            start = time.perf_counter()
            with db.write_txn(table) as txn:
                for r in rows:
                    table.insert(txn, r)
            with anyio.fail_after(600):
                while ops.writes + ops.skipped < len(rows):  # cheap: no table scan
                    await anyio.sleep(0.001)
            full = time.perf_counter() - start
            await wait_until_done(rec, timeout=600, poll=0.05)  # statuses too (untimed)
            out["full_write_s"] = round(full, 3)
            out["entries_per_s"] = round(len(rows) / full)

            touched = list(range(1, endpoints + 1, 10))
            new = [PolicyEntry(PolicyKey(ep, 999_999, True, 6, 80, 16)) for ep in touched]
            before = ops.writes
            start = time.perf_counter()
            with db.write_txn(table) as txn:
                for r in new:
                    table.insert(txn, r)
            committed = time.perf_counter()
            await _until_done(db, table, new)
            out["change_txn_ms"] = round((committed - start) * 1000, 2)
            out["change_ms"] = round((time.perf_counter() - committed) * 1000, 2)
            out["change_entries_written"] = ops.writes - before
            out["change_endpoints"] = len(touched)
            tg.cancel_scope.cancel()
    finally:
        maps.close()
        outer.close()
    return out


def main() -> None:
    """Run the benchmark and print its JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="100 endpoints x 50 entries")
    args = parser.parse_args()
    endpoints, entries = (100, 50) if args.quick else (1000, 100)
    result: dict[str, Any] = {
        "endpoints": endpoints,
        "entries_per_endpoint": entries,
        "python": platform.python_version(),
    }
    for name, value in anyio.run(_run, MemoryMap, endpoints, entries).items():
        result[f"memory_{name}"] = value
    support = kernel_support()
    if support.ok:
        for name, value in anyio.run(_run, KernelMap, endpoints, entries).items():
            result[f"kernel_{name}"] = value
    else:
        result["kernel_unavailable"] = support.reason
    print(json.dumps(result))


if __name__ == "__main__":
    main()
