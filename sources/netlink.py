"""The netlink source: the devices and node-addresses tables, kept equal to the kernel's links,
addresses and routes.

How it works:

* A reader thread (started with `anyio.to_thread.run_sync`, so nothing on the
  event loop ever blocks on netlink) opens an rtnetlink socket subscribed to
  link, IPv4/IPv6 address and IPv4/IPv6 route events, *then* takes a full dump
  (links, addresses, routes of every table) through a pyroute2 ``IPRoute`` —
  subscribing first means no change can fall between the dump and the events.
  It converts kernel messages into small immutable records (`LinkInfo`,
  `AddrInfo`, `RouteInfo`) and hands them to the event loop through a memory
  object stream.
* The `NetlinkSource.run` task keeps a `KernelModel` (the kernel state as last
  reported): a dump replaces it, events update it. Bursts are batched: after
  a change, the tables are written at most once every ``batch_interval``
  seconds, in one write transaction that replaces the changed device rows and
  upserts/deletes node addresses through `LBWriter` (so NodePort frontends are
  re-marked Pending and their expansion follows).
* Any netlink error (ENOBUFS when the kernel dropped events because the socket
  buffer overflowed, a failed dump, a closed socket) means events may have been
  lost: the reader closes everything, reopens, and takes a new full dump, which
  replaces the model, so the tables converge to the kernel's state again.
  Repeated failures back off (up to 5 s). Errors are counted in `stats` and
  the last one is kept for health reporting.
* The source registers an initializer ("netlink") on the devices and the
  node-addresses tables at construction and marks it done in the transaction
  that applies the first full dump.
* Cancelling the task stops the reader (it is woken through a pipe, closes its
  sockets and returns) before `run` returns.

``netns`` (a name under /var/run/netns or a path) makes both sockets live in
that network namespace (pyroute2 creates them there), so tests and the agent can
target one; ``None`` is the agent's own namespace.

The kernel flushes the IPv4 routes of a device that goes down (all but the
``local`` routes of its addresses), and every route of a removed device,
without sending RTM_DELROUTE; the model does the same (a kernel test checks
that the event-driven state equals a fresh dump after such churn). Link
messages of the bridge family (AF_BRIDGE, bridge port state) are ignored.
"""

from __future__ import annotations

import collections
import dataclasses
import errno
import ipaddress
import logging
import math
import os
import select
import socket
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream

from sources.node_address_selection import (
    NodeAddressConfig,
    is_global_unicast,
    select_device,
    select_node_addresses,
)
from statedb import DB, StatewrightError, Table, WriteTxn
from tables.devices import Device, DeviceAddress, flag_names, new_devices_table
from tables.l3n4 import IPAddress, IPNetwork
from tables.lb_writer import LBWriter
from tables.node_addresses import NodeAddress

log = logging.getLogger(__name__)

#: Name of the table initializer this source registers.
INITIALIZER = "netlink"

# rtnetlink message types and multicast groups (linux/rtnetlink.h).
RTM_NEWLINK, RTM_DELLINK = 16, 17
RTM_NEWADDR, RTM_DELADDR = 20, 21
RTM_NEWROUTE, RTM_DELROUTE = 24, 25
RTMGRP_LINK = 0x1
RTMGRP_IPV4_IFADDR = 0x10
RTMGRP_IPV4_ROUTE = 0x40
RTMGRP_IPV6_IFADDR = 0x100
RTMGRP_IPV6_ROUTE = 0x400
EVENT_GROUPS = (
    RTMGRP_LINK | RTMGRP_IPV4_IFADDR | RTMGRP_IPV6_IFADDR | RTMGRP_IPV4_ROUTE | RTMGRP_IPV6_ROUTE
)
NETLINK_ROUTE = 0
AF_BRIDGE = 7
IFF_UP = 0x1
IFA_F_SECONDARY = 0x01
RT_TABLE_LOCAL = 255
RTN_UNICAST = 1
RTN_LOCAL = 2
# Socket options not exported by the socket module.
SO_RCVBUFFORCE = 33

#: Longest wait between two rebuild attempts after repeated failures (seconds).
MAX_BACKOFF = 5.0
#: First wait after a failed rebuild (seconds).
MIN_BACKOFF = 0.05


