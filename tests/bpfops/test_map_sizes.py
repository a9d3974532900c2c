"""The ``--bpf-lb-*-map-max`` flags size their maps, on memory and kernel maps.

Each flag sizes its own group of LB maps (`bpf.catalog.LB_MAP_GROUPS`); the others keep
``--bpf-lb-map-max``. On kernel maps the capacity checked is the one the kernel reports
for the created map (``max_entries`` of its map info); memory maps refuse an entry past
their capacity as the kernel does. Sizes the agent cannot honour are refused before
anything is opened (out of the kernel's u32 range, or zero for ``--bpf-lb-map-max``),
or, when the kernel refuses them, at start with the flag named.
"""

from __future__ import annotations

import errno

import pytest

from bpf import lb
from bpf.catalog import LB_MAP_GROUPS, LBMapSizes, group_of
from bpf.errors import MapError
from statewright.loadbalancer import LoadBalancer, LoadBalancerError, MapsPlacement, map_sizes
from tables.lb_config import MAP_SIZE_FLAGS, FlagError, LBConfig

BASE = 4096
OWN = 1500

#: Each flag and the group it sizes; the Cilium spelling of the backends' flag and the
#: shorter alias.
FLAGS = [
    ("bpf-lb-service-map-max", "services"),
    ("bpf-lb-service-backend-map-max", "backends"),
    ("bpf-lb-backend-map-max", "backends"),
    ("bpf-lb-rev-nat-map-max", "rev_nat"),
    ("bpf-lb-affinity-map-max", "affinity"),
    ("bpf-lb-source-range-map-max", "source_range"),
    ("bpf-lb-maglev-map-max", "maglev"),
]


def _open(backend_kind: str, pin_dir: str, flags: list[str]) -> LoadBalancer:
    config = LBConfig.from_flags(
        ["--bpf-lb-maglev-table-size=1021", "--enable-scale-to-zero", *flags]
    )
    lbal = LoadBalancer(config, MapsPlacement(backend=backend_kind, pin_dir=pin_dir))
    lbal.open_maps()
    assert lbal.maps_kind == backend_kind
    return lbal


def _capacities(lbal: LoadBalancer) -> dict[str, int]:
    assert lbal.maps is not None
    return {name: m.backend.info().max_entries for name, m in lbal.maps.maps.items()}


@pytest.mark.parametrize(("flag", "group"), FLAGS, ids=[f for f, _ in FLAGS])
def test_each_flag_sizes_its_maps(
    flag: str, group: str, backend_kind: str, pin_dir: str
) -> None:
    """The flag's maps get its size, every other LB map ``--bpf-lb-map-max``."""
    lbal = _open(backend_kind, pin_dir, [f"--bpf-lb-map-max={BASE}", f"--{flag}={OWN}"])
    try:
        caps = _capacities(lbal)
        assert set(caps) >= {n for names in LB_MAP_GROUPS.values() for n in names}
        for name, cap in caps.items():
            assert cap == (OWN if group_of(name) == group else BASE), name
        assert lbal.config.map_size_flag(group) == MAP_SIZE_FLAGS[group]
    finally:
        lbal.close_maps()


def test_map_max_sizes_every_map(backend_kind: str, pin_dir: str) -> None:
    """``--bpf-lb-map-max`` alone sizes every LB map; without it, Cilium's 65536."""
    lbal = _open(backend_kind, pin_dir, ["--bpf-lb-map-max=3000"])
    try:
        assert set(_capacities(lbal).values()) == {3000}
        assert lbal.config.map_size_flag("maglev") == "bpf-lb-map-max"
    finally:
        lbal.close_maps()
    assert map_sizes(LBConfig()) == LBMapSizes.uniform(lb.LB_MAP_MAX_ENTRIES)


def test_a_full_map_refuses_the_next_entry(backend_kind: str, pin_dir: str) -> None:
    """The size is honoured, not only reported: a backends map of 2 takes no third."""
    lbal = _open(backend_kind, pin_dir, ["--bpf-lb-service-backend-map-max=2"])
    try:
        assert lbal.maps is not None
        be4 = lbal.maps.be4
        for i in (1, 2):
            be4.update(i, lb.Backend4(bytes([10, 0, 0, i]), 80, 6))
        with pytest.raises(MapError) as e:
            be4.update(3, lb.Backend4(b"\x0a\x00\x00\x03", 80, 6))
        assert e.value.errno == errno.E2BIG
    finally:
        lbal.close_maps()


@pytest.mark.parametrize(
    ("flags", "match"),
    [
        (["--bpf-lb-map-max=0"], "bpf-lb-map-max.*below 1"),
        (["--bpf-lb-service-map-max=-1"], "bpf-lb-service-map-max.*negative"),
        (["--bpf-lb-maglev-map-max=4294967296"], "bpf-lb-maglev-map-max.*above 4294967295"),
        (["--bpf-lb-map-max=4294967296"], "bpf-lb-map-max.*above"),
        (["--bpf-lb-affinity-map-max=many"], "bpf-lb-affinity-map-max"),
    ],
)
def test_sizes_out_of_range_are_refused(flags: list[str], match: str) -> None:
    """Refused while the flags are read, before any map is opened (both backends)."""
    with pytest.raises(FlagError, match=match):
        LBConfig.from_flags(flags)


def test_zero_leaves_a_group_to_map_max() -> None:
    """0 (the default) for a group's flag means ``--bpf-lb-map-max``."""
    c = LBConfig.from_flags(["--bpf-lb-map-max=512", "--bpf-lb-rev-nat-map-max=0"])
    assert map_sizes(c) == LBMapSizes.uniform(512)
    assert c.map_size_flag("rev_nat") == "bpf-lb-map-max"


@pytest.mark.kernel
def test_a_size_the_kernel_refuses_fails_the_start_naming_the_flag() -> None:
    """The kernel refuses hash maps of 2**31 entries (E2BIG, without allocating): the
    maps do not open, the error names the map, the size and the flag, and nothing of
    the half-opened set stays open."""
    import os
    import uuid

    from bpf.probe import kernel_support
    from tests.pins import BPFFS, remove_pin_dir

    support = kernel_support(BPFFS)
    if not support.ok:
        pytest.skip(f"kernel BPF maps unavailable: {support.reason}")
    pin_dir = os.path.join(BPFFS, f"statewright-lbsize-{uuid.uuid4().hex[:12]}")
    config = LBConfig.from_flags(["--bpf-lb-service-backend-map-max=2147483648"])
    lbal = LoadBalancer(config, MapsPlacement(backend="kernel", pin_dir=pin_dir))
    try:
        with pytest.raises(LoadBalancerError) as e:
            lbal.open_maps()
        text = str(e.value)
        assert "lb4_backends" in text and "2147483648" in text
        assert "--bpf-lb-service-backend-map-max" in text
        assert lbal.maps is None
        assert not os.path.exists(os.path.join(pin_dir, "lb4_backends"))
    finally:
        remove_pin_dir(pin_dir)
