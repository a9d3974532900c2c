"""L3n4Addr: an IP address, an L4 port and protocol, and a scope, as used by every LB table.

Text form (what the tables show and the corpus writes): ``10.0.0.1:80/TCP``,
``[2001::1]:443/UDP``, and a ``/i`` suffix for the internal scope of a
two-scope service (``1.1.1.1:80/TCP/i``). The ``/PROTO`` part may be omitted
when parsing (TCP is assumed).

Index keys: 16 bytes of address (IPv4 mapped into IPv6 space, so both
families share one order and a CIDR prefix query matches whole bytes of the
address), 2 bytes of port, 1 byte of protocol, 1 byte of scope and 1 byte of IP
version (so that an IPv4 address and its IPv4-mapped IPv6 form stay distinct). Keys
therefore order by address, then port, then protocol, then scope.
"""

from __future__ import annotations

import dataclasses
import functools
import ipaddress
import socket
import struct
from collections.abc import Callable
from dataclasses import dataclass
from itertools import repeat
from typing import Any, ClassVar

from statedb import keys as keycodec
from statedb import rowbuild
from statedb.errors import InputError

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

TCP = "TCP"
UDP = "UDP"
SCTP = "SCTP"
ANY = "ANY"

#: Protocols in the order of their key byte (ANY sorts first, as "no protocol").
PROTOCOLS: tuple[str, ...] = (ANY, TCP, UDP, SCTP)
_PROTO_CODE = {p: i for i, p in enumerate(PROTOCOLS)}

#: Scope of a frontend: external (the default) or internal (``/i``, two-scope services).
SCOPE_EXTERNAL = 0
SCOPE_INTERNAL = 1


_IPv4 = ipaddress.IPv4Address
_IPv6 = ipaddress.IPv6Address
_IP_TYPES = (ipaddress.IPv4Address, ipaddress.IPv6Address)
_V4_MAPPED = b"\x00" * 10 + b"\xff\xff"
_ZERO4 = b"\x00" * 4
_ZERO16 = b"\x00" * 16
_AF_INET = socket.AF_INET
_ntop = socket.inet_ntop
_from_bytes = int.from_bytes
#: IPv4Address(int) without its argument checks (the address property builds one).
_set_ipv4_int = ipaddress.IPv4Address.__dict__["_ip"].__set__
#: ``int(address)`` of an IPv4Address, read in C (its ``__int__`` is a Python method).
_ipv4_int = ipaddress.IPv4Address.__dict__["_ip"].__get__


class AddressError(InputError):
    """A malformed address, port, protocol or scope; the message names what is wrong."""


def parse_protocol(text: str) -> str:
    """Return the canonical protocol name for ``text`` (case-insensitive) or raise AddressError."""
    p = text.strip().upper()
    if p not in _PROTO_CODE:
        raise AddressError(f"unknown protocol {text!r} (expected one of TCP, UDP, SCTP, ANY)")
    return p


def parse_ip(text: str) -> IPAddress:
    """Parse an IPv4/IPv6 address (brackets around IPv6 allowed) or raise AddressError."""
    t = text.strip()
    if t.startswith("[") and t.endswith("]"):
        t = t[1:-1]
    try:
        return ipaddress.ip_address(t)
    except ValueError:
        raise AddressError(f"invalid IP address {text!r}") from None


@dataclass(frozen=True)
class _L3n4AddrFields:
    """The fields of L3n4Addr, in order (the field list ``dataclasses.fields``,
    ``replace`` and ``asdict`` read from L3n4Addr)."""

    address: IPAddress
    port: int
    protocol: str = TCP
    scope: int = SCOPE_EXTERNAL


