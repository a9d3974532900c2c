"""``statewright lb maps-dump`` and ``statewright lb list``: the LB maps, for tests and people.

Both read the load-balancer maps pinned under a directory by a running (or stopped)
agent, from any process, without creating or changing anything: a missing map counts
as empty, a map whose layout differs from the catalogue is an error.

* ``maps-dump`` prints the corpus line format (``SVC:``/``BE:``/``REV:``/``AFF:``/
  ``MAGLEV:``/``SRCRANGE:``), sorted; ``--check-empty`` exits 1 when an entry remains.
* ``list`` shows one line per frontend: service id, address, type, flags, and its
  backends in slot order with their states.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from bpf import catalog, lb
from bpf.errors import MapError
from bpf.kernel_map import KernelMap
from bpf.memory_map import MemoryMap
from bpf.probe import DEFAULT_PIN_DIR, kernel_support
from bpf.spec import MapSpec
from bpf.typed_map import TypedMap
from bpfops.lb_maps import LB_MAP_NAMES, MAGLEV4, MAGLEV6, LBMaps
from bpfops.maps_dump import dump_lines, list_frontends
from statedb.errors import StatewrightError
from statewright.cli.common import format_table

if TYPE_CHECKING:
    from statewright.cli import Commands, SubParsers

PIN_DIR_ENV = "STATEWRIGHT_BPF_PIN_DIR"


class LBCliError(StatewrightError, RuntimeError):
    """The pinned maps cannot be read; the message says why."""


def add_commands(subparsers: SubParsers, commands: Commands) -> None:
    """Register ``lb maps-dump`` and ``lb list``; each leaf sets ``func(args) -> int``."""
    group = subparsers.add_parser("lb", help="inspect the load-balancer BPF maps")
    sub = group.add_subparsers(dest="lb_command", required=True)
    default_dir = os.environ.get(PIN_DIR_ENV, DEFAULT_PIN_DIR)

    dump = sub.add_parser("maps-dump", help="print the LB maps in the corpus line format")
    dump.add_argument("file", nargs="?", help="write to this file instead of stdout")
    dump.add_argument("--pin-dir", default=default_dir, help=f"default {default_dir}")
    dump.add_argument(
        "--check-empty", action="store_true", help="exit 1 when any LB map entry remains"
    )
    dump.set_defaults(func=cmd_maps_dump)
    commands["lb maps-dump"] = dump

    lst = sub.add_parser(
        "list", help="list frontends with their backends",
        description="Every frontend of the LB maps (pinned, or the running agent's) with its "
                    "backends in slot order.",
        epilog="legend: FLAGS are those of Cilium's dump. 'non-routable': a frontend that "
               "is reached only from this node (a ClusterIP; traffic from elsewhere to it is "
               "not load-balanced). 'Local' / 'InternalLocal': the external / internal "
               "traffic policy Local (local backends only). A row with id 0 is a wildcard "
               "entry <vip>:0/ANY of a ClusterIP or LoadBalancer address, shared by the "
               "address's frontends: a connection to a port of that address that no "
               "frontend serves is dropped instead of leaving the node.",
    )
    lst.add_argument("--pin-dir", default=default_dir, help=f"default {default_dir}")
    lst.add_argument("-o", "--output", choices=("table", "json"), default="table")
    lst.set_defaults(func=cmd_list)
    commands["lb list"] = lst


# -- opening pinned maps read-only --------------------------------------------------------


def _pinned_spec(spec: MapSpec[Any, Any], m: KernelMap) -> MapSpec[Any, Any]:
    """``spec`` with the live map's capacity (and maglev table size); errors on layouts."""
    info = m.info()
    if (info.key_size, info.value_size, info.type) != (spec.key_size, spec.value_size, spec.type):
        raise LBCliError(f"pinned map {spec.name} has another layout: {spec.mismatch(info)}")
    if spec.inner is None:
        return spec.resized(info.max_entries)
    table_size = lb.MAGLEV_TABLE_SIZE
    for key in m:
        inner = m.get_inner(key)
        if inner is not None:
            table_size = inner.info().value_size // 4
            inner.close()
            break
    family = 6 if spec.name == MAGLEV6 else 4
    return catalog.maglev_spec(family, info.max_entries, table_size)


@contextlib.contextmanager
def open_pinned_lb_maps(pin_dir: str) -> Iterator[LBMaps]:
    """The LB maps pinned under ``pin_dir``, read-only use; absent maps are empty stand-ins."""
    support = kernel_support(pin_dir)
    if not support.ok:
        raise LBCliError(f"kernel BPF maps unavailable: {support.reason}")
    specs = {s.name: s for s in catalog.lb_specs()}
    opened: dict[str, TypedMap[Any, Any]] = {}
    table_size = lb.MAGLEV_TABLE_SIZE
    try:
        for name in LB_MAP_NAMES:
            spec = specs[name]
            path = os.path.join(pin_dir, name)
            if not KernelMap.is_pinned(path):
                opened[name] = TypedMap(spec, MemoryMap.create(spec))
                continue
            probe = KernelMap.open_pinned(path, spec)
            try:
                real = _pinned_spec(spec, probe)
            finally:
                probe.close()
            if name in (MAGLEV4, MAGLEV6) and real.inner is not None:
                table_size = real.inner.value_size // 4
            opened[name] = TypedMap(real, KernelMap.open_pinned(path, real))
        maps = LBMaps(opened, KernelMap, table_size, "kernel", pin_dir)
    except BaseException:
        for m in opened.values():
            m.close()
        raise
    try:
        yield maps
    finally:
        maps.close()


# -- list -----------------------------------------------------------------------------------


def format_list(records: list[dict[str, Any]]) -> str:
    """The table form of ``list_frontends``."""
    header = ["ID", "Frontend", "Type", "Flags", "Backends"]
    rows = []
    for r in records:
        bes = ", ".join(
            f"{b['address']} ({b['state']}{', inactive' if b['inactive'] else ''})"
            for b in r["backends"]
        )
        rows.append([str(r["id"]), r["address"], r["type"], ", ".join(r["flags"]), bes])
    return format_table(header, rows)


# -- commands -------------------------------------------------------------------------------


def cmd_maps_dump(args: argparse.Namespace) -> int:
    """Print (or write to ``file``) the pinned LB maps in the corpus format."""
    try:
        with open_pinned_lb_maps(args.pin_dir) as maps:
            lines = dump_lines(maps)
    except (LBCliError, MapError, OSError) as exc:
        print(f"statewright lb maps-dump: {exc}", file=sys.stderr)
        return 2
    text = "".join(line + "\n" for line in lines)
    if args.file:
        with open(args.file, "w", encoding="utf-8") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    if args.check_empty and lines:
        print(f"statewright lb maps-dump: {len(lines)} entries remain", file=sys.stderr)
        return 1
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    """Print the frontends of the pinned LB maps with their backends."""
    try:
        with open_pinned_lb_maps(args.pin_dir) as maps:
            records = list_frontends(maps)
    except (LBCliError, MapError, OSError) as exc:
        print(f"statewright lb list: {exc}", file=sys.stderr)
        return 2
    if args.output == "json":
        print(json.dumps(records, indent=2))
    else:
        sys.stdout.write(format_list(records))
    return 0


def main(argv: list[str] | None = None) -> int:
    """Standalone entry: ``python -m statewright.cli.lb_commands lb maps-dump``."""
    from statewright.cli import run

    parser = argparse.ArgumentParser(prog="statewright")
    add_commands(parser.add_subparsers(dest="command", required=True), {})
    return run(parser, argv)


if __name__ == "__main__":
    raise SystemExit(main())
