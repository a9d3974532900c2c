"""The generic list/watch loop for one Kubernetes resource (a reflector, as client-go calls it).

A `Reflector` keeps a consumer up to date with one resource type:

1. **list**, paginated (``limit``/``continue``), remembering the list's
   resourceVersion; each page is compared with what the reflector delivered
   before (its store of name -> resourceVersion) and new or changed objects
   (another resourceVersion) are delivered at once, so the tables fill while
   later pages are fetched; after the last page the objects the list did not
   contain are delivered as deletions, in the delivery marked ``synced=True``.
   The first list therefore delivers everything; a relist after 410 Gone
   delivers exactly what changed while the watch was away, and the consumer's
   tables are never emptied in between (no traffic is dropped by a relist).
2. **watch** from that resourceVersion with bookmarks (``allowWatchBookmarks``)
   and a server-side timeout (``timeoutSeconds``, jittered like client-go's so
   a fleet of agents does not reconnect at once). ADDED/MODIFIED become upserts,
   DELETED deletions, BOOKMARK only moves the resourceVersion. When the server
   ends the stream (its timeout) the watch resumes at once from the last
   resourceVersion seen.
3. **errors**: 410 Gone (an ERROR event on the watch, or the status of a watch
   or list request) means the version is gone: relist (after a backoff when the
   list itself failed or its version was already gone). Anything else
   (connection refused or reset, TLS, 401, 429, 5xx, a malformed stream) waits
   with jittered exponential backoff (a
   ``Retry-After`` header is honoured) and resumes the watch, or relists when
   no list has completed. A stalled watch — no byte for ``stall_timeout``
   seconds, bookmarks included — is detected by the socket's read timeout and
   restarted the same way.

Deltas are delivered in the order the server sent them, one per event; coalescing per
object key (upstream's reflector buffer) is the consumer's job, done by the Kubernetes
source's applier for each batch it writes (`sources.k8s_source.coalesce`).

Blocking client calls run in worker threads (`anyio.to_thread.run_sync`); a watch's body
is read by the event loop from its non-blocking socket when it is readable
(`sources.k8s_watch_body`; a compressed or unchunked body by a worker thread, see
`_WatchPump`): the event loop never blocks on the network. Objects are decoded from the raw
response by `sources.k8s_json.loads` (orjson where
installed, else ``json.loads``): 0.9-1.6 us per Service against 22-43 us for the client's
model classes (benchmarks/k8s.py, ``decode_*``), and the converter wants plain dicts
anyway.
"""

from __future__ import annotations

import functools
import http.client
import logging
import random
import socket
import sys
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, cast

import anyio
import urllib3

from sources import k8s_json
from sources.k8s_client import K8sClient, resource_path
from sources.k8s_http import K8sApiError, describe_error
from sources.k8s_watch_body import ChunkedBodyError, socket_body
from sources.thread_calls import Prefetch, loop_call_soon
from statedb import rowbuild
from statedb.errors import StatewrightError
from statedb.rows import assignable_twin, slot_constructor

log = logging.getLogger(__name__)

#: Watch events decoded and delivered per loop turn (`Reflector._decode_and_deliver`).
DECODE_BATCH = 128
#: Seconds between looks at the earlier reflector's list (`Reflector.lists_after`).
LIST_ORDER_POLL = 0.01

# Reflector states (health).
LISTING = "listing"
WATCHING = "watching"
BACKING_OFF = "backing-off"
STOPPED = "stopped"


@dataclass(frozen=True, slots=True)
class ResourceSpec:
    """One resource to reflect: its name, kind, API version and plural (the collection
    listed and watched across all namespaces), and a field selector."""

    #: Short name used in health and logs ("services").
    name: str
    kind: str
    api_version: str
    #: The resource's plural ("services", "endpointslices", "ciliumidentities").
    plural: str
    field_selector: str = ""

    @property
    def path(self) -> str:
        """The collection's API path (every namespace)."""
        return resource_path(self.api_version, self.plural)


