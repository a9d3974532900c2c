"""An in-memory target with a model check: after convergence, the target holds exactly what
the table's rows say it should.

`MemoryTarget` keeps a dict from a key to a value, both derived from a row by functions the
test gives. It implements `Operations` and `BatchOperations` (per-entry results), records
every operation, and can be changed behind the reconciler's back (`put`, `remove`) to test
pruning. `MemoryTarget.check` is the model check: it compares the target with the state
`expected` computes from a snapshot of the table and raises `ModelMismatch` with a readable
difference.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping
from typing import Any, Generic, TypeVar

from reconciler.operations import BatchEntry
from statedb import ReadTxn, StatewrightError, Table

O = TypeVar("O")
K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class ModelMismatch(StatewrightError, AssertionError):
    """The target does not hold what the table says it should; the message lists the keys
    missing from the target, the stray ones and those with a different value."""


def diff_states(expected: Mapping[Any, Any], actual: Mapping[Any, Any], limit: int = 10) -> str:
    """A short description of how ``actual`` differs from ``expected`` ('' when equal)."""
    missing = [k for k in expected if k not in actual]
    stray = [k for k in actual if k not in expected]
    changed = [k for k in expected if k in actual and expected[k] != actual[k]]
    parts = []
    if missing:
        parts.append(f"missing {missing[:limit]}" + (" ..." if len(missing) > limit else ""))
    if stray:
        parts.append(f"stray {stray[:limit]}" + (" ..." if len(stray) > limit else ""))
    if changed:
        shown = ", ".join(f"{k!r}: {actual[k]!r} != {expected[k]!r}" for k in changed[:limit])
        parts.append(f"different {{{shown}}}" + (" ..." if len(changed) > limit else ""))
    return "; ".join(parts)


def _same(row: Any) -> Any:
    return row


class MemoryTarget(Generic[O, K, V]):
    """A target holding ``key(row) -> value(row)`` for the rows it was given.

    ``value`` defaults to the row itself, which is right only when rows carry no status
    (the status changes on every write back); usually give a function that drops the status.
    ``history`` records ``(operation, key)`` pairs in call order, ``prunes`` counts prunes.
    Thread-safe: a test may read or tamper with it while the reconciler runs.
    """

    def __init__(self, key: Callable[[O], K], value: Callable[[O], V] = _same) -> None:
        self.key = key
        self.value = value
        self.data: dict[K, V] = {}
        self.history: list[tuple[str, K | None]] = []
        self.prunes = 0
        self._lock = threading.Lock()

    # ----- Operations ------------------------------------------------------------------
    def update(self, txn: ReadTxn, revision: int, obj: O) -> None:
        """Store ``value(obj)`` under ``key(obj)``."""
        k = self.key(obj)
        v = self.value(obj)
        with self._lock:
            self.data[k] = v
            self.history.append(("update", k))

    def delete(self, txn: ReadTxn, revision: int, obj: O) -> None:
        """Remove ``key(obj)`` (absent is fine)."""
        k = self.key(obj)
        with self._lock:
            self.data.pop(k, None)
            self.history.append(("delete", k))

    def prune(self, txn: ReadTxn, objects: Iterator[O]) -> None:
        """Remove every key that none of ``objects`` has."""
        keep = {self.key(o) for o in objects}
        with self._lock:
            for k in [k for k in self.data if k not in keep]:
                del self.data[k]
            self.history.append(("prune", None))
            self.prunes += 1

    def update_batch(self, txn: ReadTxn, batch: list[BatchEntry[O]]) -> None:
        """`update` for each entry."""
        for entry in batch:
            self.update(txn, entry.revision, entry.obj)

    def delete_batch(self, txn: ReadTxn, batch: list[BatchEntry[O]]) -> None:
        """`delete` for each entry."""
        for entry in batch:
            self.delete(txn, entry.revision, entry.obj)

    # ----- behind the reconciler's back ------------------------------------------------
    def put(self, key: K, value: V) -> None:
        """Add or change an entry as something other than the reconciler would."""
        with self._lock:
            self.data[key] = value

    def remove(self, key: K) -> None:
        """Remove an entry as something other than the reconciler would."""
        with self._lock:
            self.data.pop(key, None)

    # ----- the model check -------------------------------------------------------------
    def snapshot(self) -> dict[K, V]:
        """A copy of what the target holds."""
        with self._lock:
            return dict(self.data)

    def expected(self, rows: Iterable[O]) -> dict[K, V]:
        """What the target should hold for ``rows`` (all desired rows of the table)."""
        return {self.key(o): self.value(o) for o in rows}

    def check(self, txn: ReadTxn, table: Table[O]) -> None:
        """Raise `ModelMismatch` unless the target equals the rows of ``table`` at ``txn``."""
        expected = self.expected(table.all(txn))
        actual = self.snapshot()
        if actual != expected:
            raise ModelMismatch(
                f"target differs from table {table.name!r}: {diff_states(expected, actual)}"
            )
