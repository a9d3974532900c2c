"""Service flags (lb4_service/lb6_service ``flags`` + ``flags2`` as one u16) and their names.

Bit values and names follow Cilium's datapath, so the maps read the same to its tools
and the dump prints the corpus's ``FLAGS=ClusterIP+sessionAffinity+non-routable``.
"""

from __future__ import annotations

from dataclasses import dataclass

from bpfops.model import (
    CLUSTER_IP,
    EXTERNAL_IPS,
    HOST_PORT,
    LOAD_BALANCER,
    LOCAL_REDIRECT,
    NODE_PORT,
)

EXTERNAL_IPS_FLAG = 1 << 0
NODE_PORT_FLAG = 1 << 1
EXT_LOCAL_SCOPE = 1 << 2
HOST_PORT_FLAG = 1 << 3
SESSION_AFFINITY = 1 << 4
LOAD_BALANCER_FLAG = 1 << 5
ROUTABLE = 1 << 6
SOURCE_RANGE = 1 << 7
LOCAL_REDIRECT_FLAG = 1 << 8
NAT_46X64 = 1 << 9
L7_LOAD_BALANCER = 1 << 10
LOOPBACK = 1 << 11
INT_LOCAL_SCOPE = 1 << 12
TWO_SCOPES = 1 << 13
QUARANTINED = 1 << 14  # on backend slots
SOURCE_RANGE_DENY = 1 << 14  # on the master slot (same bit)
FWD_MODE_DSR = 1 << 15

_TYPE_FLAGS = {
    EXTERNAL_IPS: EXTERNAL_IPS_FLAG,
    NODE_PORT: NODE_PORT_FLAG,
    HOST_PORT: HOST_PORT_FLAG,
    LOAD_BALANCER: LOAD_BALANCER_FLAG,
    LOCAL_REDIRECT: LOCAL_REDIRECT_FLAG,
    CLUSTER_IP: 0,
}


@dataclass(frozen=True, slots=True)
class FlagParams:
    """Inputs of the flag computation for one service entry."""

    svc_type: str
    ext_local: bool = False
    int_local: bool = False
    session_affinity: bool = False
    routable: bool = False
    check_source_range: bool = False
    source_range_deny: bool = False
    dsr: bool = False
    l7_load_balancer: bool = False
    loopback: bool = False
    quarantined: bool = False


def service_flags(p: FlagParams) -> int:
    """The u16 flags word for ``p``."""
    if p.svc_type not in _TYPE_FLAGS:
        raise ValueError(f"unknown frontend type {p.svc_type!r}")
    flags = _TYPE_FLAGS[p.svc_type]
    if p.ext_local:
        flags |= EXT_LOCAL_SCOPE
    if p.int_local:
        flags |= INT_LOCAL_SCOPE
    if p.session_affinity:
        flags |= SESSION_AFFINITY
    if p.routable:
        flags |= ROUTABLE
    if p.check_source_range:
        flags |= SOURCE_RANGE
        if p.source_range_deny:
            flags |= SOURCE_RANGE_DENY
    if p.l7_load_balancer:
        flags |= L7_LOAD_BALANCER
    # Two scopes: the service has a separate internal-scope entry (cluster-internal
    # traffic keeps its own policy), which ClusterIP never needs.
    if p.ext_local != p.int_local and p.svc_type != CLUSTER_IP:
        flags |= TWO_SCOPES
    if p.quarantined:
        flags |= QUARANTINED
    if p.dsr:
        flags |= FWD_MODE_DSR
    if p.loopback:
        flags |= LOOPBACK
    return flags


def split(flags: int) -> tuple[int, int]:
    """The u16 word as the map's (flags, flags2) bytes."""
    return flags & 0xFF, (flags >> 8) & 0xFF


def join(flags: int, flags2: int) -> int:
    """(flags, flags2) bytes back to the u16 word."""
    return (flags & 0xFF) | ((flags2 & 0xFF) << 8)


def svc_type_of(flags: int) -> str:
    """The frontend type a flags word encodes (first match, as Cilium decodes it)."""
    if flags & EXTERNAL_IPS_FLAG:
        return EXTERNAL_IPS
    if flags & NODE_PORT_FLAG:
        return NODE_PORT
    if flags & LOAD_BALANCER_FLAG:
        return LOAD_BALANCER
    if flags & HOST_PORT_FLAG:
        return HOST_PORT
    if flags & LOCAL_REDIRECT_FLAG:
        return LOCAL_REDIRECT
    return CLUSTER_IP


def flag_names(flags: int) -> list[str]:
    """The names of the set flags, in Cilium's order (type first)."""
    names = [svc_type_of(flags)]
    seen_deny = False
    if flags & EXT_LOCAL_SCOPE:
        names.append("Local")
    if flags & INT_LOCAL_SCOPE:
        names.append("InternalLocal")
    if flags & TWO_SCOPES:
        names.append("two-scopes")
    if flags & SESSION_AFFINITY:
        names.append("sessionAffinity")
    if not flags & ROUTABLE:
        names.append("non-routable")
    if flags & SOURCE_RANGE:
        names.append("check source-range")
        if flags & SOURCE_RANGE_DENY:
            seen_deny = True
            names.append("deny")
    if flags & NAT_46X64:
        names.append("46x64")
    if flags & L7_LOAD_BALANCER:
        names.append("l7-load-balancer")
    if flags & LOOPBACK:
        names.append("loopback" if svc_type_of(flags) == HOST_PORT else "delegate-if-local")
    if not seen_deny and flags & QUARANTINED:
        names.append("quarantined")
    if flags & FWD_MODE_DSR:
        names.append("dsr")
    return names


def flags_string(flags: int) -> str:
    """The dump's ``FLAGS=`` value: names joined with ``+``."""
    return "+".join(flag_names(flags))
