"""A reconciler whose Operations are for other rows than its table's (issue #15)."""

from __future__ import annotations

from reconciler import Config, Reconciler
from tests.typing_samples.rows import (
    HostOps,
    ZoneOps,
    db,
    host_status,
    hosts,
    set_host_status,
    set_zone_status,
    zone_status,
    zones,
)

rec = Reconciler(db, Config(hosts, ZoneOps(), host_status, set_host_status))  # E: misc
kw = Reconciler(db, config=Config(zones, HostOps(), zone_status, set_zone_status))  # E: misc
explicit = Config[object](hosts, HostOps(), host_status, set_host_status)  # E: arg-type
other_status = Config(hosts, HostOps(), zone_status, set_host_status)  # E: arg-type