@dataclass(frozen=True, slots=True)
class ReflectorConfig:
    """Timing of the list/watch loop (defaults suit a real cluster; tests shorten them)."""

    #: Objects per list page (client-go asks for 500). Each request costs the client about
    #: a millisecond of CPU whatever its size (urllib3 and http.client's Python), 2 us
    #: per service of an initial list at 500, half that at 1,000; but pages of 1,000 left
    #: 5-9 MB more RSS after a 60,000-service sync (malloc's free memory held).
    page_size: int = 500
    #: Server-side watch timeout; each watch asks for a value in [t, 2t) (client-go: 5 min).
    watch_timeout: float = 300.0
    #: No byte (event or bookmark) for this long: the watch is stalled, restart it. The
    #: API server sends a bookmark about once a minute (kubernetes/kubernetes#90249),
    #: though clients may not rely on it: a quiet watch judged stalled by mistake costs
    #: one reconnect from the same resourceVersion (no relist).
    stall_timeout: float = 150.0
    connect_timeout: float = 10.0
    #: Read timeout of a list request.
    list_timeout: float = 60.0
    backoff_initial: float = 0.8
    backoff_max: float = 30.0
    #: Backoff delays are multiplied by a random factor in [1, 1 + jitter).
    jitter: float = 0.5
    #: A server's Retry-After is honoured up to this many seconds.
    max_retry_after: float = 300.0


@dataclass(frozen=True, slots=True)
class Delta:
    """One change to deliver: ``upsert`` with the object, or ``delete`` (object with at
    least kind and metadata.namespace/name).

    ``version`` is the object's resourceVersion as a number (`rv_number`), what the
    consumer counts progress in; left out, it is read from ``obj``. The reflector gives
    it (it reads every resourceVersion anyway): the consumer then reads no object's
    metadata for it."""

    op: str  # "upsert" | "delete"
    key: str  # namespace/name (name for cluster-scoped objects)
    obj: Mapping[str, Any]
    version: int = -1

    def __post_init__(self) -> None:
        if self.version < 0:
            object.__setattr__(self, "version", rv_number(self.obj))


def rv_number(obj: Mapping[str, Any]) -> int:
    """An object's ``metadata.resourceVersion`` as a number: 0 when it has none, or one
    that is no string of digits (a list's deletion stub, a malformed object)."""
    meta = obj.get("metadata")
    if type(meta) is not dict:  # the usual one first, without the fallback's lookups
        meta = meta or {}
    rv = meta.get("resourceVersion")
    return int(rv) if isinstance(rv, str) and rv.isdigit() else 0


#: ``Delta(op, key, obj, version)`` through its slots (one per object watched).
_new_delta = slot_constructor(Delta, "new_delta")


#: Deltas of a list page, built by plain slot stores (`statedb.rows.assignable_twin`):
#: ``_DeltaSlots()`` is an empty one.
_DeltaSlots = cast(Callable[[], Any], assignable_twin(Delta))
#: Whether `_new_delta` is statedb's compiled row builder (a fifth of the instructions of
#: the slot stores), not the Python one (the slot stores and a call).
_BUILT_IN_C = rowbuild.COMPILED

#: The consumer: ``deliver(reflector, deltas, synced)``; ``synced`` is True on the delivery
#: that completes a list. It may wait (back-pressure).
Deliver = Callable[["Reflector", list[Delta], bool], Awaitable[None]]


class GoneError(StatewrightError):
    """410 Gone: the resourceVersion (or continue token) expired; relist."""


class StreamError(StatewrightError):
    """The watch stream carried an ERROR event other than 410, or could not be decoded."""


@dataclass(slots=True)
class ReflectorHealth:
    """What a reflector is doing, for the health report."""

    state: str = LISTING
    since: float = field(default_factory=time.time)
    synced: bool = False
    last_error: str = ""
    error_since: float = 0.0
    resource_version: str = ""
    lists: int = 0
    watches: int = 0
    events: int = 0


def object_key(obj: Mapping[str, Any]) -> str:
    """``namespace/name`` (``name`` for cluster-scoped objects).

    Interned: the reflectors keep the key of every object, and the converter keeps the
    same ``namespace/name`` of each Service and EndpointSlice (interned too): one string
    for both."""
    meta = obj.get("metadata") or {}
    ns = meta.get("namespace") or ""
    name = meta.get("name") or ""
    return sys.intern(f"{ns}/{name}" if ns else str(name))