# ----- kernel records -------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class LinkInfo:
    """A link as the kernel reports it (RTM_NEWLINK)."""

    index: int
    name: str
    mtu: int
    flags: int
    hardware_addr: str = ""
    kind: str = ""
    master_index: int = 0
    oper_state: str = ""


@dataclass(frozen=True, slots=True)
class AddrInfo:
    """An address of a link (RTM_NEWADDR). For IPv6 the secondary bit is IFA_F_TEMPORARY."""

    index: int
    address: IPAddress
    prefixlen: int
    scope: int
    secondary: bool


@dataclass(frozen=True, slots=True)
class RouteInfo:
    """One next hop of a route (RTM_NEWROUTE); multipath routes give one record per hop."""

    family: int
    table: int
    dst: IPNetwork
    oif: int
    priority: int = 0
    tos: int = 0
    type: int = RTN_UNICAST

    @property
    def key(self) -> tuple[Any, ...]:
        """What identifies the route (and next hop) for replacement and deletion."""
        return (self.family, self.table, self.dst, self.tos, self.priority, self.oif)


KernelObject = LinkInfo | AddrInfo | RouteInfo


@dataclass(frozen=True, slots=True)
class Update:
    """One change from an event: ``op`` "set" (new or changed) or "delete"."""

    op: Literal["set", "delete"]
    obj: KernelObject


@dataclass(frozen=True, slots=True)
class Snapshot:
    """A full dump of the namespace's links, addresses and routes."""

    links: tuple[LinkInfo, ...]
    addrs: tuple[AddrInfo, ...]
    routes: tuple[RouteInfo, ...]


@dataclass(frozen=True, slots=True)
class ReaderErrorEvent:
    """The reader hit an error (events may be lost) and is rebuilding from a new dump."""

    message: str
    errno: int | None = None


ReaderItem = Snapshot | tuple[Update, ...] | ReaderErrorEvent


# ----- message conversion ---------------------------------------------------------------------
def _attr(msg: Any, name: str, default: Any = None) -> Any:
    v = msg.get_attr(name)
    return default if v is None else v


def link_from_msg(msg: Any) -> LinkInfo:
    """Convert an ifinfmsg (pyroute2) into a `LinkInfo`."""
    kind = ""
    info = msg.get_attr("IFLA_LINKINFO")
    if info is not None:
        kind = info.get_attr("IFLA_INFO_KIND") or ""
    return LinkInfo(
        index=int(msg["index"]),
        name=str(_attr(msg, "IFLA_IFNAME", "")),
        mtu=int(_attr(msg, "IFLA_MTU", 0)),
        flags=int(msg["flags"]),
        hardware_addr=str(_attr(msg, "IFLA_ADDRESS", "")),
        kind=str(kind),
        master_index=int(_attr(msg, "IFLA_MASTER", 0)),
        oper_state=str(_attr(msg, "IFLA_OPERSTATE", "")),
    )


def addr_from_msg(msg: Any) -> AddrInfo | None:
    """Convert an ifaddrmsg into an `AddrInfo` (None for a family other than IPv4/IPv6).

    IPv4 takes IFA_LOCAL (on point-to-point links IFA_ADDRESS is the peer); flags
    come from IFA_FLAGS when present (the header field has only 8 bits).
    """
    family = int(msg["family"])
    if family not in (socket.AF_INET, socket.AF_INET6):
        return None
    text = msg.get_attr("IFA_LOCAL") if family == socket.AF_INET else None
    if text is None:
        text = msg.get_attr("IFA_ADDRESS")
    if text is None:
        return None
    flags = msg.get_attr("IFA_FLAGS")
    if flags is None:
        flags = msg["flags"]
    return AddrInfo(
        index=int(msg["index"]),
        address=ipaddress.ip_address(text),
        prefixlen=int(msg["prefixlen"]),
        scope=int(msg["scope"]),
        secondary=bool(int(flags) & IFA_F_SECONDARY),
    )


