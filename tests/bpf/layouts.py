"""Every codec under test, with hypothesis strategies generated from their members."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from bpf import catalog
from bpf.codec import Field, ScalarCodec, StructCodec, U32ArrayCodec

_INT_BOUNDS = {"B": 0xFF, "H": 0xFFFF, "I": 0xFFFFFFFF, "Q": 0xFFFFFFFFFFFFFFFF}


def field_strategy(f: Field) -> st.SearchStrategy[Any]:
    """Values a member can hold."""
    if f.fmt.endswith("s"):
        n = int(f.fmt[:-1])
        return st.binary(min_size=n, max_size=n)
    return st.integers(0, _INT_BOUNDS[f.fmt])


def value_strategy(codec: Any) -> st.SearchStrategy[Any]:
    """Values a codec can encode."""
    if isinstance(codec, StructCodec):
        kwargs = {f.name: field_strategy(f) for f in codec.members if not f.pad}
        return st.builds(codec.cls, **kwargs)
    if isinstance(codec, ScalarCodec):
        return st.integers(0, (1 << (8 * codec.size)) - 1)
    if isinstance(codec, U32ArrayCodec):
        return st.lists(
            st.integers(0, 0xFFFFFFFF), min_size=codec.length, max_size=codec.length
        ).map(tuple)
    raise TypeError(codec)


def all_codecs() -> dict[str, Any]:
    """Key and value codec of every catalogue map (and the maglev inner table), by C name."""
    out: dict[str, Any] = {}
    specs = list(catalog.all_specs().values())
    small_maglev = catalog.maglev_inner_spec(4, 251)
    for spec in [*specs, small_maglev]:
        for codec in (spec.key, spec.value):
            out.setdefault(f"{spec.name}:{codec.c_name}", codec)
    return out