class Reflector:
    """List and watch one resource, delivering differences to a consumer."""

    def __init__(
        self,
        client: K8sClient,
        spec: ResourceSpec,
        deliver: Deliver,
        config: ReflectorConfig | None = None,
        *,
        rng: random.Random | None = None,
    ) -> None:
        self.client = client
        self.spec = spec
        self.deliver = deliver
        self.config = config or ReflectorConfig()
        self.health = ReflectorHealth()
        self._rng = rng or random.Random()
        #: name -> resourceVersion (as `_version`) of every object delivered and not
        #: deleted since.
        self._store: dict[str, int | str] = {}
        self._rv = ""
        self._failures = 0
        self._resp: Any = None
        self._listed_at = 0.0
        #: The reflector whose initial list this one's first list is delivered after, or
        #: None (`K8sSource`: Services after EndpointSlices); see `_wait_for_earlier_list`.
        self.lists_after: Reflector | None = None
        self._waited = False

    @property
    def name(self) -> str:
        """The resource's short name."""
        return self.spec.name

    @property
    def store(self) -> dict[str, str]:
        """Delivered objects: name -> resourceVersion (a copy)."""
        return {k: str(v) for k, v in self._store.items()}

    def _set_state(self, state: str) -> None:
        if self.health.state != state:
            self.health.state = state
            self.health.since = time.time()

    def _fail(self, e: BaseException) -> None:
        msg = describe_error(e)
        if not self.health.last_error or self.health.state != BACKING_OFF:
            self.health.error_since = time.time()
        self.health.last_error = msg
        log.warning("k8s %s: %s", self.spec.name, msg)

    # ----- the loop ---------------------------------------------------------------------------
    async def run(self) -> None:
        """List and watch until cancelled."""
        need_list = True
        try:
            while True:
                try:
                    if need_list:
                        await self._list()
                        need_list = False
                    await self._watch()
                    self._failures = 0
                except (
                    GoneError,
                    K8sApiError,
                    urllib3.exceptions.HTTPError,
                    http.client.HTTPException,
                    OSError,
                    StreamError,
                    ChunkedBodyError,
                    ValueError,  # a list that is not JSON
                ) as e:
                    if isinstance(e, K8sApiError) and e.status == 410:
                        # 410 as the watch request's status rather than as an ERROR event.
                        e = GoneError(describe_error(e))
                    if isinstance(e, GoneError):
                        log.info("k8s %s: %s; relisting", self.spec.name, e)
                        spin = need_list or time.monotonic() - self._listed_at < 1.0
                        need_list = True
                        if not spin:
                            continue
                        # The list itself expired (its continue token), or its version
                        # was already too old for a watch: back off instead of spinning.
                    self._fail(e)
                    delay = self._backoff(e)
                    self._set_state(BACKING_OFF)
                    await anyio.sleep(delay)
        finally:
            self._set_state(STOPPED)
            self._close_response()

    def _backoff(self, e: BaseException) -> float:
        ra = e.retry_after if isinstance(e, K8sApiError) else None
        if ra is not None:
            self._failures += 1
            return min(ra, self.config.max_retry_after)
        c = self.config
        base = min(c.backoff_max, c.backoff_initial * (2**self._failures))
        self._failures += 1
        return base * (1.0 + c.jitter * self._rng.random())

    # ----- list ---------------------------------------------------------------------------------
    def _list_page(self, cont: str) -> dict[str, Any]:
        c = self.config
        query = [("limit", str(c.page_size))]
        if cont:
            query.append(("continue", cont))
        if self.spec.field_selector:
            query.append(("fieldSelector", self.spec.field_selector))
        data = self.client.get(
            self.spec.path, query=query, timeout=(c.connect_timeout, c.list_timeout)
        )
        doc = k8s_json.loads(data)
        if not isinstance(doc, dict):
            raise StreamError(f"list returned {type(doc).__name__}, not an object")
        return doc

    async def _list(self) -> None:
        """List page by page. New or changed objects are delivered with each page (the
        tables fill while later pages are fetched); the objects the list did not contain
        are deleted after the last page, in the delivery that says ``synced``. The next
        page is requested before a page is delivered (`Prefetch`): its fetch and decoding
        overlap the applier's work on the one before."""
        self._set_state(LISTING)
        # With nothing delivered before (the first list), nothing can be missing from
        # this one: no set of the keys seen is needed (two big sets' work per object).
        seen: set[str] | None = set() if self._store else None
        meta, deltas = await self._list_pages(seen)
        if seen is not None:
            for key in sorted(self._store.keys() - seen):
                del self._store[key]
                deltas.append(Delta("delete", key, self._stub(key)))
        rv = str(meta.get("resourceVersion") or "")
        self._rv = rv
        self.health.resource_version = rv
        self.health.lists += 1
        self._listed_at = time.monotonic()
        await self._wait_for_earlier_list()
        await self.deliver(self, deltas, True)
        self.health.synced = True
        self._failures = 0

    async def _list_pages(self, seen: set[str] | None) -> tuple[dict[str, Any], list[Delta]]:
        """Fetch the pages, each requested while the one before is delivered; deliver all
        but the last; return the last page's metadata and deltas (``seen``: as in
        `_page_deltas`)."""
        fetch = self._prefetch("")
        while True:
            doc = await self._fetched(fetch)
            meta = doc.get("metadata") or {}
            deltas = self._page_deltas(doc, seen)
            cont = meta.get("continue") or ""
            if not cont:
                return meta, deltas
            fetch = self._prefetch(cont)
            if deltas:
                await self._wait_for_earlier_list()
                await self.deliver(self, deltas, False)

    def _prefetch(self, cont: str) -> Prefetch[dict[str, Any]]:
        """The list page after ``cont`` ("": the first), requested now in a thread."""
        return Prefetch(functools.partial(self._list_page, cont), f"k8s-list-{self.spec.name}")

    @staticmethod
    async def _fetched(fetch: Prefetch[dict[str, Any]]) -> dict[str, Any]:
        """A list page's document; 410 Gone (the continue token expired mid-list) as
        `GoneError`: the list starts over (what was delivered is in the store; the new
        list's difference corrects it)."""
        try:
            return await fetch.result()
        except K8sApiError as e:
            if e.status == 410:
                raise GoneError(describe_error(e)) from None
            raise

    def _page_deltas(self, doc: dict[str, Any], seen: set[str] | None) -> list[Delta]:
        """The upserts of a list page's new or changed objects (recorded in the store),
        every object's key added to ``seen`` (None: not tracked, the first list)."""
        deltas: list[Delta] = []
        append = deltas.append
        kind, api_version, store = self.spec.kind, self.spec.api_version, self._store
        intern = sys.intern
        new_delta, in_c = _new_delta, _BUILT_IN_C
        for item in doc.get("items") or []:
            if type(item) is not dict and not isinstance(item, dict):
                continue
            # List items carry neither kind nor apiVersion; the converter needs kind.
            item["kind"] = kind
            item["apiVersion"] = api_version
            meta = item.get("metadata")
            if type(meta) is dict:
                # `object_key` and `_version(_rv_of(item))` of the usual item, inline.
                ns = meta.get("namespace")
                name = meta.get("name")
                rv = meta.get("resourceVersion")
                if type(ns) is str and ns and type(name) is str:
                    key = intern(f"{ns}/{name}")
                else:
                    key = object_key(item)
                if type(rv) is str and rv.isascii() and rv.isdigit() and rv[0] != "0":
                    number = int(rv)
                    version: int | str = number
                else:
                    version = _version(_rv_of(item))
                    number = rv_number(item)
            else:
                key = object_key(item)
                version = _version(_rv_of(item))
                number = rv_number(item)
            if seen is not None:
                seen.add(key)
            if store.get(key) != version:
                store[key] = version
                if in_c:
                    # One call of the compiled row builder.
                    append(new_delta("upsert", key, item, number))
                    continue
                # A Delta("upsert", key, item, number), built by plain slot stores (without
                # the call the Python builder would add).
                d: Any = _DeltaSlots()
                d.op = "upsert"
                d.key = key
                d.obj = item
                d.version = number
                d.__class__ = Delta
                append(d)
        return deltas

    async def _wait_for_earlier_list(self) -> None:
        """Before this reflector's first delivery: wait until the `lists_after` reflector
        has delivered its initial list, or stopped listing (it failed and backs off, or
        was stopped: one resource's trouble never holds another back). Only the first
        list waits.

        What for: a Service applied before its EndpointSlices gets frontends without
        backends, written (and reconciled into the maps) again when its slices arrive;
        with the slices first, each frontend is written once, with its backends. The
        page fetched meanwhile waits here (the next one is not fetched until it is
        delivered), so the wait holds one page, not the whole list."""
        if self._waited:
            return
        self._waited = True
        other = self.lists_after
        if other is None:
            return
        while not other.health.synced and other.health.state == LISTING:
            await anyio.sleep(LIST_ORDER_POLL)

    def _stub(self, key: str) -> dict[str, Any]:
        ns, _, name = key.rpartition("/")
        meta = {"name": name, "namespace": ns} if ns else {"name": name}
        return {"kind": self.spec.kind, "apiVersion": self.spec.api_version, "metadata": meta}

    # ----- watch --------------------------------------------------------------------------------
    def _open_watch(self) -> Any:
        c = self.config
        timeout = int(c.watch_timeout * (1.0 + self._rng.random())) or 1
        query = [
            ("allowWatchBookmarks", "true"),
            ("resourceVersion", self._rv),
            ("timeoutSeconds", str(timeout)),
            ("watch", "true"),
        ]
        if self.spec.field_selector:
            query.append(("fieldSelector", self.spec.field_selector))
        return self.client.watch(
            self.spec.path, query=query, timeout=(c.connect_timeout, c.stall_timeout)
        )

    def _close_response(self) -> None:
        resp, self._resp = self._resp, None
        if resp is None:
            return
        # Shut the socket down first: a worker thread blocked reading it wakes up.
        sock = getattr(getattr(resp, "connection", None), "sock", None)
        if isinstance(sock, socket.socket):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        try:
            resp.close()
        except Exception:  # closing a broken response must not mask the real error
            pass

    async def _watch(self) -> None:
        resp = await anyio.to_thread.run_sync(self._open_watch)
        self._resp = resp
        self._set_state(WATCHING)
        self.health.watches += 1
        self.health.last_error = ""
        failure: BaseException | None = None
        try:
            body = socket_body(resp, self.config.stall_timeout)
            if body is not None:  # the usual case: read by the loop, no thread
                failure = await self._consume(body.take)
            else:
                failure = await self._consume_in_thread(resp)
        finally:
            self._close_response()
        if failure is not None:
            raise failure

    async def _consume_in_thread(self, resp: Any) -> BaseException | None:
        """`_consume` for a body `socket_body` does not read (compressed or not chunked):
        urllib3 reads it in a worker thread."""
        pump = _WatchPump(resp.stream(65536, decode_content=True))
        # Errors leave the task group as values: raised inside it they would come out
        # wrapped in an ExceptionGroup.
        async with anyio.create_task_group() as tg:
            tg.start_soon(pump.run_in_thread)
            failure = await self._consume(pump.take)
            tg.cancel_scope.cancel()
        return failure

    async def _consume(
        self, take: Callable[[], Awaitable[tuple[bytes, bool, BaseException | None]]]
    ) -> BaseException | None:
        """Decode and deliver what ``take`` returns (what arrived, the stream ended, its
        error) until the stream ends; the error that ended it (None when the server ended
        the watch cleanly: resume)."""
        buf = b""
        while True:
            data, finished, error = await take()
            if data:
                buf += data
                if b"\n" in buf:
                    *lines, buf = buf.split(b"\n")
                    bad = await self._decode_and_deliver(lines)
                    if bad is not None:
                        return bad
            if error is not None:
                if _is_read_timeout(error):
                    stalled = StreamError(
                        f"watch stalled: nothing received for {self.config.stall_timeout:g}s"
                    )
                    stalled.__cause__ = error
                    return stalled
                return error
            if finished:
                return None

    async def _decode_and_deliver(self, lines: list[bytes]) -> Exception | None:
        """Decode and deliver ``lines`` `DECODE_BATCH` at a time, yielding between batches
        (a watch that fell behind hands over thousands of events at once: decoded in one
        go they held the event loop for a second); the error at the first bad line."""
        for start in range(0, len(lines), DECODE_BATCH):
            if start:
                await anyio.lowlevel.checkpoint()
            deltas, bad = self._decode(lines[start : start + DECODE_BATCH])
            if deltas:
                await self.deliver(self, deltas, False)
            if bad is not None:
                # Returned only now: what came before it is in the store, so it must have
                # been delivered, or a relist would think it applied.
                return bad
        return None

    def _decode(self, lines: list[bytes]) -> tuple[list[Delta], Exception | None]:
        """The deltas of complete event lines up to the first error, and that error
        (`GoneError` for an ERROR 410, `StreamError` otherwise)."""
        deltas: list[Delta] = []
        for line in lines:
            if not line.strip():
                continue
            try:
                event = k8s_json.loads(line)
                etype = event["type"]
                obj = event["object"]
            except (ValueError, KeyError, TypeError):
                return deltas, StreamError(f"undecodable watch event: {line[:200]!r}")
            if etype == "ERROR":
                code = obj.get("code") if isinstance(obj, dict) else None
                msg = obj.get("message", "") if isinstance(obj, dict) else str(obj)
                if code == 410:
                    return deltas, GoneError(f"watch: {msg or '410 Gone'}")
                return deltas, StreamError(f"watch ERROR {code}: {msg}")
            if not isinstance(obj, dict):
                return deltas, StreamError(f"watch event {etype}: object is not a mapping")
            rv = _rv_of(obj)
            if etype == "BOOKMARK":
                if rv:
                    self._rv = rv
                    self.health.resource_version = rv
                continue
            key = object_key(obj)
            obj.setdefault("kind", self.spec.kind)
            if etype in ("ADDED", "MODIFIED"):
                self._store[key] = _version(rv)
                deltas.append(_new_delta("upsert", key, obj, rv_number(obj)))
            elif etype == "DELETED":
                self._store.pop(key, None)
                deltas.append(Delta("delete", key, obj))
            else:
                return deltas, StreamError(f"unknown watch event type {etype!r}")
            if rv:
                self._rv = rv
            self.health.events += 1
        self.health.resource_version = self._rv
        return deltas, None


