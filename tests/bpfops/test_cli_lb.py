"""``statewright lb maps-dump`` / ``lb list``: pinned kernel maps read from another process."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from bpf import lb
from bpfops.lb_maps import LBMaps
from bpfops.maps_dump import dump_lines, list_frontends
from bpfops.model import ServiceSpec
from statewright.cli.lb_commands import format_list
from tests.bpfops.conftest import MapsMaker
from tests.bpfops.helpers import NO_TXN, be, fe, new_ops

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def populate(maps: LBMaps) -> None:
    ops = new_ops(maps, wildcard_entries=True, algorithm_annotation=True)
    svc = ServiceSpec(
        "test/echo", session_affinity=True, affinity_timeout=10, lb_algorithm="maglev"
    )
    ops.update(
        NO_TXN,
        1,
        fe("10.96.0.1:80", backends=(be("10.244.0.1:80"), be("10.244.0.2:80", 1)), service=svc),
    )
    ops.update(
        NO_TXN, 2, fe("[fd00::1]:53", "LoadBalancer", (be("[fd00:244::1]:53"),), proto="UDP")
    )


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "statewright", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
        check=False,
    )


def test_list_frontends_shows_slots_and_states() -> None:
    maps = LBMaps.in_memory(max_entries=64, maglev_table_size=251)
    populate(maps)
    records = list_frontends(maps)
    assert [r["address"] for r in records] == [
        "10.96.0.1:0/ANY",
        "[fd00::1]:0/ANY",
        "10.96.0.1:80/TCP",
        "[fd00::1]:53/UDP",
    ]
    main = records[2]
    assert main["type"] == "ClusterIP" and main["algorithm"] == "maglev"
    assert [(b["address"], b["state"], b["inactive"]) for b in main["backends"]] == [
        ("10.244.0.1:80/TCP", "active", False),
        ("10.244.0.2:80/TCP", "terminating", True),
    ]
    text = format_list(records)
    assert text.splitlines()[0].split() == ["ID", "Frontend", "Type", "Flags", "Backends"]
    assert "10.244.0.2:80/TCP (terminating, inactive)" in text


@pytest.mark.kernel
@pytest.mark.parametrize("backend_kind", ["kernel"], indirect=True)
def test_maps_dump_and_list_from_another_process(make_maps: MapsMaker, pin_dir: str) -> None:
    maps = make_maps()
    populate(maps)
    want = dump_lines(maps)
    maps.close()
    out = run_cli("lb", "maps-dump", "--pin-dir", pin_dir)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == want
    assert any(line.startswith("MAGLEV: ID=1 INNER=[1(1021)]") for line in want)
    listed = run_cli("lb", "list", "--pin-dir", pin_dir)
    assert listed.returncode == 0, listed.stderr
    assert "10.244.0.2:80/TCP (terminating, inactive)" in listed.stdout
    check = run_cli("lb", "maps-dump", "--check-empty", "--pin-dir", pin_dir)
    assert check.returncode == 1


@pytest.mark.kernel
@pytest.mark.parametrize("backend_kind", ["kernel"], indirect=True)
def test_maps_dump_of_empty_and_missing_maps(make_maps: MapsMaker, pin_dir: str) -> None:
    out = run_cli("lb", "maps-dump", "--check-empty", "--pin-dir", pin_dir)  # nothing pinned
    assert out.returncode == 0 and out.stdout == ""
    maps = make_maps()
    maps.svc4.update(lb.Service4Key(bytes(4), 0), lb.ServiceValue())
    maps.close()
    out = run_cli("lb", "maps-dump", "--check-empty", "--pin-dir", pin_dir)
    assert out.returncode == 1 and out.stdout.startswith("SVC: ID=0 ADDR=0.0.0.0:0/ANY SLOT=0")
