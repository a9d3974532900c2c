"""What a held snapshot costs: at most the row versions it can see, never every write since.

A `ReadTxn` kept alive for a long time (e.g. in a suspended coroutine) must not stop
statedb from freeing the versions no live snapshot sees: the version stores keep per key
only the records some live snapshot reads, the log frees the others and compaction keeps
it near the number of rows. ``older_versions`` here counts records (in every version
store), where `Table.retention` counts the primary store's keys.
"""

from __future__ import annotations

import gc
import itertools
from dataclasses import dataclass

from statedb import DB, Index, ReadTxn, Table, keys, ordered, table_state


@dataclass(frozen=True, slots=True)
class Row:
    """A row: id (primary key), a unique name and a version."""

    id: int
    name: str
    ver: int


NAME: Index[Row, str] = Index("name", key=lambda r: r.name)


def new_db(unique: bool = False) -> tuple[DB, Table[Row]]:
    idx = (NAME,) if unique else ()
    table: Table[Row] = Table("rows", Index("id", key=lambda r: r.id, encode=keys.uint64), *idx)
    return DB(table), table


def figures(table: Table[Row], txn: ReadTxn) -> dict[str, int]:
    """rows, log_records, older_versions (all version stores) and heads of the latest state."""
    st = table.state(txn)
    stores = [st.store, *(s for s in st.secondary if s is not None)]
    older = sum(len(o) if isinstance(o, list) else 1 for s in stores for o in s.older.values())
    out = {
        "rows": st.count,
        "log_records": st.log_len,
        "older_versions": older,
        "heads": len(st.store.heads),
    }
    official = table.retention(txn)
    assert official["rows"] == out["rows"]
    assert official["log_records"] == out["log_records"]
    assert official["older_versions"] == len(st.store.older) <= out["older_versions"]
    return out


