"""The C headers are the source of truth: compile them with clang, read the BTF, and check
that every Python codec and map spec matches it (sizes, offsets, byte order, map params)."""

from __future__ import annotations

import os
import subprocess
import sysconfig
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bpf import catalog
from bpf.codec import ScalarCodec, StructCodec, U32ArrayCodec
from bpf.spec import MapSpec

from .btf import BTF
from .helpers import tool

BPF_DIR = Path(__file__).resolve().parents[2] / "bpf"


def _multiarch_include() -> list[str]:
    arch = sysconfig.get_config_var("MULTIARCH") or ""
    path = f"/usr/include/{arch}"
    return [f"-I{path}"] if arch and os.path.isdir(path) else []


@pytest.fixture(scope="module")
def btf(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BTF]:
    """BTF of bpf/maps.c compiled with clang -target bpf -g."""
    clang, bpftool = tool("clang"), tool("bpftool")
    obj = tmp_path_factory.mktemp("btf") / "maps.o"
    cmd = [
        clang,
        "-target",
        "bpf",
        "-O2",
        "-g",
        *_multiarch_include(),
        "-c",
        str(BPF_DIR / "maps.c"),
        "-o",
        str(obj),
    ]
    subprocess.run(cmd, check=True, capture_output=True)
    try:
        yield BTF.from_object(bpftool, str(obj))
    finally:
        obj.unlink()


SPECS = catalog.all_specs()


def _check_struct(btf: BTF, codec: StructCodec[Any]) -> None:
    struct = btf.struct(codec.c_name)
    assert codec.size == struct["size"], f"{codec.c_name}: size {codec.size} != {struct['size']}"
    c_members = {m.name: m for m in btf.members(struct)}
    py_layout = codec.layout()
    for member, placed in zip(codec.members, py_layout):
        assert placed.c_name in c_members, f"{codec.c_name}: no C member {placed.c_name}"
        c = c_members[placed.c_name]
        assert (placed.offset, placed.size) == (c.offset, c.size), (
            f"{codec.c_name}.{placed.c_name}: python offset/size {placed.offset}/{placed.size}, "
            f"C {c.offset}/{c.size}"
        )
        if member.fmt == "H":
            want = "__be16" if member.network_order else "__u16"
            assert c.type_name == want, f"{codec.c_name}.{placed.c_name}: C type {c.type_name}"
    covered = {p.c_name for p in py_layout}
    for group in btf.top_level_groups(struct):
        names = {m.name for m in group}
        assert names & covered, f"{codec.c_name}: C member(s) {sorted(names)} missing in Python"


def _check_codec(btf: BTF, codec: Any, c_type_name: str, c_size: int) -> None:
    assert codec.size == c_size, f"{c_type_name}: python size {codec.size} != C {c_size}"
    if isinstance(codec, StructCodec):
        assert c_type_name == codec.c_name
        _check_struct(btf, codec)
    elif isinstance(codec, ScalarCodec | U32ArrayCodec):
        assert c_type_name == codec.c_name, f"C type {c_type_name} != python {codec.c_name}"
    else:
        raise AssertionError(f"unexpected codec {codec!r}")


def _check_map(btf: BTF, spec: MapSpec[Any, Any], c_def: dict[str, Any]) -> None:
    assert c_def["type"] == spec.type, f"{spec.name}: type"
    assert c_def["key_size"] == spec.key_size, f"{spec.name}: key size"
    assert c_def["value_size"] == spec.value_size, f"{spec.name}: value size"
    assert c_def["max_entries"] == spec.max_entries, f"{spec.name}: max_entries"
    assert c_def.get("map_flags", 0) == spec.flags, f"{spec.name}: flags"
    if "key_name" in c_def:
        _check_codec(btf, spec.key, c_def["key_name"], c_def["key_size"])
    if "value_name" in c_def:
        _check_codec(btf, spec.value, c_def["value_name"], c_def["value_size"])
    assert ("inner" in c_def) == (spec.inner is not None), f"{spec.name}: inner map"
    if spec.inner is not None:
        _check_map(btf, spec.inner, c_def["inner"])


def test_every_map_is_declared_in_c(btf: BTF) -> None:
    """The catalogue and the headers declare exactly the same maps."""
    assert sorted(btf.maps()) == sorted(SPECS)


@pytest.mark.parametrize("name", sorted(SPECS))
def test_map_matches_header(btf: BTF, name: str) -> None:
    """Type, sizes, capacity, flags, key/value layouts and inner map agree with the C header."""
    _check_map(btf, SPECS[name], btf.maps()[name])


def test_reader_detects_a_wrong_offset(btf: BTF) -> None:
    """The check itself fails on a codec that disagrees with C (guards against vacuous passes)."""
    from dataclasses import dataclass

    from bpf.codec import be16, ipv4, pad, u8, u16

    @dataclass(frozen=True, slots=True)
    class Wrong:
        address: bytes
        backend_slot: int
        dport: int
        proto: int
        scope: int

    wrong = StructCodec(
        Wrong,
        "lb4_key",
        [
            ipv4("address"),
            u16("backend_slot"),
            be16("dport"),
            u8("proto"),
            u8("scope"),
            pad("pad", 2),
        ],
    )
    with pytest.raises(AssertionError, match="offset"):
        _check_struct(btf, wrong)
