"""A prefix of etcd watched into a consumer: list, then watch from the listed revision on.

* **resume**: after a broken stream (a member gone, a partition) the watch restarts from
  the revision after the last one applied, on whichever endpoint answers: nothing is
  missed and nothing is delivered twice.
* **compaction**: when that revision has been compacted away, the prefix is listed again
  and only the difference with what was delivered goes to the consumer (as the
  Kubernetes reflector does after a 410 Gone).
* **grace**: a delete (a crashed agent's lease expiring, or a key gone in a relist) is
  delivered only after ``grace`` seconds; a put of the key within that time cancels it,
  and is delivered only if the value changed. An agent restarted within the grace period
  causes no delete-then-add flap.
* **outages**: an unreachable etcd delivers nothing: what the consumer has stays. The
  stream's member is probed every ``probe_interval`` seconds, so a member that went
  silent without closing the connection (packets dropped) is left for another.

The consumer is ``deliver(upserts, deletes, synced)`` (upserts: key -> `KeyValue`);
``synced`` is True from the first complete list on.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

import anyio
import anyio.abc

from sources.kvstore.etcd_client import (
    CompactedError,
    EtcdClient,
    KeyValue,
    KVStoreError,
    WatchEvent,
)

log = logging.getLogger(__name__)

Deliver = Callable[[Mapping[str, KeyValue], list[str], bool], Awaitable[None]]


@dataclass
class WatcherHealth:
    prefix: str
    connected: bool = False
    synced: bool = False
    revision: int = 0
    keys: int = 0
    relists: int = 0
    resumes: int = 0
    pending_deletes: int = 0
    last_error: str = ""
    since: float = 0.0

    def message(self) -> str:
        parts = [
            ("watching" if self.connected else "disconnected")
            + (" (synced)" if self.synced else " (not synced)"),
            f"{self.keys} keys at revision {self.revision}",
            f"{self.resumes} resumes, {self.relists} relists",
        ]
        if self.pending_deletes:
            parts.append(f"{self.pending_deletes} deletes in grace")
        if self.last_error:
            since = time.strftime("%H:%M:%S", time.gmtime(self.since))
            parts.append(f"last error (since {since}Z): {self.last_error}")
        return "; ".join(parts)


class PrefixWatcher:
    """See the module doc."""

    def __init__(
        self,
        client: EtcdClient,
        prefix: str,
        deliver: Deliver,
        *,
        grace: float = 0.0,
        retry_interval: float = 0.5,
        probe_interval: float = 5.0,
    ) -> None:
        self.client = client
        self.probe_interval = probe_interval
        self.prefix = prefix
        self.deliver = deliver
        self.grace = grace
        self.retry_interval = retry_interval
        #: What the consumer has (key -> last delivered value).
        self.cache: dict[str, KeyValue] = {}
        self._pending: dict[str, float] = {}
        self._pending_changed = anyio.Event()
        self._h = WatcherHealth(prefix, since=time.time())
        self._listed = False

    @property
    def synced(self) -> bool:
        return self._h.synced

    def health(self) -> WatcherHealth:
        self._h.keys, self._h.pending_deletes = len(self.cache), len(self._pending)
        return WatcherHealth(**vars(self._h))

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """List and watch until cancelled."""
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._expire_loop)
            task_status.started()
            await self._watch_loop()

    async def _watch_loop(self) -> None:
        while True:
            try:
                if not self._listed:
                    await self._relist()
                await self._stream()
            except CompactedError as e:
                log.info("kvstore: %s: %s; listing again", self.prefix, e)
                self._h.relists += 1
                self._listed = False
                continue
            except KVStoreError as e:
                self._error(e)
            self._h.resumes += 1
            await anyio.sleep(self.retry_interval)

    async def _stream(self) -> None:
        """One watch stream, with its member probed every ``probe_interval`` seconds:
        a member gone silent ends the stream (`KVStoreUnavailable`)."""
        endpoint = self.client.endpoint
        failed: list[KVStoreError] = []
        async with anyio.create_task_group() as tg:

            async def probe() -> None:
                while True:
                    await anyio.sleep(self.probe_interval)
                    try:
                        await self.client.probe(endpoint)
                    except KVStoreError as e:
                        failed.append(e)
                        tg.cancel_scope.cancel()
                        return

            tg.start_soon(probe)
            try:
                watch = self.client.watch(self.prefix, self._h.revision + 1)
                async with contextlib.aclosing(watch) as stream:
                    async for events in stream:
                        self._connected(True)
                        if events:
                            await self._apply(events)
            except KVStoreError as e:
                failed.append(e)
            tg.cancel_scope.cancel()
        if failed:
            raise failed[0]

    def _connected(self, up: bool) -> None:
        if up != self._h.connected:
            self._h.since = time.time()
        self._h.connected = up
        if up:
            self._h.last_error = ""

    def _error(self, e: BaseException) -> None:
        if self._h.connected or not self._h.last_error:
            log.warning("kvstore: watch %s: %s", self.prefix, e)
        self._connected(False)
        self._h.last_error = str(e)

    async def _relist(self) -> None:
        kvs, revision = await self.client.list_prefix(self.prefix)
        listed = {kv.key: kv for kv in kvs}
        upserts: dict[str, KeyValue] = {}
        for key, kv in listed.items():
            self._pending.pop(key, None)
            old = self.cache.get(key)
            if old is None or old.value != kv.value:
                upserts[key] = kv
            self.cache[key] = kv
        gone = [k for k in self.cache if k not in listed and k not in self._pending]
        self._h.revision = revision
        self._listed = True
        first = not self._h.synced
        if upserts or first:
            await self.deliver(upserts, [], True)
        self._h.synced = True  # once the consumer has the list
        for key in gone:
            await self._delete_later(key)

    async def _apply(self, events: list[WatchEvent]) -> None:
        upserts: dict[str, KeyValue] = {}
        for ev in events:
            kv = ev.kv
            self._h.revision = max(self._h.revision, kv.mod_revision)
            if ev.deleted:
                upserts.pop(kv.key, None)
                if kv.key in self.cache:
                    await self._delete_later(kv.key)
                continue
            self._pending.pop(kv.key, None)
            old = self.cache.get(kv.key)
            self.cache[kv.key] = kv
            if old is None or old.value != kv.value:
                upserts[kv.key] = kv
        if upserts:
            await self.deliver(upserts, [], True)

    async def _delete_later(self, key: str) -> None:
        if self.grace <= 0:
            self.cache.pop(key, None)
            await self.deliver({}, [key], True)
            return
        self._pending.setdefault(key, time.monotonic() + self.grace)
        self._pending_changed.set()

    async def _expire_loop(self) -> None:
        while True:
            now = time.monotonic()
            due = sorted(k for k, t in self._pending.items() if t <= now)
            for key in due:
                del self._pending[key]
                self.cache.pop(key, None)
            if due:
                await self.deliver({}, due, True)
            nxt = min(self._pending.values(), default=math.inf)
            self._pending_changed = anyio.Event()
            with anyio.move_on_after(max(nxt - time.monotonic(), 0.01) if nxt < math.inf else 3600):
                await self._pending_changed.wait()
