"""LBConfig: every load-balancer option, settable by its Cilium command-line flag name.

The conformance corpus starts the agent with the flags of a ``#!`` line
(``--bpf-lb-algorithm=maglev --lb-test-fault-probability=0.0``); `LBConfig.from_flags`
parses exactly those spellings. Each option is described once in `OPTIONS`
(flag name, field, kind, default, whether Statewright implements it), so a
runner can report flags that are recognised but not implemented, and flags
that are unknown, instead of silently ignoring them.

Defaults are Cilium's agent defaults; the node name defaults to this node's
(`default_node_name`). The conformance runner sets the test harness' own presets
explicitly (tests/conformance/lb_system.py).
"""

from __future__ import annotations

import dataclasses
import os
import re
import socket
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from statedb.errors import InputError

OptionKind = Literal["bool", "int", "float", "str", "duration", "range"]


def default_node_name() -> str:
    """This node's name: ``$NODE_NAME`` (a DaemonSet sets it from the downward API), else the
    host name."""
    return os.environ.get("NODE_NAME") or socket.gethostname()


class FlagError(InputError):
    """A flag is unknown or its value is invalid; ``obj`` (or the message) names the flag."""


@dataclass(frozen=True, slots=True)
class Option:
    """One LB option: its flag, the LBConfig field it sets, its kind, and whether it is
    implemented (an unimplemented option is accepted and stored but has no effect)."""

    flag: str
    field: str
    kind: OptionKind
    implemented: bool = True
    choices: tuple[str, ...] = ()
    help: str = ""
    #: Bounds of an ``int`` option (inclusive; None: unbounded above).
    minimum: int = 0
    maximum: int | None = None


@dataclass(frozen=True, slots=True)
class LBConfig:
    """Load-balancer configuration (immutable; build with `from_flags` or `replace`)."""

    # --- algorithm -------------------------------------------------------------
    algorithm: str = "random"
    algorithm_annotation: bool = False
    maglev_table_size: int = 16381
    # --- forwarding ------------------------------------------------------------
    mode: str = "snat"
    mode_annotation: bool = False
    dsr_dispatch: str = "opt"
    # --- features --------------------------------------------------------------
    enable_wildcard_entries: bool = True
    external_clusterip: bool = False
    source_range_all_types: bool = False
    enable_external_ips: bool = True
    enable_node_port: bool = True
    enable_host_port: bool = True
    enable_session_affinity: bool = True
    enable_health_check_nodeport: bool = True
    enable_service_topology: bool = False
    enable_scale_to_zero: bool = False
    enable_internal_traffic_policy: bool = True
    kube_proxy_replacement: bool = True
    enable_experimental_lb: bool = False
    enable_ipv4: bool = True
    enable_ipv6: bool = True
    #: Inclusive NodePort range.
    node_port_min: int = 30000
    node_port_max: int = 32767
    # --- map sizes -------------------------------------------------------------
    lb_map_max: int = 65536
    lb_service_map_max: int = 0
    lb_backend_map_max: int = 0
    lb_rev_nat_map_max: int = 0
    lb_affinity_map_max: int = 0
    lb_source_range_map_max: int = 0
    lb_maglev_map_max: int = 0
    # --- reconciliation --------------------------------------------------------
    retry_backoff_min: float = 0.05
    retry_backoff_max: float = 60.0
    test_fault_probability: float = 0.0
    # --- misc ------------------------------------------------------------------
    node_name: str = dataclasses.field(default_factory=default_node_name)
    state_file: str = ""
    state_file_interval: float = 0.0
    metrics_sampling_interval: float = 300.0

    # ----- derived -------------------------------------------------------------
    @property
    def service_map_max(self) -> int:
        """Entries of the services maps (lb_service_map_max or lb_map_max)."""
        return self.lb_service_map_max or self.lb_map_max

    @property
    def backend_map_max(self) -> int:
        """Entries of the backends maps."""
        return self.lb_backend_map_max or self.lb_map_max

    @property
    def rev_nat_map_max(self) -> int:
        """Entries of the reverse-NAT maps."""
        return self.lb_rev_nat_map_max or self.lb_map_max

    @property
    def affinity_map_max(self) -> int:
        """Entries of the affinity match map."""
        return self.lb_affinity_map_max or self.lb_map_max

    @property
    def source_range_map_max(self) -> int:
        """Entries of the source-range LPM maps."""
        return self.lb_source_range_map_max or self.lb_map_max

    @property
    def maglev_map_max(self) -> int:
        """Entries of the maglev outer maps."""
        return self.lb_maglev_map_max or self.lb_map_max

    def map_size_flag(self, group: str) -> str:
        """The flag that sizes the map group ``group`` (`MAP_SIZE_FLAGS`) in this
        configuration: its own flag when set, else ``bpf-lb-map-max``."""
        flag = MAP_SIZE_FLAGS[group]
        own = getattr(self, OPTIONS_BY_FLAG[flag].field)
        return flag if own else "bpf-lb-map-max"

    def in_node_port_range(self, port: int) -> bool:
        """True if ``port`` is inside the NodePort range."""
        return self.node_port_min <= port <= self.node_port_max

    def replace(self, **changes: Any) -> LBConfig:
        """Return a copy with some fields replaced."""
        return dataclasses.replace(self, **changes)

    # ----- flags -----------------------------------------------------------------
    @classmethod
    def from_flags(
        cls, flags: Iterable[str], base: LBConfig | None = None, *, strict: bool = True
    ) -> LBConfig:
        """Apply Cilium-style flags (``--name=value``, ``--name value``, bare ``--bool``) on
        top of ``base`` (default: `LBConfig()`); raise FlagError for an unknown flag when
        ``strict`` (otherwise skip it) and always for an invalid value."""
        cfg = base if base is not None else cls()
        changes: dict[str, Any] = {}
        for opt, value in _split_flags(list(flags), strict):
            changes.update(_apply(opt, value))
        return dataclasses.replace(cfg, **changes)

    @staticmethod
    def unsupported_flags(flags: Iterable[str], also_supported: Iterable[str] = ()) -> list[str]:
        """Return the flags in ``flags`` that are unknown or not implemented (as written).

        ``also_supported`` names flags (without ``--``) that the caller implements itself
        although this module marks them unimplemented (e.g. a component that acts on
        ``--enable-scale-to-zero``)."""
        extra = set(also_supported)
        out: list[str] = []
        for tok in flags:
            if not tok.startswith("--"):
                continue
            name = tok[2:].split("=", 1)[0]
            opt = OPTIONS_BY_FLAG.get(name)
            if opt is None or not (opt.implemented or name in extra):
                out.append(tok)
        return out