class L3n4Addr(bytes):
    """An address + port + protocol + scope (frontend or backend address).

    Immutable, with the value semantics of a frozen dataclass of ``address``, ``port``,
    ``protocol`` and ``scope``. The object *is* its encoded index key (a ``bytes``
    subclass without instance attributes: 16 bytes of address, IPv4 mapped, 2 of port,
    1 of protocol, 1 of scope, 1 of IP version) and every field is read from those
    bytes. The address is a key of every LB table, of statedb's primary index and of
    the LB Ops' state, so one object serves as row field, index key and dict key:
    equality and hashing are those of the bytes (in C, hash cached), and statedb's
    primary key of a frontend or backend row is the row's address object itself.

    An L3n4Addr therefore equals (and hashes like) a plain ``bytes`` holding the same
    21 bytes (nothing compares addresses with raw keys), and addresses order as their
    keys: by address (IPv4 mapped into IPv6 space, so both families compare), then
    port, protocol (ANY, TCP, UDP, SCTP) and scope, as the tables' indexes order them
    (comparisons in C: statedb's ordered views compare the keys). An IPv6 zone (``%eth0``) is
    not kept: the key never had it, so addresses that differ only in their zone were
    equal already.
    """

    __slots__ = ()
    __dataclass_fields__: ClassVar[dict[str, dataclasses.Field[Any]]]
    __match_args__ = ("address", "port", "protocol", "scope")

    def __new__(
        cls, address: IPAddress, port: int, protocol: str = TCP, scope: int = SCOPE_EXTERNAL
    ) -> L3n4Addr:
        kind = type(address)
        if kind is _IPv4:  # the common case, checked and encoded inline
            ip_key, version = _V4_MAPPED + address.packed, 4
        elif kind is _IPv6:
            ip_key, version = address.packed, 6
        else:
            if not isinstance(address, _IP_TYPES):
                raise AddressError(f"invalid IP address {address!r}")
            ip_key, version = keycodec.ip_address(address), address.version
        if type(port) is not int and (not isinstance(port, int) or isinstance(port, bool)):
            raise AddressError(f"invalid port {port!r}: not an integer")
        if not 0 <= port <= 65535:
            raise AddressError(f"invalid port {port}: out of range 0..65535")
        code = _PROTO_CODE.get(protocol) if type(protocol) is str else None
        if code is None:
            if protocol not in _PROTO_CODE:
                raise AddressError(f"unknown protocol {protocol!r}")
            code = _PROTO_CODE[protocol]
        if scope != SCOPE_EXTERNAL and scope != SCOPE_INTERNAL:
            raise AddressError(f"invalid scope {scope!r}")
        tail = bytes((code, scope, version))
        return _bytes_new(cls, ip_key + int(port).to_bytes(2, "big") + tail)

    @property
    def address(self) -> IPAddress:
        """The IP address (an ipaddress object, built from the key on each read)."""
        if self[20] == 4:
            ip = _new(_IPv4)
            _set_ipv4_int(ip, _from_bytes(self[12:16]))
            return ip
        return _IPv6(self[:16])

    @property
    def port(self) -> int:
        """The L4 port."""
        return (self[16] << 8) | self[17]

    @property
    def protocol(self) -> str:
        """The protocol name (TCP, UDP, SCTP or ANY)."""
        return PROTOCOLS[self[18]]

    @property
    def scope(self) -> int:
        """SCOPE_EXTERNAL or SCOPE_INTERNAL."""
        return self[19]

    @property
    def _key(self) -> bytes:
        """The encoded index key: the object itself."""
        return self

    @property
    def packed(self) -> bytes:
        """The IP address in network byte order (4 or 16 bytes), read from the key."""
        return self[12:16] if self[20] == 4 else self[:16]

    @property
    def version(self) -> int:
        """The IP version, 4 or 6."""
        return self[20]

    def __setattr__(self, name: str, value: Any) -> None:
        raise dataclasses.FrozenInstanceError(f"cannot assign to field {name!r}")

    def __delattr__(self, name: str) -> None:
        raise dataclasses.FrozenInstanceError(f"cannot delete field {name!r}")

    def __repr__(self) -> str:
        return (
            f"L3n4Addr(address={self.address!r}, port={self.port!r}, "
            f"protocol={self.protocol!r}, scope={self.scope!r})"
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (L3n4Addr, (self.address, self.port, self.protocol, self.scope))

    def __copy__(self) -> L3n4Addr:
        return self

    def __deepcopy__(self, memo: Any) -> L3n4Addr:
        return self

    # ----- construction ---------------------------------------------------
    @classmethod
    def make(
        cls, address: str | IPAddress, port: int, protocol: str = TCP, scope: int = SCOPE_EXTERNAL
    ) -> L3n4Addr:
        """Build from loose parts (address text, protocol in any case)."""
        addr = parse_ip(address) if isinstance(address, str) else address
        return cls(addr, port, parse_protocol(protocol), scope)

    @classmethod
    def parse(cls, text: str) -> L3n4Addr:
        """Parse ``ip:port[/PROTO][/i]`` or ``[v6]:port[/PROTO][/i]``; raise AddressError."""
        t = text.strip()
        scope = SCOPE_EXTERNAL
        if t.endswith("/i"):
            scope = SCOPE_INTERNAL
            t = t[:-2]
        proto = TCP
        hostport = t
        if "/" in t:
            hostport, _, ptext = t.rpartition("/")
            proto = parse_protocol(ptext)
        if hostport.startswith("["):
            end = hostport.find("]")
            if end < 0 or hostport[end + 1 : end + 2] != ":":
                raise AddressError(f"invalid address {text!r}: expected [ipv6]:port")
            host, port_text = hostport[1:end], hostport[end + 2 :]
        else:
            host, sep, port_text = hostport.rpartition(":")
            if not sep or ":" in host:
                raise AddressError(f"invalid address {text!r}: expected ip:port (IPv6 in [])")
        try:
            port = int(port_text)
        except ValueError:
            raise AddressError(f"invalid port {port_text!r} in {text!r}") from None
        return cls(parse_ip(host), port, proto, scope)

    # ----- views -------------------------------------------------------------
    @property
    def is_ipv6(self) -> bool:
        """True for an IPv6 address."""
        return self[20] == 6

    @property
    def is_unspecified(self) -> bool:
        """True for 0.0.0.0 / :: (the NodePort/HostPort surrogate frontends)."""
        return self[12:16] == _ZERO4 if self[20] == 4 else self[:16] == _ZERO16

    def addr_port(self) -> str:
        """``ip:port`` with IPv6 in brackets, without protocol (the REV: format)."""
        if self[20] == 6:
            return f"[{self.address}]:{self.port}"
        return f"{_ntop(_AF_INET, self[12:16])}:{self.port}"

    def __str__(self) -> str:
        s = f"{self.addr_port()}/{self.protocol}"
        return s + "/i" if self[19] == SCOPE_INTERNAL else s

    def __format__(self, spec: str) -> str:
        return format(str(self), spec)

    def with_scope(self, scope: int) -> L3n4Addr:
        """Return the same address in another scope."""
        return L3n4Addr(self.address, self.port, self.protocol, scope)

    def with_protocol(self, protocol: str) -> L3n4Addr:
        """Return the same address with another protocol."""
        return L3n4Addr(self.address, self.port, parse_protocol(protocol), self.scope)

    def key(self) -> bytes:
        """The ordered index key (address, port, protocol, scope): the object itself."""
        return self

    # ----- the LB Ops' names (bpfops.model.Addr is this class) ---------------
    @property
    def ip(self) -> IPAddress:
        """The IP address (the LB Ops' name for ``address``)."""
        return self.address

    @property
    def proto(self) -> str:
        """The protocol name (the LB Ops' name for ``protocol``)."""
        return PROTOCOLS[self[18]]

    @property
    def is_v6(self) -> bool:
        """Whether this is an IPv6 address."""
        return self[20] == 6

    @classmethod
    def of(cls, ip: str | IPAddress, port: int, proto: str = TCP, scope: int = 0) -> L3n4Addr:
        """Build from a textual or parsed IP, validating every part (AddressError, a
        ValueError, when one is wrong)."""
        return cls.make(ip, port, proto, scope)

    def with_ip(self, ip: IPAddress) -> L3n4Addr:
        """The same port, protocol and scope on another IP."""
        return new_addr(ip, self.port, self.protocol, self.scope)

    def host_port(self) -> str:
        """``ip:port`` with IPv6 in brackets (no protocol)."""
        return self.addr_port()

    def sort_key(self) -> tuple[int, bytes, int]:
        """Cilium's backend order: IPv4 before IPv6, then the address bytes, then the port."""
        v = self[20]
        return (v, self[12:16] if v == 4 else self[:16], (self[16] << 8) | self[17])


# dataclasses.fields/replace/asdict see L3n4Addr's four fields.
L3n4Addr.__dataclass_fields__ = _L3n4AddrFields.__dataclass_fields__

_KEY4 = struct.Struct(">12sIHBBB")
_KEY6 = struct.Struct(">16sHBBB")
_new = object.__new__
_bytes_new = bytes.__new__


def new_addr(
    address: IPAddress, port: int, protocol: str = TCP, scope: int = SCOPE_EXTERNAL
) -> L3n4Addr:
    """``L3n4Addr(address, port, protocol, scope)``, faster for the usual well-formed values
    (a parsed address, an int port in range, a canonical protocol name, scope 0 or 1); any
    other value takes the constructor, with its checks and errors."""
    cls = type(address)
    code = _PROTO_CODE.get(protocol) if type(protocol) is str else None
    if (
        code is None
        or type(port) is not int
        or not 0 <= port <= 65535
        or (scope != SCOPE_EXTERNAL and scope != SCOPE_INTERNAL)
    ):
        return L3n4Addr(address, port, protocol, scope)
    if cls is _IPv4:
        return _bytes_new(
            L3n4Addr, _KEY4.pack(_V4_MAPPED, _ipv4_int(address), port, code, scope, 4)
        )
    if cls is _IPv6:
        return _bytes_new(L3n4Addr, _KEY6.pack(address.packed, port, code, scope, 6))
    return L3n4Addr(address, port, protocol, scope)


_KEY4_PACKED = struct.Struct(">12s4sHBBB")


def new_addr_packed(
    packed: bytes, port: int, protocol: str = TCP, scope: int = SCOPE_EXTERNAL
) -> L3n4Addr:
    """``L3n4Addr(ip_address(packed), port, protocol, scope)`` for an IP in network byte
    order (4 bytes IPv4, 16 IPv6), without building an ipaddress object for the usual
    well-formed values (the Kubernetes converter parses addresses straight to bytes);
    any other value takes the constructor, with its checks and errors."""
    code = _PROTO_CODE.get(protocol) if type(protocol) is str else None
    n = len(packed)
    if (
        code is None
        or type(port) is not int
        or not 0 <= port <= 65535
        or (scope != SCOPE_EXTERNAL and scope != SCOPE_INTERNAL)
        or (n != 4 and n != 16)
    ):
        return L3n4Addr(ipaddress.ip_address(packed), port, protocol, scope)
    if n == 4:
        return _bytes_new(L3n4Addr, _KEY4_PACKED.pack(_V4_MAPPED, packed, port, code, scope, 4))
    return _bytes_new(L3n4Addr, _KEY6.pack(packed, port, code, scope, 6))


#: The bytes an IPv4 address in network byte order follows in a key (IPv4-mapped IPv6).
V4_KEY_PREFIX = _V4_MAPPED
_SUFFIX = struct.Struct(">HBBB")


def addr_key_suffix(port: int, protocol: str, v6: bool, scope: int = SCOPE_EXTERNAL) -> bytes:
    """The last five bytes of the key of every address with this port, protocol, family
    and scope (validated here once): ``addr_of_key(V4_KEY_PREFIX + ip4 + suffix)`` or
    ``addr_of_key(ip16 + suffix)`` then builds an address per IP without re-checking
    them (the Kubernetes converter, once per slice port). Raises AddressError."""
    code = _PROTO_CODE.get(protocol) if type(protocol) is str else None
    if code is None:
        raise AddressError(f"unknown L4 protocol {protocol!r}")
    if type(port) is not int or not 0 <= port <= 65535:
        raise AddressError(f"invalid port {port!r}")
    if scope != SCOPE_EXTERNAL and scope != SCOPE_INTERNAL:
        raise AddressError(f"invalid scope {scope!r}")
    return _SUFFIX.pack(port, code, scope, 6 if v6 else 4)


#: ``addr_of_key(key)``: the address whose 21-byte key is ``key`` (built by the caller
#: from `V4_KEY_PREFIX` and `addr_key_suffix`, so well-formed; no check here).
addr_of_key: Callable[[bytes], L3n4Addr] = functools.partial(_bytes_new, L3n4Addr)


def addrs_of_keys(keys: list[bytes]) -> list[L3n4Addr]:
    """``[addr_of_key(k) for k in keys]`` in one call: the addresses of a slice's keys
    (about 300 instructions less per key than a call of the partial for each; a
    tenth of the cost per key by `statedb.rowbuild`'s compiled helper, when built)."""
    if _COMPILED:
        return _new_keys(L3n4Addr, keys)
    return list(map(_bytes_new, _L3N4ADDRS, keys))


def addrs_of_ipv4(
    prefix: bytes, texts: list[Any], suffix: bytes
) -> tuple[list[L3n4Addr], bool] | None:
    """``addrs_of_keys([prefix + inet_pton(AF_INET, t) + suffix for t in texts])``: the
    addresses of IPv4 texts between a key's first bytes (`V4_KEY_PREFIX`) and its last
    (`addr_key_suffix`), in one call, and whether they are in increasing order (so
    distinct); None when a text is not one ``socket.inet_pton`` takes as IPv4 (a dotted
    quad string). Compiled by `statedb.rowbuild`, when built:
    about a quarter of the cost of parsing, joining and copying each."""
    if _COMPILED:
        return _new_ipv4_keys(L3n4Addr, prefix, texts, suffix)
    pton, af_inet = socket.inet_pton, socket.AF_INET
    keys: list[bytes] = []
    add = keys.append  # (a loop: a comprehension would make a function and cells per call)
    last = b""
    increasing = True
    try:
        for t in texts:
            k = prefix + pton(af_inet, t) + suffix
            if k <= last:
                increasing = False
            last = k
            add(k)
    except (OSError, ValueError, TypeError):
        return None
    return list(map(_bytes_new, _L3N4ADDRS, keys)), increasing


#: ``L3n4Addr`` without end, for `addrs_of_keys`' map (stateless: one for every call).
_L3N4ADDRS = repeat(L3n4Addr)
_COMPILED = rowbuild.COMPILED
_new_keys = rowbuild.new_keys
_new_ipv4_keys = rowbuild.new_ipv4_keys


def encode_addr_key(value: Any) -> bytes:
    """Index encoder for L3n4Addr keys; also accepts a network (a prefix query by CIDR)
    or a bare IP address (a prefix query for every port/protocol of that address)."""
    if type(value) is L3n4Addr or isinstance(value, L3n4Addr):
        return value
    if isinstance(value, ipaddress.IPv4Network | ipaddress.IPv6Network):
        return keycodec.ip_network_prefix(value)
    if isinstance(value, ipaddress.IPv4Address | ipaddress.IPv6Address):
        return keycodec.ip_address(value)
    raise TypeError(f"cannot use {value!r} as an address key")


# An address is its own key: tables keyed by addresses use it without the call.
keycodec.self_encoding(encode_addr_key, L3n4Addr)


def parse_addr_key(text: str) -> L3n4Addr | IPNetwork | IPAddress:
    """Command-line parser for address index queries: ``ip:port/PROTO``, a CIDR or an IP."""
    t = text.strip()
    try:
        return L3n4Addr.parse(t)
    except AddressError:
        pass
    if "/" in t:
        try:
            return ipaddress.ip_network(t, strict=False)
        except ValueError:
            pass
    try:
        return ipaddress.ip_address(t.strip("[]"))
    except ValueError:
        raise AddressError(f"invalid address query {text!r}") from None


def addr_json(a: L3n4Addr) -> dict[str, Any]:
    """The address as Cilium's ``db show`` JSON writes it (frontends and backends)."""
    return {"AddrCluster": str(a.address), "Protocol": a.protocol, "Port": a.port, "Scope": a.scope}
