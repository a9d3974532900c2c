"""The labels of the cluster's Namespaces, for pod identities.

Cilium copies a namespace's labels into the identity of every pod of the namespace
(``k8s:io.cilium.k8s.namespace.labels.<key>=<value>``), so that a NetworkPolicy
``namespaceSelector`` selects on identities alone. `NamespaceLabels` lists and watches
Namespaces (`sources.k8s_reflector.Reflector`, resource `namespace_resource_spec`) and
keeps each one's labels; the endpoints component runs it beside the Kubernetes source and
merges them into the Pod labels it gives the endpoint manager (`pod_identity_labels`).

It is not part of `sources.k8s_source.K8sSource`: the load balancer's tables do not depend
on Namespaces, so their initializer does not wait for this list.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import anyio
import anyio.abc

from sources.k8s_client import K8sClient
from sources.k8s_reflector import Delta, Reflector, ReflectorConfig, ResourceSpec
from tables.identities import NAMESPACE_LABELS_PREFIX

KIND_NAMESPACE = "Namespace"


def namespace_resource_spec() -> ResourceSpec:
    """Namespaces (cluster-scoped; the ClusterRole grants list and watch)."""
    return ResourceSpec("namespaces", KIND_NAMESPACE, "v1", lambda c: c.core.list_namespace)


def pod_identity_labels(
    pod_labels: Mapping[str, str] | None, namespace_labels: Mapping[str, str] | None
) -> dict[str, str] | None:
    """A Pod's labels with its namespace's labels as
    ``io.cilium.k8s.namespace.labels.<key>`` keys (what the endpoint manager takes as the
    Pod's labels, source ``k8s``); None when the Pod is unknown."""
    if pod_labels is None:
        return None
    merged = dict(pod_labels)
    for key, value in (namespace_labels or {}).items():
        merged[NAMESPACE_LABELS_PREFIX + key] = value
    return merged


class NamespaceLabels:
    """Each Namespace's labels as last listed or watched (see the module doc)."""

    def __init__(self, client: K8sClient, config: ReflectorConfig | None = None) -> None:
        self.reflector = Reflector(client, namespace_resource_spec(), self._deliver, config)
        #: Namespace name -> its labels; a namespace's labels are replaced by a new
        #: dictionary, never changed in place, so a lookup from a worker thread is safe.
        self.labels: dict[str, dict[str, str]] = {}
        #: Counts deliveries that changed `labels` (and the completed initial list).
        self.generation = 0
        self.synced = False
        self._event: anyio.Event | None = None

    def of(self, namespace: str) -> dict[str, str] | None:
        """The labels of ``namespace``, None when it is not known (yet)."""
        return self.labels.get(namespace)

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Run the reflector until cancelled."""
        task_status.started()
        await self.reflector.run()

    async def wait(self, after: int = 0) -> int:
        """Wait until `generation` is past ``after``; return it."""
        while self.generation <= after:
            if self._event is None:
                self._event = anyio.Event()
            await self._event.wait()
        return self.generation

    async def _deliver(self, reflector: Reflector, deltas: list[Delta], synced: bool) -> None:
        self.apply(deltas, synced)

    def apply(self, deltas: list[Delta], synced: bool = False) -> bool:
        """Take one delivery; True when it changed the labels (or completed the list)."""
        changed = synced and not self.synced
        self.synced = self.synced or synced
        for d in deltas:
            if d.op == "upsert":
                labels = _labels_of(d.obj)
                if self.labels.get(d.key) != labels:
                    self.labels[d.key] = labels
                    changed = True
            elif self.labels.pop(d.key, None) is not None:
                changed = True
        if changed:
            self.generation += 1
            if self._event is not None:
                self._event.set()
                self._event = None
        return changed

    def health(self) -> tuple[bool, str]:
        """(ok, message) of the reflector."""
        h = self.reflector.health
        ok = not h.last_error or h.synced
        what = "synced" if h.synced else "not synced"
        error = f": {h.last_error}" if not ok else ""
        return ok, f"{h.state} ({what}, {len(self.labels)} namespaces){error}"


def _labels_of(obj: Mapping[str, Any]) -> dict[str, str]:
    raw = (obj.get("metadata") or {}).get("labels") or {}
    return {str(k): str(v) for k, v in raw.items()} if isinstance(raw, Mapping) else {}
