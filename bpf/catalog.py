"""The catalogue of Statewright's maps, with Cilium's default capacities (configurable)."""

from __future__ import annotations

from typing import Any

from bpf import endpoints, ipcache, lb, policy
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


def lb_specs(
    max_entries: int = lb.LB_MAP_MAX_ENTRIES, maglev_table_size: int = lb.MAGLEV_TABLE_SIZE
) -> list[MapSpec[Any, Any]]:
    """Every load-balancer map, each with ``max_entries`` capacity."""
    n = max_entries
    return [
        MapSpec("lb4_services", MapType.HASH, lb.SERVICE4_KEY, lb.SERVICE4_VALUE, n, NO_PREALLOC),
        MapSpec("lb6_services", MapType.HASH, lb.SERVICE6_KEY, lb.SERVICE6_VALUE, n, NO_PREALLOC),
        MapSpec("lb4_backends", MapType.HASH, U32, lb.BACKEND4, n, NO_PREALLOC),
        MapSpec("lb6_backends", MapType.HASH, U32, lb.BACKEND6, n, NO_PREALLOC),
        MapSpec("lb4_reverse_nat", MapType.HASH, BE16, lb.REVNAT4, n, NO_PREALLOC),
        MapSpec("lb6_reverse_nat", MapType.HASH, BE16, lb.REVNAT6, n, NO_PREALLOC),
        MapSpec("lb_affinity_match", MapType.HASH, lb.AFFINITY_MATCH_KEY, U8, n, NO_PREALLOC),
        MapSpec("lb4_affinity", MapType.LRU_HASH, lb.AFFINITY4_KEY, lb.AFFINITY_VALUE, n),
        MapSpec("lb6_affinity", MapType.LRU_HASH, lb.AFFINITY6_KEY, lb.AFFINITY_VALUE, n),
        MapSpec("lb4_source_range", MapType.LPM_TRIE, lb.SOURCE_RANGE4_KEY, U8, n, NO_PREALLOC),
        MapSpec("lb6_source_range", MapType.LPM_TRIE, lb.SOURCE_RANGE6_KEY, U8, n, NO_PREALLOC),
        maglev_spec(4, n, maglev_table_size),
        maglev_spec(6, n, maglev_table_size),
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
    ]
    return {s.name: s for s in specs}


def spec_for(name: str) -> MapSpec[Any, Any] | None:
    """The spec of the map pinned as ``name`` with default capacities: a catalogue map, or
    an endpoint's ``cilium_policy_v2_<id>``; None for other names."""
    ep = policy.endpoint_of_map(name)
    if ep is not None:
        return policy_map_spec(ep)
    return all_specs().get(name)