def routes_from_msg(msg: Any) -> list[RouteInfo]:
    """Convert an rtmsg into one `RouteInfo` per next hop (none without an output device)."""
    family = int(msg["family"])
    if family not in (socket.AF_INET, socket.AF_INET6):
        return []
    table = msg.get_attr("RTA_TABLE")
    if table is None:
        table = msg["table"]
    dst_text = msg.get_attr("RTA_DST")
    plen = int(msg["dst_len"])
    if dst_text is None:
        dst_text = "0.0.0.0" if family == socket.AF_INET else "::"
    dst = ipaddress.ip_network(f"{dst_text}/{plen}", strict=False)
    oifs: list[int] = []
    oif = msg.get_attr("RTA_OIF")
    if oif is not None:
        oifs.append(int(oif))
    for hop in msg.get_attr("RTA_MULTIPATH") or ():
        hop_oif = hop.get("oif") if isinstance(hop, dict) else hop["oif"]
        if hop_oif:
            oifs.append(int(hop_oif))
    return [
        RouteInfo(
            family=4 if family == socket.AF_INET else 6,
            table=int(table),
            dst=dst,
            oif=o,
            priority=int(_attr(msg, "RTA_PRIORITY", 0)),
            tos=int(msg["tos"]),
            type=int(msg["type"]),
        )
        for o in oifs
    ]


def updates_from_msgs(msgs: Iterable[Any]) -> list[Update]:
    """Convert event messages into updates (unrelated messages are skipped)."""
    out: list[Update] = []
    for msg in msgs:
        mtype = msg["header"]["type"]
        if mtype in (RTM_NEWLINK, RTM_DELLINK):
            if int(msg["family"]) == AF_BRIDGE:
                continue
            out.append(Update("set" if mtype == RTM_NEWLINK else "delete", link_from_msg(msg)))
        elif mtype in (RTM_NEWADDR, RTM_DELADDR):
            a = addr_from_msg(msg)
            if a is not None:
                out.append(Update("set" if mtype == RTM_NEWADDR else "delete", a))
        elif mtype in (RTM_NEWROUTE, RTM_DELROUTE):
            op: Literal["set", "delete"] = "set" if mtype == RTM_NEWROUTE else "delete"
            out.extend(Update(op, r) for r in routes_from_msg(msg))
    return out


# ----- the kernel model -----------------------------------------------------------------------
class KernelModel:
    """The links, addresses and routes last reported by the kernel."""

    def __init__(self) -> None:
        self.links: dict[int, LinkInfo] = {}
        self.addrs: dict[int, dict[tuple[IPAddress, int], AddrInfo]] = {}
        self.routes: dict[tuple[Any, ...], RouteInfo] = {}

    def reset(self, snap: Snapshot) -> None:
        """Replace everything with a full dump."""
        self.links = {ln.index: ln for ln in snap.links}
        self.addrs = {}
        for a in snap.addrs:
            self.addrs.setdefault(a.index, {})[(a.address, a.prefixlen)] = a
        self.routes = {r.key: r for r in snap.routes}

    def apply(self, u: Update) -> None:
        """Apply one event, mirroring what the kernel does without telling (see module doc)."""
        obj = u.obj
        if isinstance(obj, LinkInfo):
            if u.op == "delete":
                self.links.pop(obj.index, None)
                self.addrs.pop(obj.index, None)
                self._drop_routes(obj.index, None)
                return
            self.links[obj.index] = obj
            if not obj.flags & IFF_UP:
                # IPv4 flushes the device's routes (but not the local ones of its
                # addresses) without telling; IPv6 sends RTM_DELROUTE for its own.
                self._drop_routes(obj.index, 4, keep_local=True)
        elif isinstance(obj, AddrInfo):
            key = (obj.address, obj.prefixlen)
            if u.op == "delete":
                per = self.addrs.get(obj.index)
                if per is not None:
                    per.pop(key, None)
                    if not per:
                        del self.addrs[obj.index]
            else:
                self.addrs.setdefault(obj.index, {})[key] = obj
        elif u.op == "delete":
            self.routes.pop(obj.key, None)
        else:
            self.routes[obj.key] = obj

    def _drop_routes(self, index: int, family: int | None, keep_local: bool = False) -> None:
        for k in [
            k
            for k, r in self.routes.items()
            if r.oif == index
            and (family is None or r.family == family)
            and not (keep_local and r.type == RTN_LOCAL)
        ]:
            del self.routes[k]

    def global_route_devices(self) -> set[int]:
        """Indexes of devices with a unicast route to a global destination (or a default
        route) in a table other than the local one."""
        out: set[int] = set()
        for r in self.routes.values():
            if r.table == RT_TABLE_LOCAL or r.type != RTN_UNICAST:
                continue
            if r.dst.prefixlen == 0 or is_global_unicast(r.dst.network_address):
                out.add(r.oif)
        return out

    def devices(self, config: NodeAddressConfig) -> list[Device]:
        """The device rows for the current state, with selection decided by ``config``."""
        routed = self.global_route_devices()
        out: list[Device] = []
        for ln in sorted(self.links.values(), key=lambda x: x.index):
            addrs = sorted(
                self.addrs.get(ln.index, {}).values(),
                key=lambda a: (a.address.version, int(a.address), a.prefixlen),
            )
            dev = Device(
                index=ln.index,
                name=ln.name,
                mtu=ln.mtu,
                flags=flag_names(ln.flags),
                hardware_addr=ln.hardware_addr,
                kind=ln.kind,
                master_index=ln.master_index,
                oper_state=ln.oper_state,
                addresses=tuple(
                    DeviceAddress(a.address, a.prefixlen, a.scope, a.secondary) for a in addrs
                ),
            )
            selected, reason = select_device(dev, ln.index in routed, config)
            out.append(dataclasses.replace(dev, selected=selected, reason=reason))
        return out


