"""The state machine of test_statemachine.py with snapshots held for a long time.

Besides the machine's own kept snapshots (the last four), this one holds up to three
snapshots for as long as it likes and drops any of them (or of the kept ones) at random,
while retention works in the smallest steps: the sweep checks one key per write
transaction (`statedb.table_state.SWEEP_CHUNK`) and log compaction starts after a few
records and filters three per commit. Checked, besides everything the base machine checks:

- every live snapshot (held, kept and the latest) answers every query kind on every index
  as its model says (`read_every_snapshot`, and the base machine's ``query``, which also
  draws the held ones);
- once every snapshot is dropped, write transactions free every version kept for them:
  no older record and no deletion head is left in any version store (``teardown``).
"""

from __future__ import annotations

import gc

import hypothesis.strategies as st
import pytest
from hypothesis.stateful import invariant, precondition, rule

from statedb import ReadTxn, ordered, table_state
from tests.statedb.test_statemachine import (
    QUERY_KINDS,
    SPEC,
    SPECS,
    Model,
    StateDBMachine,
    actual_query,
    copy_model,
    expected_query,
    machine_settings,
)

#: Collections traverse only what the test made (tests/statedb/conftest.py); each example
#: freezes what the examples before it left (`HeldSnapshotMachine.__init__`).
pytestmark = pytest.mark.usefixtures("frozen_heap")

#: Snapshots the machine holds at most beside the base machine's kept ones.
MAX_HELD = 3


class HeldSnapshotMachine(StateDBMachine):
    """`StateDBMachine` plus long-held snapshots, dropped at random, and tiny retention steps."""

    def __init__(self) -> None:
        # What exists before this example (hypothesis's record of the examples run so far:
        # 150,000 objects by the last ones) is frozen, so the collection of `teardown`
        # traverses only what this example made; `frozen_heap` unfreezes after the test.
        gc.freeze()
        super().__init__()
        self.held: list[tuple[ReadTxn, Model]] = []
        self.patches = pytest.MonkeyPatch()
        self.patches.setattr(table_state, "SWEEP_CHUNK", 1)
        self.patches.setattr(table_state, "SWEEP_PER_WRITE", 0)
        self.patches.setattr(ordered, "COMPACT_SLACK", 4)
        self.patches.setattr(ordered, "COMPACT_CHUNK", 3)

    # ----- snapshots held and dropped ------------------------------------------------
    @precondition(lambda self: len(self.held) < MAX_HELD)
    @rule()
    def hold(self) -> None:
        """Hold the latest snapshot until `release` drops it."""
        self.held.append((self.db.read_txn(), copy_model(self.committed)))

    @precondition(lambda self: bool(self.held) or bool(self.snapshots))
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        """Drop one held or kept snapshot, any of them (not only the oldest)."""
        pool = [("held", i) for i in range(len(self.held))]
        pool += [("kept", i) for i in range(len(self.snapshots))]
        kind, i = data.draw(st.sampled_from(pool), label="release")
        if kind == "held":
            del self.held[i]
        else:
            del self.snapshots[i]

    @precondition(lambda self: self.txn is None)
    @rule(data=st.data(), txns=st.integers(1, 5), writes=st.integers(1, 8))
    def churn(self, data: st.DataObject, txns: int, writes: int) -> None:
        """Several write transactions of inserts and deletes on one table, holding a
        snapshot between some of them (so that several revisions are live at once)."""
        spec = self.pick_spec(data)
        for _ in range(txns):
            self.txn = self.db.write_txn(self.tables[spec.name])
            self.pending = {spec.name: self.committed[spec.name].copy()}
            self.pending_deletes = {}
            for _ in range(writes):
                op = data.draw(st.sampled_from(["insert", "insert", "insert", "delete"]))
                getattr(self, op)(data)
            self.commit()
            if len(self.held) < MAX_HELD and data.draw(st.booleans(), label="hold"):
                self.hold()

    def pick_target(self, data: st.DataObject) -> tuple[ReadTxn, Model, str]:
        """The base machine's choices, and sometimes a held snapshot."""
        if self.held and data.draw(st.booleans(), label="held"):
            i = data.draw(st.integers(0, len(self.held) - 1), label="held_index")
            txn, model = self.held[i]
            return txn, model, f"held{i}"
        return super().pick_target(data)

    # ----- reads ------------------------------------------------------------------------
    @rule(data=st.data())
    def read_every_snapshot(self, data: st.DataObject) -> None:
        """Every live snapshot answers one drawn query per index of every table."""
        live = [("latest", self.db.read_txn(), self.committed)]
        live += [(f"held{i}", t, m) for i, (t, m) in enumerate(self.held)]
        live += [(f"old{i}", t, m) for i, (t, m) in enumerate(self.snapshots)]
        for where, txn, model in live:
            for spec in SPECS:
                for _ in range(1 + len(spec.secondary)):
                    kind, index, key, raw = self.draw_query(data, spec, QUERY_KINDS)
                    want = expected_query(spec, model[spec.name], kind, index, key)
                    got, plain = actual_query(self.tables[spec.name], txn, kind, index, key, raw)
                    label = f"{kind} {spec.name}.{index} {key!r} in {where}"
                    assert got == want, label
                    assert plain == [row for row, _ in want], label

    @invariant()
    def held_contents_match(self) -> None:
        """Every held snapshot shows the contents it was taken with."""
        for i, (txn, model) in enumerate(self.held):
            for spec in SPECS:
                self.check_table(txn, spec, model[spec.name], f"held{i}")

    # ----- everything dropped: everything freed -------------------------------------------
    def teardown(self) -> None:
        """Drop every snapshot: write transactions then free every version kept for them."""
        try:
            if self.txn is not None:
                self.txn.abort()
                self.txn = None
            self.held.clear()
            self.snapshots.clear()
            latest = self.db.read_txn()
            for spec in SPECS:
                table = self.tables[spec.name]
                # The table's cache of ordered views holds a state per index: move it to
                # the latest one.
                list(table.all(latest))
                for idx in spec.secondary:
                    list(table.lower_bound(latest, idx.query("")))
            del latest
            gc.collect()
            for spec in SPECS:
                self.check_all_freed(spec.name)
        finally:
            self.patches.undo()
            super().teardown()

    def check_all_freed(self, name: str) -> None:
        """Write transactions (one sweep step each) until nothing older is kept."""
        table = self.tables[name]
        for _ in range(10_000):
            with self.db.write_txn(table) as w:
                tt = w.table_txn(table)
                stores = [tt.store, *(s for s in tt.secondary if s is not None)]
                if not any(s.older or s.cursor for s in stores):
                    break
        assert not any(s.older for s in stores), f"{name}: versions kept for no snapshot"
        for s in stores:
            assert all(type(e) is tuple for e in s.heads.values()), f"{name}: deletion heads"
        self.check_table(self.db.read_txn(), SPEC[name], self.committed[name], "after teardown")


HeldSnapshotMachine.TestCase.settings = machine_settings(60, steps=80)
TestHeldSnapshots = HeldSnapshotMachine.TestCase
