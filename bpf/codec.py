"""Codecs turning frozen dataclasses into the exact bytes of a C struct and back.

A StructCodec is described field by field in C order (pads included) so that the
layout test can compare every field offset with the BTF of the C headers. The
encoder/decoder are generated once per codec, keeping the per-entry cost low.
"""

from __future__ import annotations

import ipaddress
import struct
from array import array
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, fields
from typing import Any, Generic, Protocol, TypeVar

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)


@dataclass(frozen=True, slots=True)
class Field:
    """One C struct member: python attribute, struct format char(s), byte order and rendering.

    ``render`` says how the CLI shows the value: "int", "hex", "ipv4", "ipv6",
    "ip_by_family" (16 bytes, IPv4 in the first four when the sibling ``family`` is 1)
    "ip_auto" (16 bytes shown as IPv4 when the last twelve are zero) or "mac" (a u64
    whose first six bytes in memory are the MAC).
    """

    name: str
    fmt: str
    c_name: str
    network_order: bool = False
    pad: bool = False
    render: str = "int"

    @property
    def size(self) -> int:
        """Size of the member in bytes."""
        return struct.calcsize("<" + self.fmt)


def u8(name: str, c_name: str = "") -> Field:
    """An unsigned 8-bit member."""
    return Field(name, "B", c_name or name)


def u16(name: str, c_name: str = "") -> Field:
    """An unsigned 16-bit member in host (little-endian) order."""
    return Field(name, "H", c_name or name)


def be16(name: str, c_name: str = "") -> Field:
    """An unsigned 16-bit member stored in network order, exposed as a host int."""
    return Field(name, "H", c_name or name, network_order=True)


def u32(name: str, c_name: str = "") -> Field:
    """An unsigned 32-bit member in host order."""
    return Field(name, "I", c_name or name)


def u64(name: str, c_name: str = "", render: str = "int") -> Field:
    """An unsigned 64-bit member in host order."""
    return Field(name, "Q", c_name or name, render=render)


def ipv4(name: str, c_name: str = "") -> Field:
    """A 4-byte IPv4 address in network order, exposed as bytes."""
    return Field(name, "4s", c_name or name, render="ipv4")


def ipv6(name: str, c_name: str = "", render: str = "ipv6") -> Field:
    """A 16-byte address (IPv6, or IPv4 in the first four bytes), exposed as bytes."""
    return Field(name, "16s", c_name or name, render=render)


def pad(c_name: str, size: int) -> Field:
    """Padding bytes: always written as zero, ignored when decoding."""
    return Field(c_name, f"{size}x", c_name, pad=True)


@dataclass(frozen=True, slots=True)
class FieldLayout:
    """Where a member sits in the encoded struct (for the BTF layout check)."""

    c_name: str
    offset: int
    size: int


class Codec(Protocol[T]):
    """Converts values of one type to fixed-size bytes and back."""

    @property
    def size(self) -> int:
        """Encoded size in bytes."""
        ...

    def encode(self, value: T) -> bytes:
        """Bytes for one value."""
        ...

    def decode(self, data: bytes) -> T:
        """The value encoded in ``data`` (exactly ``size`` bytes)."""
        ...

    def encode_many(self, values: Iterable[T]) -> bytes:
        """The concatenated encodings of ``values`` (for batch syscalls)."""
        ...

    def decode_many(self, data: bytes) -> list[T]:
        """Decode a buffer holding consecutive encodings."""
        ...

    def to_json(self, value: T) -> Any:
        """A JSON-friendly rendering of ``value`` for tools."""
        ...


def _render(value: Any, render: str, family: int | None) -> Any:
    if render == "ipv4":
        return str(ipaddress.IPv4Address(value))
    if render == "ipv6":
        return str(ipaddress.IPv6Address(value))
    if render == "ip_by_family":
        if family == 1:
            return str(ipaddress.IPv4Address(value[:4]))
        return str(ipaddress.IPv6Address(value))
    if render == "ip_auto":
        if not any(value[4:]):
            return str(ipaddress.IPv4Address(value[:4]))
        return str(ipaddress.IPv6Address(value))
    if render == "mac":
        return ":".join(f"{b:02x}" for b in int(value).to_bytes(8, "little")[:6])
    if render == "hex":
        return bytes(value).hex() if isinstance(value, bytes) else hex(value)
    return value


