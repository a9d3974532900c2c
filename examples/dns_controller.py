"""Example: a DNS-records controller on statedb and the reconciler, with a SQLite target.

What it shows, in the order a controller needs it:

* a statedb table of DNS records with a primary index (the record's name) and a non-unique
  secondary index (its zone), queried by zone;
* a target that is slow and fails now and then: a SQLite database (stdlib ``sqlite3``,
  reached from worker threads) whose writes fail at random with "database is locked", as a
  busy shared database does; the reconciler retries them with backoff;
* prune at start: the database holds a record a previous run left behind; the table has an
  initializer ("zone file loaded"), and the first prune runs only once the table is
  initialized, so nothing the zone file is about to load gets dropped (a prune that fails
  is tried again after ``prune_interval``);
* waiting for full convergence: ``reconciler.testing.wait_until_done`` returns when every
  record is Done, no update *or delete* retry is pending and health is OK
  (``wait_until_reconciled`` alone returns once every change was attempted);
* a watch from an asyncio task: it follows the records of one zone and keeps the latest
  count of records done.

Needs only ``pip install statewright`` (no extras). Run::

    python examples/dns_controller.py [--db PATH] [--failure-rate 0.3] [--seed 1]

It prints the database's records, the health, how many failures were retried and what the
watch saw, and exits non-zero if the database does not match the table.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import random
import sqlite3
import sys
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import anyio.to_thread

from reconciler import Config, Reconciler, Status, StatusKind, status_pending
from reconciler.testing import wait_until_done
from statedb import DB, Index, ReadTxn, Table


@dataclass(frozen=True, slots=True)
class Record:
    """A DNS record the controller wants in the database, and its reconciliation status."""

    name: str  # fully qualified name, the primary key
    zone: str
    type: str  # "A", "AAAA", "CNAME", ...
    value: str
    ttl: int = 300
    status: Status = field(default_factory=status_pending)


BY_NAME: Index[Record, str] = Index("name", key=lambda r: r.name)
BY_ZONE: Index[Record, str] = Index("zone", key=lambda r: r.zone, unique=False)


def new_table() -> Table[Record, str]:
    """The records table: unique by name, queried by zone."""
    return Table("dns-records", BY_NAME, BY_ZONE)


def get_status(r: Record) -> Status:
    """The reconciler reads a record's status here."""
    return r.status


def set_status(r: Record, s: Status) -> Record:
    """The reconciler writes a status back as a new row (rows are immutable)."""
    return dataclasses.replace(r, status=s)


class SQLiteTarget:
    """The target: table ``records(name PRIMARY KEY, type, value, ttl)`` in a SQLite file.

    Every operation runs in a worker thread (``anyio.to_thread``), so the event loop never
    waits for the disk. With ``failure_rate`` > 0, each write first fails with that
    probability (seeded), as "database is locked" does on a busy database; the reconciler
    retries it. ``failures`` counts them.
    """

    def __init__(self, path: str, failure_rate: float = 0.0, seed: int = 0) -> None:
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS records "
            "(name TEXT PRIMARY KEY, type TEXT NOT NULL, value TEXT NOT NULL, ttl INTEGER)"
        )
        self._lock = threading.Lock()  # one connection, used from several worker threads
        self._rng = random.Random(seed)
        self.failure_rate = failure_rate
        self.failures = 0

    def _write(self, sql: str, *params: object) -> None:
        with self._lock:
            if self.failure_rate and self._rng.random() < self.failure_rate:
                self.failures += 1
                raise sqlite3.OperationalError("database is locked")
            self._db.execute(sql, params)

    def upsert(self, r: Record) -> None:
        """Insert or replace the record (blocking; `update` runs it in a worker thread)."""
        self._write(
            "INSERT OR REPLACE INTO records (name, type, value, ttl) VALUES (?, ?, ?, ?)",
            r.name, r.type, r.value, r.ttl,
        )

    async def update(self, txn: ReadTxn, revision: int, r: Record) -> None:
        """Insert or replace the record (idempotent)."""
        await anyio.to_thread.run_sync(self.upsert, r)

    async def delete(self, txn: ReadTxn, revision: int, r: Record) -> None:
        """Remove the record (absent is fine)."""
        await anyio.to_thread.run_sync(self._write, "DELETE FROM records WHERE name = ?", r.name)

    async def prune(self, txn: ReadTxn, records: Iterator[Record]) -> None:
        """Remove every record of the database that no row of the table has."""
        wanted = sorted(r.name for r in records)  # read the snapshot on the event loop
        await anyio.to_thread.run_sync(self._prune, wanted)

    def _prune(self, wanted: list[str]) -> None:
        with self._lock:
            if self.failure_rate and self._rng.random() < self.failure_rate:
                self.failures += 1
                raise sqlite3.OperationalError("database is locked")
            stored = [n for (n,) in self._db.execute("SELECT name FROM records")]
            keep = set(wanted)
            for name in stored:
                if name not in keep:
                    self._db.execute("DELETE FROM records WHERE name = ?", (name,))

    def records(self) -> dict[str, tuple[str, str, int]]:
        """What the database holds: name -> (type, value, ttl)."""
        with self._lock:
            rows = self._db.execute("SELECT name, type, value, ttl FROM records ORDER BY name")
            return {name: (typ, value, ttl) for name, typ, value, ttl in rows}

    def close(self) -> None:
        """Close the connection."""
        with self._lock:
            self._db.close()


