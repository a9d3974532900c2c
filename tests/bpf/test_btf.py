"""BTF on the maps Statewright creates (bpf/btf.py, the BTF of bpf/maps.c): every catalogue
type is found with the codec's size, maps carry it (map-of-maps excepted), its absence or a
refusal never stops map creation, pinned maps without it are adopted, and bpftool's
struct view of every LB map decodes to what ``statewright lb list`` shows."""

from __future__ import annotations

import errno
import ipaddress
import json
import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from bpf import btf, catalog, lb
from bpf.btf import BtfError, BtfRegistry, BtfTypes
from bpf.codec import U8, ScalarCodec, U32ArrayCodec
from bpf.factory import BackendConfig, MapFactory
from bpf.kernel_map import KernelMap
from bpf.pinning import pin_path
from bpf.spec import MAP_OF_MAPS, MapFlag, MapSpec, MapType
from bpfops.lb_maps import (
    AFFINITY4,
    AFFINITY6,
    LB_MAP_NAMES,
    MAGLEV6,
    LBMaps,
    LBMapsConfig,
)
from bpfops.maps_dump import dump_lines, list_frontends
from bpfops.model import ServiceSpec
from tests.bpfops.helpers import NO_TXN, be, fe, new_ops

from . import bpftool_json
from .helpers import backend4, closing, ip4, tool

REPO = Path(__file__).resolve().parents[2]
SPECS = catalog.all_specs()


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """bpf/maps.c compiled by bpf.btf itself (the path first use takes)."""
    obj = tmp_path_factory.mktemp("btf") / "maps.o"
    btf.compile_types(obj, clang=tool("clang"))
    try:
        yield obj
    finally:
        obj.unlink(missing_ok=True)


@pytest.fixture
def types(compiled: Path) -> Iterator[BtfTypes]:
    """The compiled types as libbpf parses them."""
    t = BtfTypes.from_object(compiled)
    try:
        yield t
    finally:
        t.close()


@contextmanager
def using(reg: BtfRegistry) -> Iterator[BtfRegistry]:
    """Make ``reg`` the process-wide registry for a block, then restore the previous one."""
    old = btf.use_registry(reg)
    try:
        yield reg
    finally:
        btf.use_registry(old)
        reg.close()


def _all_specs() -> list[MapSpec[Any, Any]]:
    """Every catalogue map and the maglev inner maps of two table sizes."""
    inner = [catalog.maglev_inner_spec(4), catalog.maglev_inner_spec(6, 251)]
    return [*SPECS.values(), *inner]


# -- the types -------------------------------------------------------------------------


@pytest.mark.parametrize("spec", _all_specs(), ids=lambda s: f"{s.name}:{s.value_size}")
def test_every_map_type_is_in_the_btf(types: BtfTypes, spec: MapSpec[Any, Any]) -> None:
    """Each catalogue key and value type is found by its C name, with the codec's size
    (the layout test makes every catalogue map a declaration in bpf/maps.c's headers)."""
    if spec.type in MAP_OF_MAPS:
        with pytest.raises(BtfError) as exc:
            types.ids(spec)
        assert exc.value.errno == errno.EOPNOTSUPP
        return
    key_id, value_id = types.ids(spec)
    assert (types.size(key_id), types.size(value_id)) == (spec.key_size, spec.value_size)


def test_array_types_are_appended_once(types: BtfTypes) -> None:
    """``__u32[N]`` (the maglev table) is added on demand, once per size."""
    small = types.type_id("__u32[251]")
    assert types.type_id("__u32[251]") == small
    big = types.type_id("__u32[16381]")
    assert big != small
    assert (types.size(small), types.size(big)) == (251 * 4, 16381 * 4)


def test_unknown_type_and_wrong_size_are_errors(types: BtfTypes) -> None:
    """A C name the BTF lacks, or a codec of another size, is a BtfError saying so."""
    with pytest.raises(BtfError, match=r"no type sw_no_such_struct .*SW_DEFINE_MAPS") as exc:
        types.type_id("sw_no_such_struct")
    assert exc.value.errno == errno.ENOENT
    wrong: MapSpec[int, int] = MapSpec(
        "sw_wrong", MapType.HASH, ScalarCodec("<Q", "lb4_key"), U8, 4
    )
    with pytest.raises(BtfError, match=r"key type lb4_key is 12 bytes .* codec's is 8") as exc:
        types.ids(wrong)
    assert exc.value.errno == errno.EINVAL


