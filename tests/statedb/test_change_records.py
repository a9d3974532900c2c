"""`ChangeIterator.next_records`: the changes `next` reports, as the table stores them.

The change-iterator tests and the state machine run again here with `ChangeIterator.next`
answered by `next_records`, each record checked for its form (an upsert a plain tuple, a
deletion a `Deletion`) and turned into the `Change` that `next` hands out; the state
machine also with every batch decided while consumed. A property test then
interleaves writes, snapshots and both calls on two iterators of one table and compares
what each reports.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from statedb import Change, ChangeIterator, changes
from statedb.table_state import Deletion
from tests.statedb import test_bulk_writes, test_changes, test_mark_seen
from tests.statedb.test_log_gaps import Row, new_db, start_changes, write
from tests.statedb.test_statemachine import StateDBMachine


def _as_change(rec: Any) -> Change[Any]:
    """The `Change` that `next` hands out for ``rec``, after checking the record's form."""
    if type(rec) is tuple:
        assert len(rec) == 3 and type(rec[1]) is int and type(rec[2]) is bytes, rec
        return Change(*rec)
    assert type(rec) is Deletion, rec
    return rec  # type: ignore[no-any-return]


def _next_through_records(self: ChangeIterator[Any], txn: Any) -> Any:
    records, watch = self.next_records(txn)
    return map(_as_change, records), watch


@pytest.fixture(autouse=True)
def through_records(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """`next` answered by `next_records` in every test of this module."""
    monkeypatch.setattr(ChangeIterator, "next", _next_through_records)
    yield


for _module in (test_changes, test_mark_seen, test_bulk_writes):
    for _name in dir(_module):
        if _name.startswith("test_"):
            globals()[f"{_name}__records"] = getattr(_module, _name)


class TestStateDBThroughRecords(StateDBMachine.TestCase):  # type: ignore[name-defined,misc]
    """The state machine, every change read through `next_records`."""

    def setUp(self) -> None:
        self._patch = pytest.MonkeyPatch()
        self._patch.setattr(ChangeIterator, "next", _next_through_records)

    def tearDown(self) -> None:
        self._patch.undo()


class TestStateDBRecordsLargeBatches(TestStateDBThroughRecords):
    """The same, every change batch decided while consumed."""

    def setUp(self) -> None:
        super().setUp()
        self._patch.setattr(changes, "EAGER_RECORDS", 0)


#: One step: ("write", ids, value) writes rows ``ids`` with ``value`` in one transaction,
#: ("delete", ids) deletes them, ("snap",) keeps a snapshot, ("read", i, raw) reads
#: iterator i's changes on the newest kept snapshot (or the latest one), through
#: `next_records` when ``raw``.
_IDS = st.lists(st.integers(0, 7), min_size=1, max_size=4)
_STEP = st.one_of(
    st.tuples(st.just("write"), _IDS, st.integers(0, 3)),
    st.tuples(st.just("delete"), _IDS),
    st.tuples(st.just("snap")),
    st.tuples(st.just("read"), st.integers(0, 1), st.booleans()),
)


@settings(max_examples=150, deadline=2000)
@given(steps=st.lists(_STEP, max_size=25), large=st.booleans())
def test_next_records_reports_what_next_reports(steps: list[tuple[Any, ...]], large: bool) -> None:
    """Two iterators of one table, read with any mix of `next` and `next_records` on kept
    and latest snapshots, each report their changes once and in revision order, and
    rebuild the table's rows."""
    mp = pytest.MonkeyPatch()
    if large:
        mp.setattr(changes, "EAGER_RECORDS", 0)
    try:
        db, table = new_db()
        iters = [start_changes(db, table), start_changes(db, table)]
        seen: list[list[tuple[Any, int, bytes, bool]]] = [[], []]
        snaps: list[Any] = []
        for step in steps:
            if step[0] == "write":
                write(db, table, *(Row(i, step[2]) for i in step[1]))
            elif step[0] == "delete":
                with db.write_txn(table) as txn:
                    for i in step[1]:
                        table.delete(txn, Row(i, 0))
            elif step[0] == "snap":
                snaps.append(db.read_txn())
            else:
                _, k, raw = step
                txn = snaps[-1] if snaps else db.read_txn()
                if raw:
                    recs = [_as_change(r) for r in iters[k].next_records(txn)[0]]
                else:
                    recs = list(iters[k].next(txn)[0])
                seen[k] += [(c.obj, c.revision, c.key, c.deleted) for c in recs]
        # Both read up to the latest snapshot: the same rows, each change once.
        latest = db.read_txn()
        for k in (0, 1):
            last = (
                [_as_change(r) for r in iters[k].next_records(latest)[0]]
                if k
                else list(iters[k].next(latest)[0])
            )
            seen[k] += [(c.obj, c.revision, c.key, c.deleted) for c in last]
            revs = [r for _, r, _, _ in seen[k]]
            assert revs == sorted(revs) and len(set(revs)) == len(revs)
        rows = [{}, {}]  # type: list[dict[bytes, Any]]
        for k in (0, 1):
            for obj, _, key, deleted in seen[k]:
                if deleted:
                    rows[k].pop(key, None)
                else:
                    rows[k][key] = obj
        assert rows[0] == rows[1] == {table.primary_key_of(r): r for r in table.all(latest)}
        for it in iters:
            it.close()
    finally:
        mp.undo()
