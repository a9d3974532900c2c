"""The per-frontend plan: which entries a frontend needs and how they are encoded.

Functions of the ops' ``LBOpsConfig`` and a ``FrontendSpec`` alone (no recorded state, no
map access), used by ``bpfops.frontend_writer`` to write a frontend:

* whether the frontend is written at all (`enabled`, `is_candidate`) and whether it is
  expanded over the node's addresses (`is_expansion`);
* its master's flags (`master_flags`; the slots carry them without the source-range bits,
  `slot_flags`), algorithm (`lb_algorithm`, `use_maglev`) and forwarding mode (`dsr`);
* the order of its slots (`sorted_backends`: healthy before unhealthy, then active,
  terminating serving, terminating not serving, quarantined, then by address);
* the encoded services-map key of a slot (`svc_key`), its rev-NAT entry (`revnat_entry`)
  and its master value (`master_value`), in bpf.lb's byte layouts.
"""

from __future__ import annotations

import struct
from operator import or_
from typing import Any

from bpf import lb
from bpfops import flags as svcflags
from bpfops.frontend_state import PendingFrontend, swap16
from bpfops.maps_dump import AFFINITY_TIMEOUT_MASK, LB_ALG_NUMBERS, LB_ALG_SHIFT
from bpfops.model import (
    CLUSTER_IP,
    EXTERNAL_IPS,
    HOST_PORT,
    LOAD_BALANCER,
    NODE_PORT,
    PROTO_NUMBERS,
    Addr,
    BackendSpec,
    FrontendSpec,
    LBOpsConfig,
)
from tables.l3n4 import PROTOCOLS

BACKEND_ACTIVE = lb.BACKEND_ACTIVE

#: The key and backend encoders of each family (v6 False/True), bpf.lb's byte layouts.
PACKS = {
    False: (lb.SERVICE4_KEY_STRUCT.pack, lb.BACKEND4_STRUCT.pack),
    True: (lb.SERVICE6_KEY_STRUCT.pack, lb.BACKEND6_STRUCT.pack),
}


def enabled(cfg: LBOpsConfig, addr: Addr) -> bool:
    """Whether the address family of ``addr`` is enabled."""
    return cfg.enable_ipv6 if addr[20] == 6 else cfg.enable_ipv4


def is_candidate(cfg: LBOpsConfig, fe: FrontendSpec) -> bool:
    """Whether the frontend belongs in the datapath (everything with kube-proxy
    replacement; only ClusterIP, ExternalIPs and LocalRedirect without)."""
    if cfg.kube_proxy_replacement:
        return True
    return fe.type in (CLUSTER_IP, EXTERNAL_IPS, "LocalRedirect")


def in_rounds(cfg: LBOpsConfig, fe: FrontendSpec) -> bool:
    """`enabled`, `is_candidate` and not `is_expansion`, in one call: whether a round of
    ``FrontendOps.update_batch`` may hold the frontend as far as its type and family go."""
    addr, fe_type = fe.addr, fe.type
    if not (cfg.enable_ipv6 if addr[20] == 6 else cfg.enable_ipv4):
        return False
    if not cfg.kube_proxy_replacement and fe_type not in (CLUSTER_IP, EXTERNAL_IPS,
                                                          "LocalRedirect"):
        return False
    return not (fe_type == NODE_PORT or (fe_type == HOST_PORT and addr.is_unspecified))


def is_expansion(fe: FrontendSpec) -> bool:
    """Whether the frontend is expanded over the node's NodePort addresses (NodePort, and
    HostPort without a host IP)."""
    return fe.type == NODE_PORT or (fe.type == HOST_PORT and fe.addr.is_unspecified)


def check_frontend(fe: FrontendSpec) -> None:
    """Raise ValueError for a frontend the maps cannot hold."""
    if fe.service.session_affinity and fe.service.l7_proxy_port:
        raise ValueError("session affinity with an L7 proxy redirect is not supported")
    addr = fe.addr
    if not (addr[16] or addr[17]) and addr.proto != "ANY":  # port 0
        raise ValueError("port 0")


def lb_algorithm(cfg: LBOpsConfig, fe: FrontendSpec) -> int:
    """The algorithm number of the service's annotation (0: the default), if honoured."""
    if not cfg.algorithm_annotation:
        return 0
    return LB_ALG_NUMBERS.get(fe.service.lb_algorithm, 0)


def use_maglev(cfg: LBOpsConfig, fe: FrontendSpec) -> bool:
    """Whether the frontend gets a maglev table."""
    if fe.addr.is_unspecified:
        return False
    alg = lb_algorithm(cfg, fe)
    if alg != 0:
        return alg == LB_ALG_NUMBERS["maglev"]
    if cfg.algorithm != "maglev":
        return False
    if fe.type == CLUSTER_IP and not cfg.external_clusterip:
        return False
    return fe.type in (CLUSTER_IP, NODE_PORT, LOAD_BALANCER, HOST_PORT, EXTERNAL_IPS)


