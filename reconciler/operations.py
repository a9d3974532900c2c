"""What a target must implement: per-object update/delete and prune, optionally batched.

Every method may be a plain function or a coroutine function. Sync methods run
inline on the reconciler's event loop (fast targets such as maps); slow or
blocking targets should be async (or hand work to ``anyio.to_thread``).
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Iterator
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from statedb import ReadTxn

O = TypeVar("O")
O_contra = TypeVar("O_contra", contravariant=True)


class Operations(Protocol[O_contra]):
    """Applies rows of a table to a target; raise an exception to report a failure."""

    def update(self, txn: ReadTxn, revision: int, obj: O_contra) -> Awaitable[None] | None:
        """Create or update ``obj`` in the target (idempotent: it may be called again)."""
        ...

    def delete(self, txn: ReadTxn, revision: int, obj: O_contra) -> Awaitable[None] | None:
        """Remove ``obj`` from the target; removing something absent is not an error."""
        ...

    def prune(self, txn: ReadTxn, objects: Iterator[O_contra]) -> Awaitable[None] | None:
        """Remove from the target everything that is not among ``objects`` (all desired rows)."""
        ...


@dataclass(slots=True)
class BatchEntry(Generic[O]):
    """One row of a batch; the target sets ``result`` to the exception when this entry failed.

    Mutable on purpose: it is the target's per-entry answer slot, so a partial
    batch failure retries only the failed entries.
    """

    obj: O
    revision: int
    result: BaseException | None = None


class BatchOperations(Protocol[O]):
    """Optional batched form of update/delete: each entry gets its own result."""

    def update_batch(self, txn: ReadTxn, batch: list[BatchEntry[O]]) -> Awaitable[None] | None:
        """Apply every entry; set ``entry.result`` on those that failed."""
        ...

    def delete_batch(self, txn: ReadTxn, batch: list[BatchEntry[O]]) -> Awaitable[None] | None:
        """Remove every entry; set ``entry.result`` on those that failed."""
        ...


async def settle(result: Any) -> None:
    """Await ``result`` when an operation returned an awaitable (async target), else do nothing."""
    if result is not None and inspect.isawaitable(result):
        await result
