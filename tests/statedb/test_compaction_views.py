"""Log compaction and cached ordered views (statedb.ordered.compact_log).

A view some query keeps current is replayed up to the committed state and survives the
compaction; a view far behind (built once, e.g. by ``all()`` at start, never asked for
since) is dropped instead of replayed, so a compaction costs no replay of every change
since. Either way every ordered query afterwards, on old and new snapshots, returns what
the snapshot holds.
"""

from __future__ import annotations

from dataclasses import dataclass

from statedb import DB, Index, Table, keys, ordered

ROWS = 2000


@dataclass(frozen=True, slots=True)
class Row:
    """A row with a non-unique group key."""

    id: int
    group: int
    value: int


BY_ID: Index[Row, int] = Index("id", key=lambda r: r.id, encode=keys.uint64)
BY_GROUP: Index[Row, int] = Index("group", key=lambda r: r.group, encode=keys.uint64, unique=False)


def new_db() -> tuple[DB, Table[Row]]:
    """A DB with one table of ROWS rows in 10 groups."""
    table: Table[Row] = Table("rows", BY_ID, BY_GROUP)
    db = DB(table)
    with db.write_txn(table) as txn:
        for i in range(ROWS):
            table.insert(txn, Row(i, i % 10, 0))
    return db, table


def churn_until_compacted(db: DB, table: Table[Row], query_group_each_commit: bool) -> int:
    """Update rows one commit at a time until the log was compacted; return the commits."""
    first_log = db.root[table.name].log
    value = 0
    while db.root[table.name].log is first_log:
        value += 1
        with db.write_txn(table) as txn:
            for i in range(0, ROWS, 97):
                table.insert(txn, Row((i + value) % ROWS, (i + value) % 10, value))
        if query_group_each_commit:
            list(table.list(db.read_txn(), BY_GROUP.query(3)))
        assert value < 100 * ROWS
    return value


def expected(db: DB, table: Table[Row]) -> list[Row]:
    """Every row of the newest snapshot by primary key lookups."""
    txn = db.read_txn()
    rows = [table.get(txn, i) for i in range(ROWS)]
    return [r for r in rows if r is not None]


def test_a_view_far_behind_is_dropped_at_compaction() -> None:
    db, table = new_db()
    old = db.read_txn()
    before = list(table.all(old))  # builds and caches the primary view
    assert table.ordered_cache[0] is not None
    churn_until_compacted(db, table, query_group_each_commit=True)
    st = db.root[table.name]
    # The primary view was far behind: dropped. The group view was kept current: replayed
    # and relabelled to the compacted state.
    assert table.ordered_cache[0] is None
    cached = table.ordered_cache[1]
    assert cached is not None and cached[0] is st
    assert list(table.all(db.read_txn())) == expected(db, table)
    group = [r for r in expected(db, table) if r.group == 3]
    assert list(table.list(db.read_txn(), BY_GROUP.query(3))) == group
    # The old snapshot still sees what it saw.
    assert list(table.all(old)) == before


def test_a_view_close_behind_is_replayed_at_compaction() -> None:
    db, table = new_db()
    list(table.all(db.read_txn()))
    value = 0
    first_log = db.root[table.name].log
    limit = 0
    while db.root[table.name].log is first_log:
        value += 1
        with db.write_txn(table) as txn:
            for i in range(0, ROWS, 97):
                table.insert(txn, Row((i + value) % ROWS, 0, value))
        list(table.all(db.read_txn()))
        limit = ordered.replay_limit(db.root[table.name])
    assert limit >= ordered.COMPACT_SLACK
    cached = table.ordered_cache[0]
    assert cached is not None and cached[0] is db.root[table.name]
    assert list(table.all(db.read_txn())) == expected(db, table)


def test_a_view_far_behind_does_not_hold_row_versions_until_compaction() -> None:
    db, table = new_db()
    list(table.all(db.read_txn()))
    first_log = db.root[table.name].log
    limit = ordered.replay_limit(db.root[table.name])
    written = 0
    while written <= limit + 200:
        with db.write_txn(table) as txn:
            for i in range(0, ROWS, 97):
                table.insert(txn, Row(i, 0, written))
                written += 1
    assert db.root[table.name].log is first_log  # no compaction yet
    # The view (and its state) is gone, so trimming reaches the newest snapshot.
    assert table.ordered_cache[0] is None
    with db.write_txn(table) as txn:
        table.insert(txn, Row(1, 0, -1))
    assert table.trimmed_revision == db.root[table.name].revision - 1
    assert list(table.all(db.read_txn())) == expected(db, table)


def test_a_view_not_asked_for_while_compacting_is_dropped_and_holds_nothing() -> None:
    """A view built once just before a compaction (``all()`` at start, the initial prune)
    and not asked for while it runs is dropped at its end, not brought up to the
    compacted state: that state would stay live and keep a version of every row written
    after it. A view a query asks for meanwhile is brought up (see the test above)."""
    db, table = new_db()
    first_log = db.root[table.name].log
    value = 0

    def commit() -> None:
        nonlocal value
        value += 1
        with db.write_txn(table) as txn:
            for i in range(0, ROWS, 97):
                table.insert(txn, Row((i + value) % ROWS, (i + value) % 10, value))

    # Just below the log length that starts a compaction, the view is built.
    while db.root[table.name].log_len + 2 * len(range(0, ROWS, 97)) <= 2 * ROWS + (
        ordered.COMPACT_SLACK
    ):
        commit()
    list(table.all(db.read_txn()))
    assert table.ordered_cache[0] is not None
    while db.root[table.name].log is first_log:
        commit()
    assert table.ordered_cache[0] is None
    # Nothing holds a state from before: the next trim reaches the newest snapshot.
    with db.write_txn(table) as txn:
        table.insert(txn, Row(1, 1, -1))
    assert table.trimmed_revision == db.root[table.name].revision - 1
    assert list(table.all(db.read_txn())) == expected(db, table)
    group = [r for r in expected(db, table) if r.group == 3]
    assert list(table.list(db.read_txn(), BY_GROUP.query(3))) == group
