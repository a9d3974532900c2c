"""A hypothesis rule-based state machine that tests a reconciler over any table and target.

Needs hypothesis (the ``test`` extra: ``pip install 'statewright[test]'``, or hypothesis
alone); the rest of `reconciler.testing` does not.

`reconciler_state_machine(spec)` returns a `RuleBasedStateMachine` class. Each example
creates a fresh DB with ``spec.new_table()``, a fresh target with ``spec.new_target()``,
wraps the target in `FaultyOps` with a random `FaultPlan` and seed, and runs a
`Reconciler` (fake clock, random round size, per-object or batch operations) on a
background event loop. The rules then write random rows (``spec.rows``), delete existing
ones, write bursts of one key in one transaction or in quick succession, request prunes,
tamper with the target (``spec.tamper``), initialize the table at a random point, advance
the clock and let the reconciler run. Invariant: nothing is pruned before the table is
initialized. At the end, faults stop; unless the target was tampered with, the machine
first waits until every change was attempted and nothing is pending and checks that the
target matches the table before any prune (a prune would hide a delete or an update that
never reached the target); then it requests a prune, waits for the reconciler to settle,
and checks the model: the table holds the rows the machine wrote (statuses aside), every
row is Done, no retry is pending, health is OK, a prune succeeded after the faults stopped
and ``spec.observe(target) == spec.expected(rows of the table)``.

Typical use (a complete module, ``mypy --strict`` clean)::

    import dataclasses
    from dataclasses import dataclass, field

    from hypothesis import settings
    from hypothesis import strategies as st

    from reconciler import Status, status_pending
    from reconciler.testing import MemoryTarget
    from reconciler.testing.machine import MachineSpec, reconciler_state_machine
    from statedb import Index, Table, keys


    @dataclass(frozen=True)
    class Item:
        id: int
        value: str
        status: Status = field(default_factory=status_pending)


    Target = MemoryTarget[Item, int, str]

    spec: MachineSpec[Item, Target] = MachineSpec(
        new_table=lambda: Table(
            "items", Index[Item, int]("id", key=lambda o: o.id, encode=keys.uint64)
        ),
        rows=st.builds(Item, id=st.integers(0, 7), value=st.text(max_size=3)),
        new_target=lambda: Target(key=lambda o: o.id, value=lambda o: o.value),
        observe=lambda target: target.snapshot(),
        expected=lambda rows: {o.id: o.value for o in rows},
        get_object_status=lambda o: o.status,
        set_object_status=lambda o, s: dataclasses.replace(o, status=s),
    )
    TestItems = reconciler_state_machine(spec).TestCase
    TestItems.settings = settings(max_examples=50, stateful_step_count=30, deadline=None)
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from reconciler.clock import FakeClock
from reconciler.config import Config
from reconciler.operations import Operations
from reconciler.status import Status, StatusKind, status_pending
from reconciler.testing.convergence import DEFAULT_TIMEOUT, BackgroundReconciler
from reconciler.testing.faults import FaultPlan, FaultyOps
from reconciler.testing.memory import diff_states
from statedb import DB, Table

O = TypeVar("O")
T = TypeVar("T")

#: Fault rates the machine draws from for each example (0.0: no faults, 1.0: every call
#: fails until the faults stop).
FAULT_RATES: Sequence[float] = (0.0, 0.3, 0.7, 1.0)

#: Fake-clock settings of the machine's reconcilers: backoff from 1 s to 4 s, prunes every 30 s.
RETRY_MIN_BACKOFF = 1.0
RETRY_MAX_BACKOFF = 4.0
PRUNE_INTERVAL = 30.0

TARGET_DIFFERS = "target differs from the table"
NO_PRUNE_YET = "no successful prune since the faults stopped"


@dataclass(frozen=True)
class MachineSpec(Generic[O, T]):
    """What `reconciler_state_machine` needs to know about a table, its rows and a target.

    ``new_table``: a new, unregistered table (one per example). ``rows``: rows to write;
    their primary keys should come from a small set so that writes update and delete
    existing rows; statuses are replaced by a fresh Pending one before every write.
    ``new_target``: a fresh target of type T implementing `Operations` (one per example);
    it is wrapped in `FaultyOps`, so it needs no batch operations of its own.
    ``observe(target)``: the target's state; ``expected(rows)``: the state it should have
    for these rows (every row of the table); they are compared with ``==``.
    ``tamper``: optional, changes the target behind the reconciler's back; it is given the
    target, the primary keys (encoded) of the rows the table holds, and a number drawn
    from 0-15, and must only add what the table does not want (prune removes it; changing
    wanted entries is drift, which only refresh repairs).
    ``observe`` and ``tamper`` run on the reconciler's event loop thread, between target
    operations, so targets that are not thread-safe need no locking.
    ``backend``: the event loop, ``"asyncio"`` or ``"trio"``. ``timeout``: the bound, in
    seconds, of each wait for the reconciler (a guard against hangs).
    """

    new_table: Callable[[], Table[O]]
    rows: st.SearchStrategy[O]
    new_target: Callable[[], T]
    observe: Callable[[T], Any]
    expected: Callable[[list[O]], Any]
    get_object_status: Callable[[O], Status]
    set_object_status: Callable[[O, Status], O]
    tamper: Callable[[T, frozenset[bytes], int], None] | None = None
    backend: str = "asyncio"
    timeout: float = DEFAULT_TIMEOUT


class _ReconcilerMachineBase(RuleBasedStateMachine):
    """Everything of the machine but the rules drawing rows (those need the spec's
    strategy when the class is made): start, deletes, faults, prunes, tampering,
    initialization, the clock, and convergence at the end. ``spec`` is set by
    `reconciler_state_machine` on each subclass."""

    spec: MachineSpec[Any, Any]

    def __init__(self) -> None:
        super().__init__()
        self.runner: BackgroundReconciler[Any] | None = None
        # What the table should hold: encoded primary key -> the row last written.
        self.model: dict[bytes, Any] = {}
        self.initialized = False
        # Set once the target was changed behind the reconciler's back: from then on
        # only a prune can make it match the table.
        self.tampered = False

    @initialize(
        seed=st.integers(0, 2**32 - 1),
        rate=st.sampled_from(FAULT_RATES),
        latency=st.sampled_from([0.0, 0.0, 0.001]),
        batch=st.booleans(),
        round_size=st.sampled_from([1, 2, 1000]),
    )
    def start(
        self, seed: int, rate: float, latency: float, batch: bool, round_size: int
    ) -> None:
        self.clock = FakeClock()
        self.table = self.spec.new_table()
        self.db = DB(self.table)
        with self.db.write_txn(self.table) as w:
            self._mark_init = self.table.register_initializer(w, "state-machine")
        self.target = self.spec.new_target()
        plan = FaultPlan.uniform(rate, latency=(0.0, latency))
        inner: Operations[Any] = self.target
        self.faulty = FaultyOps(inner, plan, seed=seed, table=self.table)
        config: Config[Any] = Config(
            table=self.table,
            operations=self.faulty,
            batch_operations=self.faulty if batch else None,
            get_object_status=self.spec.get_object_status,
            set_object_status=self.spec.set_object_status,
            name="state-machine",
            clock=self.clock,
            rate_limit=None,
            retry_min_backoff=RETRY_MIN_BACKOFF,
            retry_max_backoff=RETRY_MAX_BACKOFF,
            prune_interval=PRUNE_INTERVAL,
            incremental_round_size=round_size,
        )
        self.runner = BackgroundReconciler(self.db, config, backend=self.spec.backend)

    @property
    def bg(self) -> BackgroundReconciler[Any]:
        assert self.runner is not None
        return self.runner

    # ----- table writes ---------------------------------------------------------
    def _write(self, w: Any, row: Any, delete_like: Any = None) -> None:
        """Insert ``row`` (with a fresh Pending status), or delete ``delete_like``'s key."""
        if row is not None:
            fresh = self.spec.set_object_status(row, status_pending())
            self.table.insert(w, fresh)
            self.model[self.table.primary_key_of(fresh)] = fresh
        else:
            assert delete_like is not None
            self.table.delete(w, delete_like)
            self.model.pop(self.table.primary_key_of(delete_like), None)

    @precondition(lambda self: bool(self.model))
    @rule(data=st.data())
    def delete_existing(self, data: st.DataObject) -> None:
        key = data.draw(st.sampled_from(sorted(self.model)), label="key")
        with self.db.write_txn(self.table) as w:
            self._write(w, None, self.model[key])

    # ----- the world around -----------------------------------------------------
    @rule()
    def request_prune(self) -> None:
        self.bg.reconciler.prune()

    @rule(n=st.integers(0, 15))
    def tamper_with_target(self, n: int) -> None:
        if self.spec.tamper is not None:
            # On the reconciler's loop thread, so it never races a target operation.
            self.bg.portal.call(self.spec.tamper, self.target, frozenset(self.model), n)
            self.tampered = True

    @precondition(lambda self: not self.initialized)
    @rule()
    def initialize_table(self) -> None:
        with self.db.write_txn(self.table) as w:
            self._mark_init(w)
        self.initialized = True

    @rule(dt=st.sampled_from([0.5, 1.0, 2.0, 5.0, 31.0]))
    def advance_clock(self, dt: float) -> None:
        self.clock.advance(dt)

    @rule()
    def let_it_run(self) -> None:
        self.bg.wait_reconciled(timeout=self.spec.timeout)

    @invariant()
    def never_pruned_before_initialization(self) -> None:
        if self.runner is not None:
            assert self.faulty.pruned_uninitialized == 0, "pruned an uninitialized table"

    # ----- convergence ------------------------------------------------------------
    def _problems(self) -> list[str]:
        rec = self.bg.reconciler
        txn = self.db.read_txn()
        rows = list(self.table.all(txn))
        problems: list[str] = []
        stored = {self.table.primary_key_of(o): o for o in rows}
        if set(stored) != set(self.model):
            problems.append(
                f"table keys {sorted(stored)} != written keys {sorted(self.model)}"
            )
        else:
            probe = status_pending()
            changed = [
                k for k, o in stored.items()
                if self.spec.set_object_status(o, probe)
                != self.spec.set_object_status(self.model[k], probe)
            ]
            if changed:
                problems.append(f"rows changed by someone else: {changed[:5]}")
        not_done = [o for o in rows if self.spec.get_object_status(o).kind is not StatusKind.DONE]
        if not_done:
            problems.append(f"{len(not_done)} row(s) not Done")
        if len(rec.retries):
            problems.append(f"{len(rec.retries)} retry(ies) pending")
        if not rec.health.ok:
            problems.append(f"health: {rec.health}")
        if self.faulty.prunes_ok == 0:
            problems.append(NO_PRUNE_YET)
        actual = self.bg.portal.call(self.spec.observe, self.target)  # see tamper_with_target
        expected = self.spec.expected(rows)
        if actual != expected:
            detail = (
                diff_states(expected, actual)
                if isinstance(actual, dict) and isinstance(expected, dict)
                else f"{actual!r} != {expected!r}"
            )
            problems.append(f"{TARGET_DIFFERS}: {detail}")
        return problems

    def _converge_before_prune(self) -> None:
        """Without tampering, the target must match the table once every change was
        attempted and nothing is pending, before the final prune: a prune would hide a
        delete or update that never reached the target."""
        deadline = time.monotonic() + self.spec.timeout
        while True:
            self.bg.wait_reconciled(timeout=self.spec.timeout)
            problems = [p for p in self._problems() if p != NO_PRUNE_YET]
            if not problems:
                return
            attempted = self.bg.reconciler.reconciled_revision >= self.table.revision(
                self.db.read_txn()
            )
            if attempted and len(problems) == 1 and problems[0].startswith(TARGET_DIFFERS):
                raise AssertionError(
                    "every change was reconciled and nothing is pending, but before "
                    f"any prune the {problems[0]}"
                )
            if time.monotonic() > deadline:
                raise AssertionError("reconciler did not settle: " + "; ".join(problems))
            self.clock.advance(RETRY_MAX_BACKOFF + 1.0)  # every retry is due
            time.sleep(0.001)

    def _settle(self) -> None:
        self.faulty.enabled = False
        if not self.tampered:
            self._converge_before_prune()
        self.faulty.prunes_ok = 0  # a successful prune must happen from here on
        if not self.initialized:
            self.initialize_table()
        self.bg.reconciler.prune()
        deadline = time.monotonic() + self.spec.timeout
        only_target = 0  # polls in a row where nothing but the target's state is wrong
        while problems := self._problems():
            only_target = only_target + 1 if problems[0].startswith(TARGET_DIFFERS) else 0
            # Settled but wrong: more polls (each advances the clock past the backoff,
            # 20 of them past a periodic prune) cannot change the outcome, so fail now
            # rather than at the deadline (which would make shrinking very slow).
            if only_target > 20 or time.monotonic() > deadline:
                raise AssertionError("reconciler did not settle: " + "; ".join(problems))
            self.clock.advance(RETRY_MAX_BACKOFF + 1.0)  # every retry is due
            self.bg.wait_reconciled(timeout=self.spec.timeout)
            time.sleep(0.001)
        assert self.faulty.pruned_uninitialized == 0, "pruned an uninitialized table"

    def teardown(self) -> None:
        if self.runner is None:
            return
        try:
            self._settle()
        finally:
            self.runner.close()


