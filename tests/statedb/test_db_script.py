"""The cases of cilium/statedb's script test (testdata/db.txtar) that apply to this library.

The script drives two tables, test1 and test2, of objects with a uint64 id, a tag
set and a network prefix through inserts, failing multi-object writes, queries on
every index, deletes driven by query results and the show/dump formats. Each test
below is one section of that script, with the expected outputs of the script's
files written out as constants.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterator

import pytest

from statedb import DB, Table, keys, show
from tests.statedb.helpers import ID_INDEX, OBJ1, OBJ2, PREFIX_INDEX, TAGS_INDEX, Obj, new_db

OBJS_TABLE = (
    "ID   Key   Prefix        Tags\n"
    "1          10.0.0.0/8    bar, foo\n"
    "2          10.1.2.3/32   baz, foo\n"
)
OBJ1_TABLE = "ID   Key   Prefix       Tags\n1          10.0.0.0/8   bar, foo\n"
OBJ2_TABLE = "ID   Key   Prefix        Tags\n2          10.1.2.3/32   baz, foo\n"
EMPTY_TABLE = "ID   Key   Prefix   Tags\n"
OBJS_IDS_TABLE = "ID\n1\n2\n"
TAGS_ONLY_TABLE = "Tags\nbar, foo\nbaz, foo\n"
TEST1_YAML = """\
id: 1
prefix: 10.0.0.0/8
tags:
    - bar
    - foo
---
id: 2
prefix: 10.1.2.3/32
tags:
    - baz
    - foo
"""
OBJ1_YAML = "id: 1\nprefix: 10.0.0.0/8\ntags:\n    - bar\n    - foo\n"
OBJ2_YAML = "id: 2\nprefix: 10.1.2.3/32\ntags:\n    - baz\n    - foo\n"
TEST1_JSON = """\
{
  "ID": 1,
  "Tags": [
    "bar",
    "foo"
  ]
}
{
  "ID": 2,
  "Tags": [
    "baz",
    "foo"
  ]
}
"""
DUMP_EXPECTED = """\
{
  "test1": [
    {"ID":1,"Tags":["bar","foo"]}
  ],
  "test2": [
    {"ID":2,"Tags":["baz","foo"]}
  ]
}
"""


class Missing(Exception):
    """Stands for the script's missing.yaml: a write that fails half-way."""


@pytest.fixture
def empty_db() -> tuple[DB, Table[Obj], Table[Obj]]:
    """The script's starting point: two registered, empty tables."""
    db, (t1, t2) = new_db("test1", "test2")
    return db, t1, t2


@pytest.fixture
def loaded_db(
    empty_db: tuple[DB, Table[Obj], Table[Obj]],
) -> tuple[DB, Table[Obj], Table[Obj]]:
    """test1 holds obj1 and obj2, test2 holds obj2 (after the script's inserts)."""
    db, t1, t2 = empty_db
    with db.write_txn(t1) as txn:
        t1.insert(txn, OBJ1)
    with db.write_txn(t1) as txn:
        t1.insert(txn, OBJ2)
    with db.write_txn(t2) as txn:
        t2.insert(txn, OBJ2)
    return db, t1, t2


def ids(rows: Iterator[Obj]) -> list[int]:
    """The ids of rows, in the order given."""
    return [r.id for r in rows]


def table_text(rows: Iterator[Obj]) -> str:
    """Rows as the script's .table files show them."""
    return show.format_rows(rows, "table", row_type=Obj)


def net_prefix(text: str) -> bytes:
    """Encoded prefix-query key for a network given as text."""
    return keys.ip_network_prefix(ipaddress.ip_network(text))


def test_tables_registered_initialized_and_empty(
    empty_db: tuple[DB, Table[Obj], Table[Obj]],
) -> None:
    """`db`, `db/initialized`, `db/show` and `db/empty` on fresh tables."""
    db, t1, t2 = empty_db
    assert [t.name for t in db.tables] == ["test1", "test2"]
    assert db.table("test1") is t1
    txn = db.read_txn()
    for t in (t1, t2):
        done, watch = t.initialized(txn)
        assert done and watch.closed
        assert t.count(txn) == 0
        assert show.show_table(db, t.name) == EMPTY_TABLE


def test_failed_insert_commits_nothing(empty_db: tuple[DB, Table[Obj], Table[Obj]]) -> None:
    """`! db/insert test1 obj1.yaml missing.yaml`: the first insert is rolled back."""
    db, t1, _ = empty_db
    with pytest.raises(Missing), db.write_txn(t1) as txn:
        t1.insert(txn, OBJ1)
        assert t1.get(txn, 1) == OBJ1  # visible inside the transaction
        raise Missing("missing.yaml")
    txn2 = db.read_txn()
    assert t1.count(txn2) == 0
    assert t1.revision(txn2) == 0


