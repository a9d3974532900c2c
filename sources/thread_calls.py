"""Blocking calls in threads, their results handed back to the event loop.

`Prefetch` starts a blocking call in a thread of its own at once and lets the event loop
await its result later. The reflector lists a resource page by page: with the next page's
request started before the current page is delivered, the network, the server and the
page's decoding overlap the applier's work on the page before. ``anyio.to_thread`` does
not fit there: it queues the call to its worker only after three turns of the event loop,
and the applier, woken by the delivery, runs its page (about 60 ms for 500 EndpointSlices)
within those turns, so each request waited for the previous page to be applied (at
60,000 services half of the slices' list time was the loop waiting).

`loop_call_soon` gives any thread a way to have a callback run in the event loop without
waiting for it.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

import anyio
import sniffio

T = TypeVar("T")


def loop_call_soon() -> Callable[[Callable[[], None]], None]:
    """For the running event loop: a function any thread may call to have a callback run
    soon in the loop, without waiting for it (asyncio's ``call_soon_threadsafe``, trio's
    ``run_sync_soon``; anyio only offers the waiting kind)."""
    lib = sniffio.current_async_library()
    if lib == "asyncio":
        loop = asyncio.get_running_loop()

        def call_soon(fn: Callable[[], None]) -> None:
            loop.call_soon_threadsafe(fn)

        return call_soon
    if lib == "trio":
        import trio

        return trio.lowlevel.current_trio_token().run_sync_soon
    raise RuntimeError(f"unsupported event loop {lib!r}")


class Prefetch(Generic[T]):
    """``fn()`` started now in a daemon thread named ``name``; `result` waits for it in
    the event loop and returns its value or raises its exception. Create it in the event
    loop's thread. A result nobody awaits is dropped (a cancelled list's page): the thread
    ends when ``fn`` returns, bounded by ``fn``'s own timeouts."""

    def __init__(self, fn: Callable[[], T], name: str) -> None:
        self._done = anyio.Event()
        self._call_soon = loop_call_soon()
        self._value: tuple[T] | None = None
        self._error: Exception | None = None
        threading.Thread(target=self._run, args=(fn,), name=name, daemon=True).start()

    def _run(self, fn: Callable[[], T]) -> None:
        try:
            self._value = (fn(),)
        except Exception as e:  # kept for `result`, which raises it
            self._error = e
        try:
            self._call_soon(self._done.set)
        except RuntimeError:
            pass  # the event loop is closed: nobody waits for the result any more

    async def result(self) -> T:
        """The call's value (waiting for it), or its exception raised."""
        await self._done.wait()
        if self._error is not None:
            raise self._error
        assert self._value is not None
        return self._value[0]