def dsr(cfg: LBOpsConfig, fe: FrontendSpec) -> bool:
    """Whether the frontend is forwarded in DSR mode (else SNAT)."""
    mode = cfg.lb_mode
    if mode == "hybrid":
        mode = "dsr" if fe.addr.proto == "TCP" else "snat"
    if cfg.mode_annotation and fe.service.forwarding_mode in ("dsr", "snat"):
        mode = fe.service.forwarding_mode
    return mode == "dsr"


#: `master_flags`' results by their inputs (FlagParams' fields in order, the quarantine
#: bit aside): a few dozen combinations in practice; cleared past _FLAGS_MAX.
_FLAGS: dict[tuple[Any, ...], int] = {}
_FLAGS_MAX = 4096


def master_flags(cfg: LBOpsConfig, fe: FrontendSpec) -> int:
    """The service flags of the frontend's master entry."""
    svc = fe.service
    routable = (fe.type != CLUSTER_IP or cfg.external_clusterip) and not fe.addr.is_unspecified
    check_sr = bool(svc.source_ranges) and (
        cfg.source_range_all_types or fe.type in (LOAD_BALANCER, EXTERNAL_IPS)
    )
    # FlagParams' fields: svc_type, ext_local, int_local, session_affinity, routable,
    # check_source_range, source_range_deny, dsr, l7_load_balancer, loopback.
    key = (
        fe.type,
        bool(svc.ext_local),
        bool(svc.int_local),
        bool(svc.session_affinity),
        routable,
        check_sr,
        check_sr and bool(svc.source_ranges_deny),
        dsr(cfg, fe),
        bool(svc.l7_proxy_port),
        bool(svc.loopback_hostport or svc.proxy_delegation),
    )
    flags = _FLAGS.get(key)
    if flags is None:
        flags = svcflags.service_flags(svcflags.FlagParams(*key))
        if len(_FLAGS) >= _FLAGS_MAX:
            _FLAGS.clear()
        _FLAGS[key] = flags
    return flags


#: The master's flags the slots carry too (`slot_flags`).
SLOT_FLAGS_MASK = ~(svcflags.SOURCE_RANGE | svcflags.SOURCE_RANGE_DENY)


def slot_flags(master: int) -> int:
    """The flags of the slots given the master's: source-range bits live on the master
    only (the deny bit doubles as the slots' quarantine bit); quarantined slots carry the
    same flags as the others."""
    return master & SLOT_FLAGS_MASK


def sorted_backends(
    fe: FrontendSpec, restored_quarantined: dict[Addr, set[Addr]]
) -> list[BackendSpec]:
    """The frontend's backends in slot order. A backend restored as quarantined (see
    ``bpfops.frontend_restore``) counts as unhealthy; the quarantines a health report or
    another listed state explains are dropped from ``restored_quarantined``."""
    quarantined = restored_quarantined.get(fe.addr)
    bes = list(fe.backends)
    if quarantined:
        # A restored quarantine stands in for the health of an active backend until a
        # health check reports. A backend listed in another state (terminating, not
        # serving, maintenance: the tail slot is explained by that, e.g. an entry
        # several frontends share holds another frontend's "active") was not
        # quarantined, and turning ready later makes it active, not quarantined.
        for be in bes:
            if be.health_known or be.state != BACKEND_ACTIVE or be.not_serving:
                quarantined.discard(be.addr)
        if not quarantined:
            del restored_quarantined[fe.addr]
        bes = [
            be._replace(unhealthy=True) if be.addr in quarantined and not be.unhealthy else be
            for be in bes
        ]
    elif in_slot_order(bes):
        return bes
    # Then Addr.sort_key's order (family, address bytes, port). Serving terminating
    # backends before those no longer serving: when no active backend is left the
    # first ones are used.
    bes.sort(key=lambda b: (b.unhealthy, b.state, b.not_serving, b.addr.sort_key()))
    return bes


def in_slot_order(bes: list[BackendSpec]) -> bool:
    """Whether ``bes`` is in slot order already, as `sorted_backends` would sort it: every
    backend healthy, active and serving (the usual frontend), of one IP family and in
    ascending address order (a frontend row lists its backends so). Within a family the
    address' key bytes order as `Addr.sort_key` does (address, then port); the check costs
    a comparison per backend, the sort a key tuple per backend."""
    prev: Addr | None = None
    for b in bes:
        if b.unhealthy or b.state != BACKEND_ACTIVE or b.not_serving:
            return False
        a = b.addr
        if prev is not None and (a[20] != prev[20] or not prev < a):
            return False
        prev = a
    return True


