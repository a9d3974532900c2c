"""Validation of address fields held as raw network-order bytes in map values."""

from __future__ import annotations


def check_length(owner: object, field: str, value: bytes, length: int) -> None:
    """Raise ValueError unless ``value`` is exactly ``length`` bytes (struct would pad it)."""
    if not isinstance(value, bytes) or len(value) != length:
        cls = owner if isinstance(owner, type) else type(owner)
        raise ValueError(f"{cls.__name__}.{field}: need {length} bytes, got {value!r}")
