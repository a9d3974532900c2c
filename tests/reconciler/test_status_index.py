"""The status index (rows by status kind, queried and watched), `wait_for_status`, and
`Reconciler.health_watch` (closes when health or the retry queue changes), waited on
from asyncio and trio tasks and from a thread."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field, replace

import anyio
import pytest

from reconciler import (
    Config,
    Level,
    Reconciler,
    Status,
    StatusKind,
    UnknownStatusKindError,
    rows_with_status,
    status_done,
    status_error,
    status_index,
    status_pending,
    wait_for_status,
)
from reconciler.status_index import encode_status_kind, parse_status_kind
from statedb import DB, Index, ReadTxn, Table
from statedb.keys import KeyTypeError

BACKENDS = ["asyncio", "trio"]
WAIT_S = 15.0  # a bound against hangs on a loaded machine, not a timing requirement


@dataclass(frozen=True)
class Row:
    name: str
    value: int = 0
    status: Status = field(default_factory=status_pending)


def get_status(r: Row) -> Status:
    return r.status


def set_status(r: Row, s: Status) -> Row:
    return replace(r, status=s)


BY_NAME = Index[Row, str]("name", key=lambda r: r.name)
BY_STATUS = status_index(get_status)


class BreakableOps:
    """A dict target whose updates of the names in ``broken`` fail."""

    def __init__(self) -> None:
        self.broken: set[str] = set()
        self.applied: dict[str, int] = {}

    def update(self, txn: ReadTxn, revision: int, obj: Row) -> None:
        if obj.name in self.broken:
            raise RuntimeError(f"{obj.name} is broken")
        self.applied[obj.name] = obj.value

    def delete(self, txn: ReadTxn, revision: int, obj: Row) -> None:
        self.applied.pop(obj.name, None)

    def prune(self, txn: ReadTxn, objects: Iterator[Row]) -> None:
        keep = {o.name for o in objects}
        for name in set(self.applied) - keep:
            del self.applied[name]


def _setup() -> tuple[DB, Table[Row, str], BreakableOps, Reconciler[Row]]:
    table = Table("rows", BY_NAME, BY_STATUS)
    db = DB(table)
    ops = BreakableOps()
    rec = Reconciler(db, Config(table, ops, get_status, set_status,
                                retry_min_backoff=0.001, retry_max_backoff=0.01))
    return db, table, ops, rec


def _names(rows: Iterator[Row] | list[Row]) -> list[str]:
    return [r.name for r in rows]


# ----- the index itself ------------------------------------------------------------------
def test_rows_by_status_kind_in_primary_key_order() -> None:
    table = Table("rows", BY_NAME, BY_STATUS)
    db = DB(table)
    with db.write_txn(table) as txn:
        table.insert(txn, Row("c", status=status_error("boom")))
        table.insert(txn, Row("a"))
        table.insert(txn, Row("b", status=status_done()))
        table.insert(txn, Row("d", status=status_error("bang")))
    txn = db.read_txn()
    assert _names(table.list(txn, BY_STATUS.query(StatusKind.ERROR))) == ["c", "d"]
    assert _names(table.list(txn, BY_STATUS.query(StatusKind.PENDING))) == ["a"]
    assert _names(table.list(txn, BY_STATUS.query(StatusKind.REFRESHING))) == []
    # The command line's form: a kind as text, in any case.
    assert _names(table.list(txn, BY_STATUS.query_str("done"))) == ["b"]
    assert BY_STATUS.name == "status" and not BY_STATUS.unique
    rows, _ = rows_with_status(db, table, BY_STATUS, [StatusKind.PENDING, StatusKind.ERROR])
    assert _names(rows) == ["a", "c", "d"]


def test_bad_kinds_are_refused_clearly() -> None:
    assert parse_status_kind("ERROR") is StatusKind.ERROR
    assert parse_status_kind(" Pending ") is StatusKind.PENDING
    with pytest.raises(UnknownStatusKindError, match=r"unknown status kind 'Failed'.*Pending"):
        parse_status_kind("Failed")
    with pytest.raises(KeyTypeError, match="status_kind takes StatusKind, got str"):
        encode_status_kind("Error")  # type: ignore[arg-type]
    assert encode_status_kind(StatusKind.DONE) == b"Done"


def test_one_index_per_reconciler_by_name() -> None:
    idx = status_index(get_status, name="status-maps")
    assert idx.name == "status-maps"
    table = Table("rows", BY_NAME, BY_STATUS, idx)
    db = DB(table)
    with db.write_txn(table) as txn:
        table.insert(txn, Row("a"))
    assert _names(table.list(db.read_txn(), idx.query(StatusKind.PENDING))) == ["a"]


# ----- with a reconciler -----------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
def test_watch_error_rows_until_they_are_repaired(backend: str) -> None:
    """A task watches the Error rows through the index; the set shrinks to empty once the
    target is repaired, and `wait_for_status` returns then."""
    db, table, ops, rec = _setup()
    ops.broken = {"r1", "r3"}
    seen: list[list[str]] = []

    async def watcher() -> None:
        while True:
            rows, watch = table.list_watch(db.read_txn(), BY_STATUS.query(StatusKind.ERROR))
            names = _names(rows)
            if not seen or seen[-1] != names:
                seen.append(names)
            if names == ["r1", "r3"]:
                ops.broken.clear()  # repair: the retries succeed
            if seen[-1] == [] and len(seen) > 1:
                return
            await watch.wait_async()

    async def main() -> None:
        with anyio.fail_after(WAIT_S):
            async with anyio.create_task_group() as tg:
                await tg.start(rec.run)
                tg.start_soon(watcher)
                with db.write_txn(table) as txn:
                    for i in range(5):
                        table.insert(txn, Row(f"r{i}", i))
                await wait_for_status(db, table, BY_STATUS, timeout=WAIT_S)
                await rec.wait_until_done(timeout=WAIT_S)
                tg.cancel_scope.cancel()

    anyio.run(main, backend=backend)
    assert ["r1", "r3"] in seen and seen[-1] == []
    assert ops.applied == {f"r{i}": i for i in range(5)}


def test_wait_for_status_times_out_naming_what_is_left() -> None:
    db, table, ops, rec = _setup()
    ops.broken = {"stuck"}

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            await tg.start(rec.run)
            with db.write_txn(table) as txn:
                table.insert(txn, Row("stuck"))
            with pytest.raises(TimeoutError, match=r"1 row\(s\) still Pending, Refreshing, "
                                                   r"Error after 0\.3 s"):
                await wait_for_status(db, table, BY_STATUS, timeout=0.3)
            tg.cancel_scope.cancel()

    anyio.run(main)


# ----- health watch ----------------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
def test_health_watch_follows_degraded_and_recovered(backend: str) -> None:
    """An asyncio (or trio) task follows health through the watch alone: OK, Degraded
    while a row fails, OK again after the repair."""
    db, table, ops, rec = _setup()
    ops.broken = {"bad"}
    levels: list[Level] = []

    async def follower() -> None:
        while True:
            watch = rec.health_watch()  # first the watch, then the state it covers
            level = rec.health.level
            if not levels or levels[-1] is not level:
                levels.append(level)
            if level is Level.DEGRADED:
                ops.broken.clear()
            if levels[-1] is Level.OK and Level.DEGRADED in levels:
                return
            await watch.wait_async()

    async def main() -> None:
        with anyio.fail_after(WAIT_S):
            async with anyio.create_task_group() as tg:
                await tg.start(rec.run)
                with db.write_txn(table) as txn:
                    table.insert(txn, Row("good"))
                    table.insert(txn, Row("bad"))
                await follower()
                await rec.wait_until_done(timeout=WAIT_S)
                tg.cancel_scope.cancel()

    anyio.run(main, backend=backend)
    assert levels[-2:] == [Level.DEGRADED, Level.OK]


def test_health_watch_stays_open_while_nothing_changes() -> None:
    """A round that changes neither health nor the retry queue (a row rewritten in place,
    same count) does not close the watch; a retry re-queued with health unchanged does."""
    db, table, ops, rec = _setup()

    async def main() -> None:
        with anyio.fail_after(WAIT_S):
            async with anyio.create_task_group() as tg:
                await tg.start(rec.run)
                with db.write_txn(table) as txn:
                    table.insert(txn, Row("a", 1))
                await rec.wait_until_done(timeout=WAIT_S)
                watch = rec.health_watch()
                health = rec.health
                with db.write_txn(table) as txn:
                    table.insert(txn, Row("a", 2))
                    revision = table.revision(txn)
                await rec.wait_until_reconciled(revision, timeout=WAIT_S)
                await rec.wait_until_done(timeout=WAIT_S)
                assert ops.applied == {"a": 2}
                assert rec.health == health and not watch.closed
                # Always failing: every retry re-queues the same error, health stays the
                # same Degraded report, and the queue's changes still close the watch.
                ops.broken = {"a"}
                with db.write_txn(table) as txn:
                    table.insert(txn, Row("a", 3))
                while rec.health.level is not Level.DEGRADED:
                    await rec.health_watch().wait_async()
                degraded = rec.health
                watch = rec.health_watch()
                changes = rec.retries.changes
                await watch.wait_async()
                assert rec.retries.changes > changes
                assert rec.health == degraded
                tg.cancel_scope.cancel()

    anyio.run(main)


def test_health_watch_from_a_thread_closes_when_the_reconciler_stops() -> None:
    db, table, _, rec = _setup()
    woke = threading.Event()

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            await tg.start(rec.run)
            with db.write_txn(table) as txn:
                table.insert(txn, Row("a"))
            await rec.wait_until_done(timeout=WAIT_S)
            watch = rec.health_watch()

            def wait_in_thread() -> None:
                if watch.wait(WAIT_S):
                    woke.set()

            thread = threading.Thread(target=wait_in_thread)
            thread.start()
            tg.cancel_scope.cancel()
        await anyio.to_thread.run_sync(thread.join, WAIT_S)

    anyio.run(main)
    assert woke.is_set()
    assert rec.health.level is Level.STOPPED
