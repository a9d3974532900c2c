"""statedb benchmark: prints one JSON object of throughput, latency and memory figures.

Run ``python benchmarks/statedb.py`` (full sizes) or ``--quick`` (reduced sizes,
under a minute). Every figure is measured twice: a plain key with the collector
configuration the Statewright agent runs with (`statedb.gc_tuning.tune_gc`: a raised
young-generation threshold and the start-up heap frozen), the same key with the suffix
``_default_gc`` with Python's default collector settings, as a library user has them.

get_per_s (random primary keys of the loaded table) comes with its bounds, measured on the
same rows and ids: ``get_plain_dict_per_s`` (a dict of the rows by int id),
``get_record_dict_per_s`` (a dict laid out as statedb stores a table, read inline without a
call) and ``get_hot_1000_keys_per_s`` (get on 1,000 keys that stay in the caches).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import platform
import random
import statistics
import struct
import sys
import time
import tracemalloc
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import anyio

from statedb import DB, Index, Table, Watch, keys
from statedb.gc_tuning import tune_gc


@dataclass(frozen=True, slots=True)
class Row:
    """A benchmark row: numeric id, a name for prefix queries, a group for a non-unique index."""

    id: int
    name: str
    group: str


BY_ID: Index[Row, int] = Index("id", key=lambda r: r.id, encode=keys.uint64)
BY_NAME: Index[Row, str] = Index("name", key=lambda r: r.name)
BY_GROUP: Index[Row, str] = Index("group", key=lambda r: r.group, unique=False)


def make_rows(n: int) -> list[Row]:
    """Rows with ids 0..n-1 in random order (so inserts are not in key order)."""
    ids = list(range(n))
    random.Random(7).shuffle(ids)
    return [Row(i, f"row-{i:08d}", f"group-{i % 1000:04d}") for i in ids]


def insert_rate(rows: list[Row], per_txn: int, secondary: bool) -> float:
    """Rows inserted per second at ``per_txn`` rows per write transaction."""
    table = Table("t", BY_ID, BY_GROUP) if secondary else Table("t", BY_ID)
    db = DB(table)
    start = time.perf_counter()
    for s in range(0, len(rows), per_txn):
        with db.write_txn(table) as txn:
            for r in rows[s : s + per_txn]:
                table.insert(txn, r)
    return len(rows) / (time.perf_counter() - start)


def loaded(rows: list[Row]) -> tuple[DB, Table[Row]]:
    """A DB whose table holds ``rows`` (primary, unique name index, non-unique group index)."""
    table = Table("t", BY_ID, BY_NAME, BY_GROUP)
    db = DB(table)
    for s in range(0, len(rows), 1000):
        with db.write_txn(table) as txn:
            for r in rows[s : s + 1000]:
                table.insert(txn, r)
    return db, table


def read_rates(
    db: DB, table: Table[Row], rows_in_insert_order: list[Row], gets: int
) -> dict[str, float]:
    """Gets/s and their bounds, ordered view build rate, prefix rows/s, iteration rows/s."""
    n = len(rows_in_insert_order)
    rtxn = db.read_txn()
    ids = [random.randrange(n) for _ in range(gets)]
    get = table.get
    start = time.perf_counter()
    for i in ids:
        get(rtxn, i)
    get_s = gets / (time.perf_counter() - start)

    # The bounds of get_per_s, measured beside it on the same rows and ids. At these sizes
    # a random lookup is bound by memory latency (the dict's index and entry, the stored
    # key object and the stored record are each a cache and TLB miss), not by the work of
    # the call: see get_hot_1000_keys_per_s.
    # 1. A plain dict of the rows by their int ids, filled in insertion order: the
    # cheapest lookup Python has. (Not from table.all: that would build the ordered view
    # whose first build is timed below.)
    bare = {r.id: r for r in rows_in_insert_order}
    bare_get = bare.get
    start = time.perf_counter()
    for i in ids:
        bare_get(i)
    bare_s = gets / (time.perf_counter() - start)
    del bare
    # 2. A plain dict laid out as statedb stores a table (encoded key -> (row, revision,
    # key) record, filled in insertion order), read without a call: encode, look up, take
    # the row. Here ends what storing a revision per row with bytes keys allows.
    encode = struct.Struct(">Q").pack  # what get uses for keys.uint64, in C
    if encode(n - 1) != BY_ID.encode(n - 1):
        raise AssertionError("the C encoder differs from keys.uint64")
    records: dict[bytes, tuple[Row, int, bytes]] = {}
    for rev, r in enumerate(rows_in_insert_order, 1):
        k = encode(r.id)
        records[k] = (r, rev, k)
    records_get = records.get
    start = time.perf_counter()
    for i in ids:
        e = records_get(encode(i))
        if e is not None:
            e[0]
    records_s = gets / (time.perf_counter() - start)
    del records

    # get on 1,000 keys (in the processor's caches after the first pass): the call's own
    # cost without the memory latency of a large table.
    hot = [i % 1000 for i in ids]
    start = time.perf_counter()
    for i in hot:
        get(rtxn, i)
    hot_s = gets / (time.perf_counter() - start)

    start = time.perf_counter()
    table.all(rtxn)  # first ordered query of this snapshot builds the view
    build_s = time.perf_counter() - start

    start = time.perf_counter()
    rows = 0
    for _ in range(3):
        for _row in table.all(rtxn):
            rows += 1
    iterate = rows / (time.perf_counter() - start)

    q = BY_NAME.query("row-000")
    start = time.perf_counter()
    rows = 0
    for _ in range(20):
        for _row in table.prefix(rtxn, q):
            rows += 1
    prefix = rows / (time.perf_counter() - start)
    return {
        "get_per_s": get_s,
        "get_plain_dict_per_s": bare_s,
        "get_record_dict_per_s": records_s,
        "get_hot_1000_keys_per_s": hot_s,
        "ordered_view_build_rows_per_s": n / build_s,
        "iterate_rows_per_s": iterate,
        "prefix_rows_per_s": prefix,
    }


def replay_rate(db: DB, table: Table[Row], n: int) -> dict[str, float]:
    """Cost of ordered queries after writes: each round writes 100 rows, then lists one group."""
    rnd = random.Random(3)
    rounds = 200
    start = time.perf_counter()
    for _ in range(rounds):
        with db.write_txn(table) as txn:
            for _ in range(100):
                i = rnd.randrange(n)
                old = table.get(txn, i)
                if old is not None:
                    table.insert(txn, replace(old, group=f"group-{rnd.randrange(1000):04d}"))
        list(table.list(db.read_txn(), BY_GROUP.query("group-0001")))
    return {"write100_then_list_per_s": rounds / (time.perf_counter() - start)}


def changes_rate(db: DB, table: Table[Row], n: int) -> float:
    """Rows/s delivered by a change iterator: a full first pass, then a pass over n updates.

    Only the time spent consuming changes counts, not the writes in between.
    """
    with db.write_txn(table) as txn:
        it = table.changes(txn)
    start = time.perf_counter()
    delivered = sum(1 for _ in it.next(db.read_txn())[0])
    first = time.perf_counter() - start
    rows = list(table.all(db.read_txn()))
    for s in range(0, len(rows), 1000):
        with db.write_txn(table) as txn:
            for r in rows[s : s + 1000]:
                table.insert(txn, replace(r, name=r.name + "x"))
    start = time.perf_counter()
    delivered2 = sum(1 for _ in it.next(db.read_txn())[0])
    second = time.perf_counter() - start
    it.close()
    if delivered != n or delivered2 != n:
        raise AssertionError(f"change iterator delivered {delivered}/{delivered2}, expected {n}")
    return (delivered + delivered2) / (first + second)


async def _wakeups(samples: int) -> list[float]:
    table: Table[Row] = Table("w", BY_ID)
    db = DB(table)
    with db.write_txn(table) as txn:
        table.insert(txn, Row(0, "a", "g"))
    out: list[float] = []
    committed_at = [0.0]

    async def waiter(w: Watch) -> None:
        await w.wait_async()
        out.append((time.perf_counter() - committed_at[0]) * 1e6)

    for i in range(samples):
        _, watch = table.get_watch(db.read_txn(), 0)

        async with anyio.create_task_group() as tg:
            tg.start_soon(waiter, watch)
            await anyio.sleep(0)
            txn = db.write_txn(table)
            table.insert(txn, Row(0, f"a{i}", "g"))
            committed_at[0] = time.perf_counter()
            txn.commit()
    return out


def wakeup_latency(samples: int, backend: str) -> dict[str, float]:
    """Commit-to-wakeup latency of an anyio task awaiting a get() watch, p50/p99 in us."""
    lat = sorted(anyio.run(_wakeups, samples, backend=backend))
    return {
        "p50": statistics.median(lat),
        "p99": lat[min(len(lat) - 1, int(len(lat) * 0.99))],
    }


def bytes_per_row(n: int) -> dict[str, float]:
    """tracemalloc bytes per row beyond the row objects: primary index only, then with views."""
    rows = make_rows(n)
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    table = Table("m", BY_ID, BY_GROUP)
    db = DB(table)
    for s in range(0, n, 1000):
        with db.write_txn(table) as txn:
            for r in rows[s : s + 1000]:
                table.insert(txn, r)
    gc.collect()
    stored = tracemalloc.get_traced_memory()[0] - base
    rtxn = db.read_txn()
    table.all(rtxn)
    list(table.list(rtxn, BY_GROUP.query("group-0001")))
    with_views = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    return {"stored": stored / n, "with_views": with_views / n}


def origin_bytes_per_object(n: int) -> float:
    """tracemalloc bytes per source object of the agent's ``origins`` table
    (tables/origins.py: one row per applied object, its index entry included), for a
    Service and an EndpointSlice of ten endpoints per service as the LB benchmark builds
    them; the input objects are built before the baseline and stay alive."""
    from tables.origins import SOURCE_K8S, OriginRecorder, new_origins_table

    objs: list[dict[str, object]] = []
    for i in range(n // 2):
        meta = {"name": f"svc-{i}", "namespace": "bench"}
        objs.append({"kind": "Service", "metadata": meta})
        objs.append({
            "kind": "EndpointSlice",
            "metadata": {"name": f"svc-{i}-abcde", "namespace": "bench",
                         "labels": {"kubernetes.io/service-name": f"svc-{i}"}},
            "endpoints": [{"addresses": [f"10.{i >> 8 & 255}.{i & 255}.{k}"]}
                          for k in range(10)],
        })
    table = new_origins_table()
    db = DB(table)
    rec = OriginRecorder(table)
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    for s in range(0, len(objs), 20):
        with db.write_txn(table) as txn:
            for o in objs[s : s + 20]:
                rec.record(txn, o, SOURCE_K8S)
            txn.commit()
    gc.collect()
    stored = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    return stored / len(objs)


def held_snapshot_memory(n_rows: int, updates: int, trace: bool, per_txn: int = 100) -> float:
    """With ``trace``: tracemalloc bytes the table holds after ``updates`` updates of
    ``n_rows`` rows (``per_txn`` per write transaction) while one snapshot taken after
    loading them stays held, as a ReadTxn kept in a suspended coroutine would, beyond the
    table before the updates. Without: the updates per second (tracemalloc slows them).

    What the snapshot sees (one version per row) has to stay; every other version written
    since need not."""
    table = Table("h", BY_ID)
    db = DB(table)
    with db.write_txn(table) as txn:
        for i in range(n_rows):
            table.insert(txn, Row(i, "", ""))
    gc.collect()
    if trace:
        tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    held = db.read_txn()
    names = [f"v{v}" for v in range(per_txn)]
    start = time.perf_counter()
    k = 0
    for _ in range(updates // per_txn):
        with db.write_txn(table) as txn:
            for name in names:
                k += 1
                table.insert(txn, Row(k % n_rows, name, ""))
    elapsed = time.perf_counter() - start
    if not trace:
        return k / elapsed
    gc.collect()
    held_bytes = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    assert table.get(held, 0) == Row(0, "", "")
    return float(held_bytes)


@contextlib.contextmanager
def agent_collector() -> Iterator[None]:
    """The agent's collector configuration (`tune_gc`) for the duration of the block; the
    previous thresholds are restored and the heap unfrozen afterwards."""
    previous = tune_gc()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*previous)


def measure(quick: bool) -> dict[str, float]:
    """Every figure once, with whatever collector configuration is in force."""
    n = 100_000 if quick else 1_000_000
    n_insert = 40_000 if quick else 200_000
    mem_rows = 100_000 if quick else 1_000_000
    random.seed(1)

    rows = make_rows(n_insert)
    out: dict[str, float] = {}
    for per in (1, 10, 100, 1000):
        count = min(len(rows), 20_000) if per == 1 else len(rows)
        out[f"insert_per_s_txn{per}"] = insert_rate(rows[:count], per, False)
        out[f"insert_per_s_txn{per}_secondary"] = insert_rate(rows[:count], per, True)
    del rows

    big = make_rows(n)
    db, table = loaded(big)
    out.update(read_rates(db, table, big, 200_000 if quick else 1_000_000))
    out.update(replay_rate(db, table, n))
    out["changes_rows_per_s"] = changes_rate(db, table, n)
    del db, table, big
    gc.collect()

    lat = wakeup_latency(500 if quick else 3000, "asyncio")
    out["wakeup_p50_us"], out["wakeup_p99_us"] = lat["p50"], lat["p99"]
    lat_trio = wakeup_latency(300 if quick else 1000, "trio")
    out["wakeup_trio_p50_us"], out["wakeup_trio_p99_us"] = lat_trio["p50"], lat_trio["p99"]

    mem = bytes_per_row(mem_rows)
    out["bytes_per_row_overhead"] = mem["stored"]
    out["bytes_per_row_with_ordered_views"] = mem["with_views"]
    out["origin_bytes_per_object"] = origin_bytes_per_object(20_000 if quick else 100_000)
    n_held = held_updates(quick)
    out["held_snapshot_updates_per_s"] = held_snapshot_memory(HELD_ROWS, n_held, False)
    out["held_snapshot_bytes_after_updates"] = held_snapshot_memory(HELD_ROWS, n_held, True)
    return out


#: Rows of `held_snapshot_memory`'s table; its updates by `held_updates`.
HELD_ROWS = 10_000


def held_updates(quick: bool) -> int:
    """Updates `held_snapshot_memory` makes (the figure's N)."""
    return 100_000 if quick else 500_000


def main() -> None:
    """Run every measurement with both collector configurations and print one JSON object."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="reduced sizes (< 60 s)")
    args = ap.parse_args()
    default = measure(args.quick)
    gc.collect()
    with agent_collector():
        agent = measure(args.quick)
    out: dict[str, object] = {}
    for key, value in agent.items():
        out[key] = value
        out[f"{key}_default_gc"] = default[key]
    out["memory_rows"] = 100_000 if args.quick else 1_000_000
    out["held_snapshot_rows"] = HELD_ROWS
    out["held_snapshot_updates"] = held_updates(args.quick)
    out["machine"] = {
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "quick": args.quick,
    }
    for k, v in out.items():
        if isinstance(v, float):
            out[k] = round(v, 1)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