def check_snapshot(table: Table[Row], txn: ReadTxn, want: dict[int, Row]) -> None:
    """Every read of ``txn`` shows ``want``."""
    rows = [want[i] for i in sorted(want)]
    assert list(table.all(txn)) == rows
    assert all(table.get(txn, i) == r for i, r in want.items())
    assert list(table.lower_bound(txn, rows[len(rows) // 2].id)) == rows[len(rows) // 2 :]
    assert table.count(txn) == len(want)


def test_one_held_snapshot_keeps_what_it_sees_through_100000_updates() -> None:
    """1,000 rows, one snapshot held, 100,000 updates: bounded versions and log."""
    db, table = new_db()
    n_rows, per_txn = 1000, 100
    with db.write_txn(table) as w:
        for i in range(n_rows):
            table.insert(w, Row(i, f"n{i}", 0))
    held = db.read_txn()
    held_rows = {i: Row(i, f"n{i}", 0) for i in range(n_rows)}
    worst: dict[str, int] = {}
    k = 0
    for _ in range(100_000 // per_txn):
        with db.write_txn(table) as w:
            for _ in range(per_txn):
                k += 1
                table.insert(w, Row(k % n_rows, f"n{k % n_rows}", k))
        f = figures(table, db.read_txn())
        for name, v in f.items():
            worst[name] = max(worst.get(name, 0), v)
        # The held snapshot's version of each row, plus the versions the last transaction
        # replaced (checked against the live snapshots when the next one starts).
        assert f["older_versions"] <= n_rows + per_txn, f
        assert f["log_records"] <= 2 * n_rows + ordered.COMPACT_SLACK + per_txn, f
        assert f["heads"] == n_rows, f
    # One more transaction checks the last one's: only the held snapshot's versions remain,
    # and the one version this transaction replaced itself.
    with db.write_txn(table) as w:
        table.insert(w, Row(0, "n0", -1))
    assert figures(table, db.read_txn())["older_versions"] <= n_rows + 1
    check_snapshot(table, held, held_rows)
    assert worst["older_versions"] <= n_rows + per_txn


def _rewrite_all(db: DB, table: Table[Row], versions: range, n: int) -> None:
    """One transaction per version ``v`` rewriting rows 0..n-1, named a<i> or b<i> by turns."""
    for v in versions:
        with db.write_txn(table) as w:
            for i in range(n):
                table.insert(w, Row(i, f"{'ab'[v % 2]}{i}", v))


def test_a_dropped_snapshot_frees_what_only_it_saw() -> None:
    """Two held snapshots; the older one dropped: the sweep frees its versions."""
    db, table = new_db(unique=True)
    with db.write_txn(table) as w:
        for i in range(300):
            table.insert(w, Row(i, f"a{i}", 0))
    first = db.read_txn()
    _rewrite_all(db, table, range(1, 4), 300)
    second = db.read_txn()
    second_rows = {i: Row(i, f"b{i}", 3) for i in range(300)}
    _rewrite_all(db, table, range(4, 8), 300)
    both = figures(table, db.read_txn())["older_versions"]
    check_snapshot(table, first, {i: Row(i, f"a{i}", 0) for i in range(300)})
    del first
    gc.collect()
    # The sweep checks SWEEP_CHUNK keys per write transaction: enough transactions for a
    # pass over every kept version's key (fewer keys than versions), and one more.
    for v in range(8, 9 + -(-both // table_state.SWEEP_CHUNK)):
        with db.write_txn(table) as w:
            table.insert(w, Row(0, f"x{v}", v))
    after = figures(table, db.read_txn())["older_versions"]
    assert after < both
    # What remains is what the second snapshot reads: one version per row in the primary
    # store and, in the unique index, per row its name "b..." and the deletion under its
    # earlier name "a..." (both written again since), plus what the last commit replaced.
    assert after <= 3 * 300 + 4
    check_snapshot(table, second, second_rows)
    assert all(table.get(second, NAME.query(f"b{i}")) == second_rows[i] for i in range(300))
    del second
    # The table's cache of ordered views held the second snapshot's view (and with it the
    # snapshot): a query on the latest state replaces it.
    list(table.all(db.read_txn()))
    gc.collect()
    # The sweep checks SWEEP_CHUNK keys per write transaction at least: two passes here.
    # (New rows only: the cached view's state sees every current row's version.)
    kept = figures(table, db.read_txn())["older_versions"]
    for v in range(2 * (1 + -(-kept // table_state.SWEEP_CHUNK))):
        with db.write_txn(table) as w:
            table.insert(w, Row(1000 + v, f"new{v}", v))
    with db.write_txn(table) as w:
        w.table_txn(table)  # trims
    assert figures(table, db.read_txn())["older_versions"] == 0


def test_keys_created_and_deleted_under_a_held_snapshot_leave_nothing() -> None:
    """Churn of new keys (inserted, then deleted) while a snapshot is held."""
    db, table = new_db(unique=True)
    with db.write_txn(table) as w:
        for i in range(100):
            table.insert(w, Row(i, f"keep{i}", 0))
    held = db.read_txn()
    it_db_rows = {i: Row(i, f"keep{i}", 0) for i in range(100)}
    for b in range(200):
        with db.write_txn(table) as w:
            for j in range(50):
                table.insert(w, Row(1000 + b * 50 + j, f"tmp{b}-{j}", b))
            if b % 2:
                # Some deleted in the transaction that created them.
                table.delete(w, Row(1000 + b * 50, "", 0))
        with db.write_txn(table) as w:
            for j in range(50):
                table.delete(w, Row(1000 + b * 50 + j, "", 0))
    with db.write_txn(table) as w:
        table.insert(w, Row(0, "keep0", 1))
    f = figures(table, db.read_txn())
    assert f["rows"] == 100
    assert f["heads"] <= 100 + 50, f
    assert f["older_versions"] <= 2, f
    assert f["log_records"] <= 2 * 100 + ordered.COMPACT_SLACK + 100, f
    check_snapshot(table, held, it_db_rows)


def test_a_long_held_snapshot_is_swept_a_bounded_slice_per_write() -> None:
    """A snapshot held while every row was written again, then dropped: the sweep that
    frees its versions checks at most `SWEEP_CHUNK` keys per small write transaction
    (what each such transaction costs the writer's thread), and is done after as many
    transactions as that takes, the snapshot's rows intact until it goes."""
    n = 20 * table_state.SWEEP_CHUNK
    db, table = new_db()
    with db.write_txn(table) as w:
        for i in range(n):
            table.insert(w, Row(i, f"a{i}", 0))
    held = db.read_txn()
    with db.write_txn(table) as w:
        for i in range(n):
            table.insert(w, Row(i, f"b{i}", 1))
    # A short-lived reader, dying at each write (as the reconciler's and the probes' do),
    # keeps a pass due; the held snapshot keeps every row's first version.
    with db.write_txn(table) as w:
        table.insert(w, Row(0, "c0", 2))
    check_snapshot(table, held, {i: Row(i, f"a{i}", 0) for i in range(n)})
    assert figures(table, db.read_txn())["older_versions"] >= n
    del held
    gc.collect()
    store = table.state(db.read_txn()).store
    left = [len(store.older)]
    for v in range(3, 3 + n // table_state.SWEEP_CHUNK + 2):
        with db.write_txn(table) as w:
            table.insert(w, Row(1, f"c{v}", v))
        left.append(len(store.older))
    # Each transaction's trim checked one slice (two rows written: at most SWEEP_CHUNK).
    assert all(a - b <= table_state.SWEEP_CHUNK for a, b in itertools.pairwise(left)), left
    assert left[-1] <= 2, left
