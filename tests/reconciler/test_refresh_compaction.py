"""The refresher's due entries under churn: one per live Done row, due an interval after
its newest Done status, in the order the rows became Done; deleted rows and rows no longer
Done have none."""

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
        table=table,
        operations=MockOps(),
        get_object_status=get_status,
        set_object_status=set_status,
        refresh_interval=3600.0,
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
                assert len(refresher._due) == 60  # one entry per row, however often written
            with db.write_txn(table) as w:
                for i in range(10):
                    table.delete(w, TestObject(i))
                for i in (20, 11):  # written Done again, last: at the end, in that order
                    table.insert(w, TestObject(i, value="again", status=status_done()))
                table.insert(w, TestObject(12, value="pending"))  # no longer Done
            await refresher._step(it)
        finally:
            it.close()

    anyio.run(churn)
    keys = list(refresher._due)
    live = {table.primary_key_of(o) for o in table.all(db.read_txn()) if o.value != "pending"}
    assert set(keys) == live  # one entry per live Done row, none for the others
    assert keys[-2:] == [table.primary_key_of(TestObject(20)), table.primary_key_of(TestObject(11))]
    newest = {
        table.primary_key_of(o): o.status.updated_at + 3600.0 for o in table.all(db.read_txn())
    }
    assert all(when == newest[k] for k, when in refresher._due.items())  # the newest status
    dues = list(refresher._due.values())
    assert dues == sorted(dues)  # the order they come due
