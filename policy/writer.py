"""The policy writer: follows identities, endpoints and policies in statedb and keeps the
``policy-entries`` and ``policy-endpoints`` tables equal to the computed policy.

`PolicyWriter.step` reads what changed in the three input tables since the last step
(statedb change iterators), feeds it to the `PolicyComputation` in an order that keeps
each step's work to what changed (new identities, then policies, then endpoints, then
identities that went away) and writes the changed rows in one write transaction. A row is
written only when its content changed, so an unchanged entry never goes back through the
reconciler. `PolicyWriter.run` steps whenever an input table changes.

Initialization: the writer registers the ``policy`` initializer on its two output tables
and completes it in the first step whose snapshot of the ``policies`` table is initialized
(every policy source has delivered its initial state), so a reconciler of the entries
never prunes a map entry whose policy has simply not been read yet.

Which endpoints: those with an identity (endpoint rows with ``identity`` 0 are waiting for
one and have no policy yet).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import anyio

from policy.compute import PolicyChanges, PolicyComputation
from policy.model import Policy, PortNames
from statedb import DB, ChangeIterator, Table, WatchSet, WriteTxn
from tables.endpoints import Endpoint
from tables.identities import Identity
from tables.policy_entries import (
    PolicyEndpoint,
    PolicyEntry,
    policy_endpoint_id_index,
    policy_key_index,
)

log = logging.getLogger(__name__)

#: The initializer the writer holds on ``policy-entries`` and ``policy-endpoints``.
INITIALIZER = "policy"


@dataclass(slots=True)
class StepResult:
    """What one step did."""

    inputs: int = 0  # input changes read
    written: int = 0  # rows inserted or deleted in the output tables
    seconds: float = 0.0


class PolicyWriter:
    """See the module doc."""

    def __init__(
        self,
        db: DB,
        *,
        identities: Table[Identity],
        endpoints: Table[Endpoint],
        policies: Table[Policy],
        entries: Table[PolicyEntry],
        policy_endpoints: Table[PolicyEndpoint],
        computation: PolicyComputation | None = None,
    ) -> None:
        self.db = db
        self.identities = identities
        self.endpoints = endpoints
        self.policies = policies
        self.entries = entries
        self.policy_endpoints = policy_endpoints
        self.computation = computation if computation is not None else PolicyComputation()
        with db.write_txn(identities, endpoints, policies) as wtxn:
            self._id_changes: ChangeIterator[Identity] = identities.changes(wtxn)
            self._ep_changes: ChangeIterator[Endpoint] = endpoints.changes(wtxn)
            self._pol_changes: ChangeIterator[Policy] = policies.changes(wtxn)
        # The output tables stay uninitialized (a reconciler prunes nothing) until a step
        # has computed from a ``policies`` table whose sources are all in.
        with db.write_txn(entries, policy_endpoints) as wtxn:
            self._init_done: list[Callable[[WriteTxn], None]] | None = [
                entries.register_initializer(wtxn, INITIALIZER),
                policy_endpoints.register_initializer(wtxn, INITIALIZER),
            ]
        self._ep_identity: dict[int, int] = {}
        #: Endpoint -> its named ports; identity -> its endpoints (for the union of its
        #: pods' named ports, which egress named ports resolve to).
        self._ep_names: dict[int, PortNames] = {}
        self._identity_eps: dict[int, set[int]] = {}
        self.steps = 0
        #: The repository revision every row written so far reflects: set after each
        #: step's write, so a reader that reads it before its snapshot of the output
        #: tables knows the rows are current as of it (an endpoint row with an older
        #: revision was not affected by the changes since).
        self.synced_revision = 0
        self.last = StepResult()
        #: Called after each step that wrote rows (tests, metrics).
        self.on_step: Callable[[StepResult], None] | None = None

    def close(self) -> None:
        """Stop tracking the input tables."""
        for it in (self._id_changes, self._ep_changes, self._pol_changes):
            it.close()

    @property
    def revision(self) -> int:
        """The policy repository's revision."""
        return self.computation.repo.revision

    def step(self) -> tuple[StepResult, WatchSet]:
        """Apply what changed in the input tables; return what was done and a watch set
        that fires when more changes arrive."""
        t0 = time.perf_counter()
        comp = self.computation
        txn = self.db.read_txn()
        id_changes, w1 = self._id_changes.next(txn)
        ep_changes, w2 = self._ep_changes.next(txn)
        pol_changes, w3 = self._pol_changes.next(txn)
        result = StepResult()
        gone_identities: list[int] = []
        for c in id_changes:
            result.inputs += 1
            if c.deleted:
                gone_identities.append(c.obj.id)
            else:
                comp.upsert_identity(c.obj.id, c.obj.labels)
        for pc in pol_changes:
            result.inputs += 1
            if pc.deleted:
                comp.delete_policy(pc.obj.key)
            else:
                comp.upsert_policy(pc.obj)
        touched: set[int] = set()
        for ec in ep_changes:
            result.inputs += 1
            ep = ec.obj
            old_identity = self._ep_identity.get(ep.id)
            if old_identity is not None:
                self._identity_eps.get(old_identity, set()).discard(ep.id)
                touched.add(old_identity)
            if ec.deleted or not ep.identity:
                self._ep_names.pop(ep.id, None)
                if self._ep_identity.pop(ep.id, None) is not None:
                    comp.delete_endpoint(ep.id)
            else:
                names = ep.port_names()
                self._ep_identity[ep.id] = ep.identity
                self._ep_names[ep.id] = names
                self._identity_eps.setdefault(ep.identity, set()).add(ep.id)
                touched.add(ep.identity)
                comp.set_endpoint(ep.id, ep.identity, names)
        for ident in touched:
            comp.set_port_names(ident, self._identity_names(ident))
        for ident in gone_identities:
            comp.delete_identity(ident)
        changes = comp.take_changes()
        policies_in, init_watch = self.policies.initialized(txn)
        done = self._init_done if policies_in else None
        if changes or done:
            result.written = self.write(changes, done)
            self._init_done = None if done else self._init_done
        self.synced_revision = comp.repo.revision
        result.seconds = time.perf_counter() - t0
        self.steps += 1
        self.last = result
        if result.written and self.on_step is not None:
            self.on_step(result)
        watches = WatchSet([w1, w2, w3])
        if self._init_done is not None:
            watches.add(init_watch)
        return result, watches

    def _identity_names(self, identity: int) -> PortNames:
        """The union of the named ports of the endpoints of ``identity``."""
        eps = self._identity_eps.get(identity)
        if not eps:
            self._identity_eps.pop(identity, None)
            return {}
        out: dict[tuple[str, int], frozenset[int]] = {}
        for ep in eps:
            for key, ports in self._ep_names.get(ep, {}).items():
                out[key] = out.get(key, frozenset()) | ports
        return out

    def write(
        self, changes: PolicyChanges, init_done: list[Callable[[WriteTxn], None]] | None = None
    ) -> int:
        """Write the changed rows (skipping those already equal) and complete the output
        tables' initializer when ``init_done`` is given; return rows written."""
        written = 0
        with self.db.write_txn(self.entries, self.policy_endpoints) as wtxn:
            for done in init_done or ():
                done(wtxn)
            for key, entry in changes.entries.items():
                old = self.entries.get(wtxn, policy_key_index.query(key))
                if entry is None:
                    if old is not None:
                        self.entries.delete(wtxn, old)
                        written += 1
                elif old != entry:
                    self.entries.insert(wtxn, entry)
                    written += 1
            for ep, row in changes.endpoints.items():
                old_ep = self.policy_endpoints.get(wtxn, policy_endpoint_id_index.query(ep))
                if row is None:
                    if old_ep is not None:
                        self.policy_endpoints.delete(wtxn, old_ep)
                        written += 1
                elif old_ep != row:
                    self.policy_endpoints.insert(wtxn, row)
                    written += 1
        return written

    async def run(self, *, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
        """Step whenever an input changes (each step in a worker thread, so a large
        recomputation never holds up the event loop); cancel the task to stop."""
        started = False
        try:
            while True:
                result, watches = await anyio.to_thread.run_sync(self.step)
                if result.written:
                    log.debug(
                        "policy: %d input change(s), %d row(s) written in %.1f ms",
                        result.inputs,
                        result.written,
                        result.seconds * 1000,
                    )
                if not started:
                    task_status.started()
                    started = True
                await watches.wait_async()
        finally:
            self.close()
