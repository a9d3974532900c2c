"""The endpoints component's HTTP API: Cilium's ``/endpoint`` routes (what statewright-cni
calls), ``/ipam`` and ``/ipcache``.

Each handler reads the component's manager, IPAM, reconcilers and Ops as they are when it
runs (503 before the component started). Manager and IPAM calls write state files, so they
run in worker threads (`call_blocking`); their errors become the API's answers
(`api_error`: the error's ``http_status``). A deletion waits (at most
`DISCONNECT_TIMEOUT`) until both reconcilers removed the endpoint's map entries.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import anyio

from statewright.api_types import ApiError, Request, Route
from tables.endpoint_manager import EndpointManager
from tables.endpoints import EndpointChange, EndpointError
from tables.identities import IdentityError
from tables.ipam import IPAMError, parse_address
from tables.state_dir import StateDirError

if TYPE_CHECKING:
    from statewright.agent.components.endpoints import EndpointsComponent

log = logging.getLogger("statewright.agent.endpoints")

#: How long a deletion waits for the reconcilers to remove the endpoint's map entries.
DISCONNECT_TIMEOUT = 10.0


def api_error(e: Exception) -> ApiError:
    """The API's answer to a failure of IPAM, identities, endpoints or state files."""
    status = getattr(e, "http_status", 500)
    return ApiError(int(status), str(e))


async def call_blocking(fn: Callable[..., Any], *args: Any) -> Any:
    """Run a manager call (it fsyncs state files) in a worker thread; errors -> ApiError."""
    try:
        return await anyio.to_thread.run_sync(fn, *args)
    except (IPAMError, EndpointError, IdentityError, StateDirError) as e:
        raise api_error(e) from None