def _version(rv: str) -> int | str:
    """A resourceVersion as the store keeps it: the number when it is one in canonical
    decimal form (every API server's are: etcd revisions), else the string. An int of a
    revision takes 28 bytes against 56 for its string, about 3 MB at 60,000 Services and
    their EndpointSlices; equal versions give equal values, different ones different."""
    if rv.isascii() and rv.isdigit() and (rv[0] != "0" or rv == "0"):
        return int(rv)
    return rv


def _rv_of(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion") or "")


def _is_read_timeout(e: BaseException) -> bool:
    """True for the socket read timeout that marks a stalled watch."""
    if isinstance(e, urllib3.exceptions.ReadTimeoutError | TimeoutError | socket.timeout):
        return True
    return isinstance(e, urllib3.exceptions.ProtocolError) and "timed out" in repr(e)


class _WatchPump:
    """Reads a watch stream in a worker thread; the event loop takes what has arrived.

    Why not one thread hop per read: under load the loop is busy applying a batch while
    several events arrive; the reader keeps appending and the loop takes them all at
    once, so decoding and delivery batch by themselves. The loop is woken only when the
    buffer goes from empty to non-empty, without the reader waiting for it (a blocking
    ``anyio.from_thread.run_sync`` would hold the reader until the busy loop got round
    to it: one event per loop turn under load), and the reader waits only when
    ``max_pending_bytes`` are not taken yet (back-pressure, not unbounded memory: the
    socket's buffers then fill and the server holds the rest).
    Build it in the event loop's thread."""

    def __init__(self, chunks: Iterator[bytes], max_pending_bytes: int = 8 << 20) -> None:
        self._chunks = chunks
        self._max = max_pending_bytes
        self._buf: deque[bytes] = deque()
        self._pending = 0
        self._cond = threading.Condition()
        self._ready = anyio.Event()
        self._finished = False
        self._error: BaseException | None = None
        self._closed = False
        self._call_soon = loop_call_soon()

    async def run_in_thread(self) -> None:
        """Run the reader in a worker thread (abandoned on cancellation: the caller shuts
        the socket down, which ends the read)."""
        try:
            await anyio.to_thread.run_sync(self._read_all, abandon_on_cancel=True)
        finally:
            with self._cond:
                self._closed = True
                self._cond.notify_all()

    def _wake(self) -> None:
        self._ready.set()

    def _notify_loop(self) -> None:
        try:
            self._call_soon(self._wake)
        except RuntimeError:  # the loop is closed: nobody waits any more
            pass

    def _read_all(self) -> None:
        try:
            for chunk in self._chunks:
                with self._cond:
                    while self._pending >= self._max and not self._closed:
                        self._cond.wait(0.1)
                    if self._closed:
                        return
                    was_empty = not self._buf
                    self._buf.append(chunk)
                    self._pending += len(chunk)
                if was_empty:
                    self._notify_loop()
        except BaseException as e:  # handed to the event loop, which raises it
            self._error = e
        finally:
            self._finished = True
            self._notify_loop()

    async def take(self) -> tuple[bytes, bool, BaseException | None]:
        """Wait for data or the end: (bytes that arrived, stream ended, its error)."""
        while True:
            with self._cond:
                if self._buf or self._finished:
                    data = b"".join(self._buf)
                    self._buf.clear()
                    self._pending = 0
                    self._cond.notify_all()
                    return data, self._finished and not data, self._error if not data else None
            await self._ready.wait()
            self._ready = anyio.Event()
