"""The catalogue of Statewright's maps, with Cilium's default capacities (configurable)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bpf import ct, endpoints, ipcache, lb, nat, policy
from bpf.codec import BE16, U8, U32
from bpf.spec import MapFlag, MapSpec, MapType

NO_PREALLOC = int(MapFlag.NO_PREALLOC)


def _is_prime(n: int) -> bool:
    if n < 2:
        return False
    i = 2
    while i * i <= n:
        if n % i == 0:
            return False
        i += 1
    return True


def maglev_inner_spec(family: int, table_size: int = lb.MAGLEV_TABLE_SIZE) -> MapSpec[int, Any]:
    """Inner maglev map: an array of one entry holding ``table_size`` backend ids."""
    if not _is_prime(table_size):
        raise ValueError(f"maglev table size must be prime, got {table_size}")
    return MapSpec(
        f"lb{family}_maglev_inner", MapType.ARRAY, U32, lb.maglev_table_codec(table_size), 1
    )


#: max_entries is a u32 in the kernel's map attributes.
MAX_ENTRIES_LIMIT = 2**32 - 1

#: The maps each `LBMapSizes` field sizes (Cilium's ``--bpf-lb-*-map-max`` groups; the
#: scale-to-zero map, keyed by service id, is sized like the services maps).
LB_MAP_GROUPS: dict[str, tuple[str, ...]] = {
    "services": ("lb4_services", "lb6_services", "lb_scale_to_zero"),
    "backends": ("lb4_backends", "lb6_backends"),
    "rev_nat": ("lb4_reverse_nat", "lb6_reverse_nat"),
    "affinity": ("lb_affinity_match", "lb4_affinity", "lb6_affinity"),
    "source_range": ("lb4_source_range", "lb6_source_range"),
    "maglev": ("lb4_maglev", "lb6_maglev"),
}


@dataclass(frozen=True, slots=True)
class LBMapSizes:
    """The capacity (max_entries) of each group of load-balancer maps (`LB_MAP_GROUPS`)."""

    services: int = lb.LB_MAP_MAX_ENTRIES
    backends: int = lb.LB_MAP_MAX_ENTRIES
    rev_nat: int = lb.LB_MAP_MAX_ENTRIES
    affinity: int = lb.LB_MAP_MAX_ENTRIES
    source_range: int = lb.LB_MAP_MAX_ENTRIES
    maglev: int = lb.LB_MAP_MAX_ENTRIES

    def __post_init__(self) -> None:
        for group in LB_MAP_GROUPS:
            n = getattr(self, group)
            if not 0 < n <= MAX_ENTRIES_LIMIT:
                raise ValueError(f"{group} maps: max_entries {n} not in 1..{MAX_ENTRIES_LIMIT}")

    @classmethod
    def uniform(cls, n: int) -> LBMapSizes:
        """Every map with ``n`` entries."""
        return cls(n, n, n, n, n, n)

    def of(self, map_name: str) -> int:
        """The capacity of the map ``map_name`` (KeyError for a map of no group)."""
        return int(getattr(self, group_of(map_name)))


def group_of(map_name: str) -> str:
    """The `LBMapSizes` field that sizes ``map_name`` (KeyError for another map)."""
    for group, names in LB_MAP_GROUPS.items():
        if map_name in names:
            return group
    raise KeyError(map_name)


def lb_specs(
    max_entries: int = lb.LB_MAP_MAX_ENTRIES,
    maglev_table_size: int = lb.MAGLEV_TABLE_SIZE,
    sizes: LBMapSizes | None = None,
) -> list[MapSpec[Any, Any]]:
    """Every load-balancer map, sized by ``sizes`` (default: ``max_entries`` each)."""
    z = sizes if sizes is not None else LBMapSizes.uniform(max_entries)
    svc, be, rev, aff, src = z.services, z.backends, z.rev_nat, z.affinity, z.source_range
    return [
        MapSpec("lb4_services", MapType.HASH, lb.SERVICE4_KEY, lb.SERVICE4_VALUE, svc, NO_PREALLOC),
        MapSpec("lb6_services", MapType.HASH, lb.SERVICE6_KEY, lb.SERVICE6_VALUE, svc, NO_PREALLOC),
        MapSpec("lb4_backends", MapType.HASH, U32, lb.BACKEND4, be, NO_PREALLOC),
        MapSpec("lb6_backends", MapType.HASH, U32, lb.BACKEND6, be, NO_PREALLOC),
        MapSpec("lb4_reverse_nat", MapType.HASH, BE16, lb.REVNAT4, rev, NO_PREALLOC),
        MapSpec("lb6_reverse_nat", MapType.HASH, BE16, lb.REVNAT6, rev, NO_PREALLOC),
        MapSpec("lb_affinity_match", MapType.HASH, lb.AFFINITY_MATCH_KEY, U8, aff, NO_PREALLOC),
        MapSpec("lb4_affinity", MapType.LRU_HASH, lb.AFFINITY4_KEY, lb.AFFINITY_VALUE, aff),
        MapSpec("lb6_affinity", MapType.LRU_HASH, lb.AFFINITY6_KEY, lb.AFFINITY_VALUE, aff),
        MapSpec("lb4_source_range", MapType.LPM_TRIE, lb.SOURCE_RANGE4_KEY, U8, src, NO_PREALLOC),
        MapSpec("lb6_source_range", MapType.LPM_TRIE, lb.SOURCE_RANGE6_KEY, U8, src, NO_PREALLOC),
        maglev_spec(4, z.maglev, maglev_table_size),
        maglev_spec(6, z.maglev, maglev_table_size),
    ]


def scale_to_zero_spec(
    max_entries: int = lb.LB_MAP_MAX_ENTRIES,
) -> MapSpec[lb.ScaleToZeroKey, lb.ScaleToZeroValue]:
    """The scale-to-zero map (services-map ids that opted in); opened only with
    --enable-scale-to-zero, sized like the services map."""
    return MapSpec(
        "lb_scale_to_zero",
        MapType.HASH,
        lb.SCALE_TO_ZERO_KEY,
        lb.SCALE_TO_ZERO_VALUE,
        max_entries,
        NO_PREALLOC,
    )


def maglev_spec(
    family: int,
    max_entries: int = lb.LB_MAP_MAX_ENTRIES,
    table_size: int = lb.MAGLEV_TABLE_SIZE,
) -> MapSpec[int, int]:
    """Outer maglev map (hash of maps keyed by __be16 rev-NAT id) for family 4 or 6."""
    return MapSpec(
        f"lb{family}_maglev",
        MapType.HASH_OF_MAPS,
        BE16,
        U32,
        max_entries,
        NO_PREALLOC,
        inner=maglev_inner_spec(family, table_size),
    )


def endpoints_spec(
    max_entries: int = endpoints.ENDPOINTS_MAP_MAX_ENTRIES,
) -> MapSpec[endpoints.EndpointKey, endpoints.EndpointInfo]:
    """The endpoints (lxc) map."""
    return MapSpec(
        "endpoints",
        MapType.HASH,
        endpoints.ENDPOINT_KEY,
        endpoints.ENDPOINT_INFO,
        max_entries,
        NO_PREALLOC,
    )


def ipcache_spec(
    max_entries: int = ipcache.IPCACHE_MAP_MAX_ENTRIES,
) -> MapSpec[ipcache.IPCacheKey, ipcache.RemoteEndpointInfo]:
    """The ipcache LPM map."""
    return MapSpec(
        "ipcache",
        MapType.LPM_TRIE,
        ipcache.IPCACHE_KEY,
        ipcache.REMOTE_ENDPOINT_INFO,
        max_entries,
        NO_PREALLOC,
    )


def policy_map_spec(
    endpoint_id: int | None = None, max_entries: int = policy.POLICY_MAP_MAX_ENTRIES
) -> MapSpec[policy.PolicyMapKey, policy.PolicyMapEntry]:
    """An endpoint's policy map (LPM trie, Cilium's cilium_policy_v2 layout), named
    ``cilium_policy_v2_<id, 5 digits>``; without an id, the layout's own name."""
    name = policy.POLICY_MAP_PREFIX if endpoint_id is None else policy.policy_map_name(endpoint_id)
    return MapSpec(
        name, MapType.LPM_TRIE, policy.POLICY_KEY, policy.POLICY_ENTRY, max_entries, NO_PREALLOC
    )


