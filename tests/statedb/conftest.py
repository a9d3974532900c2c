"""Fixtures of the statedb tests.

``frozen_heap``: the property tests that collect garbage after dropping snapshots
(``gc.collect()`` after a drop, at a state machine's teardown) run with the heap they find
frozen (``gc.freeze()``), so a full collection traverses only the objects the test made.
Without it each collection also traverses every module, collected test and fixture of the
run: about 70 ms per collection for one test file, 200-300 ms in the whole suite, where
those collections were most of these tests' time. What the test made (tables, snapshots,
transactions) is collected as before: only objects older than the test are left alone,
and the heap is unfrozen again after the test.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest


@pytest.fixture
def frozen_heap() -> Iterator[None]:
    """Freeze the objects that exist before the test; unfreeze them after it."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
