"""The reconciler never blocks its event loop on a table lock: while a writer thread holds
the table in a long write transaction, the status commit waits for it in a worker thread
and other tasks of the loop keep running."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field, replace

import anyio

from reconciler import Config, Reconciler, Status, status_pending
from reconciler.testing import MemoryTarget
from statedb import DB, Index, Table


@dataclass(frozen=True)
class Row:
    name: str
    status: Status = field(default_factory=status_pending)


HOLD_S = 0.4


def test_status_commit_waits_for_a_busy_table_off_the_loop() -> None:
    table = Table("rows", Index("name", key=lambda r: r.name))
    db = DB(table)
    target: MemoryTarget[Row, str, Row] = MemoryTarget(key=lambda r: r.name)
    rec = Reconciler(db, Config(table, target, lambda r: r.status,
                                lambda r, s: replace(r, status=s)))
    holding = threading.Event()
    release = threading.Event()

    def writer() -> None:
        # Insert a row, then hold the table while the reconciler wants to commit its status.
        with db.write_txn(table) as txn:
            table.insert(txn, Row("a"))
        with db.write_txn(table):
            holding.set()
            release.wait(3)
            holding.clear()  # still inside: from here on the table is being given back

    ticks_while_held = 0

    async def main() -> None:
        nonlocal ticks_while_held
        async with anyio.create_task_group() as tg:
            await tg.start(rec.run)
            th = threading.Thread(target=writer)
            th.start()
            await anyio.to_thread.run_sync(holding.wait, 10)
            # The reconciler has the change by now or soon; while the table is held its
            # status commit must wait without stopping this loop.
            with anyio.move_on_after(HOLD_S):
                while True:
                    await anyio.sleep(0.005)
                    if holding.is_set():
                        ticks_while_held += 1
            release.set()
            await anyio.to_thread.run_sync(th.join, 10)
            rev = table.revision(db.read_txn())
            await rec.wait_until_reconciled(rev, 10)
            tg.cancel_scope.cancel()

    anyio.run(main)
    # A loop blocked in the lock would run again only after the writer gave up waiting
    # and released the table: no tick would be counted while it was held.
    assert ticks_while_held >= 10, ticks_while_held
    assert target.snapshot() == {"a": Row("a", target.snapshot()["a"].status)}
    row = table.get(db.read_txn(), "a")
    assert row is not None and row.status.kind.name == "DONE"


# A loop blocked on the lock is late by about the writer's whole hold; one that is not,
# by a scheduling delay. The limit tells the two apart even on a machine loaded far past
# its cores; the figures themselves (with a 0.5 s writer: under 100 ms on this machine)
# come from benchmarks/loop_lateness.py.
LATE_LIMIT_S = 0.5
WRITER_HOLD_S = 1.0


class _Lateness:
    """Ticks every 10 ms on the event loop and records the largest delay past a tick."""

    def __init__(self) -> None:
        self.worst = 0.0

    async def run(self) -> None:
        while True:
            before = anyio.current_time()
            await anyio.sleep(0.01)
            self.worst = max(self.worst, anyio.current_time() - before - 0.01)


def _hold_in_thread(db: DB, table: Table[Row], held: threading.Event) -> threading.Thread:
    def writer() -> None:
        with db.write_txn(table):
            held.set()
            time.sleep(WRITER_HOLD_S)

    th = threading.Thread(target=writer)
    th.start()
    return th


def _reconciler(refresh_interval: float | None = None) -> tuple[
    DB, Table[Row], Reconciler[Row], MemoryTarget[Row, str, Row]
]:
    table = Table("rows", Index("name", key=lambda r: r.name))
    db = DB(table)
    target: MemoryTarget[Row, str, Row] = MemoryTarget(key=lambda r: r.name)
    rec = Reconciler(db, Config(table, target, lambda r: r.status,
                                lambda r, s: replace(r, status=s),
                                refresh_interval=refresh_interval))
    return db, table, rec, target


def test_start_waits_for_a_busy_table_off_the_loop() -> None:
    """`tg.start(rec.run)` needs the table once (to start its change stream): while another
    thread holds the table, the loop keeps running."""
    db, table, rec, _ = _reconciler()
    lateness = _Lateness()

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(lateness.run)
            held = threading.Event()
            th = _hold_in_thread(db, table, held)
            await anyio.to_thread.run_sync(held.wait, 10)
            started = anyio.current_time()
            await tg.start(rec.run)
            waited = anyio.current_time() - started
            await anyio.to_thread.run_sync(th.join, 10)
            tg.cancel_scope.cancel()
        assert waited > WRITER_HOLD_S / 2, f"start did not wait for the held table ({waited:.3f} s)"

    anyio.run(main)
    assert lateness.worst < LATE_LIMIT_S, f"loop late by {lateness.worst * 1000:.0f} ms"


def test_refresher_waits_for_a_busy_table_off_the_loop() -> None:
    """The refresher marks due rows Refreshing in a write transaction: while another
    thread holds the table when rows fall due, the loop keeps running."""
    db, table, rec, target = _reconciler(refresh_interval=0.3)
    lateness = _Lateness()

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            with db.write_txn(table) as txn:
                for n in range(20):
                    table.insert(txn, Row(f"r{n}"))
            await tg.start(rec.run)
            await rec.wait_until_done(10)
            tg.start_soon(lateness.run)
            before = rec.metrics.refreshes_total
            held = threading.Event()
            # Rows fall due 0.3 s after they were Done: hold the table across that moment.
            th = _hold_in_thread(db, table, held)
            await anyio.to_thread.run_sync(th.join, 10)
            with anyio.fail_after(10):
                while rec.metrics.refreshes_total == before:
                    await anyio.sleep(0.02)
            tg.cancel_scope.cancel()

    anyio.run(main)
    assert lateness.worst < LATE_LIMIT_S, f"loop late by {lateness.worst * 1000:.0f} ms"
    assert len(target.snapshot()) == 20
