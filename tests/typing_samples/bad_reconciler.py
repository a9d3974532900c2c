"""A reconciler whose Operations are for other rows than its table's (issue #15)."""

from __future__ import annotations

from reconciler import Config, Reconciler, status_field_accessors, status_set_accessors
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

GET_STATUS, SET_STATUS = status_field_accessors()
SET_GET, SET_SET = status_set_accessors("name")
accessors = Config(hosts, ZoneOps(), GET_STATUS, SET_STATUS)  # E: misc
set_accessors = Config(zones, HostOps(), SET_GET, SET_SET)  # E: misc
