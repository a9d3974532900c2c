"""Watch channels: one-shot signals that close when a query's result may have changed.

A `Watch` starts open and is closed exactly once. Waiting is possible from
plain threads (`Watch.wait`) and from anyio tasks on the asyncio or trio
backend (`await Watch.wait_async()`); `WatchSet` waits for the first of
many. Closing a watch nobody waits on costs one flag write, because the
thread event and the waiter list are created only when someone waits.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable

# One lock for all watches: waiter registration and close are short, and a
# lock per watch would cost memory on every watch ever created.
_lock = threading.Lock()


class Watch:
    """A one-shot signal. `close` wakes every waiter; waiting on a closed watch returns at once."""

    __slots__ = ("__weakref__", "_callbacks", "_closed")

    def __init__(self) -> None:
        self._closed = False
        self._callbacks: list[Callable[[], None]] | None = None

    @property
    def closed(self) -> bool:
        """True once the watch has been closed."""
        return self._closed

    def close(self) -> None:
        """Close the watch and wake all waiters; closing twice is harmless."""
        if self._closed:
            return
        with _lock:
            if self._closed:
                return
            self._closed = True
            callbacks, self._callbacks = self._callbacks, None
        if callbacks:
            for cb in callbacks:
                cb()

    def add_callback(self, cb: Callable[[], None]) -> bool:
        """Call ``cb`` (from the closing thread) when the watch closes.

        Returns False without registering when it is already closed.
        """
        with _lock:
            if self._closed:
                return False
            if self._callbacks is None:
                self._callbacks = [cb]
            else:
                self._callbacks.append(cb)
            return True

    def remove_callback(self, cb: Callable[[], None]) -> None:
        """Forget a callback registered with `add_callback` (no-op when absent)."""
        with _lock:
            if self._callbacks:
                try:
                    self._callbacks.remove(cb)
                except ValueError:
                    pass

    def wait(self, timeout: float | None = None) -> bool:
        """Block the calling thread until closed or ``timeout`` seconds pass; return closed."""
        if self._closed:
            return True
        event = threading.Event()
        if not self.add_callback(event.set):
            return True
        try:
            return event.wait(timeout)
        finally:
            self.remove_callback(event.set)

    async def wait_async(self) -> None:
        """Wait in an anyio task (asyncio or trio backend) until the watch closes."""
        if self._closed:
            return
        await _wait_any_async([self])

    def __repr__(self) -> str:
        return f"<Watch {'closed' if self._closed else 'open'}>"


def closed_watch() -> Watch:
    """Return a watch that is already closed."""
    w = Watch()
    w._closed = True
    return w


class WatchSet:
    """A set of watches to wait on together; waiting returns the ones that closed."""

    __slots__ = ("_watches",)

    def __init__(self, watches: Iterable[Watch] = ()) -> None:
        self._watches: list[Watch] = list(watches)

    def add(self, *watches: Watch) -> None:
        """Add watches to the set."""
        self._watches.extend(watches)

    def clear(self) -> None:
        """Remove every watch from the set."""
        self._watches.clear()

    def __len__(self) -> int:
        return len(self._watches)

    def _closed(self) -> list[Watch]:
        return [w for w in self._watches if w._closed]

    def wait(self, timeout: float | None = None) -> list[Watch]:
        """Block until any watch closes or ``timeout`` passes; return the closed ones (maybe [])."""
        done = self._closed()
        if done or not self._watches:
            return done
        event = threading.Event()
        registered = [w for w in self._watches if w.add_callback(event.set)]
        try:
            if len(registered) == len(self._watches):
                event.wait(timeout)
        finally:
            for w in registered:
                w.remove_callback(event.set)
        return self._closed()

    async def wait_async(self, timeout: float | None = None) -> list[Watch]:
        """Wait in an anyio task until any watch closes or ``timeout`` passes; return those."""
        done = self._closed()
        if done or not self._watches:
            return done
        await _wait_any_async(self._watches, timeout)
        return self._closed()


async def _wait_any_async(watches: list[Watch], timeout: float | None = None) -> None:
    """Suspend the current task until one of ``watches`` closes or ``timeout`` seconds
    pass (cancellation-safe).

    On asyncio the timeout is a timer that completes the task's future, as a close does:
    a loop that waits with a timeout at every turn (a reconciler's next retry or prune)
    pays for a timer handle, not for a cancel scope."""
    # imported here: a process that only imports statedb (statewright-cni, which needs
    # the exception root) does not pay for asyncio; under a running loop it is loaded
    import asyncio

    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        loop = None
    if loop is None:  # not asyncio: the trio backend
        import trio

        event = trio.Event()
        token = trio.lowlevel.current_trio_token()
        loop_thread = threading.get_ident()

        def wake() -> None:
            if threading.get_ident() == loop_thread:
                event.set()
            else:
                try:
                    token.run_sync_soon(event.set)
                except trio.RunFinishedError:
                    pass

        registered = [w for w in watches if w.add_callback(wake)]
        try:
            if len(registered) == len(watches):
                if timeout is None:
                    await event.wait()
                else:
                    # move_on_at: a negative timeout (already past) is no error.
                    with trio.move_on_at(trio.current_time() + timeout):
                        await event.wait()
        finally:
            for w in registered:
                w.remove_callback(wake)
        return

    fut: asyncio.Future[None] = loop.create_future()
    loop_thread_id = threading.get_ident()

    def set_done() -> None:
        if not fut.done():
            fut.set_result(None)

    def wake_asyncio() -> None:
        if threading.get_ident() == loop_thread_id:
            set_done()
        elif not loop.is_closed():
            loop.call_soon_threadsafe(set_done)

    registered = [w for w in watches if w.add_callback(wake_asyncio)]
    timer = None
    try:
        if len(registered) == len(watches):
            if timeout is not None:
                timer = loop.call_later(timeout, set_done)
            await fut
    finally:
        if timer is not None:
            timer.cancel()
        for w in registered:
            w.remove_callback(wake_asyncio)
