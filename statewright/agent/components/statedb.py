"""The statedb component: the agent's database, its health and the ``/tables`` routes."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence
from typing import Any

import anyio
import anyio.to_thread

from statedb import DB, ReadTxn, Table
from statedb.gc_tuning import (
    DEFAULT_COLLECT_INTERVAL,
    DEFAULT_RECLAIM_BYTES,
    collect_periodically,
    collector_tuned,
)
from statedb.show import FORMATS, show_table, to_plain
from statewright.api_types import (
    JSON,
    NDJSON,
    TEXT,
    ApiError,
    NdjsonStream,
    QueryParam,
    Request,
    Route,
    TextBody,
)
from statewright.component import DEGRADED, OK, Component, Health, Hive, Provided


def row_document(row: Any) -> Any:
    """A row as JSON-ready data (its ``to_json()`` when it has one), as ``db show -o json``."""
    fn = getattr(row, "to_json", None)
    return to_plain(fn() if fn is not None else row)


TABLES_SCHEMA = {
    "type": "array",
    "items": {
        "type": "object",
        "required": ["name", "rows", "revision", "initialized", "pending"],
        "properties": {
            "name": {"type": "string"},
            "rows": {"type": "integer", "minimum": 0},
            "revision": {"type": "integer", "minimum": 0},
            "initialized": {"type": "boolean"},
            "pending": {"type": "array", "items": {"type": "string"}},
        },
    },
}


#: The agent's database, for every component that registers or reads tables.
DATABASE: Provided[DB] = Provided("db", DB)


#: How far (in revisions) a table's oldest live snapshot may lag behind the table before
#: health reports it: at least this many, and at least four times the rows (a reader that
#: walks a large table while writers go on is not a leak).
HELD_SNAPSHOT_LAG = 100_000


def held_snapshots(db: DB, txn: ReadTxn) -> list[str]:
    """One line per table whose oldest live snapshot lags far behind its revision.

    Such a snapshot is a ReadTxn (or WriteTxn) some code keeps referenced, typically in a
    coroutine's local variable across an await; it holds every table's state of that
    moment, so statedb keeps the row versions written since (docs/statedb.md, "Holding a
    transaction"). The line names the table, the lag and what it keeps."""
    out = []
    for table in db.tables:
        r = table.retention(txn)
        lag = r["revision"] - r["oldest_snapshot"]
        if lag > max(HELD_SNAPSHOT_LAG, 4 * r["rows"]):
            out.append(
                f"table {table.name}: a snapshot at revision {r['oldest_snapshot']} is held "
                f"{lag} revisions behind ({r['older_versions']} keys with older versions, "
                f"{r['log_records']} log records for {r['rows']} rows)"
            )
    return out


class StateDBComponent(Component):
    """Provides ``db``; healthy when every table's initializers are done.

    In a process that tuned its garbage collector (`statedb.gc_tuning.tune_gc`, which
    ``statewright agent`` calls at start), it also runs the periodic full collection
    that frees reference cycles among frozen objects (`collect_periodically`): every
    ``collect_interval`` seconds a forked child counts them, and once they reach
    ``reclaim_bytes`` a full collection reclaims them. In-process agents (tests,
    embedding) leave the collector as they found it unless given an interval.
    """

    name = "statedb"
    provides = (DATABASE,)

    def __init__(self, collect_interval: float | None = None,
                 reclaim_bytes: int = DEFAULT_RECLAIM_BYTES) -> None:
        self.db = DB()
        #: Seconds between two checks for cyclic garbage among frozen objects; None: the
        #: default interval when the process tuned its collector by the time the
        #: component starts, else none.
        self.collect_interval = collect_interval
        #: Cyclic garbage (bytes) from which a check reclaims it with a full collection
        #: (0: whenever there is any); see `statedb.gc_tuning.collect_periodically`.
        self.reclaim_bytes = reclaim_bytes

    async def start(self, hive: Hive) -> None:
        """Publish the database; start the periodic collection when configured."""
        hive.provide(self, DATABASE, self.db)
        interval = self.collect_interval
        if interval is None and collector_tuned():
            interval = DEFAULT_COLLECT_INTERVAL
        if interval is not None:

            async def collect(*, task_status: Any) -> None:
                await collect_periodically(interval, reclaim_bytes=self.reclaim_bytes,
                                           task_status=task_status)

            await hive.spawn(self, collect, label="gc-collect")

    def health(self) -> list[Health]:
        """Degraded while some table waits for an initializer (names them), and while some
        table's oldest live snapshot is far behind it (`held_snapshots`)."""
        txn = self.db.read_txn()
        pending = {t.name: p for t in self.db.tables if (p := t.pending_initializers(txn))}
        out = []
        if pending:
            out.append(Health(self.name, DEGRADED, "tables waiting for " + json.dumps(pending)))
        held = held_snapshots(self.db, txn)
        if held:
            out.append(Health(f"{self.name}/snapshots", DEGRADED, "; ".join(held)))
        return out or [Health(self.name, OK, f"{len(self.db.tables)} tables initialized")]

    def routes(self) -> Sequence[Route]:
        """``/tables``, ``/tables/{name}``, ``/tables/{name}/changes``."""
        table = {"name": "the table's name"}
        missing = {404: "no such table"}
        return (
            Route("/tables", self._tables, summary="every table and its state",
                  response=TABLES_SCHEMA),
            Route("/tables/{name}", self._table, summary="a table's rows", params=table,
                  query=(QueryParam("format", {"type": "string", "enum": list(FORMATS)},
                                    "json (default) or a text form of `db show`"),),
                  response={"type": "array", "items": {"type": "object"}},
                  media_types=(JSON, TEXT), errors=missing),
            Route("/tables/{name}/changes", self._changes, params=table,
                  summary="the table's changes, newline-delimited JSON (one "
                          "{revision, deleted, object} per line)",
                  query=(QueryParam("follow", {"type": "string",
                                               "enum": ["0", "1", "false", "true"]},
                                    "1 (default): wait for further changes; 0: stop after "
                                    "the current rows"),),
                  media_types=(NDJSON,), errors=missing),
        )

    def _lookup(self, name: str) -> Table[Any]:
        for t in self.db.tables:
            if t.name == name:
                return t
        names = ", ".join(t.name for t in self.db.tables)
        raise ApiError(404, f"no table {name!r} (tables: {names})")

    async def _tables(self, req: Request) -> Any:
        txn = self.db.read_txn()
        out = []
        for t in self.db.tables:
            init, _ = t.initialized(txn)
            out.append({"name": t.name, "rows": t.count(txn), "revision": t.revision(txn),
                        "initialized": init, "pending": t.pending_initializers(txn)})
        return out

    async def _table(self, req: Request) -> Any:
        name = req.params["name"]
        table = self._lookup(name)
        fmt = req.query.get("format", "json")
        if fmt not in FORMATS:
            raise ApiError(400, f"unknown format {fmt!r}; use one of: {', '.join(FORMATS)}")
        # In a worker thread (statedb snapshots may be read from any thread): converting
        # 200 frontends takes about 25 ms, which the event loop spends serving /health
        # and the other requests meanwhile (benchmarks/api.py).
        if fmt == "json":
            txn = self.db.read_txn()
            return await anyio.to_thread.run_sync(
                lambda: [row_document(r) for r in table.all(txn)])
        return TextBody(await anyio.to_thread.run_sync(show_table, self.db, name, fmt))

    async def _changes(self, req: Request) -> Any:
        table = self._lookup(req.params["name"])
        follow = req.query.get("follow", "1") not in ("0", "false")
        db = self.db

        async def lines() -> AsyncIterator[str]:
            with db.write_txn(table) as wtxn:
                it = table.changes(wtxn)
            # A client may follow for days: a held transaction would keep every table's
            # old row versions that long.
            del wtxn
            try:
                while True:
                    changes, watch = it.next(db.read_txn())
                    for c in changes:
                        yield json.dumps({"revision": c.revision, "deleted": c.deleted,
                                          "object": row_document(c.obj)}) + "\n"
                    if not follow:
                        return
                    await watch.wait_async()
            finally:
                it.close()

        return NdjsonStream(lines)