#: A map's max_entries is a u32 in the kernel's map attributes (the kernel may refuse
#: less: it refuses a hash map of 2**31 entries or more, and the agent then refuses to
#: start, naming the flag).
MAP_MAX_LIMIT = 2**32 - 1

#: The map groups (`bpf.catalog.LB_MAP_GROUPS`) and the flag that sizes each (0, the
#: default, leaves it to ``--bpf-lb-map-max``).
MAP_SIZE_FLAGS: dict[str, str] = {
    "services": "bpf-lb-service-map-max",
    "backends": "bpf-lb-service-backend-map-max",
    "rev_nat": "bpf-lb-rev-nat-map-max",
    "affinity": "bpf-lb-affinity-map-max",
    "source_range": "bpf-lb-source-range-map-max",
    "maglev": "bpf-lb-maglev-map-max",
}

#: Every option, by flag. ``implemented=False``: accepted, stored, no effect yet.
OPTIONS: tuple[Option, ...] = (
    Option("bpf-lb-algorithm", "algorithm", "str", choices=("random", "maglev")),
    Option("node-port-algorithm", "algorithm", "str", choices=("random", "maglev")),
    Option("bpf-lb-algorithm-annotation", "algorithm_annotation", "bool"),
    Option("bpf-lb-maglev-table-size", "maglev_table_size", "int"),
    Option("bpf-lb-mode", "mode", "str", choices=("snat", "dsr", "hybrid")),
    Option("node-port-mode", "mode", "str", choices=("snat", "dsr", "hybrid")),
    Option("bpf-lb-mode-annotation", "mode_annotation", "bool"),
    Option("bpf-lb-dsr-dispatch", "dsr_dispatch", "str", implemented=False),
    Option("bpf-lb-enable-wildcard-entries", "enable_wildcard_entries", "bool"),
    Option("bpf-lb-external-clusterip", "external_clusterip", "bool"),
    Option("bpf-lb-source-range-all-types", "source_range_all_types", "bool"),
    Option("enable-external-ips", "enable_external_ips", "bool"),
    Option("enable-node-port", "enable_node_port", "bool"),
    Option("enable-host-port", "enable_host_port", "bool"),
    Option("enable-session-affinity", "enable_session_affinity", "bool"),
    Option("enable-health-check-nodeport", "enable_health_check_nodeport", "bool"),
    Option("enable-service-topology", "enable_service_topology", "bool"),
    Option("enable-scale-to-zero", "enable_scale_to_zero", "bool"),
    Option("enable-internal-traffic-policy", "enable_internal_traffic_policy", "bool"),
    Option("kube-proxy-replacement", "kube_proxy_replacement", "bool"),
    Option("enable-experimental-lb", "enable_experimental_lb", "bool",
           help="accepted for compatibility; the table-based LB is the only one"),
    Option("enable-ipv4", "enable_ipv4", "bool"),
    Option("enable-ipv6", "enable_ipv6", "bool"),
    Option("node-port-range", "node_port_min", "range"),
    Option("bpf-lb-map-max", "lb_map_max", "int", minimum=1, maximum=MAP_MAX_LIMIT,
           help="entries of every LB map a --bpf-lb-*-map-max flag does not size"),
    Option("bpf-lb-service-map-max", "lb_service_map_max", "int", maximum=MAP_MAX_LIMIT,
           help="entries of the services maps (and scale-to-zero); 0: --bpf-lb-map-max"),
    Option("bpf-lb-service-backend-map-max", "lb_backend_map_max", "int",
           maximum=MAP_MAX_LIMIT, help="entries of the backends maps; 0: --bpf-lb-map-max"),
    Option("bpf-lb-backend-map-max", "lb_backend_map_max", "int", maximum=MAP_MAX_LIMIT,
           help="alias of --bpf-lb-service-backend-map-max"),
    Option("bpf-lb-rev-nat-map-max", "lb_rev_nat_map_max", "int", maximum=MAP_MAX_LIMIT,
           help="entries of the reverse-NAT maps; 0: --bpf-lb-map-max"),
    Option("bpf-lb-affinity-map-max", "lb_affinity_map_max", "int", maximum=MAP_MAX_LIMIT,
           help="entries of the affinity maps (match and LRU); 0: --bpf-lb-map-max"),
    Option("bpf-lb-source-range-map-max", "lb_source_range_map_max", "int",
           maximum=MAP_MAX_LIMIT, help="entries of the source-range maps; 0: --bpf-lb-map-max"),
    Option("bpf-lb-maglev-map-max", "lb_maglev_map_max", "int", maximum=MAP_MAX_LIMIT,
           help="entries of the maglev outer maps; 0: --bpf-lb-map-max"),
    Option("lb-retry-backoff-min", "retry_backoff_min", "duration"),
    Option("lb-retry-backoff-max", "retry_backoff_max", "duration"),
    # Fault injection into map writes: the test harness' map wrapper acts on it.
    Option("lb-test-fault-probability", "test_fault_probability", "float", implemented=False),
    Option("node-name", "node_name", "str"),
    Option("lb-state-file", "state_file", "str", implemented=False),
    Option("lb-state-file-interval", "state_file_interval", "duration", implemented=False),
    Option("metrics-sampling-interval", "metrics_sampling_interval", "duration",
           implemented=False),
)