# ----- the reader thread ----------------------------------------------------------------------
class _Stopped(StatewrightError):
    """The reader was asked to stop (or the event loop side went away); caught inside the
    reader thread, never raised to callers."""


class NetlinkReader:
    """Reads rtnetlink in its own thread: open, dump, then events; rebuild after errors.

    ``emit`` hands an item to the event loop and blocks while the stream is full
    (back-pressure: the kernel buffers meanwhile, and overflows into ENOBUFS, which
    triggers a rebuild). It raises when the receiving side is gone.
    """

    def __init__(
        self,
        emit: Callable[[ReaderItem], None],
        *,
        netns: str | None = None,
        rcvbuf: int = 1 << 20,
    ) -> None:
        self.emit = emit
        self.netns = netns
        self.rcvbuf = rcvbuf
        self._stop = threading.Event()
        self._resume = threading.Event()
        self._resume.set()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        # Guards the pipe: once the thread closed it, its numbers may belong to other files.
        self._pipe_lock = threading.Lock()
        self._pipe_open = True
        self._injected: list[int] = []
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._ipr: Any = None

    # -- control (any thread) --
    def stop(self) -> None:
        """Ask the reader to return soon (it wakes from poll through a pipe)."""
        self._stop.set()
        self._resume.set()
        self._wake()

    def pause(self) -> None:
        """Stop reading events until `resume` (testing aid: let events pile up)."""
        self._resume.clear()

    def resume(self) -> None:
        """Read events again after `pause`."""
        self._resume.set()
        self._wake()

    def inject_error(self, code: int) -> None:
        """Act as if the event socket failed with ``code`` (testing aid)."""
        with self._lock:
            self._injected.append(code)
        self._wake()

    def _wake(self) -> None:
        with self._pipe_lock:
            if not self._pipe_open:
                return
            try:
                os.write(self._wake_w, b"x")
            except BlockingIOError:  # pipe full: already woken
                pass

    # -- the thread --
    def run(self) -> None:
        """The thread body: (re)build and read events until `stop`."""
        backoff = MIN_BACKOFF
        try:
            while not self._stop.is_set():
                try:
                    self._open()
                    snap = self._dump()
                    self.emit(snap)
                    backoff = MIN_BACKOFF
                    self._read_events()
                except _Stopped:
                    break
                except Exception as e:
                    code = e.errno if isinstance(e, OSError) else getattr(e, "code", None)
                    where = f" in netns {self.netns!r}" if self.netns else ""
                    msg = f"netlink{where}: {type(e).__name__}: {e}; rebuilding from a full dump"
                    self._close()
                    self.emit(ReaderErrorEvent(msg, code if isinstance(code, int) else None))
                    if self._stop.wait(backoff):
                        break
                    backoff = min(backoff * 2, MAX_BACKOFF)
        except _Stopped:
            pass
        finally:
            self._close()
            with self._pipe_lock:
                self._pipe_open = False
                os.close(self._wake_r)
                os.close(self._wake_w)

    def _open(self) -> None:
        """Subscribe to events first, then open the dump handle (no gap between them)."""
        from pyroute2 import IPRoute
        from pyroute2 import netns as pnetns

        self._close()
        sock = pnetns.create_socket(
            netns=self.netns,
            family=socket.AF_NETLINK,
            socket_type=socket.SOCK_DGRAM,
            proto=NETLINK_ROUTE,
            flags=0,
        )
        try:
            try:
                sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, self.rcvbuf)
            except OSError:  # no CAP_NET_ADMIN: the plain option, capped by rmem_max
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, self.rcvbuf)
            sock.bind((0, EVENT_GROUPS))
            sock.setblocking(False)
        except BaseException:
            sock.close()
            raise
        self._sock = sock
        self._ipr = IPRoute(netns=self.netns, flags=0) if self.netns else IPRoute()
        # Drop errors injected before this (re)build: they are handled by it.
        with self._lock:
            self._injected.clear()

    def _close(self) -> None:
        sock, self._sock = self._sock, None
        ipr, self._ipr = self._ipr, None
        if sock is not None:
            sock.close()
        if ipr is not None:
            try:
                ipr.close()
            except Exception as e:  # closing must not hide the error being handled
                log.debug("netlink: closing the dump handle: %s", e)

    def _dump(self) -> Snapshot:
        """A full dump of links, addresses and routes; retried when the kernel reports it
        was interrupted by a concurrent change (NLM_F_DUMP_INTR)."""
        from pyroute2.netlink.exceptions import NetlinkDumpInterrupted

        ipr = self._ipr
        assert ipr is not None
        for attempt in range(10):
            if self._stop.is_set():
                raise _Stopped
            try:
                links = tuple(
                    link_from_msg(m) for m in ipr.get_links() if int(m["family"]) != AF_BRIDGE
                )
                addrs = tuple(a for a in map(addr_from_msg, ipr.get_addr()) if a is not None)
                routes = tuple(r for m in ipr.route("dump") for r in routes_from_msg(m))
                return Snapshot(links, addrs, routes)
            except NetlinkDumpInterrupted:
                log.debug("netlink: dump interrupted (attempt %d), retrying", attempt + 1)
        raise OSError(errno.EAGAIN, "full dump interrupted 10 times in a row")

    def _read_events(self) -> None:
        """Read, parse and emit events until stopped; raise on a socket error."""
        from pyroute2.netlink.rtnl.marshal import MarshalRtnl

        sock = self._sock
        assert sock is not None
        marshal = MarshalRtnl()
        # poll, not select: the agent may hold more than FD_SETSIZE descriptors.
        poller = select.poll()
        poller.register(sock.fileno(), select.POLLIN)
        poller.register(self._wake_r, select.POLLIN)
        while True:
            if not self._resume.is_set():
                self._resume.wait()
            if self._stop.is_set():
                raise _Stopped
            with self._lock:
                injected = self._injected.pop(0) if self._injected else None
            if injected is not None:
                # Simulate an overflow: what is queued is lost, then the error.
                self._discard_queued(sock)
                raise OSError(injected, f"{os.strerror(injected)} (injected)")
            ready = {fd for fd, _ in poller.poll()}
            if self._wake_r in ready:
                try:
                    while os.read(self._wake_r, 512):
                        pass
                except BlockingIOError:
                    pass
            if sock.fileno() not in ready or not self._resume.is_set():
                continue
            batch: list[Update] = []
            for _ in range(64):  # read what is queued, then hand it over in one item
                try:
                    data = sock.recv(1 << 16)
                except BlockingIOError:
                    break
                batch.extend(updates_from_msgs(marshal.parse(data)))
            if batch:
                self.emit(tuple(batch))

    @staticmethod
    def _discard_queued(sock: socket.socket) -> None:
        while True:
            try:
                sock.recv(1 << 16)
            except (BlockingIOError, OSError):
                return