def test_closed_types_are_an_error_not_a_crash(compiled: Path) -> None:
    """After close() every use raises EBADF instead of touching freed libbpf memory."""
    t = BtfTypes.from_object(compiled)
    t.close()
    t.close()  # idempotent
    for use in (lambda: t.type_id("lb4_key"), lambda: t.size(1), t.load):
        with pytest.raises(BtfError, match="is closed") as exc:
            use()
        assert exc.value.errno == errno.EBADF


def test_object_staleness_and_clang_errors(tmp_path: Path) -> None:
    """A missing or older object is stale; a clang failure names the source and leaves
    neither the object nor a temporary file behind."""
    obj = tmp_path / "types.o"
    assert btf.is_stale(obj)
    btf.compile_types(obj, clang=tool("clang"))
    assert not btf.is_stale(obj)
    newer = tmp_path / "newer.c"
    newer.write_text("int x;\n")
    os.utime(newer, (obj.stat().st_mtime + 10, obj.stat().st_mtime + 10))
    assert btf.is_stale(obj, newer)
    broken = tmp_path / "broken.c"
    broken.write_text("int x = ;\n")
    with pytest.raises(BtfError, match=f"clang failed on {broken}") as exc:
        btf.compile_types(tmp_path / "broken.o", broken, clang=tool("clang"))
    assert exc.value.errno == errno.EINVAL
    assert sorted(p.name for p in tmp_path.iterdir()) == ["broken.c", "newer.c", "types.o"]


# -- maps in the kernel ------------------------------------------------------------------


@pytest.mark.kernel
@pytest.mark.parametrize("spec", _all_specs(), ids=lambda s: f"{s.name}:{s.value_size}")
def test_created_maps_carry_btf(compiled: Path, spec: MapSpec[Any, Any]) -> None:
    """Every map KernelMap creates has BTF (bpftool lists its btf_id), map-of-maps none."""
    small = spec if spec.type == MapType.ARRAY else spec.resized(8)
    with using(BtfRegistry(compiled)) as reg:
        assert reg.status().ok
        with closing(KernelMap.create(small)) as m:
            info = m.info()
            shown = json.loads(
                subprocess.run(
                    [tool("bpftool"), "-j", "map", "show", "id", str(info.id)],
                    check=True,
                    capture_output=True,
                    text=True,
                ).stdout
            )
    if spec.type in MAP_OF_MAPS:
        assert info.btf_id == 0 and "btf_id" not in shown
    else:
        assert info.btf_id != 0 and shown["btf_id"] == info.btf_id


@pytest.mark.kernel
def test_without_clang_maps_have_no_btf_and_say_why(
    tmp_path: Path, kernel_pin_dir: str, monkeypatch: pytest.MonkeyPatch, caplog: Any
) -> None:
    """No object and no clang: maps are created (and work) without BTF; the log and the
    factory's reason say why."""
    monkeypatch.setattr(btf, "find_clang", lambda: None)
    spec = SPECS["lb4_backends"].resized(8)
    with (
        caplog.at_level(logging.INFO, logger="statewright.bpf"),
        using(BtfRegistry(tmp_path / "missing.o")) as reg,
    ):
        status = reg.status()
        factory = MapFactory(BackendConfig(backend="kernel", pin_dir=kernel_pin_dir))
        with closing(KernelMap.create(spec)) as m:
            m.update((1).to_bytes(4, "little"), spec.value.encode(backend4(1)))
            assert m.info().btf_id == 0
            assert m.count() == 1
    assert not status.ok
    assert "missing.o not built and clang not installed" in status.reason
    assert "no BTF: " in factory.reason and factory.btf == status
    assert "maps are created without BTF" in caplog.text


@pytest.mark.kernel
def test_first_use_builds_a_missing_object_and_keeps_an_older_one(
    tmp_path: Path, compiled: Path, caplog: Any
) -> None:
    """A missing object is compiled on first use; when rebuilding a stale one fails, the
    older object is used (with a warning) rather than no BTF."""
    tool("clang")
    fresh = tmp_path / "fresh.o"
    with using(BtfRegistry(fresh)) as reg:
        assert reg.status() == btf.BtfStatus(True, f"BTF from {fresh}")
        with closing(KernelMap.create(SPECS["lb4_services"].resized(8))) as m:
            assert m.info().btf_id != 0
    older = tmp_path / "older.o"
    older.write_bytes(compiled.read_bytes())
    broken = tmp_path / "broken.c"
    broken.write_text("int x = ;\n")
    os.utime(broken, (older.stat().st_mtime + 10, older.stat().st_mtime + 10))
    with (
        caplog.at_level(logging.WARNING, logger="statewright.bpf"),
        using(BtfRegistry(older, source=broken)) as reg,
    ):
        assert reg.status().ok
    assert f"clang failed on {broken}" in caplog.text and f"using the older {older}" in caplog.text


