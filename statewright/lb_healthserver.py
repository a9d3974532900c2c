"""The service health-check server (Kubernetes ``healthCheckNodePort``), as Cilium's.

A Service with ``externalTrafficPolicy: Local`` and a ``healthCheckNodePort`` tells
external load balancers which nodes have local endpoints: on that port each node answers
an HTTP GET with ``200`` and the number of local, active endpoints, or ``503`` when there
are none (kube-proxy's JSON body and headers). `HealthServer` follows the frontends table:

* one HTTP listener per health-check port of the services that qualify (a LoadBalancer or
  NodePort frontend of external scope, Local external traffic policy, a port > 0);
  a listener that cannot bind retries with a backoff, and its failure is reported in
  `status`, never raised into the load balancer;
* for each LoadBalancer frontend of such a service, a synthetic service
  ``<namespace>/<name>:healthserver`` (source ``local``, Local traffic policies) with the
  frontend ``<LB VIP>:<port>/TCP`` whose backend is the node's first NodePort address
  (internal scope) at that port, so the health port is also reachable on the VIP. It goes
  when the service no longer qualifies.

The server follows the frontends table through a change iterator: each pass looks at
the frontends changed since the last one (a status write by the reconciler included)
and keeps the qualifying ones, so a pass costs what changed, not the table's size.

The listeners bind ``bind_address`` (all addresses when empty); the conformance runner
binds a loopback address so that tests never listen on the machine's interfaces.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass
from email.utils import formatdate
from typing import Any

import anyio
import anyio.abc

from statedb import DB, ChangeIterator, ReadTxn
from statedb.watch import WatchSet
from tables.backends import BackendParams, BackendState
from tables.frontends import FrontendParams, SVCType
from tables.l3n4 import SCOPE_EXTERNAL, SCOPE_INTERNAL, TCP, L3n4Addr
from tables.lb_writer import LBWriter
from tables.services import Service, TrafficPolicy

log = logging.getLogger("statewright.lb.healthserver")

#: Suffix of the synthetic services exposing a health port on LoadBalancer VIPs.
HEALTH_SUFFIX = ":healthserver"
#: Source of the synthetic services and their backends.
HEALTH_SOURCE = "local"
#: The frontend types a health-check port applies to.
_EXTERNAL_TYPES = (SVCType.LOAD_BALANCER, SVCType.NODE_PORT)
#: Least time between two passes over the frontends table (Cilium rate-limits too).
MIN_INTERVAL = 0.1
#: Backoff of a listener that cannot bind.
BIND_BACKOFF_MIN = 0.2
BIND_BACKOFF_MAX = 10.0
#: How long a client may take to send its request head, and its largest size.
REQUEST_TIMEOUT = 5.0
MAX_REQUEST = 16384


@dataclass(frozen=True, slots=True)
class HealthResponse:
    """What the server answers for one service."""

    service: str
    local_endpoints: int

    @property
    def status(self) -> tuple[int, str]:
        """HTTP status: 200 with local endpoints, 503 without."""
        return (200, "OK") if self.local_endpoints > 0 else (503, "Service Unavailable")

    def body(self) -> bytes:
        """kube-proxy's JSON body (Go's encoder: compact, newline-terminated)."""
        ns, _, name = self.service.partition("/")
        doc = {"service": {"namespace": ns, "name": name}, "localEndpoints": self.local_endpoints}
        return (json.dumps(doc, separators=(",", ":")) + "\n").encode()

    def http(self) -> bytes:
        """The whole HTTP/1.1 response; the server closes the connection after it (no
        ``Connection`` header, as Go's server answering a single request)."""
        code, reason = self.status
        body = self.body()
        head = [
            f"HTTP/1.1 {code} {reason}",
            "Content-Type: application/json",
            "X-Content-Type-Options: nosniff",
            f"X-Load-Balancing-Endpoint-Weight: {self.local_endpoints}",
            f"Date: {formatdate(time.time(), usegmt=True)}",
            f"Content-Length: {len(body)}",
        ]
        return ("\r\n".join(head) + "\r\n\r\n").encode() + body


class _Listener:
    """One health-check port: serves the service's answer until cancelled."""

    def __init__(self, server: HealthServer, port: int, service: str) -> None:
        self.server = server
        self.port = port
        self.service = service
        self.scope = anyio.CancelScope()
        #: "Running" while the job runs (as a Cilium job reports it), the bind error while
        #: binding fails (retried).
        self.state = "Running"
        self.ok = True

    async def run(self) -> None:
        backoff = BIND_BACKOFF_MIN
        with self.scope:
            while True:
                try:
                    listener = await anyio.create_tcp_listener(
                        local_host=self.server.bind_address or None,
                        local_port=self.port,
                        reuse_port=False,
                    )
                except OSError as exc:
                    self.ok = False
                    self.state = f"listen on port {self.port}: {exc}"
                    log.warning("health server for %s: %s (retrying)", self.service, self.state)
                    await anyio.sleep(backoff)
                    backoff = min(backoff * 2, BIND_BACKOFF_MAX)
                    continue
                self.ok, self.state = True, "Running"
                async with listener:
                    await listener.serve(self._handle)

    async def _handle(self, stream: anyio.abc.SocketStream) -> None:
        async with stream:
            data = b""
            with anyio.move_on_after(REQUEST_TIMEOUT):
                while b"\r\n\r\n" not in data and len(data) < MAX_REQUEST:
                    try:
                        chunk = await stream.receive(4096)
                    except (anyio.EndOfStream, anyio.BrokenResourceError):
                        break
                    data += chunk
            if not data:
                return
            response = HealthResponse(self.service, self.server.local_endpoints(self.service))
            try:
                await stream.send(response.http())
            except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                pass


class HealthServer:
    """Health-check listeners and the ``:healthserver`` services; see the module docstring."""

    def __init__(self, db: DB, writer: LBWriter, node_name: str, bind_address: str = "") -> None:
        self.db = db
        self.writer = writer
        self.node_name = node_name
        self.bind_address = bind_address
        self.listeners: dict[int, _Listener] = {}
        #: Health-check port per qualifying service.
        self.port_by_service: dict[str, int] = {}
        #: What was written per synthetic service: (frontend addresses, backend address).
        self._written: dict[str, tuple[tuple[L3n4Addr, ...], L3n4Addr]] = {}
        self._tg: anyio.abc.TaskGroup | None = None
        self.running = False
        #: (frontends, node-addresses) revisions the last pass saw, and what it wanted.
        self._synced: tuple[int, int] = (-1, -1)
        self._last_desired: tuple[
            dict[str, int], dict[str, tuple[tuple[L3n4Addr, ...], L3n4Addr]]
        ] = ({}, {})
        #: The qualifying frontends as of the last pass, by encoded primary key (the
        #: table's order): (service, health-check port, LoadBalancer VIP or None).
        self._qualifying: dict[bytes, tuple[str, int, L3n4Addr | None]] = {}

    # ----- what callers read ---------------------------------------------------------------
    def local_endpoints(self, service: str) -> int:
        """Active backends of ``service`` on this node (or of no known node)."""
        backends = self.writer.backends
        txn = self.db.read_txn()
        by_service = backends.index("service")
        count = 0
        for be in backends.list(txn, by_service.query(service)):
            inst = be.instance(service)
            if inst is None:
                continue
            if inst.node_name and inst.node_name != self.node_name:
                continue
            if inst.state is BackendState.ACTIVE:
                count += 1
        return count

    def _revisions(self, txn: ReadTxn) -> tuple[int, int]:
        return (
            self.writer.frontends.revision(txn),
            self.writer.node_addresses.revision(txn),
        )

    def idle(self) -> bool:
        """Whether listeners and synthetic services match the current frontends and node
        addresses (or the server is not running)."""
        if not self.running:
            return True
        txn = self.db.read_txn()
        if self._synced == self._revisions(txn):
            return True
        # Changed since: idle still when the changes ask for nothing new (e.g. only the
        # reconciler's status updates of frontends).
        return self._desired(txn, self.writer.frontends.all(txn)) == self._last_desired

    def status(self) -> list[tuple[str, bool, str]]:
        """(job, ok, message) of the control loop and of each listener, Cilium's job names."""
        out = [("job-control-loop", True, f"{len(self.listeners)} health servers running")]
        for port in sorted(self.listeners):
            lst = self.listeners[port]
            out.append((f"job-listener-{port}", lst.ok, lst.state))
        return out

    # ----- the loop ------------------------------------------------------------------------
    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Follow the frontends (and node addresses) until cancelled; listeners stop with it."""
        async with anyio.create_task_group() as tg:
            self._tg = tg
            self.running = True
            task_status.started()
            frontends = self.writer.frontends
            with self.db.write_txn(frontends) as wtxn:
                changes: ChangeIterator[Any] = frontends.changes(wtxn)
            # Not kept for the loop's lifetime: a finished transaction still holds the
            # snapshot of every table it began with, and a held snapshot keeps every row
            # version since it (no trim, no log compaction).
            del wtxn
            self._qualifying = {}
            try:
                last = -MIN_INTERVAL
                while True:
                    # At most one pass per MIN_INTERVAL; the first change after a quiet
                    # spell is handled at once (a token bucket of one, as Cilium's limiter).
                    wait = last + MIN_INTERVAL - time.monotonic()
                    if wait > 0:
                        await anyio.sleep(wait)
                    last = time.monotonic()
                    txn = self.db.read_txn()
                    changed, fe_watch = changes.next_records(txn)
                    _, na_watch = self.writer.node_addresses.all_watch(txn)
                    try:
                        self._follow(changed)
                        self._sync_qualifying(txn)
                    except Exception:  # a bad pass must not end the health server
                        log.exception("health server: sync failed")
                    # The revisions this pass read; its own writes (the :healthserver
                    # services) close the watches, so the next pass confirms them.
                    self._synced = self._revisions(txn)
                    del txn, changed  # a held ReadTxn keeps old row versions (docs/statedb.md)
                    await WatchSet([fe_watch, na_watch]).wait_async()
            finally:
                changes.close()
                self.running = False
                for lst in self.listeners.values():
                    lst.scope.cancel()
                self.listeners.clear()
                tg.cancel_scope.cancel()

    @staticmethod
    def _qualifies(fe: Any) -> tuple[str, int, L3n4Addr | None] | None:
        """What frontend ``fe`` asks of the health server: (its service, the health-check
        port, the VIP of a LoadBalancer frontend or None); None when it asks nothing."""
        # The type first: most frontends are ClusterIPs, and this runs for every change of
        # the frontends table (the reconciler's status writes included).
        if fe.type not in _EXTERNAL_TYPES:
            return None
        svc = fe.service
        if svc is None or svc.name.endswith(HEALTH_SUFFIX):
            return None
        if fe.address.scope == SCOPE_INTERNAL:
            return None
        port = svc.health_check_node_port
        if port <= 0 or svc.ext_traffic_policy is not TrafficPolicy.LOCAL:
            return None
        vip = None
        if fe.type is SVCType.LOAD_BALANCER:
            vip = L3n4Addr(fe.address.address, port, TCP, SCOPE_EXTERNAL)
        return svc.name, port, vip

    def _follow(self, changed: Iterable[tuple[Any, int, bytes]]) -> None:
        """Bring `_qualifying` up to date with the changes of the frontends table (the
        change log's records, `ChangeIterator.next_records`: an upsert is a plain tuple
        (obj, revision, key), a deletion is not)."""
        qualifying = self._qualifying
        qualifies = self._qualifies
        drop = qualifying.pop
        external = _EXTERNAL_TYPES
        for rec in changed:
            # `_qualifies`' first test inline: most frontends are ClusterIPs, and every
            # frontend's change comes twice (its write and the reconciler's status).
            if type(rec) is tuple and rec[0].type in external:
                q = qualifies(rec[0])
                if q is not None:
                    qualifying[rec[2]] = q
                    continue
            drop(rec[2], None)

    def _sync_qualifying(self, txn: ReadTxn) -> None:
        """Make listeners and synthetic services match `_qualifying` (frontends in the
        table's order, as a full pass sees them)."""
        q = self._qualifying
        self._apply(*self._wanted(txn, (q[k] for k in sorted(q))))

    def _desired(
        self, txn: ReadTxn, frontends: Iterable[Any]
    ) -> tuple[dict[str, int], dict[str, tuple[tuple[L3n4Addr, ...], L3n4Addr]]]:
        """What ``frontends`` ask for: the health-check port of each qualifying service,
        and per synthetic service its frontend addresses and backend address."""
        qualifies = self._qualifies
        return self._wanted(
            txn, (q for q in (qualifies(fe) for fe in frontends) if q is not None)
        )

    def _wanted(
        self, txn: ReadTxn, qualifying: Iterable[tuple[str, int, L3n4Addr | None]]
    ) -> tuple[dict[str, int], dict[str, tuple[tuple[L3n4Addr, ...], L3n4Addr]]]:
        """`_desired` from the qualifying frontends' (service, port, VIP), in table order."""
        ports: dict[str, int] = {}
        vips: dict[str, set[L3n4Addr]] = {}
        for name, port, vip in qualifying:
            ports[name] = port
            if vip is not None:
                vips.setdefault(name + HEALTH_SUFFIX, set()).add(vip)
        wanted: dict[str, tuple[tuple[L3n4Addr, ...], L3n4Addr]] = {}
        for name, addrs in vips.items():
            fes = tuple(sorted(addrs, key=lambda a: a.key()))
            port = fes[0].port
            be_ip = self._backend_ip(txn, fes[0].address.version == 6)
            wanted[name] = (fes, L3n4Addr(be_ip, port, TCP, SCOPE_INTERNAL))
        return ports, wanted

    def _apply(
        self, ports: dict[str, int], wanted: dict[str, tuple[tuple[L3n4Addr, ...], L3n4Addr]]
    ) -> None:
        """Make listeners and synthetic services match what the frontends ask for."""
        self._last_desired = (ports, wanted)
        self._sync_listeners(ports)
        self._sync_services(wanted)

    def _sync_listeners(self, ports: dict[str, int]) -> None:
        for name, port in list(self.port_by_service.items()):
            if ports.get(name) != port:
                del self.port_by_service[name]
                lst = self.listeners.pop(port, None)
                if lst is not None:
                    lst.scope.cancel()
        for name in sorted(ports):
            port = ports[name]
            if name in self.port_by_service:
                continue
            if port in self.listeners:
                log.warning(
                    "health server: port %d of %s is already served for %s",
                    port, name, self.listeners[port].service,
                )
                continue
            lst = _Listener(self, port, name)
            self.listeners[port] = lst
            self.port_by_service[name] = port
            assert self._tg is not None
            self._tg.start_soon(lst.run)

    def _backend_ip(self, txn: ReadTxn, v6: bool) -> Any:
        """The first NodePort address of the family, else the unspecified address."""
        import ipaddress

        for na in self.writer.node_addresses.all(txn):
            if na.nodeport and (na.address.version == 6) == v6:
                return na.address
        return ipaddress.ip_address("::" if v6 else "0.0.0.0")

    def _sync_services(
        self, wanted: dict[str, tuple[tuple[L3n4Addr, ...], L3n4Addr]]
    ) -> None:
        stale = [n for n in self._written if n not in wanted]
        changed = [n for n, w in wanted.items() if self._written.get(n) != w]
        if not stale and not changed:
            return
        with self.writer.write_txn() as wtxn:
            for name in stale:
                self.writer.release_backends_of_service(wtxn, name, HEALTH_SOURCE)
                self.writer.delete_service_and_frontends(wtxn, name)
                del self._written[name]
            for name in changed:
                fes, be_addr = wanted[name]
                svc = Service(
                    name,
                    source=HEALTH_SOURCE,
                    ext_traffic_policy=TrafficPolicy.LOCAL,
                    int_traffic_policy=TrafficPolicy.LOCAL,
                )
                try:
                    self.writer.upsert_service_and_frontends(
                        wtxn,
                        svc,
                        [
                            FrontendParams(a, SVCType.LOAD_BALANCER, name, service_port=a.port)
                            for a in fes
                        ],
                    )
                except Exception as exc:  # e.g. the VIP:port belongs to another service
                    log.warning("health server: cannot expose %s: %s", name, exc)
                    continue
                self.writer.set_backends(
                    wtxn,
                    name,
                    HEALTH_SOURCE,
                    [
                        BackendParams(
                            be_addr,
                            node_name=self.node_name,
                            source=HEALTH_SOURCE,
                            state=BackendState.ACTIVE,
                        )
                    ],
                )
                self._written[name] = wanted[name]
