"""What `statewright explain` knows of each map besides its key layout: the maps that hold
the datapath's runtime state or this node's own state (no statedb row and no source
object behind an entry: explain says so rather than failing), the short key forms of the
side maps of the load balancer, the ipcache and the policy maps, and lookups that are
exact on LPM tries.
"""

from __future__ import annotations

import ipaddress
from typing import Any

from bpf import lb
from bpf.ct import CT4_MAP, CT6_MAP, METRICS_MAP
from bpf.events import CONFIG_MAP, LIMIT_MAP, LOST_MAP, RING_MAP
from bpf.ipcache import IPCacheKey
from bpf.nat import DEVICES_MAP, NAT4_MAP, NAT6_MAP
from bpf.spec import MapType
from bpfops.lb_maps import AFFINITY4, AFFINITY6
from statewright.observe.map_keys import numeric_id

_CT = ("connection tracking: the datapath creates an entry for each flow it sees and "
       "removes it when the flow ends or the garbage collector expires it; "
       "see `statewright ct list`")
_NAT = ("north-south NAT (bpf/nodeport.c): the datapath creates an entry for each "
        "connection from outside it translates (a NodePort's SNAT and reverse DNAT), and "
        "the garbage collector expires them; see `statewright nodeport` (its NAT entries)")
_AFFINITY = ("session affinity: the datapath records the backend each client was given "
             "(an LRU map); the eligible backends are lb_affinity_match's entries, which "
             "`explain lb_affinity_match` follows to their services")
_EVENTS = "the datapath's event ring and its settings; see `statewright monitor stats`"

#: Maps whose entries no statedb row explains, with what they are.
RUNTIME_MAPS: dict[str, str] = {
    CT4_MAP: _CT,
    CT6_MAP: _CT,
    NAT4_MAP: _NAT,
    NAT6_MAP: _NAT,
    AFFINITY4: _AFFINITY,
    AFFINITY6: _AFFINITY,
    METRICS_MAP: ("the tc programs' drop and forward counters, by reason and direction; "
                  "see `statewright ct stats`"),
    RING_MAP: _EVENTS,
    CONFIG_MAP: _EVENTS,
    LIMIT_MAP: _EVENTS,
    LOST_MAP: _EVENTS,
    DEVICES_MAP: ("this node's external devices and their SNAT addresses, written by the "
                  "nodeport component from the devices table (netlink); no source object; "
                  "see `statewright nodeport`"),
}


def runtime_answer(name: str, key_text: str) -> dict[str, Any]:
    """`explain`'s answer for a map of `RUNTIME_MAPS`: what the map holds, no rows."""
    return {
        "map": name,
        "key": key_text,
        "present": None,
        "value": None,
        "rows": [],
        "objects": [],
        "rules": [],
        "runtime": RUNTIME_MAPS[name],
    }


def exact_lookup(m: Any, key: Any) -> Any:
    """``m.lookup(key)``, but for an LPM trie only when ``key`` itself is stored (a lookup
    there answers the longest stored prefix covering the key, maybe a shorter one)."""
    value = m.lookup(key)
    if value is None or m.spec.type != MapType.LPM_TRIE:
        return value
    stored = m.keys()
    return value if any(k == key for k in stored) else None


def inner_table(m: Any, key: Any) -> list[int] | None:
    """The inner array's first value of a hash-of-maps entry (a maglev table), or None."""
    inner = m.get_inner(key)
    if inner is None:
        return None
    try:
        value = inner.lookup(0)
    finally:
        inner.close()
    return None if value is None else list(value)


def maglev_summary(table: list[int]) -> dict[str, Any]:
    """A maglev table as `explain` shows it: its size and how many slots each backend
    id holds."""
    counts: dict[int, int] = {}
    for be in table:
        counts[be] = counts.get(be, 0) + 1
    return {"size": len(table),
            "backend_slots": {str(k): v for k, v in sorted(counts.items())}}


def _network(text: str) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
    try:
        return ipaddress.ip_network(text.strip(), strict=False)
    except ValueError as e:
        raise ValueError(str(e)) from None


def ipcache_text(text: str) -> IPCacheKey | None:
    """``10.244.0.0/16`` or an address (its /32 or /128) as an ipcache key."""
    if "=" in text:
        return None
    net = _network(text)
    return IPCacheKey.for_cidr(net.network_address.packed, net.prefixlen)


def source_range_text(v6: bool) -> Any:
    """``ID CIDR`` (a service id and a source range) as a source-range key."""
    def parse(text: str) -> Any:
        parts = text.split()
        if "=" in text or len(parts) != 2 or numeric_id(parts[0]) is None:
            return None
        net = _network(parts[1])
        if (net.version == 6) != v6:
            raise ValueError(f"{net} is IPv{net.version}")
        cls = lb.SourceRange6Key if v6 else lb.SourceRange4Key
        return cls.for_cidr(numeric_id(parts[0]) or 0, net.network_address.packed,
                            net.prefixlen)

    return parse


def affinity_match_text(text: str) -> lb.AffinityMatchKey | None:
    """``BACKEND_ID/SERVICE_ID`` as an lb_affinity_match key."""
    parts = text.strip().split("/")
    if "=" in text or len(parts) != 2:
        return None
    be, svc = numeric_id(parts[0]), numeric_id(parts[1])
    if be is None or svc is None:
        raise ValueError("expected BACKEND_ID/SERVICE_ID")
    return lb.AffinityMatchKey(be, svc)


def scale_to_zero_text(text: str) -> lb.ScaleToZeroKey | None:
    """A service id as an lb_scale_to_zero key."""
    n = numeric_id(text)
    return None if n is None else lb.ScaleToZeroKey(n)


def keys_by_service(m: Any) -> dict[int, list[Any]]:
    """Keys of a map keyed by a service id field (``rev_nat_id``), grouped by that id."""
    out: dict[int, list[Any]] = {}
    stored = m.keys()
    for k in stored:
        out.setdefault(k.rev_nat_id, []).append(k)
    return out