def test_failed_delete_commits_nothing(loaded_db: tuple[DB, Table[Obj], Table[Obj]]) -> None:
    """`! db/delete test1 obj1.yaml missing.yaml` leaves both objects in place."""
    db, t1, _ = loaded_db
    before = db.read_txn()
    with pytest.raises(Missing), db.write_txn(t1) as txn:
        assert t1.delete(txn, OBJ1) == OBJ1
        assert t1.get(txn, 1) is None
        raise Missing("missing.yaml")
    after = db.read_txn()
    assert table_text(t1.all(after)) == OBJS_TABLE
    assert t1.revision(after) == t1.revision(before)


def test_show_formats(loaded_db: tuple[DB, Table[Obj], Table[Obj]]) -> None:
    """`db/show` in the table (default), column-restricted, YAML and JSON formats."""
    db, t1, t2 = loaded_db
    assert show.show_table(db, "test1") == OBJS_TABLE
    assert show.show_table(db, "test1", fmt="table") == OBJS_TABLE
    assert show.show_table(db, "test1", columns=["Tags"]) == TAGS_ONLY_TABLE
    assert show.show_table(db, "test1", columns=["ID"]) == OBJS_IDS_TABLE
    assert show.show_table(db, "test1", fmt="yaml") == TEST1_YAML
    assert show.show_table(db, "test1", fmt="json") == TEST1_JSON
    assert show.show_table(db, "test2") == OBJ2_TABLE
    txn = db.read_txn()
    assert t1.count(txn) == 2 and t2.count(txn) == 1


def test_get(loaded_db: tuple[DB, Table[Obj], Table[Obj]]) -> None:
    """`db/get` by primary key, by tag and by network, shown in each format."""
    db, t1, t2 = loaded_db
    txn = db.read_txn()
    got = t2.get(txn, 2)
    assert got == OBJ2
    assert show.format_rows([got], "table") == OBJ2_TABLE
    assert show.format_rows([got], "table", columns=["Tags"]) == "Tags\nbaz, foo\n"
    assert show.format_rows([got], "yaml") == OBJ2_YAML
    assert show.format_rows([got], "json") == (
        '{\n  "ID": 2,\n  "Tags": [\n    "baz",\n    "foo"\n  ]\n}\n'
    )
    assert t2.get(txn, ID_INDEX.query_str("2")) == OBJ2

    assert show.format_rows([t1.get(txn, TAGS_INDEX.query("bar"))], "yaml") == OBJ1_YAML
    assert t1.get(txn, PREFIX_INDEX.query_str("10.1.2.3/32")) == OBJ2
    assert t1.get(txn, PREFIX_INDEX.query_str("10.0.0.0/8")) == OBJ1
    # The Go script's get on 10.1.0.0/16 is a longest-prefix lookup; the byte-ordered
    # index answers the same question with a prefix query.
    assert t1.get(txn, PREFIX_INDEX.query_str("10.1.0.0/16")) is None
    assert ids(t1.prefix(txn, PREFIX_INDEX.query_bytes(net_prefix("10.1.0.0/16")))) == [2]
    assert t1.get(txn, 3) is None
    assert t1.get(txn, TAGS_INDEX.query("nope")) is None


def test_list(loaded_db: tuple[DB, Table[Obj], Table[Obj]]) -> None:
    """`db/list` on the primary and the tags index."""
    db, t1, _ = loaded_db
    txn = db.read_txn()
    assert table_text(t1.list(txn, 1)) == OBJ1_TABLE
    assert table_text(t1.list(txn, 2)) == OBJ2_TABLE
    assert table_text(t1.list(txn, TAGS_INDEX.query("bar"))) == OBJ1_TABLE
    assert table_text(t1.list(txn, TAGS_INDEX.query("baz"))) == OBJ2_TABLE
    assert table_text(t1.list(txn, TAGS_INDEX.query("foo"))) == OBJS_TABLE
    assert show.format_rows(t1.list(txn, TAGS_INDEX.query("foo")), columns=["Tags"]) == (
        TAGS_ONLY_TABLE
    )
    # A list key is exact: "ba" is a prefix of two tags but not a tag.
    assert ids(t1.list(txn, TAGS_INDEX.query("ba"))) == []
    assert table_text(t1.list(txn, 3)) == EMPTY_TABLE


def test_prefix(loaded_db: tuple[DB, Table[Obj], Table[Obj]]) -> None:
    """`db/prefix` on the tags and prefix indexes."""
    db, t1, _ = loaded_db
    txn = db.read_txn()
    assert ids(t1.prefix(txn, 1)) == [1]  # a full uint64 key prefixes only itself
    assert table_text(t1.prefix(txn, TAGS_INDEX.query("ba"))) == OBJS_TABLE
    assert ids(t1.prefix(txn, TAGS_INDEX.query("f"))) == [1, 2]  # each row once
    for net, want in [
        ("0.0.0.0/0", OBJS_TABLE),
        ("10.0.0.0/8", OBJS_TABLE),
        ("10.1.2.3/32", OBJ2_TABLE),
        ("192.168.0.0/16", EMPTY_TABLE),
        ("2001:db8::/32", EMPTY_TABLE),
        # IPv4 keys are IPv4-mapped IPv6 addresses, so ::/0 covers them too.
        ("::/0", OBJS_TABLE),
    ]:
        q = PREFIX_INDEX.query_bytes(net_prefix(net))
        assert table_text(t1.prefix(txn, q)) == want, net


