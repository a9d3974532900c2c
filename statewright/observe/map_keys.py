"""Map keys as people copy them: bpftool's hex bytes, ``statewright bpf dump``'s
``field=value`` pairs, or the short forms ``lb list`` and the tables print (a frontend
``10.96.0.10:80/TCP``, a backend or service id, an IP address).

`parse_key` turns one of those into the map's key object (the codec's dataclass or int);
a text it cannot read raises `KeyTextError` naming the forms it accepts.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import re
from typing import Any

from bpf.spec import MapSpec
from statedb.errors import InputError

_HEX_BYTE = re.compile(r"^(0x)?[0-9a-fA-F]{2}$")
_ID = re.compile(r"^(?:ID=)?(\d+)$", re.IGNORECASE)


class KeyTextError(InputError):
    """A map key that cannot be read; the message says which forms are accepted."""

    def __init__(self, map_name: str, text: str, forms: str) -> None:
        super().__init__(f"cannot read {text!r} as a key of {map_name}: expected {forms}",
                         obj=map_name, field="key")


def hex_bytes(text: str) -> bytes | None:
    """bpftool's ``0a 60 00 0a ...`` (or ``0x0a 0x60 ...``, or one run of hex digits) as
    bytes; None when the text is not hex."""
    tokens = text.replace(",", " ").split()
    if tokens and tokens[0] == "key:":
        tokens = tokens[1:]
    if len(tokens) > 1 and all(_HEX_BYTE.match(t) for t in tokens):
        return bytes(int(t, 16) for t in tokens)
    if len(tokens) == 1:
        t = tokens[0].removeprefix("0x")
        if len(t) % 2 == 0 and len(t) > 2 and all(c in "0123456789abcdefABCDEF" for c in t):
            return bytes.fromhex(t)
    return None


def _field_value(name: str, text: str, current: Any) -> Any:
    if isinstance(current, bytes):
        ip = ipaddress.ip_address(text)
        packed = ip.packed
        return packed + bytes(len(current) - len(packed)) if len(current) > len(packed) else packed
    if isinstance(current, bool):
        return text.lower() in ("1", "true", "yes")
    try:
        return int(text, 0)
    except ValueError:
        raise ValueError(f"field {name}: not a number: {text!r}") from None


def flat_key(spec: MapSpec[Any, Any], text: str) -> Any | None:
    """``field=value ...`` (``bpf dump``'s KEY column) as the spec's key dataclass; None
    when the text has no ``=``. Fields not given keep the key's zero value."""
    pairs = [t.split("=", 1) for t in text.split() if "=" in t]
    if not pairs:
        return None
    cls: Any = getattr(spec.key, "cls", None)
    if cls is None or not dataclasses.is_dataclass(cls):
        return None
    zero = spec.key.decode(bytes(spec.key_size))
    values = {f.name: getattr(zero, f.name) for f in dataclasses.fields(cls)}
    for name, raw in pairs:
        if name not in values:
            raise ValueError(f"no field {name!r} (fields: {', '.join(values)})")
        values[name] = _field_value(name, raw, values[name])
    factory: Any = cls
    return factory(**values)


def numeric_id(text: str) -> int | None:
    """``3`` or ``ID=3``: a service, backend or reverse-NAT id."""
    m = _ID.match(text.strip())
    return int(m.group(1)) if m else None


def parse_key(spec: MapSpec[Any, Any], text: str, short: Any = None, forms: str = "") -> Any:
    """The key of ``spec``'s map written as ``text``: hex bytes, ``field=value`` pairs, or
    what ``short`` (a map-specific parser returning None when it does not apply) reads.
    Hex bytes of another length than the key's are read by ``short`` if it can: a
    four-digit id or cookie (``4729``) is also two bytes of hex."""
    raw = hex_bytes(text)
    try:
        if raw is not None and len(raw) == spec.key_size:
            return spec.key.decode(raw)
        if short is not None:
            key = short(text)
            if key is not None:
                return key
        if raw is not None:
            raise ValueError(f"{len(raw)} bytes, the key has {spec.key_size}")
        key = flat_key(spec, text)
        if key is not None:
            return key
    except ValueError as e:
        raise KeyTextError(spec.name, text, f"{forms or 'hex bytes or field=value pairs'} "
                                            f"({e})") from None
    raise KeyTextError(spec.name, text, forms or "hex bytes or field=value pairs")
