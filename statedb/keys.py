"""Key encoders: turn index key values into bytes whose byte order is the value order.

Every index stores ``bytes`` keys, so one ordered structure serves every
key type. Integers are fixed-width big-endian (numeric order = byte order),
signed integers have their sign bit flipped, IP addresses are 16 bytes
(IPv4 as IPv4-mapped IPv6, so both families share one order) and networks
add one byte of prefix length. `tuple_of` composes encoders; each part is
escaped and terminated so that tuple order is preserved.

An encoder given a value of the wrong type raises `KeyTypeError`, naming the encoder, the
value and its type: the usual cause is an index whose keys are not ``str`` left with the
default encoder, `string` (e.g. ``Index("id", key=lambda r: r.id)`` with int ids needs
``encode=keys.uint64``). Indexes cannot check this before the first row is encoded, so it
shows at the first insert or lookup.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
from typing import Any, NoReturn

from statedb.errors import StateDBError

Encoder = Callable[[Any], bytes]

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

_V4_MAPPED = b"\x00" * 10 + b"\xff\xff"


class KeyTypeError(StateDBError, TypeError):
    """A key encoder was given a value of a type it does not encode (see the module doc)."""

    def __init__(self, encoder: str, expected: str, value: Any) -> None:
        hint = (
            " (the default encoder of an Index: give the index an encoder for its key type, "
            "e.g. encode=keys.uint64 for int keys)"
            if encoder == "string"
            else ""
        )
        super().__init__(
            f"key encoder keys.{encoder} takes {expected}, got {type(value).__name__} "
            f"{value!r}{hint}"
        )
        self.encoder = encoder
        self.value = value


#: Encoders that return a key of one exact type as it is (`self_encoding`).
_SELF_ENCODED: dict[Encoder, type] = {}


def self_encoding(encoder: Encoder, key_type: type[bytes]) -> None:
    """Declare that ``encoder(key)`` is ``key`` itself for every key of exactly
    ``key_type``: a bytes subclass whose value is its own ordered encoding (an address
    type, say). A table whose primary index has this encoder then uses such keys as
    they are, without calling the encoder per lookup and per row written."""
    _SELF_ENCODED[encoder] = key_type


def self_encoded_type(encoder: Encoder) -> type | None:
    """The key type ``encoder`` returns as it is (`self_encoding`), or None."""
    return _SELF_ENCODED.get(encoder)


def _wrong_type(encoder: str, expected: str, value: Any) -> NoReturn:
    raise KeyTypeError(encoder, expected, value) from None


def string(value: str) -> bytes:
    """Encode a str as UTF-8 (prefix queries on the encoded key are string prefixes)."""
    try:
        return value.encode()
    except AttributeError:  # not a str: only the error path pays for the check
        _wrong_type("string", "str", value)


def raw(value: bytes) -> bytes:
    """Use bytes as they are."""
    return value


def boolean(value: bool) -> bytes:
    """Encode a bool as one byte, False before True."""
    return b"\x01" if value else b"\x00"


def _uint(width: int) -> Callable[[int], bytes]:
    def encode(value: int) -> bytes:
        try:
            return value.to_bytes(width, "big")
        except AttributeError:
            _wrong_type(f"uint{width * 8}", "int", value)

    encode.__name__ = f"uint{width * 8}"
    encode.__doc__ = f"Encode a non-negative int as {width} big-endian bytes."
    return encode


uint8 = _uint(1)
uint16 = _uint(2)
uint32 = _uint(4)
uint64 = _uint(8)


def int64(value: int) -> bytes:
    """Encode a signed 64-bit int so that negative numbers sort first."""
    if not isinstance(value, int):
        _wrong_type("int64", "int", value)
    return (value + (1 << 63)).to_bytes(8, "big")


def ip_address(value: IPAddress | str) -> bytes:
    """Encode an IP address as 16 bytes (IPv4 mapped into IPv6 space)."""
    addr = ipaddress.ip_address(value) if isinstance(value, str) else value
    if addr.version == 4:
        return _V4_MAPPED + addr.packed
    return addr.packed


def ip_network(value: IPNetwork | str) -> bytes:
    """Encode an IP network as its 16-byte address plus one byte of prefix length."""
    net = ipaddress.ip_network(value, strict=False) if isinstance(value, str) else value
    plen = net.prefixlen + (96 if net.version == 4 else 0)
    return ip_address(net.network_address) + bytes([plen])


def ip_network_prefix(value: IPNetwork | str) -> bytes:
    """Encode a network as a key prefix matching every network/address key inside it.

    Byte granular: the prefix keeps the whole bytes covered by the prefix length, so
    a /12 query also matches the rest of its /8.
    """
    net = ipaddress.ip_network(value, strict=False) if isinstance(value, str) else value
    plen = net.prefixlen + (96 if net.version == 4 else 0)
    return ip_address(net.network_address)[: plen // 8]


def _escape(part: bytes) -> bytes:
    return part.replace(b"\x00", b"\x00\xff") + b"\x00\x01"


def tuple_key(*parts: bytes) -> bytes:
    """Join already-encoded parts into one key whose order is the tuple order."""
    return b"".join(_escape(p) for p in parts)


def tuple_of(*encoders: Encoder) -> Callable[[tuple[Any, ...]], bytes]:
    """Return an encoder for tuples whose items are encoded by ``encoders`` in turn."""

    def encode(value: tuple[Any, ...]) -> bytes:
        if len(value) != len(encoders):
            raise ValueError(f"key tuple {value!r} should have {len(encoders)} items")
        return b"".join(_escape(enc(v)) for enc, v in zip(encoders, value))

    return encode