def expected_records(rows: list[Record]) -> dict[str, tuple[str, str, int]]:
    """What the database should hold for these rows (the model the example checks)."""
    return {r.name: (r.type, r.value, r.ttl) for r in rows}


async def watch_zone(db: DB, table: Table[Record], zone: str, seen: list[str]) -> None:
    """Follow the records of ``zone`` (an asyncio task): after every change, note how many
    of them are Done. A watch closes when the query's result may have changed."""
    while True:
        rows, watch = table.list_watch(db.read_txn(), BY_ZONE.query(zone))
        records = list(rows)
        done = sum(1 for r in records if r.status.kind is StatusKind.DONE)
        seen.append(f"{zone}: {done}/{len(records)} record(s) Done")
        await watch.wait_async()


ZONE_FILE = [
    Record("www.example.org", "example.org", "A", "192.0.2.10"),
    Record("api.example.org", "example.org", "A", "192.0.2.11"),
    Record("mail.example.org", "example.org", "CNAME", "mx.example.net"),
    Record("www.example.net", "example.net", "AAAA", "2001:db8::10", ttl=60),
]


async def run(db_path: str, failure_rate: float = 0.3, seed: int = 1) -> bool:
    """Run the controller against the SQLite file ``db_path``; True when it matches."""
    # A record a previous run left behind: prune must remove it.
    leftover = SQLiteTarget(db_path)
    leftover.upsert(Record("old.example.org", "example.org", "A", "192.0.2.99"))
    leftover.close()

    table = new_table()
    db = DB(table)
    with db.write_txn(table) as txn:
        zone_file_loaded = table.register_initializer(txn, "zone-file")
    target = SQLiteTarget(db_path, failure_rate, seed)
    rec = Reconciler(db, Config(
        table, target, get_object_status=get_status, set_object_status=set_status,
        name="dns", retry_min_backoff=0.01, retry_max_backoff=0.2,
        # With an interval, the first prune runs as soon as the table is initialized (prune
        # at start), and a failed prune is tried again one interval later. With the default,
        # None, nothing prunes unless rec.prune() is called, and a failed prune stays failed
        # (health Degraded) until the next call.
        prune_interval=1.0,
    ))
    seen: list[str] = []
    watcher = asyncio.create_task(watch_zone(db, table, "example.org", seen))
    try:
        async with anyio.create_task_group() as tg:
            await tg.start(rec.run)
            # Load the zone file, then declare the table initialized (this releases the prune).
            with db.write_txn(table) as txn:
                for r in ZONE_FILE:
                    table.insert(txn, r)
                zone_file_loaded(txn)
            await wait_until_done(rec, timeout=30)
            # Later changes: one record moves, one goes away.
            with db.write_txn(table) as txn:
                www = table.get(txn, "www.example.org")
                assert www is not None
                table.insert(txn, dataclasses.replace(www, value="192.0.2.20",
                                                      status=status_pending()))
                table.delete(txn, Record("mail.example.org", "", "", ""))
            await wait_until_done(rec, timeout=30)
            snap = db.read_txn()
            zone_rows = list(table.list(snap, BY_ZONE.query("example.org")))
            final = f"example.org: {len(zone_rows)}/{len(zone_rows)} record(s) Done"
            for _ in range(500):  # the watcher runs when the loop gets to it
                if seen and seen[-1] == final:
                    break
                await asyncio.sleep(0.01)
            stored = target.records()
            expected = expected_records(list(table.all(snap)))
            for name, (typ, value, ttl) in stored.items():
                print(f"sqlite: {name} {typ} {value} ttl={ttl}")
            print(f"health: {rec.health}")
            print(f"transient failures retried: {target.failures}")
            print(f"watch (asyncio task) last saw: {seen[-1]}")
            tg.cancel_scope.cancel()
    finally:
        watcher.cancel()
        target.close()
    if stored != expected:
        print(f"MISMATCH: database {stored} != table {expected}", file=sys.stderr)
        return False
    return True


def main(argv: list[str] | None = None) -> int:
    """Parse the options and run the controller once; exit status 0 when it converged."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--db", help="SQLite file (default: a temporary one)")
    parser.add_argument("--failure-rate", type=float, default=0.3)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        path = args.db or str(Path(tmp) / "dns.sqlite")
        ok = asyncio.run(run(path, args.failure_rate, args.seed))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
