"""Error paths: each misuse of the API raises its own StateDBError subclass and changes nothing."""

from __future__ import annotations

import threading
from dataclasses import dataclass, replace

import pytest

from statedb import (
    DB,
    DuplicateTableError,
    Index,
    ObjectNotFoundError,
    ObjectReusedError,
    Query,
    RevisionMismatchError,
    StateDBError,
    Table,
    TableNotLockedError,
    TableNotRegisteredError,
    TransactionClosedError,
    UniqueIndexConflictError,
    UnknownIndexError,
    keys,
)
from tests.statedb.helpers import OBJ1, OBJ2, TAGS_INDEX, Obj, new_db, new_table, obj


@dataclass(frozen=True, slots=True)
class Named:
    """A row with a unique secondary ``name``."""

    id: int
    name: str


BY_ID: Index[Named, int] = Index("id", key=lambda r: r.id, encode=keys.uint64)
BY_NAME: Index[Named, str] = Index("name", key=lambda r: r.name)


def test_writing_an_unlocked_table() -> None:
    """A write to a table the transaction did not lock raises and names the locked tables."""
    db, (t1, t2) = new_db("t1", "t2")
    with db.write_txn(t1) as txn:
        with pytest.raises(TableNotLockedError, match=r"t2.*locked: t1"):
            t2.insert(txn, OBJ1)
        for write in (
            lambda: t2.delete(txn, OBJ1),
            lambda: t2.delete_all(txn),
            lambda: t2.modify(txn, OBJ1, lambda old, new: new),
            lambda: t2.compare_and_swap(txn, 1, OBJ1),
            lambda: t2.compare_and_delete(txn, 1, OBJ1),
            lambda: t2.changes(txn),
            lambda: t2.register_initializer(txn, "x"),
        ):
            with pytest.raises(TableNotLockedError):
                write()
        t1.insert(txn, OBJ1)  # the transaction is still usable
    rtxn = db.read_txn()
    assert t1.count(rtxn) == 1 and t2.count(rtxn) == 0


def test_unregistered_table() -> None:
    """A table not registered with the DB cannot be locked, read or looked up."""
    db, _ = new_db("t1")
    stray = new_table("stray")
    with pytest.raises(TableNotRegisteredError):
        db.write_txn(stray)
    with pytest.raises(TableNotRegisteredError):
        db.table("stray")
    with pytest.raises(TableNotRegisteredError):
        list(stray.all(db.read_txn()))


def test_reinserting_the_stored_object() -> None:
    """Re-inserting the stored object is a bug (rows are immutable); an equal copy is fine."""
    db, (t1,) = new_db("t1")
    with db.write_txn(t1) as txn:
        t1.insert(txn, OBJ1)
        with pytest.raises(ObjectReusedError, match="inserted again"):
            t1.insert(txn, OBJ1)
    rev = t1.revision(db.read_txn())
    with db.write_txn(t1) as txn:
        with pytest.raises(ObjectReusedError):
            t1.insert(txn, OBJ1)
        with pytest.raises(ObjectReusedError):
            t1.modify(txn, obj(1), lambda old, new: old)
    assert t1.revision(db.read_txn()) == rev
    with db.write_txn(t1) as txn:
        assert t1.insert(txn, replace(OBJ1)) is OBJ1
    assert t1.revision(db.read_txn()) == rev + 1


def test_compare_and_swap_and_delete() -> None:
    """CAS and compare-and-delete succeed on the current revision only."""
    db, (t1,) = new_db("t1")
    with db.write_txn(t1) as txn:
        t1.insert(txn, OBJ1)
    got = t1.get_revision(db.read_txn(), 1)
    assert got is not None
    _, rev = got
    newer = obj(1, None, "new")
    with db.write_txn(t1) as txn:
        with pytest.raises(RevisionMismatchError) as info:
            t1.compare_and_swap(txn, rev + 7, newer)
        assert (info.value.expected, info.value.actual) == (rev + 7, rev)
        with pytest.raises(ObjectNotFoundError):
            t1.compare_and_swap(txn, rev, OBJ2)
        with pytest.raises(RevisionMismatchError):
            t1.compare_and_delete(txn, rev - 1, OBJ1)
        with pytest.raises(ObjectNotFoundError):
            t1.compare_and_delete(txn, rev, OBJ2)
        assert t1.get(txn, 1) is OBJ1  # nothing changed so far
        assert t1.compare_and_swap(txn, rev, newer) is OBJ1
        # The swap gave the row a new revision: the old one no longer matches.
        with pytest.raises(RevisionMismatchError):
            t1.compare_and_delete(txn, rev, newer)
        swapped = t1.get_revision(txn, 1)
        assert swapped == (newer, rev + 1)
        assert t1.compare_and_delete(txn, rev + 1, newer) is newer
    assert t1.count(db.read_txn()) == 0


def test_transaction_used_after_commit_or_abort() -> None:
    """Writes and commit after commit() or abort() raise; abort() after commit is harmless."""
    db, (t1,) = new_db("t1")
    txn = db.write_txn(t1)
    t1.insert(txn, OBJ1)
    txn.commit()
    assert txn.done
    with pytest.raises(TransactionClosedError, match="committed"):
        t1.insert(txn, OBJ2)
    with pytest.raises(TransactionClosedError):
        t1.delete(txn, OBJ1)
    with pytest.raises(TransactionClosedError):
        txn.commit()
    txn.abort()  # no effect on what was committed
    assert t1.get(db.read_txn(), 1) is OBJ1

    txn2 = db.write_txn(t1)
    t1.insert(txn2, OBJ2)
    txn2.abort()
    with pytest.raises(TransactionClosedError, match="aborted"):
        t1.insert(txn2, OBJ2)
    with pytest.raises(TransactionClosedError):
        txn2.commit()
    assert t1.get(db.read_txn(), 2) is None


