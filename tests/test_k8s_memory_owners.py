"""benchmarks/k8s_memory's owner attribution: each object counted once, for the first
owner that reaches it, and only the roots of an owner that does not follow references."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from types import SimpleNamespace

from benchmarks.k8s_memory import lb_owners, owner_bytes
from statedb import DB, Index, Table, keys


def test_each_object_counts_once_for_its_first_owner() -> None:
    shared = [f"shared-{i}" for i in range(3)]
    first = {"a": shared}
    second = ("x-" * 40, shared)
    out = owner_bytes([("first", [first], True), ("second", [second], True)], per=1)
    (name1, bytes1, count1, _), (name2, bytes2, count2, _) = out
    assert (name1, name2) == ("first", "second")
    # first: its dict, the key "a", the list and its three strings.
    assert count1 == 6
    # second: its tuple and the long string; the list and its strings were first's.
    assert count2 == 2
    assert bytes2 >= sys.getsizeof(second) + sys.getsizeof(second[0])
    assert bytes1 >= sum(sys.getsizeof(s) for s in shared) + sys.getsizeof(shared)


def test_an_owner_that_does_not_follow_counts_its_roots_alone() -> None:
    inner = ["not the holder's " * 4]
    holder = [inner]
    out = owner_bytes([("shallow", [holder], False), ("deep", [holder, inner], True)], per=1)
    assert [(row[0], row[2]) for row in out] == [("shallow", 1), ("deep", 2)]


def test_old_versions_are_named_apart_from_the_rows() -> None:
    """A version kept for a held snapshot is counted under the table's "old versions",
    not under its rows: its row object and its revision."""
    @dataclass(frozen=True, slots=True)
    class Row:
        id: int
        text: str

    table: Table[Row] = Table("rows", Index("id", key=lambda r: r.id, encode=keys.uint64))
    db = DB(table)
    with db.write_txn(table) as txn:
        # Revisions beyond the interpreter's shared small ints, which are nobody's.
        table.insert_many(txn, (Row(i, "") for i in range(2, 300)))
        table.insert(txn, Row(1, "old " * 30))
    held = db.read_txn()
    with db.write_txn(table) as txn:
        table.insert(txn, Row(1, "new " * 30))
    lb = SimpleNamespace(db=db, ops=None, writer=object(), converter=object())
    out = {row[0]: row for row in owner_bytes(lb_owners(lb, object()), per=1)}
    # The current rows: 299 Rows, the new string, the empty one and the 43 ids over 256.
    assert out["rows rows"][2] == 299 + 2 + 43
    old = out["statedb rows: old versions"]
    # The old Row, its string and its revision (the records and dicts are statedb's own).
    assert old[2] == 3
    assert old[1] >= sys.getsizeof("old " * 30)
    assert table.get(held, 1) == Row(1, "old " * 30)
