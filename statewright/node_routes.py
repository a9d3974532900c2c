"""RouteOps: the reconciler Operations writing the ``node-routes`` table
(tables/node_routes.py) into the kernel's main routing table through rtnetlink
(statewright/rtnl.py), in a worker thread: nothing blocks the event loop.

Every route the agent writes carries the routing protocol number `RTPROT_STATEWRIGHT`
(``ip route show proto 196``): that mark is what makes a route the agent's own.

* ``update_batch`` lists the main table once per batch and, per row: a route of ours
  with the same destination and gateway is already right and is left alone (counted in
  `skipped`: a restarted agent adopts its routes without removing and re-adding them);
  a route of another protocol to the same destination is someone else's, and the row
  fails with `RouteConflictError` (retried by the reconciler, shown in health) rather
  than replacing it; otherwise the route is replaced (``ip route replace``).
* ``delete_batch`` deletes the row's route, matching our protocol (the kernel never
  removes a route of another protocol for such a request).
* ``prune`` deletes the routes of our protocol to destinations no row wants, and no
  other route.

``netns`` (a path such as /var/run/netns/NAME): the routing table of that network
namespace instead of the agent's own (tests).
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import anyio

from reconciler import BatchEntry
from statedb import ReadTxn
from statedb.errors import StatewrightError
from statewright.rtnl import Route, Rtnl
from tables.l3n4 import IPAddress
from tables.node_routes import NodeRoute

#: The routing protocol number of the agent's routes (rtnetlink ``rtm_protocol``; not
#: one of those iproute2 names in /etc/iproute2/rt_protos).
RTPROT_STATEWRIGHT = 196


def _text(ip: IPAddress) -> str:
    """An address as the kernel's route listing spells it (`Rtnl.routes`: inet_ntop)."""
    return socket.inet_ntop(socket.AF_INET if ip.version == 4 else socket.AF_INET6, ip.packed)


class RouteConflictError(StatewrightError):
    """Another program's route holds the destination of a node route."""


class RouteOps:
    """Operations of the ``node-routes`` reconciler (see the module doc)."""

    def __init__(self, netns: str | None = None, protocol: int = RTPROT_STATEWRIGHT) -> None:
        self.netns = netns
        self.protocol = protocol
        #: Routes written (replaced), left alone because they were right, and deleted.
        self.writes = 0
        self.skipped = 0
        self.deletes = 0

    def _rtnl(self) -> Rtnl:
        return Rtnl(self.netns)

    def _table(self, rtnl: Rtnl, families: set[int]) -> dict[tuple[str, int], list[Route]]:
        out: dict[tuple[str, int], list[Route]] = {}
        for fam in sorted(families):
            for r in rtnl.routes(socket.AF_INET if fam == 4 else socket.AF_INET6):
                out.setdefault((r.dst, r.prefixlen), []).append(r)
        return out

    # ----- batches (the reconciler's calls) -------------------------------------------------
    async def update_batch(self, txn: ReadTxn, batch: list[BatchEntry[NodeRoute]]) -> None:
        """Make each row's route present (see the module doc)."""
        await anyio.to_thread.run_sync(self._update_all, batch)

    async def delete_batch(self, txn: ReadTxn, batch: list[BatchEntry[NodeRoute]]) -> None:
        """Remove each row's route (ours only)."""
        await anyio.to_thread.run_sync(self._delete_all, batch)

    async def update(self, txn: ReadTxn, revision: int, obj: NodeRoute) -> None:
        """One row (`update_batch` of one)."""
        entry = BatchEntry(obj, revision)
        await self.update_batch(txn, [entry])
        if entry.result is not None:
            raise entry.result

    async def delete(self, txn: ReadTxn, revision: int, obj: NodeRoute) -> None:
        """One row (`delete_batch` of one)."""
        entry = BatchEntry(obj, revision)
        await self.delete_batch(txn, [entry])
        if entry.result is not None:
            raise entry.result

    async def prune(self, txn: ReadTxn, objects: Iterator[NodeRoute]) -> None:
        """Delete our routes to destinations no row wants (a wanted destination with an
        old gateway is the row's update to replace, without a moment of no route)."""
        want = {(_text(r.prefix.network_address), r.prefix.prefixlen) for r in objects}
        await anyio.to_thread.run_sync(self._prune, want)

    # ----- in the worker thread ---------------------------------------------------------------
    def _update_all(self, batch: list[BatchEntry[NodeRoute]]) -> None:
        with self._rtnl() as rtnl:
            table = self._table(rtnl, {e.obj.prefix.version for e in batch})
            todo: list[tuple[BatchEntry[NodeRoute], tuple[str, int, str]]] = []
            for entry in batch:
                try:
                    want = self._needed(table, entry.obj)
                except RouteConflictError as e:
                    entry.result = e
                    continue
                if want is None:
                    self.skipped += 1
                else:
                    todo.append((entry, want))
            errors = rtnl.replace_routes([want for _, want in todo], self.protocol)
            for (entry, _), err in zip(todo, errors, strict=True):
                if err is None:
                    self.writes += 1
                else:
                    entry.result = err

    def _needed(
        self, table: dict[tuple[str, int], list[Route]], row: NodeRoute
    ) -> tuple[str, int, str] | None:
        """The route to write for ``row`` (None: ours is there and right already)."""
        dst, plen, gw = _text(row.prefix.network_address), row.prefix.prefixlen, _text(row.gateway)
        present = table.get((dst, plen), [])
        if any(r.protocol == self.protocol and r.gateway == gw for r in present):
            return None
        foreign = [r for r in present if r.protocol != self.protocol]
        if foreign:
            raise RouteConflictError(
                f"route to {row.prefix} of node {row.node}: the main table has a route to "
                f"it of routing protocol {foreign[0].protocol} (not the agent's): left alone"
            )
        return dst, plen, gw

    def _delete_all(self, batch: list[BatchEntry[NodeRoute]]) -> None:
        with self._rtnl() as rtnl:
            for entry in batch:
                r = entry.obj
                try:
                    if rtnl.delete_route(_text(r.prefix.network_address), r.prefix.prefixlen,
                                         _text(r.gateway), self.protocol):
                        self.deletes += 1
                except OSError as e:
                    entry.result = e

    def _prune(self, want: set[tuple[str, int]]) -> None:
        with self._rtnl() as rtnl:
            for fam in (socket.AF_INET, socket.AF_INET6):
                for r in rtnl.routes(fam):
                    if r.protocol != self.protocol or (r.dst, r.prefixlen) in want:
                        continue
                    if rtnl.delete_route(r.dst, r.prefixlen, r.gateway, self.protocol):
                        self.deletes += 1

    def stats(self) -> dict[str, Any]:
        """Writes, adopted (skipped) routes and deletions so far."""
        return {"writes": self.writes, "skipped": self.skipped, "deletes": self.deletes}