class StructCodec(Generic[T]):
    """Codec between a frozen dataclass and a packed little-endian C struct.

    Network-order 16-bit fields are byte-swapped inline by the generated code, so
    one ``struct.Struct`` call encodes a whole entry.
    """

    def __init__(self, cls: type[T], c_name: str, members: Sequence[Field]) -> None:
        self.cls = cls
        self.c_name = c_name
        self.members = tuple(members)
        self._struct = struct.Struct("<" + "".join(f.fmt for f in self.members))
        self.size: int = self._struct.size
        data_fields = [f for f in self.members if not f.pad]
        names = [f.name for f in fields(cls)]  # type: ignore[arg-type]
        if names != [f.name for f in data_fields]:
            raise TypeError(f"{cls.__name__}: dataclass fields {names} do not match codec members")
        self._data_fields = data_fields
        generated = self._generate(data_fields)
        self.encode: Callable[[T], bytes] = generated["encode"]
        self.decode: Callable[[bytes], T] = generated["decode"]
        self.encode_many: Callable[[Iterable[T]], bytes] = generated["encode_many"]
        self.decode_many: Callable[[bytes], list[T]] = generated["decode_many"]

    def _generate(self, data_fields: list[Field]) -> dict[str, Any]:
        """Build encode, decode, encode_many and decode_many specialised for this layout.

        Decoders fill the slots through their descriptors instead of running the frozen
        dataclass __init__ (about twice as fast; struct already guarantees the sizes that
        __post_init__ checks), and the *_many variants loop inside one function so a
        batch costs no Python call per entry.
        """
        enc_args = []
        dec_lines = []
        namespace: dict[str, Any] = {
            "_pack": self._struct.pack,
            "_unpack": self._struct.unpack,
            "_iter_unpack": self._struct.iter_unpack,
            "_cls": self.cls,
            "_new": object.__new__,
            "_join": b"".join,
        }
        for i, f in enumerate(data_fields):
            setter = f"_set{i}"
            namespace[setter] = self.cls.__dict__[f.name].__set__
            if f.network_order:
                enc_args.append(f"(((_v := o.{f.name}) & 0xff) << 8) | (_v >> 8)")
                dec_lines.append(f"{setter}(o, ((t[{i}] & 0xff) << 8) | (t[{i}] >> 8))")
            else:
                enc_args.append(f"o.{f.name}")
                dec_lines.append(f"{setter}(o, t[{i}])")
        setters = ", ".join(f"_set{i}=_set{i}" for i in range(len(data_fields)))
        packed = f"_pack({', '.join(enc_args)})"
        fill = "".join(f"        {line}\n" for line in dec_lines)
        src = (
            "def encode(o, _pack=_pack):\n"
            f"    return {packed}\n"
            "def encode_many(objs, _pack=_pack, _join=_join):\n"
            f"    return _join([{packed} for o in objs])\n"
            f"def decode(data, _unpack=_unpack, _cls=_cls, _new=_new, {setters}):\n"
            "    t = _unpack(data)\n"
            "    o = _new(_cls)\n" + fill.replace("        ", "    ") + "    return o\n"
            f"def decode_many(data, _iter_unpack=_iter_unpack, _cls=_cls, _new=_new, {setters}):\n"
            "    out = []\n"
            "    append = out.append\n"
            "    for t in _iter_unpack(data):\n"
            "        o = _new(_cls)\n" + fill + "        append(o)\n"
            "    return out\n"
        )
        exec(compile(src, f"<codec {self.c_name}>", "exec"), namespace)
        return namespace

    def layout(self) -> list[FieldLayout]:
        """Offsets and sizes of every member, pads included, in C order."""
        out = []
        offset = 0
        for f in self.members:
            out.append(FieldLayout(f.c_name, offset, f.size))
            offset += f.size
        return out

    def to_json(self, value: T) -> dict[str, Any]:
        """Field name -> rendered value (addresses as strings, MACs as aa:bb:..)."""
        family = getattr(value, "family", None)
        return {
            f.name: _render(getattr(value, f.name), f.render, family) for f in self._data_fields
        }


