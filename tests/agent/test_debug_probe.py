"""The opt-in debug probe (statewright/agent/loop_probe.py, components/debug.py): loop
lateness into a bounded histogram, a stall found with the stack that held the loop,
tracemalloc growth by source line, and a probe that is off unless switched on."""

from __future__ import annotations

import time
import tracemalloc
from typing import Any

import anyio
import pytest

from statewright.agent.components.debug import PROBE_ENV, DebugComponent, probe_enabled
from statewright.agent.loop_probe import LAG_BUCKETS_MS, RECENT_STALLS, LoopProbe, MemoryTracer
from statewright.api_types import ApiError, Request
from statewright.component import DISABLED, OK


def test_lateness_goes_into_fixed_buckets() -> None:
    probe = LoopProbe()
    for ms in (0.1, 0.7, 3.0, 30.0, 5000.0):
        probe.record(ms)
    assert len(probe.buckets) == len(LAG_BUCKETS_MS) + 1
    assert probe.buckets[0] == 1 and probe.buckets[1] == 1 and probe.buckets[-1] == 1
    assert probe.wakeups == 5 and probe.max_ms == 5000.0


def _hold_the_loop() -> None:
    time.sleep(0.08)


def test_a_stall_is_recorded_with_the_stack_that_held_the_loop() -> None:
    probe = LoopProbe()

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            await tg.start(probe.run)
            await anyio.sleep(0.05)
            _hold_the_loop()
            await anyio.sleep(0.05)
            tg.cancel_scope.cancel()

    anyio.run(main)
    assert probe.stalls_total >= 1
    stall = max(probe.stalls, key=lambda s: s.ms)
    assert stall.ms >= 60
    doc = stall.to_json()
    assert any("_hold_the_loop" in stack for stack, _ in doc["stacks"]), doc
    assert probe.to_json(since=stall.at)["stalls"] == []
    assert len(probe.to_json()["stalls"]) == probe.stalls_total


def test_kept_stalls_are_bounded() -> None:
    probe = LoopProbe()
    assert probe.stalls.maxlen == RECENT_STALLS


def test_tracemalloc_names_the_line_that_grew() -> None:
    tracer = MemoryTracer()
    was_tracing = tracemalloc.is_tracing()
    kept: list[Any] = []
    try:
        tracer.start(1)
        assert tracer.snapshot(5)["top"] == []  # the baseline
        kept.extend(bytearray(1024) for _ in range(2000))  # ~2 MB at this line
        top = tracer.snapshot(5)["top"]
        assert top and top[0]["where"].endswith(f"{__file__}:{_line_of_growth()}")
        assert top[0]["size_kb_diff"] >= 1500
    finally:
        if not was_tracing:
            tracer.stop()


def _line_of_growth() -> int:
    import inspect

    src, start = inspect.getsourcelines(test_tracemalloc_names_the_line_that_grew)
    return start + next(i for i, line in enumerate(src) if "bytearray(1024)" in line)


def test_snapshot_without_tracing_is_refused() -> None:
    if tracemalloc.is_tracing():
        pytest.skip("tracemalloc is on for the whole test run")
    with pytest.raises(RuntimeError, match="not tracing"):
        MemoryTracer().snapshot(5)


def test_the_probe_is_off_unless_switched_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(PROBE_ENV, raising=False)
    assert not probe_enabled()
    comp = DebugComponent()
    assert comp.health()[0].state == DISABLED
    for route in comp.routes():
        body = b'{"action": "start"}' if route.methods == ("POST",) else b""
        req = Request(params={}, query={}, method=route.methods[0], body=body)
        with pytest.raises(ApiError) as e:
            anyio.run(route.handler, req)
        assert e.value.status == 404 and PROBE_ENV in str(e.value)
    monkeypatch.setenv(PROBE_ENV, "1")
    assert probe_enabled()
    assert DebugComponent().health()[0].state == OK
