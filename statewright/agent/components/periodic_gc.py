"""The garbage-collection loop the map-owning components share (``ct``, ``nodeport``):
every ``interval`` seconds, the maps' ``gc()`` runs in a thread (it walks a kernel map)
and what it removed is logged; an ``OSError`` is logged and the next pass tries again.
The loop ends once the component has dropped its maps (it stopped)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Protocol

import anyio


class Collectable(Protocol):
    """Maps with a garbage collector: ``gc()`` removes expired entries, returns how many."""

    def gc(self) -> int: ...


async def gc_every(interval: float, maps: Callable[[], Collectable | None], what: str,
                   log: logging.Logger, *,
                   task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
    """Run ``maps().gc()`` every ``interval`` seconds until ``maps()`` is None."""
    task_status.started()
    while True:
        await anyio.sleep(interval)
        current = maps()
        if current is None:
            return
        try:
            removed = await anyio.to_thread.run_sync(current.gc)
        except OSError as e:
            log.error("%s garbage collection: %s", what, e)
            continue
        if removed:
            log.info("%s garbage collection removed %d expired entries", what, removed)
