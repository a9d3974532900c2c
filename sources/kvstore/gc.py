"""The operator's identity garbage collection in kvstore mode (``statewright operator
--identity-allocation-mode kvstore``).

Agents reference an identity by ``identities/v1/value/<labels>/<node>`` keys under their
leases (sources/kvstore/identities.py); a crashed node's references expire with its
lease. Every ``interval`` seconds one pass (`collect_identities`) lists the ids and the
references; an id no reference names is unused from then on, and once it has stayed so
for ``grace`` seconds it is deleted, by a transaction that fails if the key changed
meanwhile. An agent whose endpoints still use a deleted id creates it again under the
same number. A pass that fails (etcd unreachable) deletes nothing and is logged.
"""

from __future__ import annotations

import logging
import time

import anyio
import anyio.abc

from sources.kvstore.etcd_client import EtcdClient, KVStoreError
from sources.kvstore.identities import collect_identities
from sources.kvstore.layout import KeyLayout

log = logging.getLogger("statewright.operator")


class KVStoreIdentityGC:
    """See the module doc."""

    def __init__(self, client: EtcdClient, layout: KeyLayout | None = None, *,
                 grace: float = 900.0, interval: float = 60.0) -> None:
        self.client = client
        self.layout = layout or KeyLayout()
        self.grace = grace
        self.interval = interval
        #: Id -> when it was first seen unreferenced.
        self.unused_since: dict[int, float] = {}
        self.deleted: list[int] = []
        self.last_error = ""

    async def collect(self) -> list[int]:
        """One pass; returns the ids deleted."""
        try:
            gone = await collect_identities(self.client, self.layout, self.unused_since,
                                            self.grace, time.monotonic())
        except KVStoreError as e:
            if str(e) != self.last_error:
                log.warning("operator: identity GC pass failed: %s (tried again)", e)
            self.last_error = str(e)
            return []
        self.last_error = ""
        for num in gone:
            log.info("operator: identity %d unreferenced for %.0f s: deleted", num, self.grace)
        self.deleted += gone
        return gone

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        task_status.started()
        while True:
            await self.collect()
            await anyio.sleep(self.interval)
