"""Policies from the Kubernetes API server: NetworkPolicies and CiliumNetworkPolicies in
every namespace, listed and watched (`sources.k8s_reflector.Reflector`, the resources of
`sources.k8s_source.policy_resource_specs`) into the ``policies`` table.

Each delivery is written in one write transaction (in a worker thread: parsing many
objects never holds up the event loop). An object that does not parse gets its own error
in `PolicyK8sSource.errors` (``Kind namespace/name`` -> message) and changes nothing; its
previously applied version, if any, stays in force until a valid version or its deletion
arrives. Once both initial lists are in, the ``k8s`` initializer of the ``policies`` table
is done (registered by `register_initializer`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import anyio
import anyio.abc

from policy.source import PolicyObjects
from sources.k8s_client import K8sClient
from sources.k8s_reflector import Delta, Reflector, ReflectorConfig
from sources.k8s_source import policy_resource_specs
from statedb import DB, InputError, WriteTxn

log = logging.getLogger(__name__)

INITIALIZER = "k8s"


class PolicyK8sSource:
    """See the module doc."""

    def __init__(
        self,
        db: DB,
        client: K8sClient,
        objects: PolicyObjects,
        config: ReflectorConfig | None = None,
    ) -> None:
        self.db = db
        self.objects = objects
        self.reflectors = [
            Reflector(client, spec, self._deliver, config) for spec in policy_resource_specs()
        ]
        self.errors: dict[str, str] = {}
        self.synced = False
        self._synced: set[str] = set()
        self._init_done: Callable[[WriteTxn], None] | None = None

    def register_initializer(self, txn: WriteTxn) -> None:
        """Keep the ``policies`` table uninitialized until both initial lists are in."""
        self._init_done = self.objects.table.register_initializer(txn, INITIALIZER)

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Run the reflectors until cancelled."""
        async with anyio.create_task_group() as tg:
            for r in self.reflectors:
                tg.start_soon(r.run, name=f"k8s reflector {r.name}")
            task_status.started()

    async def _deliver(self, reflector: Reflector, deltas: list[Delta], synced: bool) -> None:
        await anyio.to_thread.run_sync(self.apply, reflector, deltas, synced)

    def apply(self, reflector: Reflector, deltas: list[Delta], synced: bool) -> None:
        """Write one delivery (see the module doc)."""
        kind = reflector.spec.kind
        if synced:
            self._synced.add(reflector.name)
        with self.db.write_txn(*self.objects.tables) as txn:
            for d in deltas:
                ref = f"{kind} {d.key}"
                try:
                    if d.op == "upsert":
                        self.objects.upsert(txn, d.obj)
                    else:
                        self.objects.delete(txn, d.obj)
                except InputError as e:
                    if self.errors.get(ref) != str(e):
                        log.error("k8s policies: %s", e)
                    self.errors[ref] = str(e)
                    continue
                self.errors.pop(ref, None)
            if self._synced >= {r.name for r in self.reflectors} and not self.synced:
                self.synced = True
                if self._init_done is not None:
                    self._init_done(txn)
                    self._init_done = None

    def health(self) -> list[tuple[str, bool, str]]:
        """(resource, ok, message) per reflector, then one line for refused objects."""
        out: list[tuple[str, bool, str]] = []
        for r in self.reflectors:
            h = r.health
            ok = not h.last_error or h.synced
            what = "synced" if h.synced else "not synced"
            error = f": {h.last_error}" if not ok else ""
            out.append((r.name, ok, f"{h.state} ({what}){error}"))
        if self.errors:
            first = sorted(self.errors)[0]
            message = f"{len(self.errors)} refused, e.g. {self.errors[first]}"
            out.append(("objects", False, message))
        return out