def reconciler_state_machine(spec: MachineSpec[O, T]) -> type[RuleBasedStateMachine]:
    """A `RuleBasedStateMachine` class testing the reconciler on ``spec``'s table and target
    (see the module docstring); use its ``TestCase`` with explicit hypothesis settings."""

    class ReconcilerMachine(_ReconcilerMachineBase):
        """Random writes, faults, prunes, tampering and initialization; convergence at the end."""

        @rule(row=spec.rows)
        def insert(self, row: O) -> None:
            with self.db.write_txn(self.table) as w:
                self._write(w, row)

        @rule(
            writes=st.lists(st.tuples(spec.rows, st.booleans()), min_size=2, max_size=6),
            one_txn=st.booleans(),
        )
        def burst(self, writes: list[tuple[O, bool]], one_txn: bool) -> None:
            """Several writes (True: delete that row's key), in one transaction or in quick
            succession."""
            if one_txn:
                with self.db.write_txn(self.table) as w:
                    for row, delete in writes:
                        self._write(w, None if delete else row, row)
            else:
                for row, delete in writes:
                    with self.db.write_txn(self.table) as w:
                        self._write(w, None if delete else row, row)

    ReconcilerMachine.spec = spec
    ReconcilerMachine.__name__ = ReconcilerMachine.__qualname__ = (
        f"ReconcilerMachine_{spec.backend}"
    )
    return ReconcilerMachine
