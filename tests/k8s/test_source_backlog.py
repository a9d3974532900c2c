"""The Kubernetes source with the agent slower than the API server: a watch backlog of
1,500 Services against an applier that takes 5 ms per batch (and, at its first change of
the backlog, waits until the server has sent all of it, so the backlog is there however
fast the loaded machine lets the server emit). What the reflectors decoded
and the applier has not written yet stays bounded by the queue's bound in events (plus the
one delivery a reflector holds while it waits, and the applier's split-off rest), not by
the watch's backlog; and every change is still applied, once, in the server's order.

The backlog is counted from outside the queue: the events the Services reflector decoded
(its health's ``events``) less the changes the applier committed (``on_applied``)."""

from __future__ import annotations

import threading
import time

import anyio
import pytest

from sources.k8s_client import ClientSettings, K8sClient
from sources.k8s_reflector import DECODE_BATCH
from sources.k8s_source import K8sSource, SourceConfig
from statedb import DB
from tables.lb_writer import LBWriter

from .fake_apiserver import FakeAPIServer
from .helpers import FAST, NODE, wait_for
from .objects import node, service

pytestmark = pytest.mark.anyio

N = 1500
PREFIX = "default/backlog-"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _services(n: int) -> list[dict[str, object]]:
    return [service(f"backlog-{i:04d}", f"10.96.{10 + i // 250}.{1 + i % 250}")
            for i in range(n)]


@pytest.mark.parametrize("limit", [200, 5])
async def test_a_slow_applier_keeps_the_queue_bounded_and_loses_nothing(
    apiserver: FakeAPIServer, kubeconfig: str, limit: int
) -> None:
    """``limit`` 200: several deliveries of up to `DECODE_BATCH` wait at once; 5: each
    delivery is larger than the bound and goes in alone."""
    apiserver.upsert(node(NODE, {}))
    db = DB()
    writer = LBWriter.create(db)
    client = K8sClient(ClientSettings(kubeconfig=kubeconfig))
    applied: list[str] = []
    peak = 0
    source: K8sSource
    emitted = threading.Event()

    def on_applied(deltas: list, _oldest: float) -> None:
        nonlocal peak
        ours = [d.key for d in deltas if d.key.startswith(PREFIX)]
        if ours and not applied:
            assert emitted.wait(60), "the server did not emit the backlog"
        applied.extend(ours)
        services = next(r for r in source.reflectors if r.name == "services")
        peak = max(peak, services.health.events - len(applied))
        time.sleep(0.005)  # the agent slower than the API server

    config = SourceConfig(batch_delay=0.001, queue_events=limit, reflector=FAST)
    source = K8sSource(writer, client, node_name=NODE, config=config, on_applied=on_applied)
    with writer.write_txn() as txn:
        source.register_initializer(txn)
    try:
        async with anyio.create_task_group() as tg:
            await tg.start(source.run)
            await wait_for(lambda: source.synced, "initial sync")

            def emit() -> None:
                apiserver.upsert_many(_services(N))
                emitted.set()

            await anyio.to_thread.run_sync(emit)
            await wait_for(lambda: len(applied) >= N, f"{N} services applied", timeout=120)
            tg.cancel_scope.cancel()
    finally:
        client.close()

    assert applied == [f"{PREFIX}{i:04d}" for i in range(N)], "lost, repeated or reordered"
    names = {s.name for s in writer.services.all(db.read_txn())}
    assert {f"{PREFIX}{i:04d}" for i in range(N)} <= names
    assert not source.errors
    # The queue itself: within the bound, or one delivery alone when it is larger.
    assert source.queue.peak <= max(limit, DECODE_BATCH), source.queue.peak
    assert source.queue.queued == 0
    # Decoded and not written: the queue, the delivery a reflector holds while it waits
    # for room, and the rest of a delivery split across batches.
    bound = max(limit, DECODE_BATCH) + 2 * DECODE_BATCH
    assert peak <= bound, f"{peak} decoded events waited for the applier (bound {bound})"
    assert peak > DECODE_BATCH, f"no backlog formed (peak {peak}): the test tests nothing"