def test_lower_bound(loaded_db: tuple[DB, Table[Obj], Table[Obj]]) -> None:
    """`db/lowerbound` on the primary and the prefix index."""
    db, t1, _ = loaded_db
    txn = db.read_txn()
    assert table_text(t1.lower_bound(txn, 0)) == OBJS_TABLE
    assert table_text(t1.lower_bound(txn, 1)) == OBJS_TABLE
    assert table_text(t1.lower_bound(txn, 2)) == OBJ2_TABLE
    assert table_text(t1.lower_bound(txn, 3)) == EMPTY_TABLE
    for net, want in [
        ("0.0.0.0/0", OBJS_TABLE),
        ("10.0.0.0/8", OBJS_TABLE),
        ("10.1.0.0/16", OBJ2_TABLE),
        ("11.0.0.0/8", EMPTY_TABLE),
    ]:
        assert table_text(t1.lower_bound(txn, PREFIX_INDEX.query_str(net))) == want, net


def test_compare(loaded_db: tuple[DB, Table[Obj], Table[Obj]]) -> None:
    """`db/cmp`, including column subsets and --grep row filters."""
    db, t1, _ = loaded_db
    txn = db.read_txn()
    rows = list(t1.all(txn))
    assert table_text(iter(rows)) == OBJS_TABLE
    assert show.format_rows(rows, columns=["ID"]) == OBJS_IDS_TABLE
    bar = [r for r in rows if any("bar" in c for c in r.table_row())]
    baz = [r for r in rows if any("baz" in c for c in r.table_row())]
    assert table_text(iter(bar)) == OBJ1_TABLE
    assert table_text(iter(baz)) == OBJ2_TABLE


def test_delete(loaded_db: tuple[DB, Table[Obj], Table[Obj]]) -> None:
    """`db/delete` one object, then the other; the second delete empties the table."""
    db, t1, _ = loaded_db
    with db.write_txn(t1) as txn:
        assert t1.delete(txn, OBJ1) == OBJ1
    assert table_text(t1.all(db.read_txn())) == OBJ2_TABLE
    with db.write_txn(t1) as txn:
        # Deleting goes by primary key: any object with id 2 will do.
        assert t1.delete(txn, Obj(2)) == OBJ2
        assert t1.delete(txn, Obj(2)) is None
    txn2 = db.read_txn()
    assert table_text(t1.all(txn2)) == EMPTY_TABLE
    assert t1.count(txn2) == 0


def test_delete_with_get(empty_db: tuple[DB, Table[Obj], Table[Obj]]) -> None:
    """`db/get --delete`: look a row up and delete it in one transaction."""
    db, t1, _ = empty_db
    with db.write_txn(t1) as txn:
        t1.insert(txn, OBJ1)
    assert table_text(t1.all(db.read_txn())) == OBJ1_TABLE
    with db.write_txn(t1) as txn:
        row = t1.get(txn, 1)
        assert row is not None
        t1.delete(txn, row)
    assert t1.count(db.read_txn()) == 0


def test_delete_with_prefix(empty_db: tuple[DB, Table[Obj], Table[Obj]]) -> None:
    """`db/prefix --delete`: delete every row of a prefix query while iterating it."""
    db, t1, _ = empty_db
    with db.write_txn(t1) as txn:
        t1.insert(txn, OBJ1)
        t1.insert(txn, OBJ2)
    assert table_text(t1.all(db.read_txn())) == OBJS_TABLE
    with db.write_txn(t1) as txn:
        deleted = [t1.delete(txn, r) for r in t1.prefix(txn, TAGS_INDEX.query("fo"))]
        assert deleted == [OBJ1, OBJ2]
    assert table_text(t1.all(db.read_txn())) == EMPTY_TABLE


def test_delete_with_lower_bound(empty_db: tuple[DB, Table[Obj], Table[Obj]]) -> None:
    """`db/lowerbound --index=id --delete test1 2` leaves only obj1."""
    db, t1, _ = empty_db
    with db.write_txn(t1) as txn:
        t1.insert(txn, OBJ1)
        t1.insert(txn, OBJ2)
    with db.write_txn(t1) as txn:
        for r in t1.lower_bound(txn, ID_INDEX.query(2)):
            t1.delete(txn, r)
    assert table_text(t1.all(db.read_txn())) == OBJ1_TABLE


def test_dump(loaded_db: tuple[DB, Table[Obj], Table[Obj]]) -> None:
    """`db/dump`: the whole database as one JSON document."""
    db, t1, _ = loaded_db
    with db.write_txn(t1) as txn:
        t1.delete(txn, OBJ2)
    assert show.dump_json(db) == DUMP_EXPECTED
