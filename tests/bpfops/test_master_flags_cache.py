"""The writer's cache of master flags (`FrontendWriter.master_flags_of`) gives what
`master_flags` computes, for any mix of frontends, services and options, in any order
(the cache is keyed by what the flags depend on, not by the frontend)."""

from __future__ import annotations

import ipaddress
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from bpfops.frontend_plan import master_flags
from bpfops.lb_maps import LBMaps
from bpfops.model import FRONTEND_TYPES, Addr, FrontendSpec, ServiceSpec
from tests.bpfops.helpers import new_ops

_IPS = ["10.96.0.1", "0.0.0.0", "fd00::1", "::", "192.168.1.10"]

_frontends = st.tuples(
    st.sampled_from(_IPS),
    st.sampled_from([0, 80, 443]),
    st.sampled_from(["TCP", "UDP", "SCTP", "ANY"]),
    st.sampled_from(FRONTEND_TYPES),
    st.fixed_dictionaries(
        {
            "session_affinity": st.booleans(),
            "affinity_timeout": st.sampled_from([0, 10]),
            "ext_local": st.booleans(),
            "int_local": st.booleans(),
            "source_ranges": st.sampled_from(
                [(), (ipaddress.ip_network("10.0.0.0/8"),), (ipaddress.ip_network("fd00::/8"),)]
            ),
            "source_ranges_deny": st.booleans(),
            "forwarding_mode": st.sampled_from(["", "snat", "dsr"]),
            "proxy_delegation": st.booleans(),
            "loopback_hostport": st.booleans(),
            "load_balancer_class": st.sampled_from([None, "io.cilium/bgp-control-plane"]),
            "l7_proxy_port": st.sampled_from([0, 15001]),
        }
    ),
)

_options = st.fixed_dictionaries(
    {
        "external_clusterip": st.booleans(),
        "lb_mode": st.sampled_from(["snat", "dsr", "hybrid"]),
        "mode_annotation": st.booleans(),
        "source_range_all_types": st.booleans(),
    }
)


@settings(max_examples=300, deadline=None)
@given(_options, st.lists(_frontends, min_size=1, max_size=30))
def test_cached_flags_are_master_flags(
    options: dict[str, Any], frontends: list[tuple[Any, ...]]
) -> None:
    ops = new_ops(LBMaps.in_memory(max_entries=64, maglev_table_size=251), **options)
    writer = ops.writer
    for i, (ip, port, proto, fe_type, svc) in enumerate(frontends):
        addr = Addr.of(ip, port, proto)
        fe = FrontendSpec(addr, fe_type, ServiceSpec(f"ns/svc{i}", **svc))
        assert writer.master_flags_of(fe) == master_flags(ops.config, fe)
        # Asked again (a hit now), the same.
        assert writer.master_flags_of(fe) == master_flags(ops.config, fe)
