"""``statewright bpf maps`` and ``statewright bpf dump MAP``: inspect pinned kernel maps.

They open the pins read-only from any process (the agent need not run) and decode
entries with the catalogue's codecs; maps of unknown layout are shown as hex.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import TYPE_CHECKING, Any

from bpf import catalog
from bpf.codec import RawCodec
from bpf.errors import MapError
from bpf.kernel_map import KernelMap
from bpf.probe import DEFAULT_PIN_DIR, kernel_support
from bpf.spec import MAP_OF_MAPS, MapInfo, MapSpec, MapType
from statewright.cli.common import flat, format_table

if TYPE_CHECKING:
    from statewright.cli import Commands, SubParsers

PIN_DIR_ENV = "STATEWRIGHT_BPF_PIN_DIR"


def add_commands(subparsers: SubParsers, commands: Commands) -> None:
    """Register ``bpf maps`` and ``bpf dump``; each leaf sets ``func(args) -> int``."""
    bpf = subparsers.add_parser("bpf", help="inspect the agent's pinned BPF maps")
    sub = bpf.add_subparsers(dest="bpf_command", required=True)
    default_dir = os.environ.get(PIN_DIR_ENV, DEFAULT_PIN_DIR)

    maps = sub.add_parser("maps", help="list pinned maps (name, type, entries, max, path)")
    maps.add_argument("--pin-dir", default=default_dir, help=f"default {default_dir}")
    maps.add_argument("-o", "--output", choices=("table", "json"), default="table")
    maps.set_defaults(func=cmd_maps)
    commands["bpf maps"] = maps

    dump = sub.add_parser("dump", help="print a pinned map's decoded entries")
    dump.add_argument("map", help="map name (e.g. lb4_services) or pinned path")
    dump.add_argument("--pin-dir", default=default_dir, help=f"default {default_dir}")
    dump.add_argument("-o", "--output", choices=("table", "json"), default="table")
    dump.set_defaults(func=cmd_dump)
    commands["bpf dump"] = dump


def _type_name(map_type: int) -> str:
    try:
        return MapType(map_type).name.lower()
    except ValueError:
        return str(map_type)


def _raw_spec(name: str, info: MapInfo) -> MapSpec[Any, Any]:
    return MapSpec(
        name,
        MapType.HASH,
        RawCodec(info.key_size),
        RawCodec(info.value_size),
        info.max_entries,
        info.flags,
    )


def _open(path: str) -> KernelMap:
    name = os.path.basename(path)
    probe = KernelMap.open_pinned(path, _raw_spec(name, MapInfo(0, 1, 1, 1, 0)))
    info = probe.info()
    probe.close()
    spec = _raw_spec(name, info)
    return KernelMap.open_pinned(path, spec)


def _check_kernel(pin_dir: str) -> str | None:
    support = kernel_support(pin_dir)
    return None if support.ok else f"kernel BPF maps unavailable: {support.reason}"


def pinned_map_names(pin_dir: str) -> list[str]:
    """The pins under ``pin_dir``, relative to it: the maps at the top and those of the
    datapath's subdirectories (``sock_lb/lb4_sock_revnat``...); ``links`` directories hold
    link pins, not maps, and are left out."""
    names: list[str] = []
    for top, dirs, files in os.walk(pin_dir):
        dirs[:] = sorted(d for d in dirs if d != "links")
        rel = os.path.relpath(top, pin_dir)
        names += [f if rel == "." else os.path.join(rel, f) for f in sorted(files)]
    return names


def cmd_maps(args: argparse.Namespace) -> int:
    """List every map pinned under the pin directory."""
    pin_dir: str = args.pin_dir
    problem = _check_kernel(pin_dir)
    if problem:
        print(f"statewright bpf maps: {problem}", file=sys.stderr)
        return 1
    if not os.path.isdir(pin_dir):
        print(f"statewright bpf maps: no pin directory {pin_dir}", file=sys.stderr)
        return 1
    rows = []
    for name in pinned_map_names(pin_dir):
        path = os.path.join(pin_dir, name)
        try:
            m = _open(path)
        except MapError as exc:
            print(f"statewright bpf maps: {exc}", file=sys.stderr)
            continue
        with m:
            info = m.info()
            rows.append(
                {
                    "name": name,
                    "type": _type_name(info.type),
                    "entries": m.count(),
                    "max": info.max_entries,
                    "pinned": path,
                }
            )
    if args.output == "json":
        print(json.dumps(rows, indent=2))
    else:
        header = ["NAME", "TYPE", "ENTRIES", "MAX", "PINNED"]
        sys.stdout.write(format_table(header, [list(r.values()) for r in rows]))
    return 0


def decode_entries(name: str, m: KernelMap) -> list[dict[str, Any]]:
    """Entries of pinned map ``name`` decoded with the catalogue's codecs when layouts match."""
    info = m.info()
    spec = catalog.spec_for(name)
    if spec is not None and (spec.key_size, spec.value_size) != (info.key_size, info.value_size):
        spec = None
    out = []
    for kraw, vraw in m.dump():
        if spec is None:
            out.append({"key": kraw.hex(), "value": vraw.hex()})
            continue
        key = spec.key.to_json(spec.key.decode(kraw))
        if info.type in MAP_OF_MAPS:
            value: Any = {"inner_map_id": int.from_bytes(vraw, "little")}
        else:
            value = spec.value.to_json(spec.value.decode(vraw))
        out.append({"key": key, "value": value})
    return out


def cmd_dump(args: argparse.Namespace) -> int:
    """Print one pinned map's entries."""
    target: str = args.map
    path = target if os.sep in target else os.path.join(args.pin_dir, target)
    problem = _check_kernel(os.path.dirname(path))
    if problem:
        print(f"statewright bpf dump: {problem}", file=sys.stderr)
        return 1
    if not os.path.exists(path):
        print(f"statewright bpf dump: no map pinned at {path}", file=sys.stderr)
        return 1
    try:
        with _open(path) as m:
            entries = decode_entries(os.path.basename(path), m)
    except MapError as exc:
        print(f"statewright bpf dump: {exc}", file=sys.stderr)
        return 1
    if args.output == "json":
        print(json.dumps(entries, indent=2))
    else:
        rows = [[flat(e["key"]), flat(e["value"])] for e in entries]
        sys.stdout.write(format_table(["KEY", "VALUE"], rows))
    return 0


def main(argv: list[str] | None = None) -> int:
    """Standalone entry: ``python -m statewright.cli.bpf_commands bpf maps``."""
    from statewright.cli import run

    parser = argparse.ArgumentParser(prog="statewright")
    add_commands(parser.add_subparsers(dest="command", required=True), {})
    return run(parser, argv)


if __name__ == "__main__":
    raise SystemExit(main())
