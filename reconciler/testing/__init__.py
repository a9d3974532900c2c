"""reconciler.testing: a kit for testing reconcilers, their targets and controllers built on
them. Installed with the reconciler; needs nothing beyond its runtime dependencies, except
the state machine in `reconciler.testing.machine`, which needs hypothesis (the ``test``
extra).

* `FaultyOps` wraps any `Operations` (a real target) and injects failures, per operation
  and per batch entry, before or after the change is applied, plus latency; a `FaultPlan`
  says how often, a seed makes it repeatable.
* `MemoryTarget` is an in-memory target (a dict from a key to a value derived from each
  row) with a model check: `MemoryTarget.check` raises `ModelMismatch` unless the target
  holds exactly what the table's rows say.
* `convergence_problems` and `wait_until_done` tell when a reconciler has converged: every
  change attempted, every row Done, no update or delete retry pending, health OK.
* `BackgroundReconciler` runs a reconciler on an event loop in a background thread, for
  synchronous tests.
* `reconciler.testing.machine.reconciler_state_machine` builds a hypothesis rule-based
  state machine for any table and target from a `MachineSpec`.

Example (pytest, anyio)::

    target = MemoryTarget(key=lambda o: o.name, value=lambda o: o.address)
    ops = FaultyOps(target, FaultPlan.uniform(0.3), seed=1)
    rec = Reconciler(db, Config(table, ops, get_status, set_status))
    async with anyio.create_task_group() as tg:
        await tg.start(rec.run)
        ...  # write rows
        ops.enabled = False
        await wait_until_done(rec, timeout=10)
        target.check(db.read_txn(), table)
        tg.cancel_scope.cancel()
"""

from reconciler.testing.convergence import (
    DEFAULT_TIMEOUT,
    BackgroundReconciler,
    convergence_problems,
    wait_until_done,
)
from reconciler.testing.faults import FaultPlan, FaultyOps, InjectedFault
from reconciler.testing.memory import MemoryTarget, ModelMismatch, diff_states

__all__ = [
    "DEFAULT_TIMEOUT",
    "BackgroundReconciler",
    "FaultPlan",
    "FaultyOps",
    "InjectedFault",
    "MemoryTarget",
    "ModelMismatch",
    "convergence_problems",
    "diff_states",
    "wait_until_done",
]
