"""The ``policies`` table and the handler that fills it from Kubernetes objects.

Sources (the manifest directory, the Kubernetes source) hand NetworkPolicy and
CiliumNetworkPolicy objects to `PolicyObjects`, inside their own write transaction:
``check`` parses without writing, ``upsert`` parses and writes the `Policy` row, ``delete``
removes it. Parsing comes first, so an invalid object raises `policy.errors.PolicyError`
before anything of it is written: the source reports that one object and applies the
others. The policy computation (policy/writer.py) follows the table.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

from policy.errors import PolicyError
from policy.model import Policy
from policy.parse import POLICY_KINDS, parse_policy
from statedb import Index, Table, WriteTxn
from statedb import keys as keycodec
from tables.origins import OriginRecorder

POLICIES_TABLE = "policies"

policy_key_index: Index[Policy, str] = Index("key", key=lambda p: p.key, encode=keycodec.string)


def new_policies_table() -> Table[Policy]:
    """A new, unregistered ``policies`` table (one row per policy object)."""
    return Table(POLICIES_TABLE, policy_key_index, row_type=Policy)


def object_key(obj: Mapping[str, Any]) -> str:
    """``Kind/namespace/name`` of a policy object (namespace ``default`` when missing)."""
    kind = obj.get("kind")
    meta = obj.get("metadata")
    if not isinstance(meta, Mapping) or not isinstance(meta.get("name"), str):
        raise PolicyError("missing or not a string", obj=str(kind), field="metadata.name")
    ns = meta.get("namespace") or "default"
    return f"{kind}/{ns}/{meta['name']}"


def object_revision(obj: Mapping[str, Any]) -> str:
    """The revision of a policy object: its ``metadata.resourceVersion`` (API server), else
    ``sha256:`` and the first 12 hex digits of a digest of its content (manifests)."""
    meta = obj.get("metadata")
    rv = meta.get("resourceVersion") if isinstance(meta, Mapping) else None
    if isinstance(rv, (str, int)) and str(rv):
        return str(rv)
    text = json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()[:12]


class PolicyObjects:
    """NetworkPolicy and CiliumNetworkPolicy objects -> rows of the ``policies`` table."""

    kinds: tuple[str, ...] = POLICY_KINDS

    def __init__(
        self, table: Table[Policy], source: str = "", origins: OriginRecorder | None = None
    ) -> None:
        self.table = table
        #: Which source the objects come from (``k8s``, ``manifests``), kept in each row.
        self.source = source
        #: Records each object's origin (uid, resourceVersion) when the caller's source
        #: does not (the manifest source records its objects' files and lines itself).
        self.origins = origins

    @property
    def tables(self) -> tuple[Table[Any], ...]:
        """The tables a caller's write transaction must lock."""
        if self.origins is not None:
            return (self.table, self.origins.table)
        return (self.table,)

    def check(self, obj: Mapping[str, Any]) -> None:
        """Parse ``obj`` as `upsert` would, writing nothing (PolicyError when invalid)."""
        parse_policy(obj)

    def upsert(self, txn: WriteTxn, obj: Mapping[str, Any]) -> None:
        """Parse and write one policy object with its source and revision (unchanged:
        nothing written)."""
        policy = replace(parse_policy(obj), source=self.source,
                         source_revision=object_revision(obj))
        old = self.table.get(txn, policy_key_index.query(policy.key))
        if old != policy or old is None or old.source_revision != policy.source_revision:
            self.table.insert(txn, policy)
        if self.origins is not None:
            self.origins.record(txn, obj, self.source)

    def delete(self, txn: WriteTxn, obj: Mapping[str, Any]) -> None:
        """Remove a policy object (only its kind and name are needed)."""
        old = self.table.get(txn, policy_key_index.query(object_key(obj)))
        if old is not None:
            self.table.delete(txn, old)
        if self.origins is not None:
            self.origins.forget(txn, obj)

    def resync(self, txn: WriteTxn, kind: str, objs: Iterable[Mapping[str, Any]]) -> None:
        """Make ``objs`` the complete set of policies of ``kind``: upsert them, delete the
        rest (a Kubernetes list)."""
        items = list(objs)
        keep = {object_key(o) for o in items}
        for p in list(self.table.prefix(txn, policy_key_index.query(f"{kind}/"))):
            if p.key not in keep:
                self.table.delete(txn, p)
                if self.origins is not None:
                    self.origins.forget_key(txn, p.key)
        for o in items:
            self.upsert(txn, o)
