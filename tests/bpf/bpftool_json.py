"""Decoding of ``bpftool -j map dump``'s struct view (the ``formatted`` part BTF gives).

bpftool prints each member of a map's BTF key and value types by name: integers as
the number their bytes make in host order (so a ``__be16`` port 80 reads 20480 and a
``__be32`` address 10.96.0.1 reads 16801802), arrays as lists, anonymous struct or
union members under the name ``""`` and named unions as an object with every
alternative. These helpers turn such an object into the value a codec stands for,
by member name and without the codec's byte layout, so a test can tell whether the
BTF names and types match what the Python side means.
"""

from __future__ import annotations

import json
import subprocess
from typing import Any

from bpf.codec import Field, ScalarCodec, StructCodec, U32ArrayCodec


def dump(bpftool: str, *target: str) -> list[dict[str, Any]]:
    """``bpftool -j map dump <target>`` (``pinned PATH`` or ``id N``) as parsed JSON."""
    out = subprocess.run(
        [bpftool, "-j", "map", "dump", *target],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    entries: list[dict[str, Any]] = json.loads(out)
    return entries


def raw_bytes(hex_bytes: list[str]) -> bytes:
    """bpftool's raw ``["0x0a", ...]`` key or value."""
    return bytes(int(b, 16) for b in hex_bytes)


def _members(obj: dict[str, Any]) -> dict[str, Any]:
    """Named members of a struct object, with anonymous ("") members lifted into it."""
    out: dict[str, Any] = {}
    for name, value in obj.items():
        if name == "" and isinstance(value, dict):
            out.update(_members(value))
        else:
            out[name] = value
    return out


def _address(value: Any, size: int) -> bytes:
    """Raw network-order bytes of an address member: ``__be32`` (an int), ``union
    sw_v6addr`` (``addr`` is its byte array) or a union holding one of those."""
    if isinstance(value, int):
        return value.to_bytes(size, "little")
    if isinstance(value, list):
        return bytes(value)
    if "addr" in value:
        return bytes(value["addr"])
    # A named union such as lb6_affinity_key.client_id: the alternative holding the address.
    for alternative in value.values():
        if isinstance(alternative, dict) and "addr" in alternative:
            return bytes(alternative["addr"])
    raise AssertionError(f"no {size}-byte address in {value!r}")


def _integer(value: Any, size: int, network_order: bool) -> int:
    """An integer member; a named union of integers (lb4_affinity_key.client_id, u32
    client_ip or u64 client_cookie) gives its widest alternative, which holds every
    byte (the narrower ones show its low bytes: little-endian host)."""
    if isinstance(value, dict):
        value = max(v for v in value.values() if isinstance(v, int))
    assert isinstance(value, int), f"not an integer: {value!r}"
    raw = value.to_bytes(size, "little")
    return int.from_bytes(raw, "big" if network_order else "little")


def _field(f: Field, value: Any) -> Any:
    if f.fmt.endswith("s"):
        return _address(value, f.size)
    return _integer(value, f.size, f.network_order)


def decode(codec: Any, value: Any) -> Any:
    """The codec-level value (dataclass, int or tuple) that bpftool's formatted ``value``
    shows, found by member names; AssertionError when a member is missing."""
    if isinstance(codec, StructCodec):
        assert isinstance(value, dict), f"{codec.c_name}: not a struct: {value!r}"
        members = _members(value)
        kwargs = {}
        for f in codec.members:
            if f.pad:
                continue
            assert f.c_name in members, f"{codec.c_name}: bpftool shows no member {f.c_name}"
            kwargs[f.name] = _field(f, members[f.c_name])
        return codec.cls(**kwargs)
    if isinstance(codec, ScalarCodec):
        return _integer(value, codec.size, codec.c_name.startswith("__be"))
    if isinstance(codec, U32ArrayCodec):
        assert isinstance(value, list) and len(value) == codec.length, f"{codec.c_name}"
        return tuple(int(v) for v in value)
    raise TypeError(f"no decoder for {codec!r}")