class EndpointAPI:
    """The routes of one endpoints component (see the module doc)."""

    def __init__(self, component: EndpointsComponent) -> None:
        self.component = component

    def routes(self) -> Sequence[Route]:
        """The endpoint, ipcache and IPAM routes; schemas in endpoint_schemas.py."""
        from statewright.agent.components import endpoint_schemas as sch

        ep = {"id": sch.ENDPOINT_ID}
        off = {503: "the endpoints component is not started, or addresses or identities "
                    "are exhausted"}
        bad = {400: "a bad endpoint id or request (the message names the field)"}
        missing = {404: "no such endpoint"}
        return (
            Route("/endpoint", self._list, summary="every endpoint",
                  response=sch.ENDPOINT_LIST, errors=off),
            Route("/endpoint/{id}", self._get, summary="one endpoint", params=ep,
                  response=sch.ENDPOINT, errors={**off, **bad, **missing}),
            Route("/endpoint/{id}", self._put, ("PUT",), summary="create an endpoint",
                  params=ep, status=201, body=sch.ENDPOINT_CREATE_REQUEST, response=sch.ENDPOINT,
                  errors={**off, **bad, 409: "the endpoint or an address exists already"}),
            Route("/endpoint/{id}", self._patch, ("PATCH",), summary="change an endpoint",
                  params=ep, body=sch.ENDPOINT_CHANGE_REQUEST, response=sch.ENDPOINT,
                  errors={**off, **bad, **missing, 409: "an address is taken"}),
            Route("/endpoint/{id}", self._delete, ("DELETE",), summary="delete an endpoint",
                  params=ep, response=sch.ENDPOINT_DELETED, errors={**off, **bad, **missing}),
            Route("/ipcache", self._ipcache, summary="the ipcache's desired entries, and the "
                  "map writes of both reconcilers since start", response=sch.IPCACHE,
                  errors=off),
            Route("/ipam", self._ipam_status, summary="pools, router addresses, allocations",
                  response=sch.IPAM_STATUS, errors=off),
            Route("/ipam", self._ipam_next, ("POST",), summary="allocate the next address(es)",
                  query=(sch.FAMILY, sch.OWNER), response=sch.IPAM_RESPONSE,
                  errors={**off, 400: "a bad owner"}),
            Route("/ipam/{ip}", self._ipam_ip, ("POST",), summary="allocate this address",
                  params={"ip": "the address"}, query=(sch.OWNER,),
                  response=sch.IPAM_RESPONSE,
                  errors={**off, 400: "not an address of the pools, or a bad owner",
                          409: "the address is allocated already"}),
            Route("/ipam/{ip}", self._ipam_release, ("DELETE",), summary="release an address",
                  params={"ip": "the address"}, query=(sch.OWNER_CHECK,),
                  response=sch.ALLOCATION,
                  errors={**off, 400: "not an address, or a router address",
                          404: "the address is not allocated",
                          409: "another owner holds the address"}),
        )

    def _mgr(self) -> EndpointManager:
        if self.component.manager is None or self.component.ipam is None:
            raise ApiError(503, "endpoints: not started")
        return self.component.manager

    async def _list(self, req: Request) -> Any:
        return [ep.to_json() for ep in self._mgr().all()]

    async def _get(self, req: Request) -> Any:
        ep = await call_blocking(self._mgr().get, req.params["id"])
        return ep.to_json()

    async def _put(self, req: Request) -> Any:
        mgr = self._mgr()
        change = _parse_change(req)
        ep = await call_blocking(mgr.create, req.params["id"], change)
        return ep.to_json()

    async def _patch(self, req: Request) -> Any:
        mgr = self._mgr()
        change = _parse_change(req)
        ep = await call_blocking(mgr.update, req.params["id"], change)
        return ep.to_json()

    async def _delete(self, req: Request) -> Any:
        mgr = self._mgr()
        ep, revisions = await call_blocking(mgr.begin_delete, req.params["id"])
        await self._wait_entries_removed(ep.id, revisions)
        await call_blocking(mgr.finish_delete, ep)
        return {"deleted": ep.id}

    async def _wait_entries_removed(self, ep_id: int, revisions: tuple[int, int]) -> None:
        """Wait until both reconcilers attempted every change up to ``revisions`` (the
        endpoint's entries deleted from the maps); bounded by DISCONNECT_TIMEOUT."""
        pending = list(zip(("endpoint-map", "ipcache"), revisions, strict=True))
        with anyio.move_on_after(DISCONNECT_TIMEOUT) as scope:
            for name, revision in pending:
                rec = self.component.reconcilers.get(name)
                if rec is not None:
                    await rec.wait_until_reconciled(revision)
        if scope.cancelled_caught:
            log.warning(
                "endpoint %d: map entries not removed within %.0f s; deleting it anyway "
                "(the reconcilers keep retrying)",
                ep_id,
                DISCONNECT_TIMEOUT,
            )

    async def _ipcache(self, req: Request) -> Any:
        """The ipcache rows, and per map the entries written and found already right (a
        restarted agent whose rows match the pinned maps writes none)."""
        mgr = self._mgr()
        txn = mgr.db.read_txn()
        return {
            "entries": [row.to_json() for row in mgr.entries.ipcache.all(txn)],
            "writes": {name: {"writes": ops.writes, "skipped": ops.skipped}
                       for name, ops in sorted(self.component.ops.items())},
        }

    async def _ipam_status(self, req: Request) -> Any:
        self._mgr()
        assert self.component.ipam is not None
        return self.component.ipam.status()

    async def _ipam_next(self, req: Request) -> Any:
        self._mgr()
        ipam = self.component.ipam
        assert ipam is not None
        owner = req.query.get("owner", "") or "api"
        family = req.query.get("family", "")
        if family not in ("", "ipv4", "ipv6"):
            raise ApiError(400, f"ipam: family {family!r}: use ipv4 or ipv6")
        try:
            ipam.check_ready()
        except IPAMError as e:
            raise api_error(e) from None
        fams = [int(family[-1])] if family else ipam.families()
        got: list[Any] = []
        try:
            for fam in fams:
                got.append(await call_blocking(ipam.allocate_next, fam, owner))
        except ApiError:
            for ip in got:  # all families or none
                await call_blocking(ipam.release, ip)
            raise
        return self._ipam_response(got)

    async def _ipam_ip(self, req: Request) -> Any:
        self._mgr()
        ipam = self.component.ipam
        assert ipam is not None
        owner = req.query.get("owner", "") or "api"
        try:
            ip = parse_address(req.params["ip"])
        except IPAMError as e:
            raise api_error(e) from None
        await call_blocking(ipam.allocate, ip, owner)
        return self._ipam_response([ip])

    async def _ipam_release(self, req: Request) -> Any:
        self._mgr()
        ipam = self.component.ipam
        assert ipam is not None
        owner = req.query.get("owner") or None
        held = await call_blocking(ipam.release, req.params["ip"], owner)
        return held.to_json()

    def _ipam_response(self, ips: list[Any]) -> dict[str, Any]:
        """Cilium's IPAMResponse shape: ``address`` plus per family the address, the
        gateway (the router address) and the pod CIDRs."""
        assert self.component.ipam is not None
        txn = self.component.ipam.db.read_txn()
        out: dict[str, Any] = {"address": {}}
        for ip in ips:
            fam = f"ipv{ip.version}"
            router = self.component.ipam.router(txn, ip.version)
            out["address"][fam] = str(ip)
            out[fam] = {
                "ip": str(ip),
                "gateway": str(router) if router else "",
                "cidrs": [str(c) for c in self.component.ipam.cidrs(ip.version)],
            }
        return out


def _parse_change(req: Request) -> EndpointChange:
    try:
        return EndpointChange.parse(req.json())
    except EndpointError as e:
        raise api_error(e) from None
