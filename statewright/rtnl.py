"""A minimal rtnetlink client: the few requests statewright-cni makes, on a plain socket.

Why not pyroute2: the CNI plugin is a new process per call, and importing pyroute2 (its
package ``__init__`` loads every pyroute2 module) costs more than everything else the
plugin does. This module needs only ``socket`` and ``struct``; its requests are those of
``ip link``/``ip addr``/``ip neigh``/``ip route``:

* links: look up by name or index (index, name, MAC), create a veth pair, set the name,
  MTU, up state or network namespace, delete;
* addresses: add (optionally without duplicate address detection), list an interface's;
* a permanent neighbour entry; a route (destination, output interface, optional
  gateway and scope);
* routes of the main table: list them (`Rtnl.routes`), and replace or delete a route
  via a gateway marked with a routing protocol number (``ip route replace DST via GW
  proto N``; the node routes of statewright/node_routes.py).

`Rtnl(netns=PATH)` opens its socket inside the network namespace at PATH (the calling
thread enters it for the ``socket()`` call only, then returns): the socket keeps working
there. A request the kernel refuses raises `RtnlError` (an OSError with the errno,
naming the request).
"""

from __future__ import annotations

import errno as errno_mod
import ipaddress
import os
import socket
import struct
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from statedb.errors import StatewrightError

NETLINK_ROUTE = 0
CLONE_NEWNET = 0x40000000

RTM_NEWLINK, RTM_DELLINK, RTM_GETLINK = 16, 17, 18
RTM_NEWADDR, RTM_GETADDR = 20, 22
RTM_NEWROUTE, RTM_DELROUTE, RTM_GETROUTE = 24, 25, 26
RTM_NEWNEIGH = 28
NLMSG_ERROR, NLMSG_DONE = 2, 3

NLM_F_REQUEST, NLM_F_ACK = 0x1, 0x4
NLM_F_DUMP = 0x300
NLM_F_REPLACE, NLM_F_EXCL, NLM_F_CREATE = 0x100, 0x200, 0x400

IFLA_ADDRESS, IFLA_IFNAME, IFLA_MTU, IFLA_LINKINFO, IFLA_NET_NS_FD = 1, 3, 4, 18, 28
IFLA_INFO_KIND, IFLA_INFO_DATA, VETH_INFO_PEER = 1, 2, 1
IFF_UP = 0x1
IFA_ADDRESS, IFA_LOCAL, IFA_FLAGS = 1, 2, 8
IFA_F_NODAD = 0x02
NDA_DST, NDA_LLADDR = 1, 2
NUD_PERMANENT = 0x80
RTA_DST, RTA_OIF, RTA_GATEWAY, RTA_TABLE = 1, 4, 5, 15
RT_TABLE_MAIN, RTPROT_BOOT, RTN_UNICAST = 254, 3, 1
RT_SCOPE_UNIVERSE, RT_SCOPE_LINK = 0, 253

#: Requests `Rtnl.replace_routes` sends before it reads their acknowledgements (each
#: waits in the socket's receive buffer meanwhile).
PIPELINE = 64

_NLMSGHDR = struct.Struct("=IHHII")  # length, type, flags, sequence, port id
_RTATTR = struct.Struct("=HH")  # length, type
_IFINFOMSG = struct.Struct("=BxHiII")  # family, type, index, flags, change
_IFADDRMSG = struct.Struct("=BBBBI")  # family, prefixlen, flags, scope, index
_NDMSG = struct.Struct("=BxxxiHBB")  # family, ifindex, state, flags, type
_RTMSG = struct.Struct("=BBBBBBBBI")  # family, dst/src len, tos, table, proto, scope, type, flags


class RtnlError(StatewrightError, OSError):
    """A request the kernel refused: ``errno`` and the request in the message."""

    def __init__(self, err: int, what: str) -> None:
        super().__init__(err, f"netlink {what}: {os.strerror(err)}")


@dataclass(frozen=True, slots=True)
class Route:
    """A main-table unicast route: destination prefix, gateway ("" when none), routing
    protocol number and output interface."""

    dst: str
    prefixlen: int
    gateway: str
    protocol: int
    oif: int


@dataclass(frozen=True, slots=True)
class Link:
    """An interface: index, name and MAC (``aa:bb:..``, empty when it has none)."""

    index: int
    name: str
    mac: str


def _attr(kind: int, payload: bytes) -> bytes:
    data = _RTATTR.pack(_RTATTR.size + len(payload), kind) + payload
    return data + bytes(-len(data) % 4)