OPTIONS_BY_FLAG: dict[str, Option] = {o.flag: o for o in OPTIONS}

_DURATION_RE = re.compile(r"(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)")
_UNIT = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(text: str) -> float:
    """Parse a Go duration (``10ms``, ``1m30s``, ``0``) into seconds; raise ValueError."""
    t = text.strip()
    if t in ("0", ""):
        return 0.0
    pos, total = 0, 0.0
    for m in _DURATION_RE.finditer(t):
        if m.start() != pos:
            break
        total += float(m.group(1)) * _UNIT[m.group(2)]
        pos = m.end()
    if pos != len(t) or pos == 0:
        raise ValueError(f"invalid duration {text!r}")
    return total


def _parse_bool(text: str) -> bool:
    t = text.strip().lower()
    if t in ("true", "1", "t", "yes"):
        return True
    if t in ("false", "0", "f", "no"):
        return False
    raise ValueError(f"invalid boolean {text!r}")


def _split_flags(tokens: Sequence[str], strict: bool) -> list[tuple[Option, str | None]]:
    out: list[tuple[Option, str | None]] = []
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        i += 1
        if not tok.startswith("--"):
            raise FlagError(f"unexpected argument {tok!r} (flags start with --)")
        name, eq, value = tok[2:].partition("=")
        opt = OPTIONS_BY_FLAG.get(name)
        if opt is None:
            if strict:
                raise FlagError(f"unknown flag --{name}")
            continue
        if not eq:
            if opt.kind == "bool":
                out.append((opt, None))
                continue
            if i >= len(tokens) or tokens[i].startswith("--"):
                raise FlagError("needs a value", obj=f"flag --{name}")
            value = tokens[i]
            i += 1
        out.append((opt, value))
    return out


def _apply(opt: Option, value: str | None) -> dict[str, Any]:
    try:
        if opt.kind == "bool":
            return {opt.field: True if value is None else _parse_bool(value)}
        assert value is not None
        if opt.choices and value not in opt.choices:
            raise ValueError(f"{value!r} is not one of {', '.join(opt.choices)}")
        if opt.kind == "int":
            n = int(value)
            if n < opt.minimum:
                raise ValueError(
                    f"{value!r} is negative" if n < 0 else f"{value!r} is below {opt.minimum}"
                )
            if opt.maximum is not None and n > opt.maximum:
                raise ValueError(f"{value!r} is above {opt.maximum}")
            return {opt.field: n}
        if opt.kind == "float":
            return {opt.field: float(value)}
        if opt.kind == "duration":
            return {opt.field: parse_duration(value)}
        if opt.kind == "range":
            lo, sep, hi = value.partition("-")
            if not sep:
                lo, sep, hi = value.partition(",")
            a, b = int(lo), int(hi)
            if not 0 < a <= b <= 65535:
                raise ValueError(f"invalid port range {value!r}")
            return {"node_port_min": a, "node_port_max": b}
        return {opt.field: value}
    except ValueError as e:
        raise FlagError(str(e), obj=f"flag --{opt.flag}") from None
