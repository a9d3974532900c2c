"""Read and write transactions.

A `ReadTxn` is a snapshot of every table: taking one reads a single
reference (the DB's current root), so it is O(1), never waits for writers
and never sees later commits. A `WriteTxn` locks the tables it names, in
the DB's fixed global order, and sees its own uncommitted writes. A thread
holds at most one write transaction of a DB at a time (a second one, nested,
raises `NestedWriteTxnError`), so every writer takes all its locks in one go,
in that order, and two writers cannot deadlock. `commit` publishes a new root
and closes the watches of everything that changed, `abort` discards the writes
and closes nothing.
"""

from __future__ import annotations

import threading
import time
from types import TracebackType
from typing import TYPE_CHECKING, Any

from statedb.errors import (
    NestedWriteTxnError,
    StateDBError,
    TableNotLockedError,
    TransactionClosedError,
)
from statedb.ordered import compact_log
from statedb.table_state import TableState, TableTxn
from statedb.watch import Watch

if TYPE_CHECKING:
    from statedb.db import DB
    from statedb.table import Table


class ReadTxn:
    """A consistent, immutable snapshot of every table in a DB."""

    __slots__ = ("db", "states")

    def __init__(self, db: DB, states: dict[str, TableState]) -> None:
        self.db = db
        self.states = states

    def __repr__(self) -> str:
        revs = ", ".join(f"{n}@{s.revision}" for n, s in self.states.items())
        return f"<{type(self).__name__} {revs}>"


class LocksBusy(StateDBError):
    """Internal: a non-blocking write transaction found a table locked (`DB.try_write_txn`
    turns it into None)."""


class WriteTxn(ReadTxn):
    """A transaction that may write the tables it locked; use as a context manager.

    Weakly referenceable: a helper that keeps per-transaction state can tell its
    transaction without keeping it, and so its tables' states, alive after it ended."""

    __slots__ = ("__weakref__", "_done", "_locked", "_owner", "_started", "_tables", "_wait_s")

    def __init__(self, db: DB, tables: list[Table[Any]], *, blocking: bool = True) -> None:
        start = time.perf_counter()
        me = threading.get_ident()
        writers = db.writers
        held = writers.get(me)
        if held is not None:
            raise NestedWriteTxnError(held, [t.name for t in tables])
        taken: list[Table[Any]] = []
        try:
            for t in tables:
                if not t.lock.acquire(blocking):
                    raise LocksBusy(t.name)
                taken.append(t)
        except BaseException:
            for t in reversed(taken):
                t.lock.release()
            raise
        writers[me] = [t.name for t in tables]
        self._owner = me
        acquired = time.perf_counter()
        self._wait_s = acquired - start
        self._started = acquired
        root = db.root
        super().__init__(db, dict(root))
        self._tables = tables
        self._locked: dict[str, TableTxn] = {}
        self._done: str | None = None

    def table_txn(self, table: Table[Any]) -> TableTxn:
        """Return the writable state of ``table``; raise if it is not locked or txn is over."""
        tt = self._locked.get(table.name)
        if tt is not None:
            return tt
        if self._done is not None:
            raise TransactionClosedError(self._done)
        if table not in self._tables:
            raise TableNotLockedError(table.name, [t.name for t in self._tables])
        tt = TableTxn(table, self.states[table.name])
        self._locked[table.name] = tt
        self.states[table.name] = tt
        return tt

    @property
    def done(self) -> bool:
        """True after commit() or abort()."""
        return self._done is not None

    def commit(self) -> ReadTxn:
        """Publish the writes atomically, close affected watches, and return the new snapshot."""
        if self._done is not None:
            raise TransactionClosedError(self._done)
        db = self.db
        sealed: list[tuple[TableTxn, TableState]] = []
        try:
            for tt in self._locked.values():
                if tt.modified:
                    tt.release_tombstones()
                    st = tt.seal()
                    tt.table.snapshots.track(st)
                    st = compact_log(tt.table, st)
                    sealed.append((tt, st))
            if sealed:
                with db.commit_lock:
                    root = dict(db.root)
                    for tt, st in sealed:
                        root[tt.table.name] = st
                    db.root = root
            else:
                # Nothing written: nothing to publish (the locked tables' states in the
                # current root are the ones this transaction began with).
                root = db.root
            # Published: no head is above the new committed revisions any more.
            for name, tt in self._locked.items():
                tt.settle(root[name].revision)
            # Close watches while the tables are still locked: the next writer of a
            # table must not swap its watches concurrently with this one, or a watch
            # handed out in between is replaced without ever being closed.
            for tt, st in sealed:
                _close_watches(tt, st)
        finally:
            self._finish("committed")
        for tt, st in sealed:
            self.states[tt.table.name] = st
        return ReadTxn(db, root)

    def abort(self) -> None:
        """Discard every write of this transaction; closes no watch."""
        if self._done is not None:
            return
        for tt in self._locked.values():
            tt.discard()
            # Not the base revision: a reader may have read one of the discarded heads
            # just before it was taken out and compare it with ``newest`` only now; with
            # ``newest`` above every revision this transaction used, that reader still
            # takes the slow path and finds the committed record (VersionStore.older_at).
            tt.settle(max(tt.revision, tt.base.revision))
        self._finish("aborted")

    def _finish(self, state: str) -> None:
        self._done = state
        for name, tt in self._locked.items():
            self.states[name] = tt.base
        self._locked = {}
        # Recorded before the locks go: each table's figures have one writer at a time.
        held = time.perf_counter() - self._started
        try:
            self.db.metrics.record_write_txn(self._tables, self._wait_s, held, state)
        finally:
            self.db.writers.pop(self._owner, None)
            for t in reversed(self._tables):
                t.lock.release()

    def __enter__(self) -> WriteTxn:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._done is not None:
            return
        if exc_type is None:
            self.commit()
        else:
            self.abort()

    def __del__(self) -> None:
        # A forgotten transaction must not keep its tables locked forever.
        if getattr(self, "_done", "x") is None:
            self.abort()


