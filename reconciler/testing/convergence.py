"""Convergence checks and a reconciler running on a background event loop.

`convergence_problems` says why a reconciler is not done yet (rows not Done, retries
pending, health not OK, changes not yet attempted); `wait_until_done` awaits the moment it
has none. `BackgroundReconciler` runs a reconciler on its own event loop thread (asyncio or
trio) for synchronous tests, such as hypothesis state machines, and waits from the test's
thread.

``wait_until_done`` polls: failed deletes leave no row behind, so nothing in the table
signals when their retries finish, and the reconciler's progress signal fires only when a
round runs. Under a `FakeClock`, retries become due only when the test advances the clock:
pass ``advance`` to move it on each poll.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Generic, TypeVar, overload

import anyio
from anyio.from_thread import BlockingPortal, start_blocking_portal

from reconciler.config import Config
from reconciler.reconciler import Reconciler
from statedb import DB

O = TypeVar("O")

#: Default bound, in seconds, of the waits below: generous, for loaded CI machines. It is a
#: guard against a hang, not a timing requirement.
DEFAULT_TIMEOUT = 30.0


def convergence_problems(reconciler: Reconciler[Any], limit: int = 5) -> list[str]:
    """Why ``reconciler`` has not converged (`Reconciler.problems`): [] when every change of
    its table was attempted, every row's status is Done, no retry (update or delete) is
    pending, no requested prune is outstanding and health is OK."""
    return reconciler.problems(limit)


async def wait_until_done(
    reconciler: Reconciler[Any],
    timeout: float | None = DEFAULT_TIMEOUT,
    *,
    poll: float = 0.005,
    advance: Callable[[], None] | None = None,
) -> None:
    """Wait until `convergence_problems` finds none; raise TimeoutError (naming what is
    left) after ``timeout`` seconds. ``advance`` is called before each poll, e.g.
    ``lambda: clock.advance(5.0)`` to make every retry due under a `FakeClock`.

    A requested prune (`Reconciler.prune`) is waited for; a periodic one is covered only
    through health: one that failed keeps health Degraded."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        problems = convergence_problems(reconciler)
        if not problems:
            return
        if deadline is not None and time.monotonic() > deadline:
            raise TimeoutError(
                f"reconciler {reconciler.name!r} not done after {timeout}s: "
                + "; ".join(problems)
            )
        if advance is not None:
            advance()
        await anyio.sleep(poll)


class BackgroundReconciler(Generic[O]):
    """A `Reconciler` running on an event loop in a background thread; a context manager.

    The test thread writes to the DB as usual and waits with `wait_reconciled` or
    `wait_done`; `close` (or leaving the ``with`` block) cancels the reconciler and stops
    the loop. ``backend`` is ``"asyncio"`` or ``"trio"`` (trio must be installed).
    """

    if TYPE_CHECKING:
        # Overloaded for the reason given at `Reconciler.__init__`: a nested
        # ``Config(table, ops)`` whose rows disagree is reported, not taken as Config[Any].
        @overload
        def __init__(self, db: DB, config: Config[O], /, *, backend: str = ...) -> None: ...

        @overload
        def __init__(self, db: DB, *, config: Config[O], backend: str = ...) -> None: ...

    def __init__(self, db: DB, config: Config[O], *, backend: str = "asyncio") -> None:
        self.db = db
        self.config = config
        self.reconciler: Reconciler[O] = Reconciler(db, config)
        self._portal_cm = start_blocking_portal(backend=backend)
        self.portal: BlockingPortal = self._portal_cm.__enter__()
        try:
            self._future, _ = self.portal.start_task(self.reconciler.run)
        except BaseException:
            self._portal_cm.__exit__(None, None, None)
            raise
        self._closed = False

    def wait_reconciled(self, revision: int | None = None, timeout: float = DEFAULT_TIMEOUT) -> int:
        """Wait until every change up to ``revision`` (default: the table's current revision)
        was attempted; return the number of objects still waiting for a retry."""
        if revision is None:
            revision = self.config.table.revision(self.db.read_txn())
        return self.portal.call(self.reconciler.wait_until_reconciled, revision, timeout)

    def wait_done(
        self,
        timeout: float | None = DEFAULT_TIMEOUT,
        *,
        advance: Callable[[], None] | None = None,
    ) -> None:
        """`wait_until_done` on the reconciler's loop, from the calling thread."""

        async def wait() -> None:
            await wait_until_done(self.reconciler, timeout, advance=advance)

        self.portal.call(wait)

    def close(self) -> None:
        """Cancel the reconciler and stop the event loop (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self._future.cancel()
        try:
            self._portal_cm.__exit__(None, None, None)
        except anyio.get_cancelled_exc_class():
            pass

    def __enter__(self) -> BackgroundReconciler[O]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
