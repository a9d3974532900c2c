"""The refresher's due heap under churn: stale entries (superseded or deleted rows) are
dropped from the heap alone, one entry per live Done row remains."""

from __future__ import annotations

import anyio

from reconciler.config import Config
from reconciler.metrics import ReconcilerMetrics
from reconciler.refresh import Refresher
from reconciler.status import status_done
from statedb import DB

from .helpers import MockOps, TestObject, get_status, new_table, set_status


def test_churned_rows_keep_one_entry_each_and_deleted_rows_none() -> None:
    table = new_table()
    db = DB(table)
    config: Config[TestObject] = Config(
        table=table, operations=MockOps(), get_object_status=get_status,
        set_object_status=set_status, refresh_interval=3600.0,
    )
    refresher = Refresher(db, config, ReconcilerMetrics())

    async def churn() -> None:
        with db.write_txn(table) as w:
            it = table.changes(w)
        try:
            for gen in range(40):  # 60 rows, each written Done 40 times
                with db.write_txn(table) as w:
                    for i in range(60):
                        table.insert(w, TestObject(i, value=str(gen), status=status_done()))
                await refresher._step(it)
                assert len(refresher._due) <= 2 * 60 + 1024 + 60  # compacted as it grows
            with db.write_txn(table) as w:
                for i in range(10):
                    table.delete(w, TestObject(i))
            await refresher._step(it)
            refresher._compact()
        finally:
            it.close()

    anyio.run(churn)
    keys = sorted(e[2] for e in refresher._due)
    live = sorted(table.primary_key_of(o) for o in table.all(db.read_txn()))
    assert keys == live  # one entry per live row, none for the deleted ones
    revisions = {table.primary_key_of(o): rev for o, rev in table.revisions(db.read_txn())}
    assert all(e[3] == revisions[e[2]] for e in refresher._due)  # each its newest revision
