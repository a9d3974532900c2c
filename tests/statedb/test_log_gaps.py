"""Superseded row versions are freed once no snapshot needs them, before any log compaction.

Trimming (at the start of a write transaction) drops the upsert records that every live
snapshot sees superseded and leaves a `Gap` in their log slots; change iterators hand out
records without keeping their snapshot or the records already handed out. Together a row
version that was replaced, and that no live snapshot or unconsumed change needs, is freed.
"""

from __future__ import annotations

import gc
import weakref
from dataclasses import dataclass
from unittest import mock

from statedb import DB, ChangeIterator, Index, Table, keys, ordered
from statedb.table_state import Gap


@dataclass(frozen=True)
class Row:
    """A row that can be weakly referenced (no slots), to tell when it is freed."""

    id: int
    value: int


BY_ID: Index[Row, int] = Index("id", key=lambda r: r.id, encode=keys.uint64)


def new_db() -> tuple[DB, Table[Row]]:
    """A DB with one table of Row."""
    table: Table[Row] = Table("rows", BY_ID)
    return DB(table), table


def write(db: DB, table: Table[Row], *rows: Row) -> None:
    """Insert ``rows`` in one write transaction (which lets go of the transaction)."""
    with db.write_txn(table) as txn:
        for r in rows:
            table.insert(txn, r)


def gaps(db: DB, table: Table[Row]) -> int:
    """How many slots of the committed log are gaps."""
    st = db.root[table.name]
    return sum(1 for e in st.log[: st.log_len] if type(e) is Gap)


def test_a_replaced_version_is_freed_at_the_next_write() -> None:
    db, table = new_db()
    first = Row(1, 0)
    gone = weakref.ref(first)
    write(db, table, first, Row(2, 0))
    del first
    write(db, table, Row(1, 1))
    assert gone() is not None  # trimmed by the next write transaction, not yet
    write(db, table, Row(3, 0))
    gc.collect()
    assert gone() is None
    assert gaps(db, table) == 1
    rtxn = db.read_txn()
    assert list(table.all(rtxn)) == [Row(1, 1), Row(2, 0), Row(3, 0)]
    assert [(c.obj, c.deleted) for c in table_changes(db, table)] == [
        (Row(2, 0), False),
        (Row(1, 1), False),
        (Row(3, 0), False),
    ]


def start_changes(db: DB, table: Table[Row]) -> ChangeIterator[Row]:
    """A new change iterator of ``table`` (its write transaction, a snapshot once committed,
    is not kept)."""
    with db.write_txn(table) as txn:
        return table.changes(txn)


def table_changes(db: DB, table: Table[Row]) -> list[object]:
    """Every row as a new change iterator's first call reports it (then closed)."""
    it = start_changes(db, table)
    try:
        changes, _ = it.next(db.read_txn())
        return list(changes)
    finally:
        it.close()


def test_a_held_snapshot_keeps_the_version_it_sees() -> None:
    db, table = new_db()
    first = Row(1, 0)
    gone = weakref.ref(first)
    write(db, table, first)
    del first
    held = db.read_txn()
    write(db, table, Row(1, 1))
    write(db, table, Row(2, 0))
    gc.collect()
    assert gone() is not None
    assert table.get(held, 1) == Row(1, 0)
    assert list(table.all(held)) == [Row(1, 0)]
    del held
    # The table's cached ordered view holds the snapshot it was built for, until an
    # ordered query of a newer snapshot replaces it.
    assert list(table.all(db.read_txn())) == [Row(1, 1), Row(2, 0)]
    write(db, table, Row(3, 0))
    gc.collect()
    assert gone() is None
    assert table.get(db.read_txn(), 1) == Row(1, 1)


def test_runs_of_gaps_share_one_object_and_keep_revision_order() -> None:
    db, table = new_db()
    write(db, table, *(Row(i, 0) for i in range(5)))
    write(db, table, *(Row(i, 1) for i in range(5)))
    write(db, table, Row(9, 0))
    st = db.root[table.name]
    log = st.log[: st.log_len]
    assert len({id(e) for e in log if type(e) is Gap}) == 1
    revisions = [e[1] for e in log]
    assert revisions == sorted(revisions)
    assert [r.value for r in table.all(db.read_txn())] == [1, 1, 1, 1, 1, 0]


def test_gaps_after_a_compaction_are_found_by_search() -> None:
    with mock.patch.object(ordered, "COMPACT_SLACK", 0):
        db, table = new_db()
        write(db, table, *(Row(i, 0) for i in range(4)))
        for v in range(1, 4):
            write(db, table, *(Row(i, v) for i in range(0, 4, 2)))
        kept = weakref.ref(table.get(db.read_txn(), 3) or Row(0, 0))
        replaced = table.get(db.read_txn(), 1)
        assert replaced is not None
        gone = weakref.ref(replaced)
        del replaced
        write(db, table, Row(1, 9))
        write(db, table, Row(8, 0))
        gc.collect()
        assert gone() is None
        assert kept() is not None
        assert sorted((r.id, r.value) for r in table.all(db.read_txn())) == [
            (0, 3),
            (1, 9),
            (2, 3),
            (3, 0),
            (8, 0),
        ]