# ----- the source -----------------------------------------------------------------------------
@dataclass(slots=True)
class NetlinkStats:
    """Counters of the source, for health and tests."""

    dumps: int = 0
    event_batches: int = 0
    updates: int = 0
    applies: int = 0
    errors: int = 0
    last_error: str = ""
    last_error_at: float = 0.0
    last_dump_at: float = 0.0
    #: errno of the most recent errors (the last 32).
    error_codes: collections.deque[int] = field(
        default_factory=lambda: collections.deque(maxlen=32)
    )


class NetlinkSource:
    """Keeps the devices and node-addresses tables up to date from rtnetlink.

    Start it with ``await task_group.start(source.run)`` (returns once the first full
    dump is in the tables) or ``task_group.start_soon(source.run)``; cancel the task
    group to stop it::

        writer = LBWriter.create(db)
        source = NetlinkSource.create(db, writer, NodeAddressConfig.from_dict(cfg))
        async with anyio.create_task_group() as tg:
            await tg.start(source.run)      # devices + node addresses are in the tables
            ...
            ok, reason = source.health()
            tg.cancel_scope.cancel()        # run returns after the reader thread exited

    Constructing it registers the "netlink" initializer on both tables, so construct
    it before anything that waits for them to be initialized.
    """

    def __init__(
        self,
        db: DB,
        writer: LBWriter,
        devices: Table[Device],
        config: NodeAddressConfig | None = None,
        *,
        netns: str | None = None,
        batch_interval: float = 0.1,
        rcvbuf: int = 1 << 20,
        queue_size: int = 64,
    ) -> None:
        if batch_interval < 0:
            raise ValueError(f"netlink source: batch_interval must be >= 0, got {batch_interval}")
        if devices.db is not db:
            raise ValueError(f"netlink source: table {devices.name!r} is not registered with db")
        self.db = db
        self.writer = writer
        self.devices = devices
        self.node_addresses = writer.node_addresses
        self.config = config if config is not None else NodeAddressConfig()
        self.netns = netns
        self.batch_interval = batch_interval
        self.rcvbuf = rcvbuf
        self.queue_size = queue_size
        self.stats = NetlinkStats()
        self.model = KernelModel()
        self._written: dict[tuple[IPAddress, str], NodeAddress] = {}
        self._reader: NetlinkReader | None = None
        self._have_dump = False
        with db.write_txn(self.devices, self.node_addresses) as txn:
            done_dev = self.devices.register_initializer(txn, INITIALIZER)
            done_na = self.node_addresses.register_initializer(txn, INITIALIZER)

        def done(wtxn: WriteTxn) -> None:
            done_dev(wtxn)
            done_na(wtxn)

        self._init_done: Callable[[WriteTxn], None] | None = done

    @classmethod
    def create(
        cls,
        db: DB,
        writer: LBWriter,
        config: NodeAddressConfig | None = None,
        **kwargs: Any,
    ) -> NetlinkSource:
        """Create the devices table, register it with ``db`` and return a source on it
        (``kwargs`` as for the constructor: netns, batch_interval, rcvbuf, queue_size)."""
        devices = new_devices_table()
        db.register(devices)
        return cls(db, writer, devices, config, **kwargs)

    @property
    def initialized(self) -> bool:
        """True once the first full dump has been written to the tables."""
        return self._init_done is None

    def health(self) -> tuple[bool, str]:
        """(ok, reason) for the agent's health report: degraded until the first dump is in
        the tables and while a rebuild after an error has not completed."""
        st = self.stats
        if not self.initialized:
            why = f": {st.last_error}" if st.last_error else ""
            return False, f"netlink: waiting for the first full dump{why}"
        if st.last_error and st.last_error_at > st.last_dump_at:
            return False, f"netlink: rebuilding after an error: {st.last_error}"
        return True, f"netlink: {st.dumps} dump(s), {st.errors} error(s)"

    # ----- testing aids --------------------------------------------------------------------------
    def pause_reading(self) -> None:
        """Testing aid: stop reading the event socket, so events pile up in the kernel."""
        if self._reader is not None:
            self._reader.pause()

    def resume_reading(self) -> None:
        """Testing aid: undo `pause_reading`."""
        if self._reader is not None:
            self._reader.resume()

    def inject_error(self, code: int = errno.ENOBUFS) -> None:
        """Testing aid: make the reader drop what is queued and fail with ``code``, as on a
        socket buffer overflow; the source then rebuilds from a full dump."""
        if self._reader is None:
            raise RuntimeError("netlink source: not running")
        self._reader.inject_error(code)

    # ----- running ---------------------------------------------------------------------------
    async def run(self, *, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
        """Run until cancelled; ``task_status.started()`` once the first dump is applied."""
        if self._reader is not None:
            raise RuntimeError("netlink source: already running")
        self._have_dump = False
        send, recv = anyio.create_memory_object_stream[ReaderItem](self.queue_size)

        def emit(item: ReaderItem) -> None:
            try:
                anyio.from_thread.run(send.send, item)
            except (anyio.BrokenResourceError, anyio.ClosedResourceError, RuntimeError):
                raise _Stopped from None

        reader = NetlinkReader(emit, netns=self.netns, rcvbuf=self.rcvbuf)
        self._reader = reader

        async def run_reader() -> None:
            # Its own limiter: the long-lived reader must not hold a token of the
            # shared worker-thread pool for the agent's lifetime.
            async with send:
                await anyio.to_thread.run_sync(reader.run, limiter=anyio.CapacityLimiter(1))

        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(run_reader)
                try:
                    async with recv:
                        await self._consume(recv, task_status)
                finally:
                    reader.stop()
        finally:
            self._reader = None

    async def _consume(self, recv: MemoryObjectReceiveStream[ReaderItem], task_status: Any) -> None:
        last_apply = -math.inf
        started = False
        while True:
            dirty = self._absorb(await recv.receive())
            dirty |= self._drain(recv)
            if not self._have_dump:
                continue
            wait = last_apply + self.batch_interval - time.monotonic()
            if wait > 0 and self.initialized:
                with anyio.move_on_after(wait):
                    while True:
                        dirty |= self._absorb(await recv.receive())
                dirty |= self._drain(recv)
            if dirty or not self.initialized:
                self.apply()
                last_apply = time.monotonic()
            if not started:
                started = True
                task_status.started()

    def _drain(self, recv: MemoryObjectReceiveStream[ReaderItem]) -> bool:
        dirty = False
        while True:
            try:
                item = recv.receive_nowait()
            except anyio.WouldBlock:
                return dirty
            dirty |= self._absorb(item)

    def _absorb(self, item: ReaderItem) -> bool:
        """Fold one reader item into the model; return True when the model changed."""
        st = self.stats
        if isinstance(item, Snapshot):
            st.dumps += 1
            st.last_dump_at = time.time()
            self.model.reset(item)
            self._have_dump = True
            log.debug(
                "netlink: full dump: %d links, %d addresses, %d routes",
                len(item.links),
                len(item.addrs),
                len(item.routes),
            )
            return True
        if isinstance(item, ReaderErrorEvent):
            st.errors += 1
            st.last_error = item.message
            st.last_error_at = time.time()
            if item.errno is not None:
                st.error_codes.append(item.errno)
            log.warning("%s", item.message)
            return False
        st.event_batches += 1
        st.updates += len(item)
        for u in item:
            self.model.apply(u)
        return True

    def apply(self) -> None:
        """Write the model to the tables in one transaction (devices replaced where they
        changed, node addresses upserted/deleted through the LBWriter)."""
        devices = self.model.devices(self.config)
        wanted = {d.index: d for d in devices}
        addrs = select_node_addresses(devices, self.config)
        new_written = {(n.address, n.device_name): n for n in addrs}
        with self.db.write_txn(self.devices, *self.writer.tables) as txn:
            for old in list(self.devices.all(txn)):
                if old.index not in wanted:
                    self.devices.delete(txn, old)
            for d in devices:
                if self.devices.get(txn, d.index) != d:
                    self.devices.insert(txn, d)
            for key, na in self._written.items():
                if key not in new_written:
                    self.writer.delete_node_address(txn, na)
            for na in addrs:
                self.writer.upsert_node_address(txn, na)
            if self._init_done is not None:
                self._init_done(txn)
                self._init_done = None
        self._written = new_written
        self.stats.applies += 1


__all__ = [
    "INITIALIZER",
    "AddrInfo",
    "KernelModel",
    "LinkInfo",
    "NetlinkReader",
    "NetlinkSource",
    "NetlinkStats",
    "ReaderErrorEvent",
    "RouteInfo",
    "Snapshot",
    "Update",
]