class ScalarCodec:
    """Codec for a bare integer key or value (u8, u16, u32, or network-order u16)."""

    def __init__(self, fmt: str, c_name: str) -> None:
        self.c_name = c_name
        self._struct = struct.Struct(fmt)
        self.size: int = self._struct.size
        self.encode: Callable[[int], bytes] = self._struct.pack
        self._array_code = {1: "B", 2: "H", 4: "I", 8: "Q"}[self.size]
        self._byteswap = fmt.startswith(">") and self.size > 1

    def decode(self, data: bytes) -> int:
        """The integer encoded in ``data``."""
        value: int = self._struct.unpack(data)[0]
        return value

    def encode_many(self, values: Iterable[int]) -> bytes:
        """Concatenated encodings (array-based, no per-element Python call)."""
        arr = array(self._array_code, values)
        if self._byteswap:
            arr.byteswap()
        return arr.tobytes()

    def decode_many(self, data: bytes) -> list[int]:
        """Decode consecutive encodings."""
        arr = array(self._array_code)
        arr.frombytes(data)
        if self._byteswap:
            arr.byteswap()
        return arr.tolist()

    def layout(self) -> list[FieldLayout]:
        """A scalar is a single member at offset 0."""
        return [FieldLayout(self.c_name, 0, self.size)]

    def to_json(self, value: int) -> int:
        """Scalars render as themselves."""
        return value


U8 = ScalarCodec("<B", "__u8")
U32 = ScalarCodec("<I", "__u32")
BE16 = ScalarCodec(">H", "__be16")


class U32ArrayCodec:
    """Codec for a fixed-length array of host-order u32 (the maglev lookup table)."""

    def __init__(self, length: int, c_name: str) -> None:
        self.length = length
        self.c_name = c_name
        self.size: int = 4 * length

    def encode(self, value: Sequence[int]) -> bytes:
        """Bytes for exactly ``length`` u32 values."""
        if len(value) != self.length:
            raise ValueError(f"{self.c_name}: need {self.length} values, got {len(value)}")
        return array("I", value).tobytes()

    def decode(self, data: bytes) -> tuple[int, ...]:
        """The u32 values in ``data``."""
        arr = array("I")
        arr.frombytes(data)
        return tuple(arr)

    def encode_many(self, values: Iterable[Sequence[int]]) -> bytes:
        """Concatenated encodings."""
        return b"".join(map(self.encode, values))

    def decode_many(self, data: bytes) -> list[tuple[int, ...]]:
        """Decode consecutive encodings."""
        return [self.decode(data[i : i + self.size]) for i in range(0, len(data), self.size)]

    def layout(self) -> list[FieldLayout]:
        """A single array member."""
        return [FieldLayout(self.c_name, 0, self.size)]

    def to_json(self, value: Sequence[int]) -> list[int]:
        """The table as a list."""
        return list(value)


class RawCodec:
    """Identity codec for maps whose layout is unknown (shown as hex)."""

    def __init__(self, size: int) -> None:
        self.size = size

    def encode(self, value: bytes) -> bytes:
        """``value`` unchanged (length checked by the backend)."""
        return value

    def decode(self, data: bytes) -> bytes:
        """``data`` unchanged."""
        return data

    def encode_many(self, values: Iterable[bytes]) -> bytes:
        """Concatenation."""
        return b"".join(values)

    def decode_many(self, data: bytes) -> list[bytes]:
        """Split into ``size``-byte chunks."""
        return [data[i : i + self.size] for i in range(0, len(data), self.size)]

    def layout(self) -> list[FieldLayout]:
        """Opaque bytes."""
        return [FieldLayout("raw", 0, self.size)]

    def to_json(self, value: bytes) -> str:
        """Hex."""
        return value.hex()
