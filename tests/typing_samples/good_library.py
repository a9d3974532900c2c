"""What the typed API infers for ordinary library use (checked by mypy --strict, and run)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, assert_type

from reconciler import Config, Reconciler, StatusKind, status_field_accessors
from reconciler.testing import BackgroundReconciler
from statedb import Index, Query, Table, Watch
from tests.typing_samples.rows import (
    HOST_ID,
    HOST_NAME,
    HOST_STATUS,
    HOST_ZONE,
    Host,
    HostOps,
    Zone,
    ZoneOps,
    db,
    host_status,
    hosts,
    set_host_status,
    set_zone_status,
    zone_status,
    zones,
)

assert_type(HOST_NAME, Index[Host, str])
assert_type(HOST_ID, Index[Host, int])
assert_type(HOST_ZONE, Index[Host, str])
assert_type(HOST_STATUS, Index[Host, StatusKind])
assert_type(hosts, Table[Host, str])
assert_type(zones, Table[Zone, str])

with db.write_txn(hosts) as wtxn:
    assert_type(hosts.insert(wtxn, Host("a", 1, "eu")), Host | None)
    hosts.insert(wtxn, Host("b", 2, "us"))

txn = db.read_txn()
assert_type(hosts.get(txn, "a"), Host | None)
assert_type(HOST_ID.query(2), Query[Host])
assert_type(hosts.get(txn, HOST_ID.query(2)), Host | None)
assert_type(hosts.list(txn, HOST_ZONE.query("eu")), Iterator[Host])
assert_type(hosts.list_watch(txn, HOST_STATUS.query(StatusKind.PENDING)),
            tuple[Iterator[Host], Watch])
assert_type(hosts.prefix(txn, "a"), Iterator[Host])
assert_type(hosts.get_revision(txn, HOST_NAME.query("a")), tuple[Host, int] | None)

rec = Reconciler(db, Config(hosts, HostOps(), host_status, set_host_status))
assert_type(rec, Reconciler[Host])
zone_rec = Reconciler(db, config=Config(zones, ZoneOps(), zone_status, set_zone_status,
                                        name="zones"))
assert_type(zone_rec, Reconciler[Zone])
assert_type(rec.health_watch(), Watch)
GET_STATUS, SET_STATUS = status_field_accessors()
assert_type(Config(hosts, HostOps(), GET_STATUS, SET_STATUS), Config[Host])


def background() -> BackgroundReconciler[Host]:
    """Not run: the testing kit's constructor infers the same way."""
    return BackgroundReconciler(db, Config(hosts, HostOps(), host_status, set_host_status,
                                           name="background"))


# A Table[Row] annotation leaves the primary key type open (Any).
loose: Table[Host] = hosts
assert_type(loose, Table[Host, Any])
