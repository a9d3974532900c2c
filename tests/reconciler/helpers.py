"""Shared test fixtures for the reconciler: a test row type, a recording mock target and a
harness running a reconciler on an anyio event loop in a background thread (the public
`reconciler.testing.BackgroundReconciler`)."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, cast

from anyio.from_thread import BlockingPortal

from reconciler import (
    BatchEntry,
    BatchOperations,
    Config,
    RateLimit,
    Reconciler,
    Status,
    StatusKind,
    status_pending,
)
from reconciler.testing import BackgroundReconciler
from statedb import DB, Index, ReadTxn, Table, keys

WAIT_S = 15.0  # generous bound for conditions on a loaded 2-core machine


@dataclass(frozen=True, slots=True)
class TestObject:
    """A reconcilable row: an id, a fault flag and the reconciliation status."""

    __test__ = False  # not a pytest test class

    id: int
    faulty: bool = False
    value: str = ""
    status: Status = field(default_factory=status_pending)


def get_status(obj: TestObject) -> Status:
    """Status accessor for TestObject."""
    return obj.status


def set_status(obj: TestObject, status: Status) -> TestObject:
    """Return a copy of obj with a new status."""
    return dataclasses.replace(obj, status=status)


def new_table(name: str = "test-objects") -> Table[TestObject]:
    """A table of TestObject keyed by id."""
    return Table(name, Index("id", key=lambda o: o.id, encode=keys.uint64))


class OpError(Exception):
    """A failure injected by a mock target."""


class MockOps:
    """A target that records every operation as text ('update(1)', 'delete(3) fail', ...)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.history: list[str] = []
        self.faulty = False
        self.prune_snapshots: list[list[int]] = []
        self.on_update: Callable[[ReadTxn, int, TestObject], None] | None = None

    def _record(self, item: str) -> None:
        with self.lock:
            self.history.append(item)

    def take(self, n: int) -> list[str]:
        """The last n recorded operations."""
        with self.lock:
            return list(self.history[-n:]) if n else []

    def update(self, txn: ReadTxn, revision: int, obj: TestObject) -> None:
        if self.on_update is not None:
            self.on_update(txn, revision, obj)
        op = f"update({obj.id})"
        if obj.status.kind is StatusKind.REFRESHING:
            op = f"update-refresh({obj.id})"
        if self.faulty or obj.faulty:
            self._record(f"{op} fail")
            raise OpError("update fail")
        self._record(op)

    def delete(self, txn: ReadTxn, revision: int, obj: TestObject) -> None:
        if self.faulty or obj.faulty:
            self._record(f"delete({obj.id}) fail")
            raise OpError("delete fail")
        self._record(f"delete({obj.id})")

    def prune(self, txn: ReadTxn, objects: Iterator[TestObject]) -> None:
        objs = list(objects)
        with self.lock:
            self.prune_snapshots.append([o.id for o in objs])
        if self.faulty:
            self._record(f"prune(n={len(objs)}) fail")
            raise OpError("prune fail")
        self._record(f"prune(n={len(objs)})")


class MockBatchOps(MockOps):
    """The same target with batch operations that give each entry its own result."""

    def update_batch(self, txn: ReadTxn, batch: list[BatchEntry[TestObject]]) -> None:
        for e in batch:
            try:
                self.update(txn, e.revision, e.obj)
            except OpError as exc:
                e.result = exc

    def delete_batch(self, txn: ReadTxn, batch: list[BatchEntry[TestObject]]) -> None:
        for e in batch:
            try:
                self.delete(txn, e.revision, e.obj)
            except OpError as exc:
                e.result = exc


def wait_for(cond: Callable[[], bool], what: str, timeout: float = WAIT_S) -> None:
    """Poll ``cond`` until true; fail with ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for: {what}")
        time.sleep(0.002)


class Harness:
    """A DB with one table, a mock target and a reconciler running on a background event loop."""

    def __init__(
        self,
        *,
        backend: str = "asyncio",
        batch: bool = False,
        ops: Any = None,
        initializer: bool = False,
        **config: Any,
    ) -> None:
        self.table = new_table()
        self.db = DB(self.table)
        self.ops = ops if ops is not None else (MockBatchOps() if batch else MockOps())
        self._mark_init: Callable[[Any], None] | None = None
        if initializer:
            with self.db.write_txn(self.table) as w:
                self._mark_init = self.table.register_initializer(w, "test")
        settings: dict[str, Any] = {
            "name": "test",
            "retry_min_backoff": 0.05,
            "retry_max_backoff": 0.05,
            "rate_limit": RateLimit(1000.0, 10),
            "get_object_status": get_status,
            "set_object_status": set_status,
        }
        settings.update(config)
        self.config: Config[TestObject] = Config(
            table=self.table,
            operations=self.ops,
            batch_operations=cast("BatchOperations[TestObject]", self.ops) if batch else None,
            **settings,
        )
        self.runner = BackgroundReconciler(self.db, self.config, backend=backend)
        self.reconciler: Reconciler[TestObject] = self.runner.reconciler
        self.portal: BlockingPortal = self.runner.portal

    def close(self) -> None:
        """Stop the reconciler (cancel its task) and the event loop."""
        self.runner.close()

    def __enter__(self) -> Harness:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ----- table writes ---------------------------------------------------------------
    def insert(self, obj: TestObject) -> int:
        """Insert a row; return the table revision after the commit."""
        with self.db.write_txn(self.table) as w:
            self.table.insert(w, obj)
        return self.table.revision(self.db.read_txn())

    def delete(self, obj_id: int) -> int:
        """Delete a row by id; return the table revision after the commit."""
        with self.db.write_txn(self.table) as w:
            self.table.delete(w, TestObject(obj_id))
        return self.table.revision(self.db.read_txn())

    def mark_init(self) -> None:
        """Finish the table's initializer."""
        assert self._mark_init is not None
        with self.db.write_txn(self.table) as w:
            self._mark_init(w)

    def rows(self) -> list[TestObject]:
        """Every row of the table."""
        return list(self.table.all(self.db.read_txn()))

    def statuses(self) -> dict[int, tuple[str, str]]:
        """id -> (status kind, error) of every row."""
        return {o.id: (o.status.kind.value, o.status.error) for o in self.rows()}

    def wait_reconciled(self, revision: int | None = None) -> int:
        """Wait until the reconciler attempted every change up to revision (default: now)."""
        return self.runner.wait_reconciled(revision, WAIT_S)

    # ----- expectations ---------------------------------------------------------------
    def expect_ops(self, *expected: str) -> None:
        """Wait until the last len(expected) operations are ``expected`` in any order."""
        want = sorted(expected)
        wait_for(
            lambda: sorted(self.ops.take(len(want))) == want,
            f"ops {want}, last ops {self.ops.take(len(want) + 3)}",
        )

    def expect_table(self, expected: dict[int, tuple[str, str]]) -> None:
        """Wait until the table holds exactly these ids with these (status, error)."""
        wait_for(
            lambda: self.statuses() == expected,
            f"table {expected}, got {self.statuses()}",
        )

    def expect_health(self, pattern: str) -> None:
        """Wait until the health line matches the regular expression ``pattern``."""
        import re

        wait_for(
            lambda: re.search(pattern, str(self.reconciler.health)) is not None,
            f"health {pattern!r}, got {self.reconciler.health}",
        )
