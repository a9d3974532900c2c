"""The ``lb/maps-dump`` text format of Cilium's LB script tests, the maps-empty check, and
`list_frontends`, the frontends as the maps hold them (``statewright lb list``, the agent's
``/lb/services``).

One line per map entry, all lines sorted as plain strings (so ``ID=10`` sorts before
``ID=2``), for example::

    BE: ID=1 ADDR=10.244.1.1:80/TCP STATE=active
    REV: ID=1 ADDR=10.96.50.104:80
    SVC: ID=1 ADDR=10.96.50.104:80/TCP SLOT=0 LBALG=undef AFFTimeout=42 COUNT=1 QCOUNT=0 FLAGS=...
    SVC: ID=1 ADDR=10.96.50.104:80/TCP SLOT=1 BEID=1 COUNT=0 QCOUNT=0 FLAGS=...

plus ``AFF:`` (affinity match), ``MAGLEV:`` (backend ids with their slot counts, most
first) and ``SRCRANGE:`` lines. The master slot's ``backend_id`` field packs the
algorithm (top 8 bits) and the affinity timeout (low 24 bits), or the L7 proxy port.
"""

from __future__ import annotations

import ipaddress
from typing import Any

from bpf import lb
from bpfops import flags as svcflags
from bpfops.lb_maps import LBMaps
from bpfops.maglev import slot_counts
from bpfops.model import SCOPE_INTERNAL, STATE_NAMES, proto_name

LB_ALG_SHIFT = 24
AFFINITY_TIMEOUT_MASK = (1 << LB_ALG_SHIFT) - 1
LB_ALG_NAMES = {0: "undef", 1: "random", 2: "maglev"}
LB_ALG_NUMBERS = {v: k for k, v in LB_ALG_NAMES.items()}


def _host_port(raw: bytes, port: int) -> str:
    if len(raw) == 4:
        return f"{ipaddress.IPv4Address(raw)}:{port}"
    return f"[{ipaddress.IPv6Address(raw)}]:{port}"


def _cidr(raw: bytes, bits: int) -> str:
    net = ipaddress.ip_network((ipaddress.ip_address(raw), bits), strict=False)
    return str(net)


def service_line(key: Any, value: lb.ServiceValue) -> str:
    """The SVC line of one services-map entry."""
    addr = _host_port(key.address, key.dport) + "/" + proto_name(key.proto)
    if key.scope == SCOPE_INTERNAL:
        addr += "/i"
    word = svcflags.join(value.flags, value.flags2)
    if key.backend_slot != 0:
        middle = f"BEID={value.backend_id}"
    elif word & svcflags.L7_LOAD_BALANCER:
        port = value.backend_id & 0xFFFF
        middle = f"L7Proxy={int.from_bytes(port.to_bytes(2, 'little'), 'big')}"
    else:
        alg = LB_ALG_NAMES.get(value.backend_id >> LB_ALG_SHIFT, "undef")
        middle = f"LBALG={alg} AFFTimeout={value.backend_id & AFFINITY_TIMEOUT_MASK}"
    return (
        f"SVC: ID={value.rev_nat_index} ADDR={addr} SLOT={key.backend_slot} {middle} "
        f"COUNT={value.count} QCOUNT={value.qcount} FLAGS={svcflags.flags_string(word)}"
    )


def backend_line(be_id: int, value: Any) -> str:
    """The BE line of one backends-map entry."""
    state = STATE_NAMES.get(value.flags, "active")
    return f"BE: ID={be_id} ADDR={_host_port(value.address, value.port)}/{proto_name(value.proto)} STATE={state}"  # noqa: E501


def dump_lines(maps: LBMaps) -> list[str]:
    """Every line of the dump, sorted as plain strings."""
    out: list[str] = []
    for v6 in (False, True):
        for key, value in maps.services(v6).dump():
            out.append(service_line(key, value))
        for be_id, value in maps.backends(v6).dump():
            out.append(backend_line(be_id, value))
        for rev_id, value in maps.revnat(v6).dump():
            out.append(f"REV: ID={rev_id} ADDR={_host_port(value.address, value.port)}")
        for key, _ in maps.source_ranges(v6).dump():
            out.append(
                f"SRCRANGE: ID={key.rev_nat_id} CIDR={_cidr(key.address, key.prefixlen - 32)}"
            )
        for rev_id, table in maps.maglev_tables(v6):
            inner = ", ".join(f"{be}({n})" for be, n in slot_counts(table))
            out.append(f"MAGLEV: ID={rev_id} INNER=[{inner}]")
    for key, _ in maps.aff_match.dump():
        out.append(f"AFF: ID={key.rev_nat_id} BEID={key.backend_id}")
    out.sort()
    return out


def dump_text(maps: LBMaps) -> str:
    """The dump as the corpus files hold it: lines joined, ending in a newline (or empty)."""
    lines = dump_lines(maps)
    return "".join(line + "\n" for line in lines)


def maps_empty(maps: LBMaps) -> list[str]:
    """The lines still in the maps; empty when ``lb/maps-empty`` should pass."""
    return dump_lines(maps)


def scale_to_zero_text(maps: LBMaps) -> str:
    """The scale-to-zero map as ``lb/scale-to-zero-dump`` prints it: one
    ``SCALETOZERO: ID=<n>`` line per tracked services-map id, by id (numerically, as
    upstream sorts the ids), newline-terminated; empty when the map is not open."""
    m = maps.scale_to_zero
    if m is None:
        return ""
    ids = sorted(key.svc_id for key, _ in m.dump())
    return "".join(f"SCALETOZERO: ID={i}\n" for i in ids)


def list_frontends(maps: LBMaps) -> list[dict[str, Any]]:
    """One record per frontend (master entry): id, address, type, flags, algorithm,
    counts and backends in slot order (wildcard entries are listed with id 0)."""
    backends: dict[int, tuple[str, str]] = {}
    for v6 in (False, True):
        for be_id, value in maps.backends(v6).dump():
            addr = f"{_host_port(value.address, value.port)}/{proto_name(value.proto)}"
            backends[be_id] = (addr, STATE_NAMES.get(value.flags, "active"))
    records: dict[tuple[bool, bytes, int, int, int], dict[str, Any]] = {}
    slots: dict[tuple[bool, bytes, int, int, int], dict[int, int]] = {}
    for v6 in (False, True):
        for key, value in maps.services(v6).dump():
            fkey = (v6, key.address, key.dport, key.proto, key.scope)
            if key.backend_slot:
                slots.setdefault(fkey, {})[key.backend_slot] = value.backend_id
                continue
            word = svcflags.join(value.flags, value.flags2)
            addr = f"{_host_port(key.address, key.dport)}/{proto_name(key.proto)}"
            if key.scope == SCOPE_INTERNAL:
                addr += "/i"
            records[fkey] = {
                "id": value.rev_nat_index,
                "address": addr,
                "type": svcflags.svc_type_of(word),
                "flags": svcflags.flag_names(word)[1:],
                "algorithm": LB_ALG_NAMES.get(value.backend_id >> LB_ALG_SHIFT, "undef"),
                "count": value.count,
                "qcount": value.qcount,
                "backends": [],
            }
    for fkey, rec in records.items():
        for slot in sorted(slots.get(fkey, {})):
            be_id = slots[fkey][slot]
            addr, state = backends.get(be_id, (f"<missing backend {be_id}>", "?"))
            inactive = slot > rec["count"]
            rec["backends"].append(
                {"slot": slot, "id": be_id, "address": addr, "state": state, "inactive": inactive}
            )
    return sorted(records.values(), key=lambda r: (r["id"], r["address"]))
