"""Queries a table cannot answer: a key of the wrong type, another table's index."""

from __future__ import annotations

from reconciler import StatusKind
from tests.typing_samples.rows import HOST_ID, HOST_STATUS, ZONE_NAME, db, hosts, zones

txn = db.read_txn()
hosts.get(txn, 12345)  # E: arg-type
hosts.get(txn, ZONE_NAME.query("eu"))  # E: arg-type
zones.list(txn, HOST_STATUS.query(StatusKind.ERROR))  # E: arg-type
HOST_ID.query("7")  # E: arg-type
HOST_STATUS.query("Error")  # E: arg-type
hosts.prefix(txn, b"a")  # E: arg-type
zone = zones.get(txn, "eu")
print(zone.name)  # E: union-attr
