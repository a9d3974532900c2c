"""Log compaction a slice per commit (statedb.ordered.Compaction): a large log is filtered
over several commits, the compacted log is published by the commit that reaches its end,
and meanwhile every reader (lookups, ordered queries, change iterators with deletions,
old snapshots) sees exactly what it would without compaction."""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest

from statedb import DB, Index, Table, keys, ordered


@dataclass(frozen=True, slots=True)
class Row:
    """A row with a non-unique group key."""

    id: int
    group: int
    value: int


BY_ID: Index[Row, int] = Index("id", key=lambda r: r.id, encode=keys.uint64)
BY_GROUP: Index[Row, int] = Index("group", key=lambda r: r.group, encode=keys.uint64, unique=False)


def test_a_large_log_is_compacted_over_several_commits(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ordered, "COMPACT_CHUNK", 500)
    table: Table[Row] = Table("rows", BY_ID, BY_GROUP)
    db = DB(table)
    rows = 3000
    with db.write_txn(table) as txn:
        for i in range(rows):
            table.insert(txn, Row(i, i % 7, 0))
    commits_in_job = 0
    published = 0
    value = 0
    while published < 3:
        value += 1
        before = db.root[table.name].log
        with db.write_txn(table) as txn:
            for i in range(0, rows, 97):
                table.insert(txn, Row((i + value) % rows, (i + value) % 7, value))
        if table.compaction is not None:
            commits_in_job += 1
        if db.root[table.name].log is not before:
            published += 1
            # Superseded records left (a few superseded while the compaction ran stay
            # until the next one). No state is kept here: it would hold back trimming.
            assert db.root[table.name].log_len < 1.2 * rows
        assert value < 10_000
    # A log of about 7,000 records at 500 per commit: several commits each time.
    assert commits_in_job >= 3 * 5
    snap = db.read_txn()
    got = {r.id: r for r in table.all(snap)}
    assert len(got) == rows
    assert [r.id for r in table.list(snap, BY_GROUP.query(3))] == sorted(
        r.id for r in got.values() if r.group == 3
    )


def test_readers_agree_with_a_model_while_compactions_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """Random upserts and deletions (with a change iterator that lags, so deletions are
    held and released while a compaction runs) against a dict model."""
    monkeypatch.setattr(ordered, "COMPACT_CHUNK", 37)
    monkeypatch.setattr(ordered, "COMPACT_SLACK", 16)
    rng = random.Random(7)
    table: Table[Row] = Table("rows", BY_ID, BY_GROUP)
    db = DB(table)
    model: dict[int, Row] = {}
    seen: dict[int, Row] = {}
    with db.write_txn(table) as txn:
        it = table.changes(txn)
    old_snaps: list[tuple[object, dict[int, Row]]] = []
    publications = 0
    for step in range(1500):
        value = step + 1
        before = db.root[table.name].log
        with db.write_txn(table) as txn:
            for _ in range(rng.randint(1, 12)):
                k = rng.randrange(400)
                if rng.random() < 0.3 and k in model:
                    table.delete(txn, model.pop(k))
                else:
                    row = Row(k, k % 5, value)
                    table.insert(txn, row)
                    model[k] = row
        if db.root[table.name].log is not before:
            publications += 1
        snap = db.read_txn()
        if step % 50 == 0:
            old_snaps.append((snap, dict(model)))
            del old_snaps[:-3]
        if rng.random() < 0.4:  # the iterator catches up now and then
            changes, _ = it.next(snap)
            for ch in changes:
                if ch.deleted:
                    seen.pop(ch.obj.id, None)
                else:
                    seen[ch.obj.id] = ch.obj
            assert seen == model
        if step % 25 == 0:
            assert {r.id: r for r in table.all(snap)} == model
            assert [r.id for r in table.list(snap, BY_GROUP.query(2))] == sorted(
                k for k, r in model.items() if r.group == 2
            )
    for snap, contents in old_snaps:
        assert {r.id: r for r in table.all(snap)} == contents  # type: ignore[arg-type]
    assert publications >= 5
    it.close()