@pytest.mark.kernel
def test_unreadable_object_leaves_maps_without_btf(tmp_path: Path) -> None:
    """An object libbpf cannot open: the reason names it, maps are still created."""
    garbage = tmp_path / "garbage.o"
    garbage.write_bytes(b"not an ELF file")
    with using(BtfRegistry(garbage, build=False)) as reg:
        assert "libbpf cannot open " + str(garbage) in reg.status().reason
        with closing(KernelMap.create(SPECS["lb4_services"].resized(8))) as m:
            assert m.info().btf_id == 0


@pytest.mark.kernel
def test_global_data_sections_load(tmp_path: Path) -> None:
    """Global variables give data sections whose sizes clang leaves to the loader (the
    kernel rejects size 0); opening the object through libbpf sizes them, so an object
    with globals loads too (as bpf/maps.c's .maps and license sections do)."""
    source = tmp_path / "globals.c"
    source.write_text(f'#include "{btf.INCLUDE_DIR}/lb.h"\nstruct lb4_key sw_key;\nint sw_x = 1;\n')
    obj = tmp_path / "globals.o"
    btf.compile_types(obj, source, clang=tool("clang"))
    with using(BtfRegistry(obj, build=False)) as reg:
        assert reg.status().ok, reg.status().reason
        spec: MapSpec[Any, int] = MapSpec("sw_btf_globals", MapType.HASH, lb.SERVICE4_KEY, U8, 4)
        with closing(KernelMap.create(spec)) as m:
            assert m.info().btf_id != 0


@pytest.mark.kernel
def test_kernel_rejecting_the_blob_leaves_maps_without_btf(
    compiled: Path, monkeypatch: pytest.MonkeyPatch, caplog: Any
) -> None:
    """The kernel rejecting the blob, at first use or once an array type was appended:
    its log line is the reason, BTF is off for the process, maps are still created."""
    real_load = btf.libbpf.btf_load
    loads = {"done": 0, "allowed": 0}

    def load(data: bytes, log_size: int = 0) -> tuple[int, str]:
        """The real load for the first ``allowed`` calls, then the kernel's EINVAL."""
        loads["done"] += 1
        if loads["done"] > loads["allowed"]:
            log = "[7] STRUCT lb4_key size=12 vlen=6\nInvalid member" if log_size else ""
            return -errno.EINVAL, log
        return real_load(data, log_size)

    monkeypatch.setattr(btf.libbpf, "btf_load", load)
    with using(BtfRegistry(compiled, build=False)) as reg:
        reason = reg.status().reason
        with closing(KernelMap.create(SPECS["lb4_services"].resized(8))) as m:
            assert m.info().btf_id == 0
    assert "the kernel rejects the BTF of" in reason and "EINVAL (Invalid member)" in reason
    loads.update(done=0, allowed=1)
    inner = catalog.maglev_inner_spec(4, 509)
    with (
        caplog.at_level(logging.WARNING, logger="statewright.bpf"),
        using(BtfRegistry(compiled, build=False)) as reg,
    ):
        assert reg.status().ok
        with closing(KernelMap.create(SPECS["lb4_services"].resized(8))) as m:
            assert m.info().btf_id != 0
        with closing(KernelMap.create(inner)) as m:  # appends __u32[509]: rejected
            assert m.info().btf_id == 0
        assert not reg.status().ok and "EINVAL (Invalid member)" in reg.status().reason
        with closing(KernelMap.create(SPECS["lb4_services"].resized(8))) as m:
            assert m.info().btf_id == 0
    assert "maps are created without BTF from now on" in caplog.text


@pytest.mark.kernel
def test_kernel_refusing_btf_falls_back(compiled: Path, caplog: Any) -> None:
    """When the kernel refuses a map with its BTF (an LPM trie needs a struct key), the map
    is created without and the reason is logged once."""
    spec: MapSpec[Any, int] = MapSpec(
        "sw_btf_lpm",
        MapType.LPM_TRIE,
        U32ArrayCodec(2, "__u32[2]"),
        U8,
        4,
        int(MapFlag.NO_PREALLOC),
    )
    with caplog.at_level(logging.WARNING, logger="statewright.bpf"), using(BtfRegistry(compiled)):
        for _ in range(2):
            with closing(KernelMap.create(spec)) as m:
                assert m.info().btf_id == 0
                m.update(spec.key.encode((32, 7)), b"\x01")
                assert m.lookup(spec.key.encode((32, 7))) == b"\x01"
    assert caplog.text.count("map sw_btf_lpm is created without BTF") == 1
    assert "the kernel refuses it with BTF: EINVAL" in caplog.text