def _close_watches(tt: TableTxn, st: TableState) -> None:
    """Close the watches of every key, prefix and table query this commit changed."""
    table = tt.table
    mine: list[Any] | None = None
    for pos, (reg, preg) in enumerate(zip(table.key_watches, table.prefix_watches)):
        # A registry's dict is empty when nobody holds a watch of it (the common case).
        key_regs = reg.data  # type: ignore[attr-defined]
        prefix_regs = preg.data  # type: ignore[attr-defined]
        if not key_regs and not prefix_regs:
            continue
        if mine is None:
            # This transaction's log records are still in the log list it appended to.
            mine = tt.log[tt.base.log_len :]
        changed = _changed_index_keys(tt, st, pos, mine)
        if key_regs:
            for key in changed:
                w = reg.pop(key, None)
                if w is not None:
                    w.close()
        if prefix_regs:
            for key in changed:
                for n in range(len(key) + 1):
                    w = preg.pop(key[:n], None)
                    if w is not None:
                        w.close()
    if st.revision != tt.base.revision and table.table_watch_taken:
        table.table_watch_taken = False
        old, table.table_watch = table.table_watch, Watch()
        old.close()
    if tt.base.pending_init != st.pending_init:
        if st.pending_init:
            if table.init_watch.closed:
                table.init_watch = Watch()
        else:
            table.init_watch.close()


def _changed_index_keys(tt: TableTxn, st: TableState, pos: int, records: list[Any]) -> set[bytes]:
    """Return the keys of index ``pos`` whose rows this transaction changed."""
    pks = {e[2] for e in records}
    if pos == 0:
        return pks
    idx = tt.table.secondary[pos - 1]
    keys: set[bytes] = set()
    for pk in pks:
        for e in (tt.base.entry(pk), st.entry(pk)):
            if e is not None:
                keys.update(idx.keys_of(e[0]))
    return keys
