"""Event-loop lateness of a reconciler against a writer thread: prints one JSON object.

A task on the reconciler's event loop ticks every 10 ms; the figure is the largest delay
of a tick past its time (ms). Each place where the reconciler needs the table's lock is
measured while another thread holds the table for 0.5 s, beside a baseline with no
writer in the same run:

- start_ms: ``await tg.start(rec.run)`` (the change stream is opened in a write txn);
- refresh_ms: the refresher marking due rows Refreshing (``refresh_interval=0.3``);
- status_commit_ms: the status write-back of a round;
- baseline_ms: the same loop with the reconciler idle and no writer.

A loop blocked on the lock would be late by about the 0.5 s hold; the new-user check of
issue 27 wants each figure under 100 ms. ``--runs N`` repeats each and reports the worst.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import anyio
import anyio.abc

from reconciler import Config, Reconciler, Status, status_pending
from reconciler.testing import MemoryTarget
from statedb import DB, Index, Table

HOLD_S = 0.5
TICK_S = 0.01


@dataclass(frozen=True)
class Row:
    name: str
    status: Status = field(default_factory=status_pending)


class Setup:
    """One table, one reconciler into a memory target, and the loop-lateness ticker."""

    def __init__(self, refresh_interval: float | None = None) -> None:
        self.table: Table[Row] = Table("rows", Index("name", key=lambda r: r.name))
        self.db = DB(self.table)
        target: MemoryTarget[Row, str, Row] = MemoryTarget(key=lambda r: r.name)
        self.rec = Reconciler(self.db, Config(
            self.table, target, lambda r: r.status, lambda r, s: replace(r, status=s),
            refresh_interval=refresh_interval))
        self.worst = 0.0

    async def tick(self) -> None:
        while True:
            before = anyio.current_time()
            await anyio.sleep(TICK_S)
            self.worst = max(self.worst, anyio.current_time() - before - TICK_S)

    def insert(self, n: int) -> None:
        with self.db.write_txn(self.table) as txn:
            for i in range(n):
                self.table.insert(txn, Row(f"r{i}"))

    async def hold(self, during: Callable[[], Awaitable[None]] | None = None) -> None:
        """Hold the table in another thread for HOLD_S, running ``during`` meanwhile."""
        held = threading.Event()

        def writer() -> None:
            with self.db.write_txn(self.table):
                held.set()
                time.sleep(HOLD_S)

        th = threading.Thread(target=writer)
        th.start()
        await anyio.to_thread.run_sync(held.wait, 10)
        if during is not None:
            await during()
        await anyio.to_thread.run_sync(th.join, 10)


async def _start(tg: anyio.abc.TaskGroup, s: Setup) -> None:
    async def start() -> None:
        await tg.start(s.rec.run)
    await s.hold(start)


async def _refresh(tg: anyio.abc.TaskGroup, s: Setup) -> None:
    s.insert(20)
    await tg.start(s.rec.run)
    await s.rec.wait_until_done(10)
    before = s.rec.metrics.refreshes_total
    s.worst = 0.0
    await s.hold()
    with anyio.fail_after(10):
        while s.rec.metrics.refreshes_total == before:
            await anyio.sleep(0.02)


async def _status_commit(tg: anyio.abc.TaskGroup, s: Setup) -> None:
    await tg.start(s.rec.run)
    s.insert(1)  # read by the next round, whose status commit may meet the held table
    await s.hold()
    await s.rec.wait_until_done(10)


async def _baseline(tg: anyio.abc.TaskGroup, s: Setup) -> None:
    await tg.start(s.rec.run)
    await anyio.sleep(HOLD_S)


def measure(scenario: Callable[[anyio.abc.TaskGroup, Setup], Awaitable[None]],
            refresh_interval: float | None = None) -> float:
    """Run one scenario in a fresh loop; return the worst lateness in ms."""
    s = Setup(refresh_interval)

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(s.tick)
            await anyio.sleep(TICK_S * 2)
            await scenario(tg, s)
            tg.cancel_scope.cancel()

    anyio.run(main)
    return round(s.worst * 1000, 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="runs per figure (worst kept)")
    args = parser.parse_args()
    out = {
        "start_ms": max(measure(_start) for _ in range(args.runs)),
        "refresh_ms": max(measure(_refresh, 0.3) for _ in range(args.runs)),
        "status_commit_ms": max(measure(_status_commit) for _ in range(args.runs)),
        "baseline_ms": max(measure(_baseline) for _ in range(args.runs)),
        "writer_hold_ms": HOLD_S * 1000,
        "runs": args.runs,
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