@pytest.mark.kernel
def test_pinned_map_without_btf_is_adopted(
    tmp_path: Path, compiled: Path, kernel_pin_dir: str, caplog: Any
) -> None:
    """A map pinned without BTF (earlier version, no clang) keeps its entries: adopted as
    it is and logged; a layout change still recreates it, then with BTF."""
    spec = SPECS["lb4_backends"].resized(16)
    config = BackendConfig(backend="kernel", pin_dir=kernel_pin_dir)
    with (
        using(BtfRegistry(tmp_path / "missing.o", build=False)),
        MapFactory(config).open_typed(spec) as m,
    ):
        m.update_batch(range(3), [backend4(i) for i in range(3)])
        assert m.backend.info().btf_id == 0
    with caplog.at_level(logging.INFO, logger="statewright.bpf"), using(BtfRegistry(compiled)):
        factory = MapFactory(config)
        with factory.open_typed(spec) as m:
            assert dict(m.items()) == {i: backend4(i) for i in range(3)}
            assert m.backend.info().btf_id == 0
        assert "pinned map lb4_backends at" in caplog.text and "has no BTF; adopted" in caplog.text
        with factory.open_typed(spec.resized(32)) as m:
            assert m.count() == 0
            assert m.backend.info().btf_id != 0


# -- bpftool's struct view of the LB maps --------------------------------------------------


def _populate(maps: LBMaps) -> dict[str, dict[Any, Any]]:
    """Services that put entries in every LB map (FrontendOps), plus affinity entries
    (the datapath's LRU maps) written directly; returns the latter."""
    ops = new_ops(maps, wildcard_entries=True, algorithm_annotation=True, maglev_table_size=251)
    ranges = (ipaddress.ip_network("192.168.0.0/16"), ipaddress.ip_network("fd00:aa::/64"))
    sticky = ServiceSpec(
        "test/echo",
        session_affinity=True,
        affinity_timeout=30,
        lb_algorithm="maglev",
        source_ranges=ranges,
    )
    ops.update(
        NO_TXN,
        1,
        fe(
            "10.96.0.1:80",
            "LoadBalancer",
            (be("10.244.0.1:8080"), be("10.244.0.2:8080", 1), be("10.244.1.3:8080")),
            sticky,
        ),
    )
    ops.update(NO_TXN, 2, fe("10.96.0.2:53", backends=(be("10.244.0.9:53"),), proto="UDP"))
    ops.update(
        NO_TXN,
        3,
        fe("[fd00::1]:443", "LoadBalancer", (be("[fd00:244::1]:8443"),), sticky),
    )
    aff4 = {lb.Affinity4Key(1 << 40 | 7, 1, 1): lb.AffinityValue(1234, 1)}
    aff6 = {lb.Affinity6Key(bytes(15) + b"\x05", 3, 0): lb.AffinityValue(99, 4)}
    for name, entries in ((AFFINITY4, aff4), (AFFINITY6, aff6)):
        for k, v in entries.items():
            maps.maps[name].update(k, v)
    return {AFFINITY4: aff4, AFFINITY6: aff6}


def _cli(*args: str) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "statewright", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def _decode_into(bpftool: str, pinned: str, decoded: LBMaps, name: str) -> int:
    """Decode bpftool's struct view of one pinned LB map into the same map of ``decoded``;
    returns the number of entries. Each entry's struct view must give its raw bytes."""
    m = decoded.maps[name]
    spec = m.spec
    entries = bpftool_json.dump(bpftool, "pinned", pinned)
    for e in entries:
        if spec.type in MAP_OF_MAPS:
            # No BTF on the outer map (the kernel refuses it): the key is raw, the value
            # the inner map's id, and the inner array is shown with its BTF.
            assert "formatted" not in e, f"{name}: map-of-maps with a struct view"
            assert spec.inner is not None
            rev_nat_id = int.from_bytes(bpftool_json.raw_bytes(e["key"]), "big")
            inner_id = int.from_bytes(bpftool_json.raw_bytes(e["value"]), "little")
            (inner,) = bpftool_json.dump(bpftool, "id", str(inner_id))
            assert inner["formatted"]["key"] == 0
            table = bpftool_json.decode(spec.inner.value, inner["formatted"]["value"])
            decoded.set_maglev(rev_nat_id, list(table), v6=name == MAGLEV6)
            continue
        assert "formatted" in e, f"{name}: bpftool shows no struct view (no BTF?): {e}"
        key = bpftool_json.decode(spec.key, e["formatted"]["key"])
        value = bpftool_json.decode(spec.value, e["formatted"]["value"])
        assert spec.key.encode(key) == bpftool_json.raw_bytes(e["key"]), f"{name}: {e}"
        assert spec.value.encode(value) == bpftool_json.raw_bytes(e["value"]), f"{name}: {e}"
        m.update(key, value)
    return len(entries)


