"""Running a K8sSource against the fake API server in a test, with short timeouts."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import anyio

from sources.k8s_client import ClientSettings, K8sClient
from sources.k8s_reflector import ReflectorConfig
from sources.k8s_source import K8sSource, SourceConfig
from statedb import DB
from tables.lb_writer import LBWriter

NODE = "node-a"

#: Reflector timing for tests: quick backoff, a stall noticed after one second.
FAST = ReflectorConfig(
    page_size=2,
    watch_timeout=30.0,
    stall_timeout=1.0,
    connect_timeout=2.0,
    list_timeout=5.0,
    backoff_initial=0.02,
    backoff_max=0.2,
)


@dataclass
class Running:
    """A source running in a task group, with its tables."""

    db: DB
    writer: LBWriter
    source: K8sSource
    client: K8sClient

    def services(self) -> list[str]:
        """Names of the services in the table."""
        return sorted(s.name for s in self.writer.services.all(self.db.read_txn()))

    def frontends(self) -> dict[str, str]:
        """Frontend address -> service name."""
        return {
            str(f.address): f.service_name for f in self.writer.frontends.all(self.db.read_txn())
        }

    def backends(self, service: str) -> list[str]:
        """Addresses of the backends ``service``'s frontends select."""
        txn = self.db.read_txn()
        return sorted(
            {
                str(b.address)
                for f in self.writer.frontends.all(txn)
                if f.service_name == service
                for b in f.backends
            }
        )

    def initialized(self) -> bool:
        """Whether the frontends table's initializers are all done."""
        return self.writer.frontends.initialized(self.db.read_txn())[0]


async def wait_for(cond: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
    """Poll ``cond`` until it holds; fail naming ``what`` after ``timeout`` seconds (a bound
    against hanging, not a performance assertion)."""
    with anyio.move_on_after(timeout):
        while not cond():
            await anyio.sleep(0.01)
        return
    raise AssertionError(f"timed out waiting for {what}")


@contextlib.asynccontextmanager
async def running_source(
    settings: ClientSettings,
    *,
    reflector: ReflectorConfig = FAST,
    db: DB | None = None,
    writer: LBWriter | None = None,
    sync_batch_size: int | None = None,
) -> AsyncIterator[Running]:
    """Start a K8sSource (initializer registered) on fresh tables; stop it on exit."""
    config = SourceConfig(batch_delay=0.001, reflector=reflector)
    if sync_batch_size is not None:
        config = dataclasses.replace(config, sync_batch_size=sync_batch_size)
    if db is None or writer is None:
        db = DB()
        writer = LBWriter.create(db)
    client = K8sClient(settings)
    source = K8sSource(writer, client, node_name=NODE, config=config)
    with writer.write_txn() as txn:
        source.register_initializer(txn)
    try:
        async with anyio.create_task_group() as tg:
            await tg.start(source.run)
            yield Running(db, writer, source, client)
            tg.cancel_scope.cancel()
    finally:
        client.close()
