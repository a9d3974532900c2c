"""Indexes and tables whose types do not fit together."""

from __future__ import annotations

from statedb import DB, Index, Table, keys
from tests.typing_samples.rows import HOST_NAME, ZONE_NAME, Host, Zone

untyped = Index("name", key=lambda h: h.name)  # E: var-annotated
no_enc: Index[Host, int] = Index("id", key=lambda h: h.id)  # E: assignment, arg-type, return-value
no_encoder_multi = Index[Host, int]("ids", keys=lambda h: [h.id])  # E: list-item
s_enc = Index[Host, int]("id", key=lambda h: h.id, encode=keys.string)  # E: arg-type, return-value
mixed = Table("mixed", HOST_NAME, ZONE_NAME)  # E: misc
db = DB(mixed)
with db.write_txn(mixed) as txn:
    typed: Table[Host, str] = Table("hosts", HOST_NAME)
    typed.insert(txn, Zone("eu"))  # E: arg-type
