"""Namespaces from the API server, into the namespaces table (tables/namespaces.py).

Cilium copies a namespace's labels into the identity of every pod of the namespace
(``k8s:io.cilium.k8s.namespace.labels.<key>=<value>``), so that a NetworkPolicy
``namespaceSelector`` selects on identities alone. `NamespaceSource` lists and watches
Namespaces (`sources.k8s_reflector.Reflector`, resource `namespace_resource_spec`) and
keeps their rows (source ``k8s``) in the ``namespaces`` table; the endpoints component
gives every pod's endpoint its namespace's labels from that table.

It is not part of `sources.k8s_source.K8sSource`: the load balancer's tables do not depend
on Namespaces, so their initializer does not wait for this list. It holds the ``k8s``
initializer of the namespaces table until its initial list is in.
"""

from __future__ import annotations

from collections.abc import Callable

import anyio
import anyio.abc

from sources.k8s_client import K8sClient
from sources.k8s_reflector import Delta, Reflector, ReflectorConfig, ResourceSpec
from statedb import DB, Table, WriteTxn
from tables.namespaces import (
    KIND_NAMESPACE,
    SOURCE_K8S,
    Namespace,
    NamespaceError,
    NamespaceObjects,
)


def namespace_resource_spec() -> ResourceSpec:
    """Namespaces (cluster-scoped; the ClusterRole grants list and watch)."""
    return ResourceSpec("namespaces", KIND_NAMESPACE, "v1", "namespaces")


class NamespaceSource:
    """The API server's Namespaces -> rows of the namespaces table (see the module doc)."""

    def __init__(
        self,
        client: K8sClient,
        db: DB,
        table: Table[Namespace],
        config: ReflectorConfig | None = None,
    ) -> None:
        self.reflector = Reflector(client, namespace_resource_spec(), self._deliver, config)
        self.db = db
        self.table = table
        self.handler = NamespaceObjects(table, SOURCE_K8S)
        #: Objects refused (malformed labels): name -> message; the rest applies.
        self.refused: dict[str, str] = {}
        self.synced = False
        self._init_done: list[Callable[[WriteTxn], None]] = []

    def register_initializer(self, txn: WriteTxn) -> None:
        """Hold the table's ``k8s`` initializer until the initial list is in."""
        self._init_done = [self.table.register_initializer(txn, SOURCE_K8S)]

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Run the reflector until cancelled."""
        task_status.started()
        await self.reflector.run()

    async def _deliver(self, reflector: Reflector, deltas: list[Delta], synced: bool) -> None:
        self.apply(deltas, synced)

    def apply(self, deltas: list[Delta], synced: bool = False) -> None:
        """Write one delivery in one transaction (completing the initializer with the
        delivery that completes the initial list); a malformed Namespace is refused on
        its own (`refused`)."""
        with self.db.write_txn(self.table) as txn:
            for d in deltas:
                try:
                    if d.op == "upsert":
                        self.handler.upsert(txn, d.obj)
                    else:
                        self.handler.delete(txn, d.obj)
                    self.refused.pop(d.key, None)
                except NamespaceError as e:
                    self.refused[d.key] = str(e)
            if synced and not self.synced:
                self.synced = True
                for done in self._init_done:
                    done(txn)
                self._init_done = []

    def health(self) -> tuple[bool, str]:
        """(ok, message) of the reflector and the refused objects."""
        h = self.reflector.health
        ok = (not h.last_error or h.synced) and not self.refused
        what = "synced" if h.synced else "not synced"
        n = sum(1 for r in self.table.all(self.db.read_txn()) if r.source == SOURCE_K8S)
        message = f"{h.state} ({what}, {n} namespaces)"
        if h.last_error and not h.synced:
            message += f": {h.last_error}"
        if self.refused:
            first = sorted(self.refused.items())[0]
            message += f"; {len(self.refused)} refused, e.g. {first[1]}"
        return ok, message