def policy_maps_spec(
    max_entries: int = policy.POLICY_ENDPOINTS_MAX_ENTRIES,
    policy_max_entries: int = policy.POLICY_MAP_MAX_ENTRIES,
) -> MapSpec[int, int]:
    """The hash of maps: endpoint id -> that endpoint's policy map (for the socket program)."""
    return MapSpec(
        policy.POLICY_MAPS,
        MapType.HASH_OF_MAPS,
        U32,
        U32,
        max_entries,
        NO_PREALLOC,
        inner=policy_map_spec(max_entries=policy_max_entries),
    )


def policy_netns_spec(
    max_entries: int = policy.POLICY_ENDPOINTS_MAX_ENTRIES,
) -> MapSpec[int, policy.PolicyNetns]:
    """Network-namespace cookie -> endpoint id and enforced directions."""
    return MapSpec(
        policy.POLICY_NETNS,
        MapType.HASH,
        policy.U64,
        policy.POLICY_NETNS_VALUE,
        max_entries,
        NO_PREALLOC,
    )


def ct_specs(max_entries: int = ct.CT_MAP_MAX_ENTRIES) -> list[MapSpec[Any, Any]]:
    """The two connection-tracking maps (LRU hashes, ``max_entries`` each)."""
    return [
        MapSpec(ct.CT4_MAP, MapType.LRU_HASH, ct.CT_TUPLE4, ct.CT_ENTRY, max_entries),
        MapSpec(ct.CT6_MAP, MapType.LRU_HASH, ct.CT_TUPLE6, ct.CT_ENTRY, max_entries),
    ]


