"""The watch pump's back-pressure: the reader thread stops taking chunks from the stream
while more than its byte bound waits for the event loop, whatever the chunks' sizes."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import anyio
import pytest

from sources.k8s_reflector import _WatchPump

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class _Stream:
    """Chunks of ``size`` bytes, counting how many the reader took."""

    def __init__(self, count: int, size: int) -> None:
        self.count = count
        self.size = size
        self.taken = 0
        self.lock = threading.Lock()

    def __iter__(self) -> Iterator[bytes]:
        for i in range(self.count):
            with self.lock:
                self.taken += 1
            yield bytes([i % 256]) * self.size


async def test_reader_waits_while_the_bytes_bound_is_reached() -> None:
    stream = _Stream(count=100, size=64 * 1024)
    pump = _WatchPump(iter(stream), max_pending_bytes=256 * 1024)
    async with anyio.create_task_group() as tg:
        tg.start_soon(pump.run_in_thread)
        await anyio.sleep(0.3)
        # Four 64 KiB chunks fill the bound; the reader holds the fifth it has read.
        assert stream.taken <= 5
        data, finished, error = await pump.take()
        assert len(data) == 4 * 64 * 1024 and not finished and error is None
        received = len(data)
        while True:
            data, finished, error = await pump.take()
            received += len(data)
            if finished:
                break
        assert error is None
        assert received == 100 * 64 * 1024
        tg.cancel_scope.cancel()
