"""Snapshots keep their history: a snapshot taken at any revision reads exactly the
model's state at that revision, whatever is written, aborted or trimmed afterwards.

Random programs of inserts, deletes, commits and aborts run against one table with a
unique and a non-unique secondary index; snapshots are taken (from `read_txn` and from
`commit`) and dropped at random points. The model is the history itself: for every
committed revision, each row and the revision that wrote it. After every step each held
snapshot is checked against the model's state at its revision through every kind of read:
primary and unique-index gets, revisions, count, ordered iteration from the start and
from a lower bound, prefixes, and non-unique index lists. Each program runs twice: as
is, and with the change log compacted at every commit that can (statedb.ordered
.COMPACT_SLACK = 0), so compaction under held snapshots is covered too. At the end,
with every snapshot dropped, the next write transaction must have trimmed every older
version: nothing is kept for snapshots that no longer exist.
"""

from __future__ import annotations

import gc
from dataclasses import dataclass
from typing import Any
from unittest import mock

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from statedb import DB, Index, ReadTxn, Table, WriteTxn, keys, ordered

#: Collections traverse only what the test made (tests/statedb/conftest.py).
pytestmark = pytest.mark.usefixtures("frozen_heap")

IDS = range(4)
VALUES = range(3)


@dataclass(frozen=True, slots=True)
class Row:
    """A row: id (primary), name (unique, moves when value changes), grp (non-unique)."""

    id: int
    value: int

    @property
    def name(self) -> str:
        """The unique index key: changes with the value, never shared by two ids."""
        return f"n{self.id}-{self.value}"


BY_ID: Index[Row, int] = Index("id", key=lambda r: r.id, encode=keys.uint64)
BY_NAME: Index[Row, str] = Index("name", key=lambda r: r.name)
BY_GRP: Index[Row, int] = Index("grp", key=lambda r: r.value, encode=keys.uint64, unique=False)

Op = tuple[Any, ...]
OPS = st.one_of(
    st.tuples(st.just("insert"), st.sampled_from(IDS), st.sampled_from(VALUES)),
    st.tuples(st.just("delete"), st.sampled_from(IDS)),
    st.tuples(st.just("commit")),
    st.tuples(st.just("abort")),
    st.tuples(st.just("snapshot")),
    st.tuples(st.just("drop"), st.integers(0, 7)),
)


# id -> (row, revision of the write that stored it): the table's contents at one revision.
Model = dict[int, tuple[Row, int]]


def check(table: Table[Row], txn: ReadTxn, history: Model, revision: int) -> None:
    """Every read of ``txn`` agrees with ``history`` (the table's contents at ``revision``)."""
    model = {i: row for i, (row, _) in history.items()}
    assert table.revision(txn) == revision
    for i in IDS:
        assert table.get(txn, i) == model.get(i)
        assert table.get_revision(txn, i) == history.get(i)
        for v in VALUES:
            row = model.get(i)
            expected = row if row is not None and row.value == v else None
            assert table.get(txn, BY_NAME.query(f"n{i}-{v}")) == expected
    assert table.count(txn) == len(model)
    ordered_rows = [model[i] for i in sorted(model)]
    assert list(table.all(txn)) == ordered_rows
    assert list(table.revisions(txn)) == [history[i] for i in sorted(history)]
    for i in IDS:
        assert list(table.lower_bound(txn, i)) == [r for r in ordered_rows if r.id >= i]
        assert list(table.prefix(txn, BY_NAME.query(f"n{i}-"))) == [
            r for r in ordered_rows if r.id == i
        ]
    for v in VALUES:
        assert list(table.list(txn, BY_GRP.query(v))) == [r for r in ordered_rows if r.value == v]


def check_held(table: Table[Row], held: list[tuple[ReadTxn, Model, int]]) -> None:
    """`check` every held snapshot (in a function: no loop variable outlives the checks
    and keeps a snapshot alive)."""
    for snap, model, rev in held:
        check(table, snap, model, rev)


@settings(max_examples=120, deadline=None)
@given(st.lists(OPS, max_size=60))
# A deletion one revision above a held snapshot, trimmed once an older snapshot goes.
@example(
    [
        ("snapshot",),
        ("insert", 1, 0),
        ("commit",),
        ("delete", 1),
        ("commit",),
        ("drop", 0),
        ("insert", 2, 0),
        ("commit",),
    ]
)
@pytest.mark.parametrize("compact_slack", [ordered.COMPACT_SLACK, 0])
def test_snapshots_read_their_revision_forever(compact_slack: int, ops: list[Op]) -> None:
    with mock.patch.object(ordered, "COMPACT_SLACK", compact_slack):
        run_program(ops)


def run_program(ops: list[Op]) -> None:
    """Run ``ops``, checking every held snapshot after each step (see the module doc)."""
    table: Table[Row] = Table("rows", BY_ID, BY_NAME, BY_GRP)
    db = DB(table)
    committed: Model = {}
    committed_rev = 0
    held: list[tuple[ReadTxn, Model, int]] = []
    wtxn: WriteTxn | None = None
    pending: Model = {}

    for op in ops:
        kind = op[0]
        if kind in ("insert", "delete"):
            if wtxn is None:
                wtxn = db.write_txn(table)
                pending = dict(committed)
            if kind == "insert":
                row = Row(op[1], op[2])
                table.insert(wtxn, row)
                pending[row.id] = (row, table.revision(wtxn))
            else:
                table.delete(wtxn, Row(op[1], 0))
                pending.pop(op[1], None)
        elif kind == "commit":
            if wtxn is not None:
                committed, committed_rev = pending, table.revision(wtxn)
                held.append((wtxn.commit(), dict(committed), committed_rev))
                wtxn = None
        elif kind == "abort":
            if wtxn is not None:
                wtxn.abort()
                wtxn = None
        elif kind == "snapshot":
            held.append((db.read_txn(), dict(committed), committed_rev))
        elif held:
            del held[op[1] % len(held)]
            gc.collect()
        check_held(table, held)
        if wtxn is not None:
            # The write transaction sees its own writes; its revision is its last write's.
            assert {r.id: (r, rev) for r, rev in table.revisions(wtxn)} == pending
            assert all(table.get_revision(wtxn, i) == pending.get(i) for i in IDS)
        check(table, db.read_txn(), committed, committed_rev)

    if wtxn is not None:
        wtxn.abort()
    # Drop every snapshot (also the write transaction's own references) and start a write
    # transaction: it trims. Only the current rows may remain, each as its single head.
    del held, wtxn
    gc.collect()
    with db.write_txn(table) as w:
        w.table_txn(table)
        st_ = table.state(w)
        for store in (st_.store, *(s for s in st_.secondary if s is not None)):
            assert store.older == {}, "versions kept for snapshots that no longer exist"
            # No deletion record left: every head is a row's record (a plain tuple).
            assert all(type(e) is tuple for e in store.heads.values())
        assert len(st_.store.heads) == len(committed)
    check(table, db.read_txn(), committed, committed_rev)