@pytest.mark.kernel
def test_bpftool_struct_view_of_every_lb_map_matches_lb_list(kernel_pin_dir: str) -> None:
    """FrontendOps fills the pinned LB maps; bpftool -j dumps each of them; its struct
    view, decoded by member name, gives the same ``lb list -o json`` and ``lb
    maps-dump`` as the kernel maps themselves (and the affinity entries written)."""
    bpftool = tool("bpftool")
    config = LBMapsConfig(
        backend="kernel", pin_dir=kernel_pin_dir, max_entries=64, maglev_table_size=251
    )
    with LBMaps.open(config) as maps:
        affinity = _populate(maps)
    with LBMaps.in_memory(max_entries=64, maglev_table_size=251) as decoded:
        counts = {
            name: _decode_into(bpftool, pin_path(kernel_pin_dir, name), decoded, name)
            for name in LB_MAP_NAMES
        }
        assert all(counts.values()), f"every LB map has entries: {counts}"
        listed = json.loads(_cli("lb", "list", "--pin-dir", kernel_pin_dir, "-o", "json"))
        assert listed == list_frontends(decoded)
        assert {r["address"] for r in listed} >= {"10.96.0.1:80/TCP", "[fd00::1]:443/TCP"}
        dumped = _cli("lb", "maps-dump", "--pin-dir", kernel_pin_dir).splitlines()
        assert dumped == dump_lines(decoded)
        assert any(line.startswith("SRCRANGE: ID=3 CIDR=fd00:aa::/64") for line in dumped)
        for name in (AFFINITY4, AFFINITY6):
            assert dict(decoded.maps[name].items()) == affinity[name]


def test_decoder_reads_struct_members_by_name() -> None:
    """The decoder itself: network-order members, addresses, anonymous unions, named
    unions, and a member bpftool does not show is an error (no vacuous passes)."""
    view = {
        "": {"backend_id": 5, "affinity_timeout": 5, "l7_lb_proxy_port": 5},
        "count": 2,
        "rev_nat_index": 1792,
        "flags": 0,
        "flags2": 0,
        "qcount": 1,
    }
    assert bpftool_json.decode(lb.SERVICE4_VALUE, view) == lb.ServiceValue(5, 2, 7, 0, 0, 1)
    key = {"address": 16801802, "dport": 20480, "backend_slot": 0, "proto": 6, "scope": 0}
    assert bpftool_json.decode(lb.SERVICE4_KEY, {**key, "pad": [0, 0]}) == lb.Service4Key(
        ip4("10.96.0.1"), 80, 0, 6
    )
    v6 = {"": {"p1": 0, "p2": 0, "p3": 0, "p4": 1 << 24}, "addr": [0] * 15 + [1]}
    aff6 = {"client_id": {"client_ip": v6, "client_cookie": 0}, "rev_nat_id": 3}
    assert bpftool_json.decode(lb.AFFINITY6_KEY, {**aff6, "netns_cookie": 0}) == (
        lb.Affinity6Key(bytes(15) + b"\x01", 3, 0)
    )
    aff4 = {"client_id": {"client_ip": 7, "client_cookie": 1 << 40 | 7}, "rev_nat_id": 1}
    assert bpftool_json.decode(lb.AFFINITY4_KEY, {**aff4, "netns_cookie": 1}) == (
        lb.Affinity4Key(1 << 40 | 7, 1, 1)
    )
    assert bpftool_json.decode(SPECS["lb4_reverse_nat"].key, 1792) == 7  # __be16 7
    with pytest.raises(AssertionError, match="no member dport"):
        bpftool_json.decode(lb.SERVICE4_KEY, {k: v for k, v in key.items() if k != "dport"})
