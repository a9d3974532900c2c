"""Property test: random table writes, a target failing at random (exceptions and partial batch
failures), random prunes, entries added to the target behind the reconciler's back and table
initialization at a random point. Once faults stop and the reconciler settles, the target must
equal the table exactly, every row must be Done and health OK; nothing may be pruned before
initialization. Runs on the asyncio and trio backends with a fake clock for the backoff."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from reconciler import BatchEntry, FakeClock, StatusKind
from statedb import ReadTxn, Table
from tests.reconciler.helpers import WAIT_S, Harness, OpError, TestObject

KEYS = st.integers(0, 7)
VALUES = st.integers(0, 50).map(str)


class FlakyTarget:
    """An in-memory target whose operations fail with probability ``fail_prob`` while ``faults``
    is on; a failure may strike before or after the change was applied."""

    def __init__(self, seed: int, fail_prob: float) -> None:
        self.lock = threading.Lock()
        self.data: dict[int, str] = {}
        self.rng = random.Random(seed)
        self.fail_prob = fail_prob
        self.faults = True
        self.table: Table[TestObject] | None = None
        self.pruned_before_init = False
        self.prunes_ok = 0

    def _fault(self) -> bool:
        return self.faults and self.rng.random() < self.fail_prob

    def _apply_update(self, obj: TestObject) -> None:
        fail_before = self._fault()
        if fail_before and self.rng.random() < 0.5:
            raise OpError(f"update {obj.id} failed before applying")
        with self.lock:
            self.data[obj.id] = obj.value
        if fail_before:
            raise OpError(f"update {obj.id} failed after applying")

    def _apply_delete(self, obj: TestObject) -> None:
        fail = self._fault()
        if fail and self.rng.random() < 0.5:
            raise OpError(f"delete {obj.id} failed before applying")
        with self.lock:
            self.data.pop(obj.id, None)
        if fail:
            raise OpError(f"delete {obj.id} failed after applying")

    def update(self, txn: ReadTxn, revision: int, obj: TestObject) -> None:
        self._apply_update(obj)

    def delete(self, txn: ReadTxn, revision: int, obj: TestObject) -> None:
        self._apply_delete(obj)

    def prune(self, txn: ReadTxn, objects: Iterator[TestObject]) -> None:
        assert self.table is not None
        if not self.table.initialized(txn)[0]:
            self.pruned_before_init = True
        keep = {o.id for o in objects}
        fail = self._fault()
        with self.lock:
            stray = [k for k in self.data if k not in keep]
            if fail:  # a failing prune may get part of the way
                stray = stray[: len(stray) // 2]
            for k in stray:
                del self.data[k]
        if fail:
            raise OpError("prune failed part way")
        self.prunes_ok += 1

    def update_batch(self, txn: ReadTxn, batch: list[BatchEntry[TestObject]]) -> None:
        if self._fault() and self.rng.random() < 0.3:
            raise OpError("update batch failed as a whole")
        for e in batch:
            try:
                self._apply_update(e.obj)
            except OpError as exc:
                e.result = exc

    def delete_batch(self, txn: ReadTxn, batch: list[BatchEntry[TestObject]]) -> None:
        for e in batch:
            try:
                self._apply_delete(e.obj)
            except OpError as exc:
                e.result = exc

    def add_behind_back(self, key: int, value: str) -> None:
        with self.lock:
            self.data[key] = value

    def snapshot(self) -> dict[int, str]:
        with self.lock:
            return dict(self.data)


class ReconcilerMachine(RuleBasedStateMachine):
    """Drives a running reconciler with random writes and faults; checks convergence at the end."""

    backend = "asyncio"

    def __init__(self) -> None:
        super().__init__()
        self.h: Harness | None = None
        self.desired: dict[int, str] = {}
        self.initialized = False

    @initialize(
        seed=st.integers(0, 2**32 - 1),
        fail_prob=st.sampled_from([0.0, 0.3, 0.7, 1.0]),
        batch=st.booleans(),
        round_size=st.sampled_from([1, 2, 1000]),
    )
    def start(self, seed: int, fail_prob: float, batch: bool, round_size: int) -> None:
        self.clock = FakeClock()
        self.target = FlakyTarget(seed, fail_prob)
        self.h = Harness(
            backend=self.backend, ops=self.target, batch=batch, initializer=True,
            clock=self.clock, rate_limit=None, retry_min_backoff=1.0, retry_max_backoff=4.0,
            prune_interval=30.0, incremental_round_size=round_size,
        )
        self.target.table = self.h.table

    @property
    def harness(self) -> Harness:
        assert self.h is not None
        return self.h

    # ----- table writes -------------------------------------------------------------
    @rule(key=KEYS, value=VALUES)
    def insert(self, key: int, value: str) -> None:
        self.harness.insert(TestObject(key, value=value))
        self.desired[key] = value

    @rule(key=KEYS)
    def delete(self, key: int) -> None:
        self.harness.delete(key)
        self.desired.pop(key, None)

    @rule(key=KEYS, values=st.lists(st.one_of(VALUES, st.none()), min_size=2, max_size=6),
          one_txn=st.booleans())
    def burst(self, key: int, values: list[str | None], one_txn: bool) -> None:
        """Many writes of one key (None = delete), in one transaction or in quick succession."""
        h = self.harness
        if one_txn:
            with h.db.write_txn(h.table) as w:
                for v in values:
                    if v is None:
                        h.table.delete(w, TestObject(key))
                    else:
                        h.table.insert(w, TestObject(key, value=v))
        else:
            for v in values:
                if v is None:
                    h.delete(key)
                else:
                    h.insert(TestObject(key, value=v))
        last = values[-1]
        if last is None:
            self.desired.pop(key, None)
        else:
            self.desired[key] = last

    @rule(rows=st.dictionaries(KEYS, st.one_of(VALUES, st.none()), min_size=1, max_size=5))
    def multi_row_txn(self, rows: dict[int, str | None]) -> None:
        h = self.harness
        with h.db.write_txn(h.table) as w:
            for k, v in rows.items():
                if v is None:
                    h.table.delete(w, TestObject(k))
                    self.desired.pop(k, None)
                else:
                    h.table.insert(w, TestObject(k, value=v))
                    self.desired[k] = v

    # ----- the world around --------------------------------------------------------------
    @rule()
    def request_prune(self) -> None:
        self.harness.reconciler.prune()

    @rule(key=st.integers(0, 15), value=VALUES)
    def add_to_target_behind_back(self, key: int, value: str) -> None:
        # Only keys the table does not want: changing a wanted entry behind the back is
        # drift, which only refresh repairs (not under test here).
        if key not in self.desired:
            self.target.add_behind_back(key, "stray-" + value)

    @precondition(lambda self: not self.initialized)
    @rule()
    def initialize_table(self) -> None:
        self.harness.mark_init()
        self.initialized = True

    @rule(dt=st.sampled_from([0.5, 1.0, 2.0, 5.0, 31.0]))
    def advance_clock(self, dt: float) -> None:
        self.clock.advance(dt)

    @rule()
    def let_it_run(self) -> None:
        self.harness.wait_reconciled()

    @invariant()
    def never_pruned_before_initialization(self) -> None:
        if self.h is not None:
            assert not self.target.pruned_before_init

    # ----- convergence ---------------------------------------------------------------------
    def _settled(self) -> bool:
        h = self.harness
        rows = h.rows()
        return (
            self.target.snapshot() == self.desired
            and {o.id: o.value for o in rows} == self.desired
            and all(o.status.kind is StatusKind.DONE for o in rows)
            and len(h.reconciler.retries) == 0
            and h.reconciler.health.ok
            and self.target.prunes_ok > 0
        )

    def _settle(self) -> None:
        h = self.harness
        self.target.faults = False
        self.target.prunes_ok = 0  # a successful prune must happen from here on
        if not self.initialized:
            h.mark_init()
            self.initialized = True
        h.reconciler.prune()
        deadline = time.monotonic() + WAIT_S
        while not self._settled():
            if time.monotonic() > deadline:
                raise AssertionError(
                    "reconciler did not settle: "
                    f"target={self.target.snapshot()} desired={self.desired} "
                    f"rows={h.statuses()} retries={len(h.reconciler.retries)} "
                    f"health={h.reconciler.health}"
                )
            self.clock.advance(5.0)  # every retry is due (max backoff 4s)
            h.wait_reconciled()
            time.sleep(0.001)
        assert not self.target.pruned_before_init

    def teardown(self) -> None:
        if self.h is None:
            return
        try:
            self._settle()
        finally:
            self.h.close()


MACHINE_SETTINGS = settings(
    max_examples=100,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


class AsyncioMachine(ReconcilerMachine):
    backend = "asyncio"


class TrioMachine(ReconcilerMachine):
    backend = "trio"


TestReconcilerAsyncio = AsyncioMachine.TestCase
TestReconcilerAsyncio.settings = MACHINE_SETTINGS
TestReconcilerTrio = TrioMachine.TestCase
TestReconcilerTrio.settings = MACHINE_SETTINGS