def test_a_change_stream_lets_go_of_what_it_handed_out() -> None:
    """A stream consumed over several rounds keeps neither its snapshot nor the records
    already taken, so a handled row that was replaced since is freed mid-stream."""
    db, table = new_db()
    it = start_changes(db, table)
    assert list(it.next(db.read_txn())[0]) == []
    first = Row(1, 0)
    gone = weakref.ref(first)
    write(db, table, first, Row(2, 0), Row(3, 0))
    del first
    rtxn = db.read_txn()
    state = weakref.ref(rtxn.states[table.name])
    changes, _ = it.next(rtxn)
    del rtxn
    taken = next(changes)
    assert taken.obj == Row(1, 0)
    del taken
    write(db, table, Row(1, 1))  # e.g. the reconciler's status write
    write(db, table, Row(4, 0))  # its trim drops the replaced version
    gc.collect()
    assert state() is None
    assert gone() is None
    assert [c.obj for c in changes] == [Row(2, 0), Row(3, 0)]
    it.close()


def test_a_version_the_transaction_replaced_itself_is_freed_at_commit() -> None:
    """A record written and replaced (or deleted) in one transaction was never committed:
    commit frees it without waiting for a trim or a compaction."""
    db, table = new_db()
    it = start_changes(db, table)
    assert list(it.next(db.read_txn())[0]) == []
    first, doomed = Row(1, 0), Row(2, 0)
    gone_first, gone_doomed = weakref.ref(first), weakref.ref(doomed)
    with db.write_txn(table) as txn:
        table.insert(txn, first)
        table.insert(txn, Row(1, 1))
        table.insert(txn, Row(3, 0))
        table.insert_many(txn, [Row(3, 1), Row(3, 2)])
        table.insert(txn, doomed)
        table.delete(txn, doomed)
        del first, doomed
    gc.collect()
    assert gone_first() is None
    # The deletion record keeps the deleted row for the change iterator; its upsert
    # record's slot is a gap.
    assert gone_doomed() is not None
    assert gaps(db, table) == 4
    rtxn = db.read_txn()
    assert list(table.all(rtxn)) == [Row(1, 1), Row(3, 2)]
    changes, _ = it.next(rtxn)
    assert [(c.obj.id, c.deleted) for c in changes] == [(1, False), (3, False), (2, True)]
    it.close()
    write(db, table, Row(4, 0))
    gc.collect()
    assert gone_doomed() is None
    assert [c.obj for c in table_changes(db, table)] == [Row(1, 1), Row(3, 2), Row(4, 0)]


def test_an_aborted_transaction_keeps_the_committed_rows() -> None:
    db, table = new_db()
    write(db, table, Row(1, 0))
    txn = db.write_txn(table)
    table.insert(txn, Row(1, 1))
    table.insert(txn, Row(1, 2))
    txn.abort()
    assert list(table.all(db.read_txn())) == [Row(1, 0)]
    write(db, table, Row(1, 3))
    assert list(table.all(db.read_txn())) == [Row(1, 3)]


@dataclass(frozen=True)
class Named:
    """A row keyed by a string that may be empty (encoded key b"", the key a gap has)."""

    name: str
    value: int


BY_NAME: Index[Named, str] = Index("name", key=lambda r: r.name)


def test_a_gap_does_not_trim_a_row_whose_key_is_empty() -> None:
    table: Table[Named] = Table("named", BY_NAME)
    db = DB(table)
    with db.write_txn(table) as txn:
        table.insert(txn, Named("", 0))
    held_first = db.read_txn()  # holds trimming back until it is let go
    with db.write_txn(table) as txn:
        table.insert(txn, Named("y", 0))
        table.insert(txn, Named("x", 0))  # replaced below: its slot becomes a gap
        table.insert(txn, Named("x", 1))
    held = db.read_txn()  # needs Named("", 0)
    with db.write_txn(table) as txn:
        table.insert(txn, Named("", 1))
    del held_first
    with db.write_txn(table) as txn:  # its trim reaches the gap, up to ``held``
        table.insert(txn, Named("b", 0))
    st = db.root[table.name]
    assert any(type(e) is Gap for e in st.log[: st.log_len])
    assert table.get(held, "") == Named("", 0)
    assert list(table.all(held)) == [Named("", 0), Named("x", 1), Named("y", 0)]
    assert table.get(db.read_txn(), "") == Named("", 1)
