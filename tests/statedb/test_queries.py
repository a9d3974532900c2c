"""Query semantics on edge cases the script port does not reach: key order across keys
that prefix each other, multi-key indexes, unique keys moving between rows, and every
query agreeing with a primary-key scan."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from statedb import DB, Index, Query, Table, keys
from tests.statedb.helpers import ID_INDEX, TAGS_INDEX, Obj, new_db, obj


@dataclass(frozen=True, slots=True)
class Named:
    """A row with a string primary key, a unique name and a non-unique group."""

    key: str
    name: str
    group: str = ""


BY_KEY: Index[Named, str] = Index("key", key=lambda r: r.key)
BY_NAME: Index[Named, str] = Index("name", key=lambda r: r.name)
BY_GROUP: Index[Named, str] = Index("group", key=lambda r: r.group, unique=False)


def named_table() -> tuple[DB, Table[Named]]:
    """A DB with one Named table."""
    t = Table("named", BY_KEY, BY_NAME, BY_GROUP)
    return DB(t), t


def test_non_unique_results_follow_key_order_when_keys_prefix_each_other() -> None:
    """Rows are ordered by index key, then primary key, even when the primary key bytes
    would sort a shorter index key after a longer one."""
    db, t = named_table()
    with db.write_txn(t) as wtxn:
        t.insert(wtxn, Named("zz", "n1", group="g"))
        t.insert(wtxn, Named("aa", "n2", group="g1"))
        t.insert(wtxn, Named("mm", "n3", group="g\x00"))
    txn = db.read_txn()
    assert [r.key for r in t.prefix(txn, BY_GROUP.query("g"))] == ["zz", "mm", "aa"]
    assert [r.key for r in t.lower_bound(txn, BY_GROUP.query("g"))] == ["zz", "mm", "aa"]
    assert [r.key for r in t.lower_bound(txn, BY_GROUP.query("g\x00"))] == ["mm", "aa"]
    assert [r.key for r in t.list(txn, BY_GROUP.query("g"))] == ["zz"]
    assert [r.key for r in t.list(txn, BY_GROUP.query("g\x00"))] == ["mm"]


def test_multi_key_rows_are_reported_once() -> None:
    """prefix and lower_bound report a row with several matching keys once, at its first."""
    db, (t1,) = new_db("t1")
    aliases: Index[Obj, str] = Index("alias", keys=lambda o: o.tags)
    t2 = Table("aliased", ID_INDEX, aliases)
    db.register(t2)
    with db.write_txn(t1, t2) as txn:
        for t in (t1, t2):
            t.insert(txn, obj(1, None, "xa", "xb"))
            t.insert(txn, obj(2, None, "xc"))
    rtxn = db.read_txn()
    for t, idx in ((t1, TAGS_INDEX), (t2, aliases)):
        assert [r.id for r in t.prefix(rtxn, idx.query("x"))] == [1, 2], idx.name
        assert [r.id for r in t.lower_bound(rtxn, idx.query("xb"))] == [1, 2], idx.name


def test_unique_key_moving_to_another_row_in_one_txn() -> None:
    """A unique key freed by deleting one row and taken by another in the same transaction
    is found by every query, inside the transaction and after commit."""
    db, t = named_table()
    with db.write_txn(t) as txn:
        t.insert(txn, Named("a", "free"))
        t.insert(txn, Named("b", "u"))
        t.insert(txn, Named("c", "other"))
    # Build the ordered views of the old state first, so the new ones are derived.
    assert [r.key for r in t.prefix(db.read_txn(), BY_NAME.query(""))] == ["a", "c", "b"]
    with db.write_txn(t) as txn:
        t.delete_all(txn)
        t.insert(txn, Named("a", "u"))
        assert [r.key for r in t.prefix(txn, BY_NAME.query(""))] == ["a"]
        assert [r.key for r in t.lower_bound(txn, BY_NAME.query("t"))] == ["a"]
        assert t.get(txn, BY_NAME.query("u")) == Named("a", "u")
    rtxn = db.read_txn()
    assert [r.key for r in t.prefix(rtxn, BY_NAME.query(""))] == ["a"]
    assert [r.key for r in t.lower_bound(rtxn, BY_NAME.query("t"))] == ["a"]
    assert list(t.all(rtxn)) == [Named("a", "u")]


def test_unique_keys_swapped_between_rows() -> None:
    """Two rows exchanging unique keys in one transaction (via a temporary key)."""
    db, t = named_table()
    with db.write_txn(t) as txn:
        t.insert(txn, Named("a", "x"))
        t.insert(txn, Named("b", "y"))
    list(t.lower_bound(db.read_txn(), BY_NAME.query("")))  # build the old view
    with db.write_txn(t) as txn:
        t.insert(txn, Named("a", "tmp"))
        t.insert(txn, Named("b", "x"))
        t.insert(txn, Named("a", "y"))
        assert [r.key for r in t.lower_bound(txn, BY_NAME.query(""))] == ["b", "a"]
    rtxn = db.read_txn()
    assert [(r.name, r.key) for r in t.lower_bound(rtxn, BY_NAME.query(""))] == [
        ("x", "b"),
        ("y", "a"),
    ]


def test_queries_on_ip_networks_mix_families_in_one_order() -> None:
    """IPv4 networks sort inside IPv6 space (IPv4-mapped); prefix length breaks ties."""
    db, (t1,) = new_db("t1")
    nets = ["10.0.0.0/8", "10.0.0.0/16", "::/0", "2001:db8::/32", "0.0.0.0/0"]
    with db.write_txn(t1) as txn:
        for i, n in enumerate(nets):
            t1.insert(txn, obj(i, n))
    prefix_idx = t1.index("prefix")
    rows = list(t1.lower_bound(db.read_txn(), prefix_idx.query_bytes(b"")))
    assert [str(r.prefix) for r in rows] == [
        "::/0",
        "0.0.0.0/0",
        "10.0.0.0/8",
        "10.0.0.0/16",
        "2001:db8::/32",
    ]
    v4 = keys.ip_network_prefix(ipaddress.ip_network("10.0.0.0/8"))
    got = [str(r.prefix) for r in t1.prefix(db.read_txn(), Query("prefix", v4))]
    assert got == ["10.0.0.0/8", "10.0.0.0/16"]
