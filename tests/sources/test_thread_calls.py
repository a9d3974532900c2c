"""`sources.thread_calls.Prefetch`: a blocking call started at once in a thread, its value
or exception handed back to the event loop."""

from __future__ import annotations

import threading
import time

import anyio
import pytest

from sources.thread_calls import Prefetch

pytestmark = pytest.mark.anyio


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


async def test_the_call_starts_before_the_event_loop_yields() -> None:
    started = threading.Event()
    fetch = Prefetch(lambda: started.set() or threading.current_thread().name, "prefetch-test")
    # The loop's thread blocks without yielding (as an applier's batch does): the call
    # runs meanwhile, in its own thread.
    assert started.wait(5.0)
    assert await fetch.result() == "prefetch-test"


async def test_an_exception_is_raised_by_result() -> None:
    def fail() -> None:
        raise ValueError("no page")

    fetch = Prefetch(fail, "prefetch-test")
    with pytest.raises(ValueError, match="no page"):
        await fetch.result()


async def test_a_result_nobody_awaits_is_dropped() -> None:
    done = threading.Event()

    def slow() -> int:
        time.sleep(0.05)
        done.set()
        return 1

    with anyio.move_on_after(0.01):
        await Prefetch(slow, "prefetch-test").result()
    assert done.wait(5.0)
    await anyio.sleep(0.01)  # the thread's hand-back runs in the loop, harmlessly
