"""Reconciler benchmark: prints one JSON object with throughput, memory and latency figures.

- objects_per_s / objects_per_s_batch: rows inserted in batches (by a writer thread)
  into a table reconciled to a no-op target, from the first insert until every row is
  Done; with per-object and with batch operations.
- peak_mem_mb: peak resident set size of the process.
- single_change_p50_us / p99: with 100,000 Done rows in the table, time from a
  single-row commit to the target's update() call for that row, the writer being a task
  on the same event loop; changes are isolated (one every ~5 ms).
- single_change_cross_thread_p50_us / p99: the same with the writer in another thread.

``--quick`` uses smaller sizes and finishes in well under a minute. Every figure is
measured twice, each time in a fresh child process (so that ``peak_mem_mb`` is the peak of
one configuration): a plain key with the collector configuration the Statewright agent
runs with (`statedb.gc_tuning.tune_gc`: a raised young-generation threshold and the
start-up heap frozen), the same key with the suffix ``_default_gc`` with Python's default
collector settings. ``--collector agent|default`` runs one configuration in this process.
"""

from __future__ import annotations

import argparse
import gc
import json
import resource
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import anyio
from anyio.from_thread import start_blocking_portal

from reconciler import BatchEntry, Config, Reconciler, Status, status_pending
from statedb import DB, Index, ReadTxn, Table, keys
from statedb.gc_tuning import tune_gc


@dataclass(frozen=True, slots=True)
class Row:
    """A benchmark row."""

    id: int
    value: int
    status: Status


def get_status(row: Row) -> Status:
    """Status accessor."""
    return row.status


def set_status(row: Row, status: Status) -> Row:
    """A copy of the row with a new status (direct construction: cheaper than replace())."""
    return Row(row.id, row.value, status)


class NoopTarget:
    """A target that accepts everything; calls ``on_seen`` when row ``watch_id`` is updated."""

    def __init__(self) -> None:
        self.watch_id = -1
        self.seen_at = 0.0
        self.on_seen: Callable[[], None] = lambda: None

    def update(self, txn: ReadTxn, revision: int, obj: Row) -> None:
        """Accept the update; note the time when it is the watched row."""
        if obj.id == self.watch_id:
            self.seen_at = time.perf_counter()
            self.on_seen()

    def delete(self, txn: ReadTxn, revision: int, obj: Row) -> None:
        """Accept the delete."""

    def prune(self, txn: ReadTxn, objects: Iterator[Row]) -> None:
        """Accept the prune."""

    def update_batch(self, txn: ReadTxn, batch: list[BatchEntry[Row]]) -> None:
        """Accept every entry."""

    def delete_batch(self, txn: ReadTxn, batch: list[BatchEntry[Row]]) -> None:
        """Accept every entry."""


def new_setup(batch: bool, round_size: int) -> tuple[DB, Table[Row], NoopTarget, Reconciler[Row]]:
    """A DB with one table and a reconciler into a no-op target."""
    table: Table[Row] = Table("bench", Index("id", key=lambda r: r.id, encode=keys.uint64))
    db = DB(table)
    target = NoopTarget()
    cfg: Config[Row] = Config(
        table=table,
        operations=target,
        get_object_status=get_status,
        set_object_status=set_status,
        batch_operations=target if batch else None,
        name="bench",
        incremental_round_size=round_size,
    )
    return db, table, target, Reconciler(db, cfg)


def throughput(n: int, per_txn: int, batch: bool, round_size: int) -> float:
    """Objects per second from the first insert until all ``n`` rows are Done.

    The rows are built before the clock starts, one list per transaction, and the writer
    lets go of each list once inserted (as a real writer would): from then on the table
    alone decides how long a row lives.
    """
    db, table, _, rec = new_setup(batch, round_size)
    pending = status_pending()
    batches = [[Row(i, i, pending) for i in range(s, min(n, s + per_txn))]
               for s in range(0, n, per_txn)]
    batches.reverse()
    with start_blocking_portal("asyncio") as portal:
        future, _ = portal.start_task(rec.run)
        start = time.perf_counter()
        _load(db, table, batches)
        last = table.revision(db.read_txn())
        retrying = portal.call(rec.wait_until_reconciled, last, 600.0)
        elapsed = time.perf_counter() - start
        future.cancel()
    assert retrying == 0
    txn = db.read_txn()
    not_done = sum(1 for r in table.all(txn) if r.status.kind.value != "Done")
    assert not_done == 0, f"{not_done} rows not Done"
    return n / elapsed


def _load(db: DB, table: Table[Row], batches: list[list[Row]]) -> None:
    """Insert the batches (last first), one write transaction each.

    A function of its own so that the writer does not keep its last transaction: a
    committed `WriteTxn` is a snapshot at its commit, and one held in the caller's frame
    would keep every row version it sees (all the Pending rows) for the whole run, as any
    long-held snapshot does.
    """
    while batches:
        with db.write_txn(table) as w:
            table.insert_many(w, batches.pop())


def _percentiles(lat: list[float]) -> tuple[float, float]:
    lat = sorted(lat)
    return statistics.median(lat), lat[min(len(lat) - 1, int(len(lat) * 0.99))]


def _loaded_setup(n_rows: int) -> tuple[DB, Table[Row], NoopTarget, Reconciler[Row]]:
    db, table, target, rec = new_setup(False, 1000)
    pending = status_pending()
    with db.write_txn(table) as w:
        for i in range(n_rows):
            table.insert(w, Row(i, i, pending))
    return db, table, target, rec