# An address' key bytes (tables.l3n4): 16 bytes of IP (IPv4 mapped), the port (network
# order), the protocol's index in PROTOCOLS, the scope, the IP version. The maps' keys and
# values start with the IP and the port in network order: a slice of the key.

#: The IANA number of each protocol index of an address key.
_IANA = bytes(PROTO_NUMBERS[p] for p in PROTOCOLS)
#: The small integers' two little-endian bytes (services-map slot numbers).
_U16_LE = tuple(i.to_bytes(2, "little") for i in range(1024))
_KEY_TAIL = struct.Struct("<BB2x")
#: Slot 0 (the master) and `_KEY_TAIL`.
_KEY_TAIL0 = struct.Struct("<2xBB2x")
_BACKEND_TAIL = struct.Struct("<BBHBx")
#: `backend_tail` by (want << 2 | protocol index): the few wants in use.
_BACKEND_TAILS: dict[int, bytes] = {}


def addr_head(addr: Addr) -> bytes:
    """The IP (4 or 16 bytes) and the port of ``addr``, both in network byte order: how
    its services-map keys and its backends-map value begin."""
    return addr[12:18] if addr[20] == 4 else addr[:18]


def slot_number(slot: int) -> bytes:
    """A services-map key's slot field (u16, little-endian)."""
    return _U16_LE[slot] if slot < 1024 else slot.to_bytes(2, "little")


def svc_key_tail(addr: Addr) -> bytes:
    """What follows the slot in ``addr``'s services-map keys: protocol, scope, padding."""
    return _KEY_TAIL.pack(_IANA[addr[18]], addr[19])


def backend_tail(proto_index: int, want: int) -> bytes:
    """What follows the address and port in a backends-map value (protocol, flags,
    cluster id, zone, padding) for an address' protocol index and a want
    (``frontend_state.want_of``)."""
    key = (want << 2) | proto_index
    tail = _BACKEND_TAILS.get(key)
    if tail is None:
        tail = _BACKEND_TAIL.pack(
            _IANA[proto_index], want >> 24, (want >> 8) & 0xFFFF, want & 0xFF
        )
        if len(_BACKEND_TAILS) >= 4096:
            _BACKEND_TAILS.clear()
        _BACKEND_TAILS[key] = tail
    return tail


#: Each services-map key tail's ``slot_number(s) + tail`` for s in [0, 1024).
_SLOT_TAILS: dict[bytes, list[bytes]] = {}


def slot_keys(key_head: bytes, key_tail: bytes, count: int) -> bytes:
    """The services-map keys of slots 1..``count`` of a frontend whose keys begin with
    ``key_head`` (`addr_head`) and end with ``key_tail`` (`svc_key_tail`), joined."""
    tails = _SLOT_TAILS.get(key_tail)
    if tails is None:
        tails = _SLOT_TAILS[key_tail] = [n + key_tail for n in _U16_LE]
    if count < len(tails):
        return key_head + key_head.join(tails[1 : count + 1]) if count else b""
    return b"".join([key_head + slot_number(s) + key_tail for s in range(1, count + 1)])


def backend_values(keys: bytes, n: int, proto_index: int, want: int) -> bytes:
    """The encoded backends-map values of ``n`` addresses whose keys are joined in
    ``keys`` (21 bytes each), all of one IP family and of the protocol ``proto_index``
    (an address key's protocol byte), each holding ``want`` (`addr_head` and
    `backend_tail` of each), joined. The heads are cut out of the one buffer by one
    ``struct`` call (a slice of each address is a C call each)."""
    if not n:
        return b""
    tail = backend_tail(proto_index, want)
    heads = _HEADS.get((keys[20], n))
    if heads is None:
        heads = _heads(keys[20], n)
    return tail.join(heads.unpack(keys)) + tail


#: `backend_values`' layouts by (family, count): each key's `addr_head` as one field.
_HEADS: dict[tuple[int, int], struct.Struct] = {}


def _heads(family: int, n: int) -> struct.Struct:
    layout = struct.Struct(("12x6s3x" if family == 4 else "18s3x") * n)
    if n <= _RUN_KEPT:
        _HEADS[family, n] = layout
    return layout


#: Each address' family, protocol and port bytes in keys joined (`usual_keys`).
_FAMILIES = slice(20, None, 21)
_PROTOCOLS = slice(18, None, 21)
_PORTS_HI = slice(16, None, 21)
_PORTS_LO = slice(17, None, 21)


def usual_keys(keys: bytes, n: int, family: int) -> int | None:
    """The protocol byte of ``n`` addresses whose keys are joined in ``keys`` (21 bytes
    each) when they are all of ``family``, of one protocol and each with a port (not 0);
    else None. (A strided slice of the buffer per field: no call per address.)"""
    if not n:
        return 0
    proto = keys[18]
    if keys[_FAMILIES].count(family) != n or keys[_PROTOCOLS].count(proto) != n:
        return None
    hi, lo = keys[_PORTS_HI], keys[_PORTS_LO]
    # The ports' high bytes, or their low bytes, are all non-zero (the usual case), or
    # no port has both zero.
    if 0 not in hi or 0 not in lo or all(map(or_, hi, lo)):
        return proto
    return None


