"""``statewright operator``: the cluster's identity garbage collector, one process for the
whole cluster (deploy/operator-deployment.yaml, one replica), as Cilium's operator.

Agents create CiliumIdentities and never delete them (another node may use one). The
operator watches every CiliumIdentity and every CiliumEndpoint; an identity that no
CiliumEndpoint's ``status.identity.id`` names is unused from the moment the operator
sees it so (a new identity too: its endpoint's object usually follows within seconds),
and once it has stayed unused for ``grace`` seconds, it is deleted. Any use in between
restarts the clock. Every ``interval`` seconds one pass deletes what is due, in a worker
thread; a failed deletion (404: someone deleted it already) is logged and tried again at
the next pass. An agent whose endpoints still use a deleted identity creates it again
under the same number (tables/cluster_identities.py).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

import anyio
import anyio.abc
import urllib3

from sources.k8s_client import K8sClient, resource_path
from sources.k8s_endpoints import endpoint_resource_spec
from sources.k8s_http import K8sApiError, describe_error
from sources.k8s_identities import GROUP, PLURAL, VERSION, identity_resource_spec
from sources.k8s_reflector import Delta, Reflector, ReflectorConfig
from statewright.identity_gc_timing import DEFAULT_GRACE, DEFAULT_INTERVAL

log = logging.getLogger("statewright.operator")


class IdentityGC:
    """See the module doc."""

    def __init__(
        self,
        client: K8sClient,
        *,
        grace: float = DEFAULT_GRACE,
        interval: float = DEFAULT_INTERVAL,
        config: ReflectorConfig | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client = client
        self.grace = grace
        self.interval = interval
        self.clock = clock
        self.reflectors = [
            Reflector(client, identity_resource_spec(), self._identities, config),
            Reflector(client, endpoint_resource_spec(), self._endpoints, config),
        ]
        #: Identity name -> when it was last seen in use (or first seen unused).
        self.identities: dict[str, float] = {}
        #: CiliumEndpoint ``namespace/name`` -> the identity it names.
        self.endpoint_identity: dict[str, str] = {}
        self._uses: dict[str, int] = {}
        self._synced: set[str] = set()
        self.deleted: list[str] = []
        self.errors: dict[str, str] = {}

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Watch and collect until cancelled."""
        async with anyio.create_task_group() as tg:
            for r in self.reflectors:
                tg.start_soon(r.run, name=f"k8s reflector {r.name}")
            task_status.started()
            while True:
                await anyio.sleep(self.interval)
                await anyio.to_thread.run_sync(self.collect)

    @property
    def synced(self) -> bool:
        """True once both initial lists are in (nothing is deleted before)."""
        return self._synced >= {r.name for r in self.reflectors}

    async def _identities(self, r: Reflector, deltas: list[Delta], synced: bool) -> None:
        now = self.clock()
        for d in deltas:
            if d.op == "upsert":
                self.identities.setdefault(d.key, now)
            else:
                self.identities.pop(d.key, None)
        if synced:
            self._synced.add(r.name)

    async def _endpoints(self, r: Reflector, deltas: list[Delta], synced: bool) -> None:
        now = self.clock()
        for d in deltas:
            old = self.endpoint_identity.pop(d.key, None)
            if old is not None:
                self._use(old, -1, now)
            if d.op == "upsert":
                num = _identity_of(d.obj)
                if num:
                    self.endpoint_identity[d.key] = num
                    self._use(num, 1, now)
        if synced:
            self._synced.add(r.name)

    def _use(self, num: str, delta: int, now: float) -> None:
        n = self._uses.get(num, 0) + delta
        if n > 0:
            self._uses[num] = n
        else:
            self._uses.pop(num, None)
        if num in self.identities:
            self.identities[num] = now  # in use now, or unused from now on

    def due(self) -> list[str]:
        """The identities unused for at least ``grace`` seconds."""
        if not self.synced:
            return []
        now = self.clock()
        return sorted(
            (n for n, since in self.identities.items()
             if n not in self._uses and now - since >= self.grace),
            key=lambda n: (len(n), n),
        )

    def collect(self) -> list[str]:
        """Delete what is `due` (blocking: a worker thread); returns what was deleted."""
        gone = []
        for name in self.due():
            try:
                self.client.delete(
                    resource_path(f"{GROUP}/{VERSION}", PLURAL, name=name), timeout=10.0
                )
            except K8sApiError as e:
                if e.status != 404:
                    self._failed(name, e)
                    continue
            except (urllib3.exceptions.HTTPError, OSError) as e:
                self._failed(name, e)
                continue
            self.errors.pop(name, None)
            self.identities.pop(name, None)
            gone.append(name)
            log.info("operator: CiliumIdentity %s unused for %.0f s: deleted", name, self.grace)
        self.deleted += gone
        return gone

    def _failed(self, name: str, e: BaseException) -> None:
        msg = f"deleting CiliumIdentity {name}: {describe_error(e)}"
        log.warning("operator: %s (tried again)", msg)
        self.errors[name] = msg


def _identity_of(obj: Mapping[str, Any]) -> str:
    status = obj.get("status")
    ident = status.get("identity") if isinstance(status, Mapping) else None
    num = ident.get("id") if isinstance(ident, Mapping) else None
    return str(num) if isinstance(num, int) and not isinstance(num, bool) else ""