def single_change_latency(n_rows: int, samples: int) -> tuple[float, float]:
    """p50/p99 microseconds from a one-row commit to its update() call, the writer being
    another task on the reconciler's event loop (how agent components share a loop)."""
    db, table, target, rec = _loaded_setup(n_rows)
    lat: list[float] = []

    async def measure() -> None:
        async with anyio.create_task_group() as tg:
            await tg.start(rec.run)
            await rec.wait_until_reconciled(table.revision(db.read_txn()))
            for k in range(samples):
                seen = anyio.Event()
                target.on_seen = seen.set
                target.watch_id = row_id = k % n_rows
                w = db.write_txn(table)
                table.insert(w, Row(row_id, k, status_pending()))
                t0 = time.perf_counter()
                rev = table.revision(w.commit())
                with anyio.fail_after(10):
                    await seen.wait()
                lat.append((target.seen_at - t0) * 1e6)
                await rec.wait_until_reconciled(rev, 10.0)
                await anyio.sleep(0.005)  # isolated changes, ~200/s
            tg.cancel_scope.cancel()

    anyio.run(measure)
    return _percentiles(lat)


def single_change_latency_cross_thread(n_rows: int, samples: int) -> tuple[float, float]:
    """Like `single_change_latency`, but the writer is a plain thread: adds the event loop's
    cross-thread wake-up (call_soon_threadsafe and the GIL hand-over)."""
    db, table, target, rec = _loaded_setup(n_rows)
    lat: list[float] = []
    seen = threading.Event()
    target.on_seen = seen.set
    with start_blocking_portal("asyncio") as portal:
        future, _ = portal.start_task(rec.run)
        portal.call(rec.wait_until_reconciled, table.revision(db.read_txn()), 600.0)
        for k in range(samples):
            seen.clear()
            target.watch_id = row_id = k % n_rows
            w = db.write_txn(table)
            table.insert(w, Row(row_id, k, status_pending()))
            t0 = time.perf_counter()
            rev = table.revision(w.commit())
            if not seen.wait(10.0):
                raise RuntimeError(f"update of row {row_id} not seen within 10s")
            lat.append((target.seen_at - t0) * 1e6)
            portal.call(rec.wait_until_reconciled, rev, 10.0)
            time.sleep(0.005)
        future.cancel()
    return _percentiles(lat)


# Keys describing the run rather than measuring it: not repeated per collector configuration.
_META = ("rows", "latency_rows", "latency_samples", "quick")


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Every figure once, in this process, with the collector configuration in force.

    Between the runs (outside what is timed) a full collection frees the previous run's
    database: a DB and its tables reference each other, so only the cyclic collector frees
    them, and without it ``peak_mem_mb`` would add up the runs instead of showing one.
    """
    n = args.rows or (200_000 if args.quick else 1_000_000)
    samples = 300 if args.quick else 2000
    latency_rows = 100_000
    result: dict[str, Any] = {
        "objects_per_s": round(throughput(n, args.per_txn, False, args.round_size)),
    }
    gc.collect()
    result["objects_per_s_batch"] = round(throughput(n, args.per_txn, True, args.round_size))
    gc.collect()
    p50, p99 = single_change_latency(latency_rows, samples)
    result["single_change_p50_us"] = round(p50, 1)
    result["single_change_p99_us"] = round(p99, 1)
    gc.collect()
    p50, p99 = single_change_latency_cross_thread(latency_rows, samples)
    result["single_change_cross_thread_p50_us"] = round(p50, 1)
    result["single_change_cross_thread_p99_us"] = round(p99, 1)
    result["peak_mem_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    return result


def _child(argv: list[str], collector: str) -> dict[str, Any]:
    """Run this script with ``--collector collector`` in a new process; return its figures."""
    out = subprocess.run(
        [sys.executable, __file__, *argv, "--collector", collector],
        check=True, stdout=subprocess.PIPE, text=True,
    ).stdout
    figures: dict[str, Any] = json.loads(out)
    return figures


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the benchmark and print the JSON result."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--quick", action="store_true", help="smaller sizes (under a minute)")
    ap.add_argument("--rows", type=int, default=None, help="rows for the throughput runs")
    ap.add_argument("--per-txn", type=int, default=10_000, help="rows per insert transaction")
    ap.add_argument("--round-size", type=int, default=1000, help="incremental round size")
    ap.add_argument(
        "--collector", choices=("agent", "default"), default=None,
        help="measure one collector configuration in this process: the agent's "
        "(statedb.gc_tuning.tune_gc()) or Python's default (default: both, in child processes)",
    )
    args = ap.parse_args(argv)
    if args.collector is not None:
        if args.collector == "agent":
            tune_gc()
        result = measure(args)
    else:
        argv = sys.argv[1:] if argv is None else argv
        default = _child(argv, "default")
        agent = _child(argv, "agent")
        result = {}
        for key, value in agent.items():
            if key in _META:
                continue
            result[key] = value
            result[f"{key}_default_gc"] = default[key]
    result["rows"] = args.rows or (200_000 if args.quick else 1_000_000)
    result["latency_rows"] = 100_000
    result["latency_samples"] = 300 if args.quick else 2000
    result["quick"] = args.quick
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