def test_failed_transaction_releases_its_locks() -> None:
    """An exception in a `with db.write_txn()` block aborts and unlocks the tables."""
    db, (t1,) = new_db("t1")
    with pytest.raises(ObjectReusedError), db.write_txn(t1) as txn:
        t1.insert(txn, OBJ1)
        t1.insert(txn, OBJ1)
    # Another thread can lock the table now (a leaked lock would block it forever).
    done = threading.Event()

    def writer() -> None:
        with db.write_txn(t1) as txn2:
            t1.insert(txn2, OBJ2)
        done.set()

    th = threading.Thread(target=writer, daemon=True)
    th.start()
    th.join(30)  # a hang guard only
    assert done.is_set()
    assert [r.id for r in t1.all(db.read_txn())] == [2]


def test_unique_secondary_index_conflict() -> None:
    """A unique secondary key used by another row is refused; the transaction goes on."""
    table = Table("named", BY_ID, BY_NAME)
    db = DB(table)
    with db.write_txn(table) as txn:
        table.insert(txn, Named(1, "x"))
        with pytest.raises(UniqueIndexConflictError) as info:
            table.insert(txn, Named(2, "x"))
        assert info.value.index == "name"
        # The same row may keep its key when replaced.
        table.insert(txn, Named(1, "x"))
        # Moving a key from one row to another within one transaction is fine.
        table.insert(txn, Named(1, "y"))
        table.insert(txn, Named(2, "x"))
    rtxn = db.read_txn()
    assert table.get(rtxn, BY_NAME.query("x")) == Named(2, "x")
    assert table.get(rtxn, BY_NAME.query("y")) == Named(1, "y")
    assert table.count(rtxn) == 2


def test_unique_multi_key_index_conflict() -> None:
    """Every key of a unique multi-key index must be unused by other rows."""
    aliases: Index[Obj, str] = Index("alias", keys=lambda o: o.tags)
    table = Table("aliased", Index("id", key=lambda o: o.id, encode=keys.uint64), aliases)
    db = DB(table)
    with db.write_txn(table) as txn:
        table.insert(txn, obj(1, None, "a", "b"))
        with pytest.raises(UniqueIndexConflictError):
            table.insert(txn, obj(2, None, "c", "b"))
        table.insert(txn, obj(2, None, "c", "d"))
    assert table.get(db.read_txn(), aliases.query("c")) == obj(2, None, "c", "d")
    assert table.get(db.read_txn(), aliases.query("b")) == obj(1, None, "a", "b")


def test_unknown_index() -> None:
    """Queries and lookups naming a missing index raise UnknownIndexError."""
    db, (t1,) = new_db("t1")
    txn = db.read_txn()
    bad = Query("nope", b"x")
    for query in (t1.get, t1.list, t1.prefix, t1.lower_bound, t1.get_watch, t1.prefix_watch):
        with pytest.raises(UnknownIndexError, match="id, tags, prefix"):
            query(txn, bad)
    with pytest.raises(UnknownIndexError):
        t1.index("nope")
    assert t1.index("tags") is TAGS_INDEX


def test_duplicate_table_registration() -> None:
    """Two tables of one name, or one table in two DBs, cannot be registered."""
    db, (t1,) = new_db("t1")
    with pytest.raises(DuplicateTableError):
        db.register(new_table("t1"))
    with pytest.raises(DuplicateTableError):
        db.register(t1)
    with pytest.raises(ValueError, match="another DB"):
        DB(t1)
    assert [t.name for t in db.tables] == ["t1"]


def test_bad_table_and_index_definitions() -> None:
    """The primary index must be unique and single-key; index names distinct; key xor keys."""
    by_id: Index[Obj, int] = Index("id", key=lambda o: o.id, encode=keys.uint64)
    with pytest.raises(ValueError, match="primary"):
        Table("t", Index("id", key=lambda o: o.id, unique=False))
    with pytest.raises(ValueError, match="primary"):
        Table("t", TAGS_INDEX)
    with pytest.raises(ValueError, match="distinct"):
        Table("t", by_id, Index("id", key=lambda o: str(o.id)))
    with pytest.raises(ValueError, match="exactly one"):
        Index("x")
    with pytest.raises(ValueError, match="exactly one"):
        Index("x", key=lambda o: o, keys=lambda o: [o])


def test_every_error_is_a_statedb_error() -> None:
    """Callers can catch StateDBError for any of them."""
    for cls in (
        DuplicateTableError,
        ObjectNotFoundError,
        ObjectReusedError,
        RevisionMismatchError,
        TableNotLockedError,
        TableNotRegisteredError,
        TransactionClosedError,
        UniqueIndexConflictError,
        UnknownIndexError,
    ):
        assert issubclass(cls, StateDBError)


def test_a_table_registered_with_a_second_db_raises_under_the_root() -> None:
    from statedb import DB, Index, StatewrightError, Table, TableRegisteredElsewhereError

    t: Table[str] = Table("t", Index("name", key=lambda r: r))
    DB(t)
    with pytest.raises(TableRegisteredElsewhereError, match="'t' is already registered") as info:
        DB(t)
    assert isinstance(info.value, StatewrightError)