#: `run_entries`' multipliers by count ``n``: (sum of 1 << 32i, sum of i << 32i, the
#: same over 96-bit lanes), for i in [0, n); kept for counts up to `_RUN_KEPT`.
_RUN_LANES: dict[int, tuple[int, int, int, int]] = {}
_RUN_KEPT = 1024


def _run_lanes(n: int) -> tuple[int, int, int, int]:
    lanes = _RUN_LANES.get(n)
    if lanes is None:
        lanes = (
            sum(1 << (32 * i) for i in range(n)),
            sum(i << (32 * i) for i in range(n)),
            sum(1 << (96 * i) for i in range(n)),
            sum(i << (96 * i) for i in range(n)),
        )
        if n <= _RUN_KEPT:
            _RUN_LANES[n] = lanes
    return lanes


def run_entries(start: int, n: int, fe_id: int, flags: int) -> tuple[bytes, bytes]:
    """The backends-map keys of the ``n`` backend ids from ``start`` on (a run, one per
    slot) and the services-map values of the slots holding them in that order (frontend
    ``fe_id``, slot ``flags``; no counts), each joined: what one id at a time gives with
    ``U32_STRUCT`` and ``SERVICE_VALUE_STRUCT`` (both little-endian).

    Computed as two integers written out little-endian, one lane per entry (no object
    per id): the keys are ``start + i`` in 32-bit lanes; each value's 96-bit lane is the
    id plus the tail (the rev-NAT id in network order at bit 48, the flags' two bytes
    at bit 64), the same in every lane. No lane carries into the next: ids are 32-bit."""
    r32, i32, r96, i96 = _RUN_LANES.get(n) or _run_lanes(n)
    # The tail: rev-NAT id (network order, lb.swap16) and the flags (svcflags.split).
    tail = (((fe_id & 0xFF) << 8 | fe_id >> 8) << 48) | ((flags & 0xFFFF) << 64)
    return (
        (start * r32 + i32).to_bytes(4 * n, "little"),
        ((start | tail) * r96 + i96).to_bytes(12 * n, "little"),
    )


def svc_key(addr: Addr, slot: int) -> bytes:
    """The encoded services-map key of ``addr``'s slot ``slot``."""
    return addr_head(addr) + slot_number(slot) + svc_key_tail(addr)


def master_key(addr: Addr) -> bytes:
    """The encoded services-map key of ``addr``'s master (slot 0): `svc_key` of slot 0."""
    head = addr[12:18] if addr[20] == 4 else addr[:18]
    return head + _KEY_TAIL0.pack(_IANA[addr[18]], addr[19])


def revnat_entry(p: PendingFrontend) -> tuple[bytes, bytes]:
    """The encoded rev-NAT entry of the frontend (key, value): the value is the frontend's
    IP and port in network order (lb4/lb6_reverse_nat), `addr_head`."""
    return lb.BE16_STRUCT.pack(p.state.id), addr_head(p.fe.addr)


def master_value(cfg: LBOpsConfig, p: PendingFrontend) -> bytes:
    """The encoded master value (slot 0) of the frontend: the L7 proxy port, or the
    algorithm and affinity timeout; the counts, the rev-NAT id and the flags."""
    fe = p.fe
    svc = fe.service
    if svc.l7_proxy_port:
        head = swap16(svc.l7_proxy_port)
    elif svc.session_affinity:
        head = (lb_algorithm(cfg, fe) << LB_ALG_SHIFT) | (
            svc.affinity_timeout & AFFINITY_TIMEOUT_MASK
        )
    else:
        head = lb_algorithm(cfg, fe) << LB_ALG_SHIFT if cfg.algorithm_annotation else 0
    flags, fe_id = p.master_flags, p.state.id
    # The flags' two bytes (svcflags.split) and the id in network order (lb.swap16).
    return lb.SERVICE_VALUE_STRUCT.pack(
        head, p.active, ((fe_id & 0xFF) << 8) | (fe_id >> 8), flags & 0xFF,
        (flags >> 8) & 0xFF, p.inactive,
    )


def with_addr(fe: FrontendSpec, addr: Addr) -> FrontendSpec:
    """``fe`` at another address (a node-address expansion)."""
    return fe._replace(addr=addr)


def merge(a: list[Addr], b: list[Addr]) -> list[Addr]:
    """``a`` followed by the addresses of ``b`` not in it."""
    out = list(a)
    for x in b:
        if x not in out:
            out.append(x)
    return out
