"""The difference between two states of the LB maps (`statewright plan`).

`diff_snapshots` compares what the maps hold (an `LBSnapshot` of the pinned maps) with
what the agent would write (the snapshot of a copy of them after the agent's own
FrontendOps applied every frontend of its tables and pruned): per map, the entries
that would be added, changed (old and new value) and removed. Entries are shown as the
corpus dump prints them (``SVC: ID=3 ADDR=10.96.0.10:80/TCP SLOT=0 ...``) and, in JSON, as
``bpf dump -o json`` decodes them. Maglev tables are compared per service id.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from bpf import catalog
from bpfops.lb_maps import (
    BACKENDS4,
    BACKENDS6,
    MAGLEV4,
    MAGLEV6,
    REVNAT4,
    REVNAT6,
    SERVICES4,
    SERVICES6,
    LBSnapshot,
)
from bpfops.maglev import slot_counts
from bpfops.maps_dump import backend_line, service_line


@dataclass(slots=True)
class MapDiff:
    """One map's differences."""

    added: list[dict[str, Any]] = field(default_factory=list)
    changed: list[dict[str, Any]] = field(default_factory=list)
    removed: list[dict[str, Any]] = field(default_factory=list)

    @property
    def count(self) -> int:
        return len(self.added) + len(self.changed) + len(self.removed)

    def to_json(self) -> dict[str, Any]:
        return {"added": self.added, "changed": self.changed, "removed": self.removed}


def _codecs(name: str) -> tuple[Any, Any]:
    spec = catalog.spec_for(name)
    if spec is None:
        return None, None
    return spec.key, spec.value


def _json(codec: Any, value: Any) -> Any:
    if codec is None:
        return repr(value)
    return codec.to_json(value)


def _text(name: str, key: Any, value: Any) -> str:
    if name in (SERVICES4, SERVICES6):
        return service_line(key, value)
    if name in (BACKENDS4, BACKENDS6):
        return backend_line(key, value)
    if name in (REVNAT4, REVNAT6):
        import ipaddress

        ip = ipaddress.ip_address(value.address)
        host = f"[{ip}]" if ip.version == 6 else str(ip)
        return f"REV: ID={key} ADDR={host}:{value.port}"
    return f"{name}: {key} = {value}"


def _record(name: str, key: Any, value: Any) -> dict[str, Any]:
    kc, vc = _codecs(name)
    return {"key": _json(kc, key), "value": _json(vc, value), "text": _text(name, key, value)}


def diff_entries(name: str, old: dict[Any, Any], new: dict[Any, Any]) -> MapDiff:
    """The differences of one map, from ``old`` to ``new`` (key -> value)."""
    out = MapDiff()
    kc, vc = _codecs(name)
    for key in sorted(new.keys() - old.keys(), key=repr):
        out.added.append(_record(name, key, new[key]))
    for key in sorted(old.keys() - new.keys(), key=repr):
        out.removed.append(_record(name, key, old[key]))
    for key in sorted(old.keys() & new.keys(), key=repr):
        if old[key] != new[key]:
            out.changed.append({
                "key": _json(kc, key),
                "old": _json(vc, old[key]),
                "new": _json(vc, new[key]),
                "text": _text(name, key, new[key]),
                "old_text": _text(name, key, old[key]),
            })
    return out


def _maglev(table: list[int]) -> dict[str, Any]:
    return {"slots": len(table), "backends": dict(slot_counts(table))}


def diff_maglev(name: str, old: list[tuple[int, list[int]]], new: list[tuple[int, list[int]]]
                ) -> MapDiff:
    """The maglev tables that would be added, changed or removed, per service id."""
    o, n = dict(old), dict(new)
    out = MapDiff()
    for rid in sorted(n.keys() - o.keys()):
        out.added.append({"key": rid, "value": _maglev(n[rid]), "text": f"MAGLEV: ID={rid}"})
    for rid in sorted(o.keys() - n.keys()):
        out.removed.append({"key": rid, "value": _maglev(o[rid]), "text": f"MAGLEV: ID={rid}"})
    for rid in sorted(o.keys() & n.keys()):
        if o[rid] != n[rid]:
            out.changed.append({"key": rid, "old": _maglev(o[rid]), "new": _maglev(n[rid]),
                                "text": f"MAGLEV: ID={rid}", "old_text": f"MAGLEV: ID={rid}"})
    return out


def diff_snapshots(current: LBSnapshot, wanted: LBSnapshot) -> dict[str, MapDiff]:
    """Per map name, what turns ``current`` into ``wanted`` (maps without a difference
    included, with empty lists)."""
    out: dict[str, MapDiff] = {}
    for name in sorted(set(current.entries) | set(wanted.entries)):
        out[name] = diff_entries(name, dict(current.entries.get(name, [])),
                                 dict(wanted.entries.get(name, [])))
    for v6, name in ((False, MAGLEV4), (True, MAGLEV6)):
        out[name] = diff_maglev(name, current.maglev.get(v6, []), wanted.maglev.get(v6, []))
    return out


def plan_json(diffs: dict[str, MapDiff], **extra: Any) -> dict[str, Any]:
    """The ``plan -o json`` document: ``changes`` (total), ``maps`` (only those with a
    difference), and what the caller adds (sources, pin directory)."""
    total = sum(d.count for d in diffs.values())
    return {
        **extra,
        "changes": total,
        "maps": {name: d.to_json() for name, d in diffs.items() if d.count},
    }


def plan_text(diffs: dict[str, MapDiff]) -> str:
    """The human form: one block per map with a difference, ``+``/``~``/``-`` lines."""
    lines: list[str] = []
    for name, d in diffs.items():
        if not d.count:
            continue
        lines.append(f"{name}: {len(d.added)} added, {len(d.changed)} changed, "
                     f"{len(d.removed)} removed")
        lines += [f"  + {r['text']}" for r in d.added]
        for r in d.changed:
            lines.append(f"  ~ {r['old_text']}")
            lines.append(f"    -> {r['text']}")
        lines += [f"  - {r['text']}" for r in d.removed]
    total = sum(d.count for d in diffs.values())
    lines.append(f"{total} change(s)" if total else "no changes: the maps hold what the "
                 "sources say")
    return "\n".join(lines) + "\n"
