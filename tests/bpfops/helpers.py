"""Small builders for FrontendSpec-based LB Ops tests."""

from __future__ import annotations

import ipaddress
import re
from typing import Any

from bpfops.frontend_ops import FrontendOps, StaticNodeView
from bpfops.lb_maps import LBMaps
from bpfops.model import (
    Addr,
    BackendSpec,
    FrontendSpec,
    LBOpsConfig,
    ServiceSpec,
)

NO_TXN: Any = None


def addr(text: str, proto: str = "TCP", scope: int = 0) -> Addr:
    """``"10.0.0.1:80"`` or ``"[fd00::1]:80"`` as an Addr."""
    host, _, port = text.rpartition(":")
    return Addr.of(host.strip("[]"), int(port), proto, scope)


def be(text: str, state: int = 0, **kw: Any) -> BackendSpec:
    """A backend at ``text``."""
    return BackendSpec(addr(text), state, **kw)


def fe(
    text: str,
    svc_type: str = "ClusterIP",
    backends: tuple[BackendSpec, ...] = (),
    service: ServiceSpec | None = None,
    proto: str = "TCP",
) -> FrontendSpec:
    """A frontend at ``text`` of ``svc_type``."""
    return FrontendSpec(addr(text, proto), svc_type, service or ServiceSpec("test/echo"), backends)


def new_ops(maps: LBMaps, node: StaticNodeView | None = None, **cfg: Any) -> FrontendOps[Any]:
    """FrontendOps on ``maps`` with the corpus's test defaults (no wildcard unless asked)."""
    settings: dict[str, Any] = {"wildcard_entries": False, "maglev_table_size": 1021}
    settings.update(cfg)
    return FrontendOps(maps, LBOpsConfig(**settings), node=node)


def ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """Parse an IP."""
    return ipaddress.ip_address(text)


ID_RE = re.compile(r"\b(ID|BEID)=(\d+)")


def normalize_ids(lines: list[str]) -> list[str]:
    """Replace ids by the addresses they stand for, so dumps compare independent of
    allocation order: service ids by their REV address, backend ids by their BE address."""
    svc: dict[str, str] = {}
    bes: dict[str, str] = {}
    for line in lines:
        m = re.match(r"REV: ID=(\d+) ADDR=(\S+)", line)
        if m:
            svc[m.group(1)] = m.group(2)
        m = re.match(r"BE: ID=(\d+) ADDR=(\S+)", line)
        if m:
            bes[m.group(1)] = m.group(2)

    def sub(line: str) -> str:
        kind = line.split(":", 1)[0]

        def repl(m: re.Match[str]) -> str:
            if m.group(1) == "BEID" or kind == "BE":
                return f"{m.group(1)}=<{bes.get(m.group(2), m.group(2))}>"
            return f"ID=<{svc.get(m.group(2), m.group(2))}>"

        line = ID_RE.sub(repl, line)
        line = re.sub(
            r"(\d+)\((\d+)\)", lambda m: f"<{bes.get(m.group(1), m.group(1))}>({m.group(2)})", line
        )
        return _inner_by_label(line) if kind == "MAGLEV" else line

    return sorted(sub(line) for line in lines)


def _inner_by_label(line: str) -> str:
    """A MAGLEV line's INNER list with backends of equal slot counts ordered by their
    address label: the dump orders those by id, which depends on allocation order."""
    m = re.search(r"INNER=\[(.*)\]", line)
    if m is None or not m.group(1):
        return line
    entries = [re.fullmatch(r"(.*)\((\d+)\)", e) for e in m.group(1).split(", ")]
    if any(e is None for e in entries):
        return line
    pairs = sorted(((e.group(1), int(e.group(2))) for e in entries if e is not None),
                   key=lambda p: (-p[1], p[0]))
    inner = ", ".join(f"{label}({count})" for label, count in pairs)
    return line[: m.start(1)] + inner + line[m.end(1) :]
