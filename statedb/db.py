"""The database: a set of registered tables and the current root snapshot of all of them."""

from __future__ import annotations

import threading
from typing import Any

import anyio

from statedb.errors import (
    DuplicateTableError,
    TableNotRegisteredError,
    TableRegisteredElsewhereError,
)
from statedb.metrics import DBMetrics
from statedb.table import Table
from statedb.table_state import TableState
from statedb.txn import LocksBusy, ReadTxn, WriteTxn
from statedb.versions import VersionStore


class DB:
    """An in-memory database of tables with snapshot reads and multi-table write transactions."""

    def __init__(self, *tables: Table[Any]) -> None:
        self.root: dict[str, TableState] = {}
        self.commit_lock = threading.Lock()
        self.metrics = DBMetrics()
        #: Thread id -> the table names of that thread's open write transaction: a
        #: thread holds at most one (`NestedWriteTxnError`), so no two writers deadlock.
        self.writers: dict[int, list[str]] = {}
        self._tables: dict[str, Table[Any]] = {}
        self.register(*tables)

    def register(self, *tables: Table[Any]) -> None:
        """Register tables; their position fixes the global lock order. A table belongs to
        one DB: registering it with a second raises `TableRegisteredElsewhereError`."""
        with self.commit_lock:
            root = dict(self.root)
            for t in tables:
                if t.name in self._tables:
                    raise DuplicateTableError(t.name)
                if t.db is not None:
                    raise TableRegisteredElsewhereError(t.name)
                t.db = self
                t.lock_order = len(self._tables)
                self._tables[t.name] = t
                st = TableState(
                    VersionStore(), [VersionStore() if i.unique else None for i in t.secondary]
                )
                t.snapshots.track(st)
                root[t.name] = st
            self.root = root

    @property
    def tables(self) -> list[Table[Any]]:
        """The registered tables in registration order."""
        return list(self._tables.values())

    def table(self, name: str) -> Table[Any]:
        """Return the registered table called ``name``."""
        t = self._tables.get(name)
        if t is None:
            raise TableNotRegisteredError(name)
        return t

    def read_txn(self) -> ReadTxn:
        """Return a snapshot of every table (O(1); never blocks)."""
        return ReadTxn(self, self.root)

    def write_txn(self, *tables: Table[Any]) -> WriteTxn:
        """Lock ``tables`` (in the global order) and return a write transaction over them."""
        return WriteTxn(self, self._lock_order(tables))

    def try_write_txn(self, *tables: Table[Any]) -> WriteTxn | None:
        """`write_txn` without waiting: None when another transaction holds one of
        ``tables`` (nothing is left locked then). An event loop uses it to write without
        blocking: on None it waits for the tables elsewhere (e.g. `wait_unlocked` in a
        worker thread) and tries again."""
        ordered = self._lock_order(tables)
        try:
            return WriteTxn(self, ordered, blocking=False)
        except LocksBusy:
            return None

    def _lock_order(self, tables: tuple[Table[Any], ...]) -> list[Table[Any]]:
        """``tables`` without repeats, in the global lock order; raise for a table of
        another DB."""
        for t in tables:
            if t.db is not self:
                raise TableNotRegisteredError(t.name)
        if len(tables) == 1:
            return list(tables)  # the common case: one table, nothing to sort
        return sorted(set(tables), key=_lock_order_of)

    async def write_txn_async(self, *tables: Table[Any]) -> WriteTxn:
        """`write_txn` for an event loop (anyio: asyncio or trio): while another thread
        holds one of ``tables``, wait for it in a worker thread, so the loop's other tasks
        keep running; then take them all at once. Use the transaction at once, with no
        ``await`` before its commit: the loop's thread holds the tables meanwhile."""
        while True:
            wtxn = self.try_write_txn(*tables)
            if wtxn is not None:
                return wtxn
            await anyio.to_thread.run_sync(self.wait_unlocked, *tables)

    @staticmethod
    def wait_unlocked(*tables: Table[Any]) -> None:
        """Block until each of ``tables`` was free once (a hint for `try_write_txn`: another
        writer may take a table again before the caller does)."""
        for t in tables:
            with t.lock:
                pass


def _lock_order_of(table: Table[Any]) -> int:
    return table.lock_order
