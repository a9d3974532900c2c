"""Cluster-wide identities: Cilium's CRD mode, where the API server holds the numbering.

Each identity in use anywhere in the cluster is a ``CiliumIdentity`` object (cilium.io/v2,
cluster-scoped) whose name is the number and whose ``security-labels`` map holds the label
set (``{"k8s:app": "web", "reserved:host": ""}``). Every agent watches them all
(sources/k8s_identities.py feeds `ClusterIdentityAllocator.observe`); this module is the
allocator's logic, with no I/O, behind the same interface as the node-local
`tables.identities.IdentityAllocator` (``acquire``/``release``/``lookup`` inside the
caller's write transaction), so the endpoint manager works the same in both modes.

The ``identities`` table holds the reserved identities, every identity a local endpoint
uses (``refcount`` > 0) and every other identity the cluster's objects define (refcount
0: remote pods' identities, which the policy's selector cache learns from this table).

* **acquire**: a label set with a row takes a reference. Otherwise a number is chosen
  locally and at once (the CNI call never waits for the API server): ``want`` when it is
  free (restore: an endpoint keeps its number), else a random free number of 256..65535
  (random, as Cilium's ID pool, so agents creating identities at once rarely pick the same
  one). The row is written with the reference; `unpublished` lists it until its object
  exists, and sources/k8s_identities.py creates the object (on 409 AlreadyExists the
  number is someone else's: the watch brings that object, `observe` moves the label set
  to another number and the creation is tried again under it).
* **agreement**: two agents racing for one new label set may each create an object. Once
  an agent has seen both, every agent uses the same one, the **winner**: the object with
  the oldest ``creationTimestamp``, then the lowest number (timestamps have whole-second
  resolution: racing creations usually tie, and the number decides). The other object
  goes unused; the operator deletes it after its grace period.
* **observe** (the watch's deltas, in the caller's write transaction): keeps the cache of
  objects and returns the renumberings ``{old: new}`` the endpoints must follow: a label
  set whose winner is another number than the local row's, and a local number that an
  object with other labels took first. An identity whose object was deleted while local
  endpoints use it keeps its number and is created again (`unpublished`), unless another
  object took the number meanwhile (then it is renumbered). A malformed object (a name
  that is not a number of the range, labels that are not a map of strings) is refused
  with its own error and changes nothing.
* **release**: the last local reference leaves the row as a refcount-0 row while its
  object exists (the cluster still defines it), else deletes it.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from statedb import DB, ReadTxn, Table, WriteTxn
from statedb.errors import InputError
from tables.identities import (
    MAX_ALLOCATED_IDENTITY,
    MIN_ALLOCATED_IDENTITY,
    IdentitiesExhaustedError,
    Identity,
    IdentityAllocator,
    LabelError,
    Labels,
    identity_id_index,
    identity_labels_index,
    normalize_labels,
    reserved_identity_of,
)

KIND = "CiliumIdentity"
API_VERSION = "cilium.io/v2"
#: The field of a CiliumIdentity holding its label set (upstream's name).
SECURITY_LABELS = "security-labels"


class IdentityObjectError(InputError):
    """A CiliumIdentity object that cannot be used (the message names it and the field)."""


def labels_to_security_labels(labels: Labels) -> dict[str, str]:
    """The ``security-labels`` map of a label set: ``source:key`` -> value."""
    out: dict[str, str] = {}
    for label in labels:
        key, _, value = label.partition("=")
        out[key] = value
    return out


def security_labels_to_labels(raw: Mapping[str, str]) -> Labels:
    """The label set of a ``security-labels`` map (`canonical` labels)."""
    return normalize_labels(
        key if value == "" and key.startswith("reserved:") else f"{key}={value}"
        for key, value in raw.items()
    )


def canonical(labels: Labels) -> Labels:
    """``labels`` as they come back from a ``security-labels`` map (a label without a
    value other than ``reserved:`` ones gets ``=``): the form rows and lookups use, so a
    local label set and its object always compare equal."""
    return security_labels_to_labels(labels_to_security_labels(labels))


@dataclass(frozen=True, slots=True)
class IdentityObject:
    """One CiliumIdentity as the watch delivered it."""

    id: int
    labels: Labels
    created: str  # metadata.creationTimestamp (RFC 3339: sorts as text)

    @property
    def rank(self) -> tuple[str, int]:
        """Lower wins among objects of one label set (see the module doc)."""
        return (self.created, self.id)


def parse_identity_object(obj: Mapping[str, Any]) -> IdentityObject:
    """The `IdentityObject` of a CiliumIdentity; IdentityObjectError when malformed."""
    meta = obj.get("metadata")
    name = meta.get("name") if isinstance(meta, Mapping) else None
    ref = f"{KIND} {name!r}"
    if not isinstance(name, str) or not name.isdigit():
        raise IdentityObjectError(f"{ref}: metadata.name: not a number")
    num = int(name)
    if not MIN_ALLOCATED_IDENTITY <= num <= MAX_ALLOCATED_IDENTITY:
        raise IdentityObjectError(
            f"{ref}: metadata.name: outside {MIN_ALLOCATED_IDENTITY}..{MAX_ALLOCATED_IDENTITY}"
        )
    raw = obj.get(SECURITY_LABELS)
    if not isinstance(raw, Mapping) or not all(
        isinstance(k, str) and k and isinstance(v, str) for k, v in raw.items()
    ):
        raise IdentityObjectError(f"{ref}: {SECURITY_LABELS}: must map label keys to strings")
    try:
        labels = security_labels_to_labels(raw)
    except LabelError as e:
        raise IdentityObjectError(f"{ref}: {SECURITY_LABELS}: {e}") from None
    if not labels:
        raise IdentityObjectError(f"{ref}: {SECURITY_LABELS}: empty")
    created = meta.get("creationTimestamp") if isinstance(meta, Mapping) else None
    return IdentityObject(num, labels, created if isinstance(created, str) else "")


def identity_object(num: int, labels: Labels) -> dict[str, Any]:
    """The CiliumIdentity an agent creates for ``labels`` under ``num``."""
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": str(num)},
        SECURITY_LABELS: labels_to_security_labels(labels),
    }


class ClusterIdentityAllocator(IdentityAllocator):
    """See the module doc. ``acquire``, ``release`` and ``observe`` run in the caller's
    write transaction on the ``identities`` table (the endpoint manager's lock held);
    `unpublished` may be called from any thread."""

    def __init__(
        self, db: DB, table: Table[Identity] | None = None, rng: random.Random | None = None
    ) -> None:
        super().__init__(db, table)
        self._rng = rng or random.Random()
        self._lock = threading.Lock()
        #: The cluster's objects by number, and the numbers of each label set.
        self._objects: dict[int, IdentityObject] = {}
        self._by_labels: dict[Labels, set[int]] = {}
        #: Current error per malformed object (name -> message).
        self.errors: dict[str, str] = {}

    # ----- the IdentityAllocator interface ----------------------------------------------------
    def acquire(self, txn: WriteTxn, labels: Labels, want: int | None = None) -> Identity:
        """The identity of ``labels`` with one more reference (see the module doc)."""
        reserved = reserved_identity_of(labels)
        if reserved is not None:
            return super().acquire(txn, labels)
        labels = canonical(labels)
        existing = self.table.get(txn, identity_labels_index.query(labels))
        if existing is not None:
            row = replace(existing, refcount=existing.refcount + 1)
            self.table.insert(txn, row)
            return row
        num = want if want is not None and self._free(txn, want) else self._random_free(txn)
        row = Identity(num, labels, 1)
        self.table.insert(txn, row)
        return row

    def release(self, txn: WriteTxn, num: int) -> None:
        """Drop one reference of ``num``; the last one keeps the row (refcount 0) while
        the cluster's object for it exists, else deletes it."""
        row = self.lookup(txn, num)
        if row is None or row.reserved:
            return
        if row.refcount > 1:
            self.table.insert(txn, replace(row, refcount=row.refcount - 1))
        elif self._winner_is(row.labels, num):
            self.table.insert(txn, replace(row, refcount=0))
        else:
            self.table.delete(txn, row)

    # ----- the cluster's objects ----------------------------------------------------------------
    def observe(
        self,
        txn: WriteTxn,
        upserts: Iterable[Mapping[str, Any]] = (),
        deletes: Iterable[str] = (),
    ) -> dict[int, int]:
        """Apply the watch's changes (objects upserted, names deleted); return the
        renumberings ``{old: new}`` of identities local endpoints use (module doc)."""
        touched: set[Labels] = set()
        with self._lock:
            for name in deletes:
                self.errors.pop(name, None)
                if name.isdigit():
                    self._forget(int(name), touched)
            for obj in upserts:
                name = str((obj.get("metadata") or {}).get("name"))
                try:
                    parsed = parse_identity_object(obj)
                except IdentityObjectError as e:
                    self.errors[name] = str(e)
                    continue
                self.errors.pop(name, None)
                self._forget(parsed.id, touched)
                self._objects[parsed.id] = parsed
                self._by_labels.setdefault(parsed.labels, set()).add(parsed.id)
                touched.add(parsed.labels)
        moves: dict[int, int] = {}
        for labels in sorted(touched):
            self._settle(txn, labels, moves)
        return moves

    def _forget(self, num: int, touched: set[Labels]) -> None:
        old = self._objects.pop(num, None)
        if old is not None:
            nums = self._by_labels.get(old.labels)
            if nums is not None:
                nums.discard(num)
                if not nums:
                    del self._by_labels[old.labels]
            touched.add(old.labels)

    def _settle(self, txn: WriteTxn, labels: Labels, moves: dict[int, int]) -> None:
        """Make the rows of ``labels`` (and of a local label set whose number its winner
        took) agree with the objects."""
        winner = self.winner(labels)
        row = self.table.get(txn, identity_labels_index.query(labels))
        if winner is not None:
            squatter = self.lookup(txn, winner)
            if squatter is not None and squatter.labels != labels:
                # A local label set took this number before its object existed: move it.
                self._move(txn, squatter, self._random_free(txn, avoid=winner), moves)
        if row is None:
            if winner is not None:
                self.table.insert(txn, Identity(winner, labels, 0))
        elif winner is None:
            if row.refcount == 0:
                self.table.delete(txn, row)
            # else: used here, its object is gone: `unpublished` creates it again.
        elif winner != row.id:
            if row.refcount == 0:
                self.table.delete(txn, row)
                self.table.insert(txn, Identity(winner, labels, 0))
            else:
                self._move(txn, row, winner, moves)

    def _move(self, txn: WriteTxn, row: Identity, num: int, moves: dict[int, int]) -> None:
        self.table.delete(txn, row)
        self.table.insert(txn, replace(row, id=num))
        first = next((old for old, new in moves.items() if new == row.id), row.id)
        moves.pop(first, None)
        moves[first] = num

    def winner(self, labels: Labels) -> int | None:
        """The number every agent uses for ``labels`` (module doc), None without object."""
        nums = self._by_labels.get(labels)
        if not nums:
            return None
        return min((self._objects[n] for n in nums), key=lambda o: o.rank).id

    def _winner_is(self, labels: Labels, num: int) -> bool:
        with self._lock:
            return self.winner(labels) == num

    def object_of(self, num: int) -> IdentityObject | None:
        """The cluster's object ``num``, as last seen."""
        with self._lock:
            return self._objects.get(num)

    def object_count(self) -> int:
        """How many objects the cache holds."""
        with self._lock:
            return len(self._objects)

    def unpublished(self, txn: ReadTxn) -> list[Identity]:
        """The identities local endpoints use that have no object yet (to create)."""
        with self._lock:
            objects = dict(self._objects)
        return [
            row
            for row in self.table.lower_bound(txn, identity_id_index.query(MIN_ALLOCATED_IDENTITY))
            if row.refcount > 0 and row.id not in objects
        ]

    def still_unpublished(self, txn: ReadTxn, row: Identity) -> bool:
        """Whether ``row`` (from `unpublished`) is, in ``txn``, still used by local
        endpoints under its number without an object."""
        current = self.lookup(txn, row.id)
        with self._lock:
            has_object = row.id in self._objects
        return (
            current is not None
            and current.refcount > 0
            and current.labels == row.labels
            and not has_object
        )

    # ----- numbers ------------------------------------------------------------------------------
    def _free(self, txn: ReadTxn, num: int) -> bool:
        return (
            MIN_ALLOCATED_IDENTITY <= num <= MAX_ALLOCATED_IDENTITY
            and num not in self._objects
            and self.lookup(txn, num) is None
        )

    def _random_free(self, txn: ReadTxn, avoid: int = 0) -> int:
        for _ in range(64):
            num = self._rng.randint(MIN_ALLOCATED_IDENTITY, MAX_ALLOCATED_IDENTITY)
            if num != avoid and self._free(txn, num):
                return num
        for num in range(MIN_ALLOCATED_IDENTITY, MAX_ALLOCATED_IDENTITY + 1):
            if num != avoid and self._free(txn, num):
                return num
        raise IdentitiesExhaustedError(
            f"identities: all numbers {MIN_ALLOCATED_IDENTITY}..{MAX_ALLOCATED_IDENTITY} are "
            "in use in the cluster"
        )