def metrics_spec() -> MapSpec[ct.MetricsKey, ct.MetricsValue]:
    """The tc programs' drop counters, by reason and direction."""
    return MapSpec(
        ct.METRICS_MAP,
        MapType.HASH,
        ct.METRICS_KEY,
        ct.METRICS_VALUE,
        ct.METRICS_MAX_ENTRIES,
        NO_PREALLOC,
    )


def nat_specs(max_entries: int = nat.NAT_MAP_MAX_ENTRIES) -> list[MapSpec[Any, Any]]:
    """The north-south NAT maps (LRU hashes, ``max_entries`` each)."""
    return [
        MapSpec(nat.NAT4_MAP, MapType.LRU_HASH, ct.CT_TUPLE4, nat.NAT_ENTRY4, max_entries),
        MapSpec(nat.NAT6_MAP, MapType.LRU_HASH, ct.CT_TUPLE6, nat.NAT_ENTRY6, max_entries),
    ]


def nodeport_devices_spec() -> MapSpec[int, nat.NodePortDevice]:
    """External device ifindex -> its SNAT addresses (for bpf/nodeport.c)."""
    return MapSpec(
        nat.DEVICES_MAP,
        MapType.HASH,
        U32,
        nat.NODEPORT_DEVICE,
        nat.DEVICES_MAX_ENTRIES,
        NO_PREALLOC,
    )


def policy_endpoints_spec(
    max_entries: int = ct.POLICY_EP_MAX_ENTRIES,
) -> MapSpec[int, policy.PolicyNetns]:
    """Endpoint id -> its enforced directions (for the tc programs)."""
    return MapSpec(
        ct.POLICY_ENDPOINTS_MAP,
        MapType.HASH,
        U32,
        policy.POLICY_NETNS_VALUE,
        max_entries,
        NO_PREALLOC,
    )


def all_specs() -> dict[str, MapSpec[Any, Any]]:
    """Every map by name, with default capacities (the per-endpoint policy maps under
    their layout's name, ``cilium_policy_v2``)."""
    specs = [
        *lb_specs(),
        scale_to_zero_spec(),
        endpoints_spec(),
        ipcache_spec(),
        policy_map_spec(),
        policy_maps_spec(),
        policy_netns_spec(),
        *ct_specs(),
        metrics_spec(),
        policy_endpoints_spec(),
        *nat_specs(),
        nodeport_devices_spec(),
    ]
    return {s.name: s for s in specs}


def spec_for(name: str) -> MapSpec[Any, Any] | None:
    """The spec of the map pinned as ``name`` with default capacities: a catalogue map, or
    an endpoint's ``cilium_policy_v2_<id>``; None for other names."""
    ep = policy.endpoint_of_map(name)
    if ep is not None:
        return policy_map_spec(ep)
    return all_specs().get(name)
