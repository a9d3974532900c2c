"""The reconciler never blocks its event loop on a table lock: while a writer thread holds
the table in a long write transaction, the status commit waits for it in a worker thread
and other tasks of the loop keep running."""

from __future__ import annotations

import threading
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