def _attrs(data: bytes) -> dict[int, bytes]:
    """The attributes of a message body (the last of a repeated type wins)."""
    out: dict[int, bytes] = {}
    pos = 0
    while pos + _RTATTR.size <= len(data):
        length, kind = _RTATTR.unpack_from(data, pos)
        if length < _RTATTR.size:
            break
        out[kind & 0x3FFF] = data[pos + _RTATTR.size : pos + length]
        pos += (length + 3) & ~3
    return out


def _ip(text: str) -> tuple[int, bytes]:
    """(address family, packed address)."""
    ip = ipaddress.ip_address(text)
    return (socket.AF_INET if ip.version == 4 else socket.AF_INET6), ip.packed


def _setns(fd: int) -> None:
    setns = getattr(os, "setns", None)  # Python 3.12+
    if setns is not None:
        setns(fd, CLONE_NEWNET)
        return
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise RtnlError(err, "setns")


@contextmanager
def _in_netns(path: str) -> Iterator[None]:
    """The calling thread in the network namespace at ``path``, then back in its own."""
    own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    try:
        target = os.open(path, os.O_RDONLY)
        try:
            _setns(target)
        finally:
            os.close(target)
        try:
            yield
        finally:
            _setns(own)
    finally:
        os.close(own)


class Rtnl:
    """One rtnetlink socket (use as a context manager, or call `close`)."""

    def __init__(self, netns: str | None = None) -> None:
        if netns:
            with _in_netns(netns):
                self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_ROUTE)
        else:
            self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_ROUTE)
        self.sock.bind((0, 0))
        self._seq = 0

    def __enter__(self) -> Rtnl:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        """Close the socket."""
        self.sock.close()

    # ----- transport ----------------------------------------------------------------------
    def _request(self, kind: int, flags: int, body: bytes, what: str) -> list[tuple[int, bytes]]:
        """Send one request; the (type, body) of each answer message. With NLM_F_DUMP all
        parts until NLMSG_DONE; otherwise until the acknowledgement (or the one answer)."""
        self._seq += 1
        seq = self._seq
        msg = _NLMSGHDR.pack(_NLMSGHDR.size + len(body), kind, NLM_F_REQUEST | flags, seq, 0)
        self.sock.send(msg + body)
        out: list[tuple[int, bytes]] = []
        while True:
            data = self.sock.recv(65536)
            pos = 0
            while pos + _NLMSGHDR.size <= len(data):
                length, mtype, _, mseq, _ = _NLMSGHDR.unpack_from(data, pos)
                payload = data[pos + _NLMSGHDR.size : pos + length]
                pos += (length + 3) & ~3
                if mseq != seq:
                    continue
                if mtype == NLMSG_DONE:
                    return out
                if mtype == NLMSG_ERROR:
                    (code,) = struct.unpack_from("=i", payload)
                    if code:
                        raise RtnlError(-code, what)
                    return out  # the acknowledgement
                out.append((mtype, payload))
                if not flags & (NLM_F_DUMP | NLM_F_ACK):
                    return out

    # ----- links ----------------------------------------------------------------------------
    def link(self, name: str | None = None, index: int = 0) -> Link | None:
        """The interface called ``name`` (or with ``index``), or None."""
        attrs = _attr(IFLA_IFNAME, name.encode() + b"\0") if name else b""
        body = _IFINFOMSG.pack(socket.AF_UNSPEC, 0, index, 0, 0) + attrs
        try:
            answer = self._request(RTM_GETLINK, 0, body, f"get link {name or index}")
        except RtnlError as e:
            if e.errno in (errno_mod.ENODEV, errno_mod.EINVAL):
                return None
            raise
        if not answer:
            return None
        payload = answer[0][1]
        _, _, idx, _, _ = _IFINFOMSG.unpack_from(payload)
        found = _attrs(payload[_IFINFOMSG.size :])
        mac = found.get(IFLA_ADDRESS, b"")
        return Link(
            idx,
            found.get(IFLA_IFNAME, b"").rstrip(b"\0").decode(),
            ":".join(f"{b:02x}" for b in mac),
        )

    def add_veth(self, name: str, peer: str) -> None:
        """Create the veth pair ``name``/``peer`` (EEXIST when ``name`` exists)."""
        peer_info = _IFINFOMSG.pack(socket.AF_UNSPEC, 0, 0, 0, 0) + _attr(
            IFLA_IFNAME, peer.encode() + b"\0"
        )
        linkinfo = _attr(IFLA_INFO_KIND, b"veth") + _attr(
            IFLA_INFO_DATA, _attr(VETH_INFO_PEER, peer_info)
        )
        body = (
            _IFINFOMSG.pack(socket.AF_UNSPEC, 0, 0, 0, 0)
            + _attr(IFLA_IFNAME, name.encode() + b"\0")
            + _attr(IFLA_LINKINFO, linkinfo)
        )
        flags = NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL
        self._request(RTM_NEWLINK, flags, body, f"add veth {name}/{peer}")

    def set_link(
        self,
        index: int,
        *,
        name: str | None = None,
        mtu: int | None = None,
        up: bool | None = None,
        netns_fd: int | None = None,
    ) -> None:
        """Change what is given of interface ``index``: name, MTU, up, network namespace."""
        flags = IFF_UP if up else 0
        change = IFF_UP if up is not None else 0
        body = _IFINFOMSG.pack(socket.AF_UNSPEC, 0, index, flags, change)
        if name is not None:
            body += _attr(IFLA_IFNAME, name.encode() + b"\0")
        if mtu is not None:
            body += _attr(IFLA_MTU, struct.pack("=I", mtu))
        if netns_fd is not None:
            body += _attr(IFLA_NET_NS_FD, struct.pack("=I", netns_fd))
        self._request(RTM_NEWLINK, NLM_F_ACK, body, f"set link {index}")

    def delete_link(self, index: int) -> None:
        """Delete interface ``index`` (a veth takes its peer with it)."""
        body = _IFINFOMSG.pack(socket.AF_UNSPEC, 0, index, 0, 0)
        self._request(RTM_DELLINK, NLM_F_ACK, body, f"delete link {index}")

    # ----- addresses, neighbours, routes -------------------------------------------------------
    def add_address(self, index: int, address: str, prefixlen: int, nodad: bool = False) -> None:
        """Add ``address/prefixlen`` to interface ``index`` (``nodad``: usable at once)."""
        family, packed = _ip(address)
        flags = IFA_F_NODAD if nodad else 0
        body = (
            _IFADDRMSG.pack(family, prefixlen, flags, RT_SCOPE_UNIVERSE, index)
            + _attr(IFA_LOCAL, packed)
            + _attr(IFA_ADDRESS, packed)
            + _attr(IFA_FLAGS, struct.pack("=I", flags))
        )
        flags_nl = NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL
        self._request(RTM_NEWADDR, flags_nl, body, f"add address {address} to {index}")

    def addresses(self, index: int, family: int = socket.AF_UNSPEC) -> list[str]:
        """The addresses of interface ``index`` (of ``family``, or all)."""
        body = _IFADDRMSG.pack(family, 0, 0, 0, 0)
        out = []
        for _, payload in self._request(RTM_GETADDR, NLM_F_DUMP, body, "list addresses"):
            _, _, _, _, idx = _IFADDRMSG.unpack_from(payload)
            if idx != index:
                continue
            found = _attrs(payload[_IFADDRMSG.size :])
            raw = found.get(IFA_ADDRESS) or found.get(IFA_LOCAL)
            if raw:
                out.append(str(ipaddress.ip_address(raw)))
        return out

    def add_neighbour(self, index: int, address: str, mac: str) -> None:
        """A permanent neighbour entry ``address`` -> ``mac`` on interface ``index``."""
        family, packed = _ip(address)
        body = (
            _NDMSG.pack(family, index, NUD_PERMANENT, 0, 0)
            + _attr(NDA_DST, packed)
            + _attr(NDA_LLADDR, bytes.fromhex(mac.replace(":", "")))
        )
        flags = NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL
        self._request(RTM_NEWNEIGH, flags, body, f"add neighbour {address}")

    def add_route(
        self,
        dst: str,
        prefixlen: int,
        oif: int,
        gateway: str | None = None,
        scope: int = RT_SCOPE_UNIVERSE,
    ) -> None:
        """A main-table route to ``dst/prefixlen`` out of ``oif`` (through ``gateway``)."""
        family, packed = _ip(dst)
        body = _RTMSG.pack(
            family, prefixlen, 0, 0, RT_TABLE_MAIN, RTPROT_BOOT, scope, RTN_UNICAST, 0
        )
        if prefixlen:
            body += _attr(RTA_DST, packed)
        body += _attr(RTA_OIF, struct.pack("=I", oif))
        if gateway is not None:
            body += _attr(RTA_GATEWAY, _ip(gateway)[1])
        flags = NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL
        self._request(RTM_NEWROUTE, flags, body, f"add route {dst}/{prefixlen}")

    def routes(self, family: int) -> list[Route]:
        """The unicast routes of the main table of ``family`` (AF_INET or AF_INET6)."""
        body = _RTMSG.pack(family, 0, 0, 0, 0, 0, 0, 0, 0)
        out = []
        for _, payload in self._request(RTM_GETROUTE, NLM_F_DUMP, body, "list routes"):
            fam, dst_len, _, _, table, proto, _, rtype, _ = _RTMSG.unpack_from(payload)
            found = _attrs(payload[_RTMSG.size :])
            if RTA_TABLE in found:
                (table,) = struct.unpack_from("=I", found[RTA_TABLE])
            if table != RT_TABLE_MAIN or rtype != RTN_UNICAST or fam != family:
                continue
            zero = bytes(4 if fam == socket.AF_INET else 16)
            # inet_ntop: the text form of `address_text`, at C speed (dumps are large)
            dst = socket.inet_ntop(fam, found.get(RTA_DST, zero))
            gw = found.get(RTA_GATEWAY)
            oif = struct.unpack_from("=I", found[RTA_OIF])[0] if RTA_OIF in found else 0
            out.append(Route(dst, dst_len, socket.inet_ntop(fam, gw) if gw else "", proto, oif))
        return out

    def _gateway_route(self, dst: str, prefixlen: int, gateway: str, protocol: int) -> bytes:
        family, packed = _ip(dst)
        body = _RTMSG.pack(
            family, prefixlen, 0, 0, RT_TABLE_MAIN, protocol, RT_SCOPE_UNIVERSE, RTN_UNICAST, 0
        )
        if prefixlen:
            body += _attr(RTA_DST, packed)
        return body + (_attr(RTA_GATEWAY, _ip(gateway)[1]) if gateway else b"")

    def replace_route(self, dst: str, prefixlen: int, gateway: str, protocol: int) -> None:
        """Add or replace the main-table route to ``dst/prefixlen`` via ``gateway`` (the
        kernel picks the interface of the gateway's connected network; ENETUNREACH when
        there is none), marked with routing protocol ``protocol``."""
        body = self._gateway_route(dst, prefixlen, gateway, protocol)
        flags = NLM_F_ACK | NLM_F_CREATE | NLM_F_REPLACE
        self._request(RTM_NEWROUTE, flags, body, f"replace route {dst}/{prefixlen} via {gateway}")

    def replace_routes(
        self, routes: list[tuple[str, int, str]], protocol: int
    ) -> list[RtnlError | None]:
        """`replace_route` for each (destination, prefix length, gateway), pipelined: up to
        `PIPELINE` requests are sent before their acknowledgements are read. The error of
        each request, in order (None: done)."""
        out: list[RtnlError | None] = []
        flags = NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_REPLACE
        for start in range(0, len(routes), PIPELINE):
            chunk = routes[start : start + PIPELINE]
            seqs: dict[int, int] = {}
            for i, (dst, plen, gw) in enumerate(chunk):
                body = self._gateway_route(dst, plen, gw, protocol)
                self._seq += 1
                seqs[self._seq] = i
                self.sock.send(
                    _NLMSGHDR.pack(_NLMSGHDR.size + len(body), RTM_NEWROUTE, flags, self._seq, 0)
                    + body
                )
            codes: dict[int, int] = {}
            while len(codes) < len(chunk):
                data = self.sock.recv(65536)
                pos = 0
                while pos + _NLMSGHDR.size <= len(data):
                    length, mtype, _, mseq, _ = _NLMSGHDR.unpack_from(data, pos)
                    if mtype == NLMSG_ERROR and mseq in seqs:
                        (code,) = struct.unpack_from("=i", data, pos + _NLMSGHDR.size)
                        codes[seqs[mseq]] = code
                    pos += (length + 3) & ~3
            for i, (dst, plen, gw) in enumerate(chunk):
                code = codes[i]
                out.append(RtnlError(-code, f"replace route {dst}/{plen} via {gw}")
                           if code else None)
        return out

    def delete_route(self, dst: str, prefixlen: int, gateway: str, protocol: int) -> bool:
        """Delete the main-table route to ``dst/prefixlen`` via ``gateway`` of routing
        protocol ``protocol`` (the kernel matches the protocol: a route of another one is
        never removed). False when there was no such route."""
        body = self._gateway_route(dst, prefixlen, gateway, protocol)
        try:
            self._request(RTM_DELROUTE, NLM_F_ACK, body, f"delete route {dst}/{prefixlen}")
        except RtnlError as e:
            if e.errno in (errno_mod.ESRCH, errno_mod.ENOENT):
                return False
            raise
        return True
