"""LBWriter: the one write API that keeps services, frontends and backends consistent.

Every method takes an open write transaction from `LBWriter.write_txn` (which
locks all four LB tables), so a source can apply one object's worth of changes
atomically: e.g. a Service becomes one `upsert_service_and_frontends` call, an
EndpointSlice one `set_backends` call. A method that raises leaves the tables
as they were *for that call* (it validates before writing); the caller normally
lets the exception abort the whole transaction (``with writer.write_txn():``).

Invariants kept here:

* every frontend belongs to an existing service (``service_name``), and its
  ``service`` field is the current service row;
* a frontend address belongs to one service: claiming another service's
  address raises `FrontendConflictError`;
* a frontend's ``backends`` are the preferred instances, for its service (or
  ``redirect_to``), of the backends that match its IP family, port name,
  traffic policy (Local: ``node_name`` equal to the configured node name),
  topology zone (`_zone_backends`) and PreferSameNode preference, sorted by address;
  terminating instances stay in the list (the BPF ops use them only when no active
  backend remains);
* whenever any of that input changes (service, backends, node addresses for
  NodePort/HostPort surrogates, node zone), the frontend is re-written with a
  fresh Pending status so the BPF reconciler applies it again; its ``id`` is
  kept;
* a backend row exists only while it has at least one instance.
"""

from __future__ import annotations

import dataclasses
import operator
import time
import weakref
from collections.abc import Callable, Iterable, Mapping
from typing import Any, NoReturn

from reconciler.status import status_pending
from statedb import DB, InputError, ReadTxn, StatewrightError, Table, WriteTxn
from tables.backends import (
    Backend,
    BackendParams,
    BackendState,
    given_in_order,
    new_backends_table,
    preferred_instances_of,
    rows_of_service,
    selects_all_of,
    single_backends,
)
from tables.frontends import Frontend, FrontendParams, SVCType, new_frontend, new_frontends_table
from tables.l3n4 import SCOPE_INTERNAL, IPAddress, L3n4Addr
from tables.lb_config import LBConfig
from tables.node_addresses import NodeAddress, new_node_addresses_table
from tables.origins import Origin, new_origins_table
from tables.services import (
    PREFER_SAME_NODE,
    PREFER_SAME_ZONE,
    Service,
    ServiceName,
    TrafficPolicy,
    new_services_table,
    source_priority,
)

_TERMINATING = (BackendState.TERMINATING, BackendState.TERMINATING_NOT_SERVING)
#: The frontend types `LBWriter._shadows_node_port` may skip.
_SHADOWING_TYPES = (SVCType.LOAD_BALANCER, SVCType.EXTERNAL_IPS)
# Enum members as module constants: reading one off its class goes through the enum
# metaclass's attribute hook (a Python-level lookup, ~20 times a global's cost).
_LOCAL = TrafficPolicy.LOCAL

#: Node label holding the node's zone (topology-aware routing).
ZONE_LABEL = "topology.kubernetes.io/zone"


class LBWriterError(StatewrightError, ValueError):
    """A write was refused; the message names the object and the reason.

    Raised as such, it means the caller broke the writer's contract (a frontend
    naming another service, a backend of another source, a duplicate frontend) or
    named a row that does not exist. Refusals caused by the input objects
    themselves are the subclasses that are also `InputError`:
    `FrontendConflictError` and `InvalidBackendError`.
    """


class FrontendConflictError(LBWriterError, InputError):
    """A frontend address is already owned by another service (``obj``: the claimant)."""

    def __init__(self, address: L3n4Addr, owner: ServiceName, claimant: ServiceName) -> None:
        super().__init__(
            f"frontend {address} conflicts with service {owner}, which already owns it",
            obj=f"service {claimant}",
        )
        self.address = address
        self.owner = owner
        self.claimant = claimant


class ServiceNotFoundError(LBWriterError):
    """A frontend was given for a service that is not in the services table."""


class InvalidBackendError(LBWriterError, InputError):
    """A backend's parameters are invalid (port 0, weight, state); ``obj`` names it."""


class CheckedBackends(tuple[BackendParams, ...]):
    """Backends that passed `LBWriter.set_backends`' checks where they were made, so that
    it does not repeat them per backend: all of one source, each with a port (not 0), a
    weight of 0..65535 and a `BackendState`, at distinct addresses. Only code that made
    those checks builds one (the Kubernetes converter: converting an EndpointSlice makes
    them); any other iterable of backends is checked by the writer. A plain tuple
    otherwise (equality, hashing, size).
    """

    __slots__ = ()


class OrderedBackends(CheckedBackends):
    """`CheckedBackends` whose maker also found them in increasing address order, all of
    the first one's family and all serving the first one's port names: a new frontend
    that selects all of them then needs no check of the tuple's order
    (`LBWriter._given_selection`). A `CheckedBackends` everywhere else."""

    __slots__ = ()


class LBWriter:
    """Writes the LB tables in one transaction, keeping frontends' backends up to date."""

    def __init__(
        self,
        db: DB,
        config: LBConfig | None = None,
        *,
        services: Table[Service],
        frontends: Table[Frontend],
        backends: Table[Backend],
        node_addresses: Table[NodeAddress],
        origins: Table[Origin] | None = None,
    ) -> None:
        self.db = db
        #: Where each applied source object came from (tables/origins.py); the sources
        #: write it in the transactions of `write_txn`, which locks it when set.
        self.origins = origins
        self.config = config if config is not None else LBConfig()
        self.services = services
        self.frontends = frontends
        self.backends = backends
        self.node_addresses = node_addresses
        self._node_labels: dict[str, str] = {}
        self._node_ip: IPAddress | None = None
        # Frontends redirected to another service (rare): address -> target service.
        # A hint for refreshes only; the frontend row stays the truth.
        self._redirect_targets: dict[L3n4Addr, ServiceName] = {}
        self._touch: _Touched | None = None
        # Per service, a superset of the addresses of its committed frontend and backend
        # rows (see "per-service lookups"); built on first use.
        self._fe_hint: dict[ServiceName, _Addrs] | None = None
        self._be_hint: dict[ServiceName, _Hint] | None = None
        # Per service without frontends whose committed rows are the one-instance rows of
        # the `CheckedBackends` in its hint, exactly: that tuple (see `_fold_pure`).
        self._pure: dict[ServiceName, CheckedBackends] = {}
        self._pure_most = 0  # the most entries ``_pure`` held since it was last made

    @classmethod
    def create(cls, db: DB, config: LBConfig | None = None) -> LBWriter:
        """Create the four LB tables, register them with ``db`` and return a writer on them."""
        services = new_services_table()
        frontends = new_frontends_table()
        backends = new_backends_table()
        node_addresses = new_node_addresses_table()
        origins = new_origins_table()
        db.register(services, frontends, backends, node_addresses, origins)
        return cls(
            db,
            config,
            services=services,
            frontends=frontends,
            backends=backends,
            node_addresses=node_addresses,
            origins=origins,
        )

    @property
    def tables(self) -> tuple[Table[Any], ...]:
        """(services, frontends, backends, node_addresses)."""
        return (self.services, self.frontends, self.backends, self.node_addresses)

    @property
    def txn_tables(self) -> tuple[Table[Any], ...]:
        """What `write_txn` locks: the LB tables and, when kept, the origins table."""
        if self.origins is None:
            return self.tables
        return (*self.tables, self.origins)

    def write_txn(self) -> WriteTxn:
        """Open a write transaction locking all LB tables and the origins table (use as
        a context manager)."""
        return self.db.write_txn(*self.txn_tables)

    def register_initializer(self, txn: WriteTxn, name: str) -> Callable[[WriteTxn], None]:
        """Register initializer ``name`` on the services, frontends and backends tables; the
        returned function marks it done on all three (for a source's first full sync)."""
        tables = (self.services, self.frontends, self.backends)
        done = [t.register_initializer(txn, name) for t in tables]

        def finish(wtxn: WriteTxn) -> None:
            for d in done:
                d(wtxn)

        return finish

    @property
    def node_labels(self) -> dict[str, str]:
        """The local node's labels (from `set_node_labels`)."""
        return dict(self._node_labels)

    @property
    def node_ip(self) -> IPAddress | None:
        """The local node's IP (from `set_node_ip`), used for proxy-delegation locality."""
        return self._node_ip

    @property
    def node_zone(self) -> str:
        """The local node's zone (from `set_node_labels`), or ""."""
        return self._node_labels.get(ZONE_LABEL, "")

    # ----- services and frontends -------------------------------------------------
    def upsert_service(self, txn: WriteTxn, svc: Service) -> None:
        """Insert or replace a service row; its existing frontends are refreshed (Pending)
        unless the service is unchanged."""
        old = self.services.get(txn, svc.name)
        if old is not None and old == svc:
            return
        self.services.insert(txn, svc)
        self._refresh_service(txn, svc.name, force=True)

    def upsert_service_and_frontends(
        self, txn: WriteTxn, svc: Service, frontends: Iterable[FrontendParams]
    ) -> None:
        """Insert or replace a service and make ``frontends`` its complete frontend set.

        Frontends are written in address order. Frontends of the service not in
        ``frontends`` are deleted. When the service row is
        unchanged, only new or changed frontends are written (and marked Pending). Raises
        `FrontendConflictError` (before writing anything) when one of the addresses
        belongs to another service, and LBWriterError for a frontend naming another
        service or a duplicate address.
        """
        if (
            type(frontends) is tuple
            and len(frontends) == 1
            and frontends[0].type not in _SHADOWING_TYPES
        ):
            self.upsert_service_and_frontend(txn, svc, frontends[0])  # most services
            return
        # Written in address order, so the reconciler (which follows the change order) gives
        # one object's frontends their service ids in address order, as Cilium does.
        # Only LoadBalancer and ExternalIPs frontends can shadow a NodePort.
        params = [
            p
            for p in frontends
            if p.type not in _SHADOWING_TYPES or not self._shadows_node_port(txn, p)
        ]
        if len(params) > 1:
            params.sort(key=lambda p: p.address.key())
        seen: set[L3n4Addr] = set()
        # Each frontend's row as the txn sees it, for _put_frontend (in params' order).
        olds: list[Frontend | None] = []
        fe_get = self.frontends.get
        for p in params:
            if p.service_name != svc.name:
                raise LBWriterError(
                    f"frontend {p.address} names service {p.service_name}, expected {svc.name}"
                )
            if p.address in seen:
                raise LBWriterError(f"service {svc.name}: duplicate frontend {p.address}")
            seen.add(p.address)
            old = fe_get(txn, p.address)
            if old is not None and old.service_name != svc.name:
                raise FrontendConflictError(p.address, old.service_name, svc.name)
            olds.append(old)
        svc, unchanged = self._keep_or_insert_service(txn, svc)
        for fe in self._frontends_of(txn, svc.name):
            if fe.address not in seen:
                self._fe_del(txn, fe)
        # The deletions above touched none of params' addresses (those are in seen), so
        # olds still holds their rows as the txn sees them.
        for p, old in zip(params, olds, strict=True):
            self._put_frontend(txn, svc, p, force=not unchanged, old=old)

    def upsert_service_and_frontend(
        self, txn: WriteTxn, svc: Service, p: FrontendParams
    ) -> None:
        """``upsert_service_and_frontends(txn, svc, (p,))``: the same checks and writes,
        without the set and lists of several frontends (most services have one)."""
        if p.type in _SHADOWING_TYPES:
            self.upsert_service_and_frontends(txn, svc, [p])  # it may shadow a NodePort
            return
        name = svc.name
        address = p.address
        if p.service_name != name:
            raise LBWriterError(
                f"frontend {address} names service {p.service_name}, expected {name}"
            )
        old = self.frontends.get(txn, address)
        if old is not None and old.service_name != name:
            raise FrontendConflictError(address, old.service_name, name)
        svc, unchanged = self._keep_or_insert_service(txn, svc)
        t = self._touch
        if t is None or t.txn() is not txn:
            t = self._touched(txn)
        rows = t.frontends_of.get(name)
        if rows is None:
            hint = self._fe_hint
            if hint is None or name in hint:
                rows = self._load_frontends_of(txn, t, name)
            else:  # no committed frontend (a new service): `_load_frontends_of`'s {}
                rows = t.frontends_of[name] = {}
        if rows and (len(rows) > 1 or address not in rows):
            for a in sorted(rows):  # the others, in address order
                if a != address:
                    self._fe_del(txn, rows[a])
        if old is not None:
            self._put_frontend(txn, svc, p, force=not unchanged, old=old)
            return
        # `_put_frontend` of a new frontend, with `_fe_put`'s bookkeeping on ``rows``
        # (the service's frontends in ``t``, which the deletions above kept current).
        fe = self._new_frontend_row(txn, svc, p)
        rows[address] = fe
        self.frontends.insert(txn, fe)

    def _keep_or_insert_service(self, txn: WriteTxn, svc: Service) -> tuple[Service, bool]:
        """The Service row to write frontends against, and whether it was unchanged: an
        equal stored row is kept (frontends refer to it; only what changed is rewritten),
        else ``svc`` is inserted."""
        old_svc = self.services.get(txn, svc.name)
        if old_svc is not None and old_svc == svc:
            return old_svc, True
        self.services.insert(txn, svc)
        return svc, False

    def _shadows_node_port(self, txn: WriteTxn, p: FrontendParams) -> bool:
        """True for a LoadBalancer/ExternalIPs frontend on a node address with a port in the
        NodePort range: it would hide the NodePort expansion there, so it is skipped."""
        if p.type not in (SVCType.LOAD_BALANCER, SVCType.EXTERNAL_IPS):
            return False
        if not self.config.in_node_port_range(p.address.port):
            return False
        return any(n.address == p.address.address for n in self.node_addresses.all(txn))

    def delete_service_and_frontends(self, txn: WriteTxn, name: ServiceName) -> Service | None:
        """Delete a service and all its frontends (backends stay); return the old service."""
        old = self.services.get(txn, name)
        for fe in self._frontends_of(txn, name):
            self._fe_del(txn, fe)
        if old is not None:
            self.services.delete(txn, old)
        return old

    def upsert_frontend(self, txn: WriteTxn, params: FrontendParams) -> None:
        """Insert or update one frontend of an existing service (conflict-checked)."""
        svc = self.services.get(txn, params.service_name)
        if svc is None:
            raise ServiceNotFoundError(
                f"frontend {params.address}: service {params.service_name} does not exist"
            )
        old = self.frontends.get(txn, params.address)
        if old is not None and old.service_name != params.service_name:
            raise FrontendConflictError(params.address, old.service_name, params.service_name)
        self._put_frontend(txn, svc, params, force=True, old=old)

    def delete_frontend(self, txn: WriteTxn, address: L3n4Addr) -> Frontend | None:
        """Delete the frontend at ``address``; return it, or None."""
        old = self.frontends.get(txn, address)
        if old is not None:
            self._fe_del(txn, old)
        return old

    def set_redirect(
        self, txn: WriteTxn, address: L3n4Addr, redirect_to: ServiceName | None
    ) -> None:
        """Make the frontend at ``address`` take its backends from ``redirect_to`` (or stop)."""
        fe = self.frontends.get(txn, address)
        if fe is None:
            raise LBWriterError(f"frontend {address} does not exist")
        fe = dataclasses.replace(fe, redirect_to=redirect_to)
        if redirect_to is None:
            self._redirect_targets.pop(address, None)
        else:
            self._redirect_targets[address] = redirect_to
        self._fe_put(txn, fe.pending(backends=self.select_backends(txn, fe)))

    # ----- backends -------------------------------------------------------------------------
    def upsert_backends(
        self, txn: WriteTxn, service: ServiceName, backends: Iterable[BackendParams]
    ) -> None:
        """Add or update the instances of ``backends`` for ``service`` (keyed by each backend's
        address and source); other instances are left alone."""
        changed = False
        for params in backends:
            changed |= self._put_instance(txn, service, params)
        if changed:
            self._refresh_service(txn, service)

    def set_backends(
        self,
        txn: WriteTxn,
        service: ServiceName,
        source: str,
        backends: Iterable[BackendParams],
    ) -> None:
        """Make ``backends`` the complete set of ``service``'s instances from ``source``:
        instances from that source not listed are released.

        Each backend is checked (its source: LBWriterError; its port, weight and state:
        `InvalidBackendError`) unless ``backends`` is a `CheckedBackends`, whose maker
        checked them: then only its source is compared."""
        prio = source_priority(source)
        key = (service, prio)
        # The service's rows as this txn sees them (kept current by _be_put/_be_del).
        t = self._touched(txn)
        rows = t.backends_of.get(service)
        if rows is None:
            rows = self._load_backends_of(txn, t, service)
        if isinstance(backends, CheckedBackends):
            checked = True
            if backends and backends[0].source != source:
                _wrong_source(service, source, backends[0])
            if not rows:
                # The service's first backends (the usual case of a load): all new to it.
                self._set_first_backends(txn, t, key, backends, rows)
                return
            wanted = {params.address: params for params in backends}
        else:
            checked = False
            wanted = {}
            for params in backends:
                if params.source != source:
                    _wrong_source(service, source, params)
                wanted[params.address] = params
        changed = False
        gone = [a for a in rows if a not in wanted]
        for a in sorted(gone) if len(gone) > 1 else gone:
            row = rows[a]
            if row.has_instance(key):
                changed |= self._drop_instance(txn, row, key)
        single = Backend.single
        # Backends at addresses the service has no row at, written in runs by
        # `_write_new_backends` (in the order of ``wanted``, as one write each would be).
        new: list[Backend] = []
        for addr, params in wanted.items():
            # The service's own row, if any (a new address may still be another service's
            # row: `_write_new_backends` finds those as it writes).
            be = rows.get(addr)
            # `_validate_backend`'s checks on their usual outcome first (the port is the
            # address's bytes 16-17), the call (and its error) otherwise.
            valid = checked or (
                (addr[16] or addr[17])
                and type(params.state) is BackendState
                and 0 <= params.weight <= 65535
            )
            if be is None:
                # A new address of the service (the usual case of a load).
                if not valid:
                    if new:  # written before the error, as one write each would be
                        self._write_new_backends(txn, service, new)
                        new = []
                    _validate_backend(service, params)
                be = single(addr, key, params)
                rows[addr] = be
                new.append(be)
                continue
            if new:
                self._write_new_backends(txn, service, new)
                new = []
                changed = True
            if valid and be.is_only_instance(key, params):
                # The instance is there as given (what `_put_instance` finds unchanged):
                # nothing to write, the usual case for most endpoints of a changed slice.
                continue
            changed |= self._put_instance(txn, service, params, key)
        if new:
            self._write_new_backends(txn, service, new)
            changed = True
        if checked and rows and len(rows) == len(wanted):
            # The service's rows are exactly ``backends``' addresses (each has a row by
            # now, and there are no others): its hint and frontends may share the tuple.
            t.given[service] = backends  # type: ignore[assignment]
        elif t.given:
            # Rows were written above without `_be_put`: an earlier tuple no longer holds.
            t.given.pop(service, None)
        if changed:
            self._refresh_backends_users(txn, t, service)

    def _set_first_backends(
        self,
        txn: WriteTxn,
        t: _Touched,
        key: tuple[ServiceName, int],
        backends: CheckedBackends,
        rows: dict[L3n4Addr, Backend],
    ) -> None:
        """`set_backends` of a service that has no rows yet (``rows``: its empty rows in
        the txn): every one of ``backends`` is new to it."""
        if not backends:
            return
        service = key[0]
        addresses = list(map(_address, backends))
        fresh = single_backends(key, backends)
        rows.update(zip(addresses, fresh))
        self._write_new_backends(txn, service, fresh, addresses)
        # Its rows are exactly ``backends``' addresses (distinct: `CheckedBackends`).
        t.given[service] = backends
        t.fresh[service] = (backends, fresh)
        self._refresh_backends_users(txn, t, service)

    def _refresh_backends_users(self, txn: WriteTxn, t: _Touched, name: ServiceName) -> None:
        """`_refresh_service` after ``name``'s backends changed; nothing to look up when
        the service has no frontends (none in its hint nor in the txn's rows: the usual
        case of a service whose slice comes first) and no frontend is redirected to it."""
        assert self._fe_hint is not None  # built by _touched
        if (
            name in self._fe_hint
            or t.frontends_of.get(name)
            or name in self._redirect_targets.values()
        ):
            self._refresh_service(txn, name)

    def _write_new_backends(
        self,
        txn: WriteTxn,
        service: ServiceName,
        new: list[Backend],
        addresses: list[L3n4Addr] | tuple[()] = (),
    ) -> None:
        """Write ``new``: rows of one instance of ``service`` each, at addresses where the
        service has none (in its txn rows already; ``addresses``: theirs, when at hand).
        Those where no row exists are inserted as they are (one lookup each:
        `Table.insert_new`); where another service has a row, the instance is added to it
        (`_put_instance`)."""
        insert_new = self.backends.insert_new
        n = len(new)
        # An address is its own primary key.
        i = insert_new(txn, new, 0, addresses)
        while i < n:
            ((key, params),) = new[i].instances
            self._put_instance(txn, service, params, key)
            i = insert_new(txn, new, i + 1, addresses)

    def release_backends(
        self, txn: WriteTxn, service: ServiceName, source: str, addresses: Iterable[L3n4Addr]
    ) -> None:
        """Remove ``service``'s instances from ``source`` at ``addresses``."""
        prio = source_priority(source)
        changed = False
        for addr in addresses:
            be = self.backends.get(txn, addr)
            if be is not None:
                changed |= self._drop_instance(txn, be, (service, prio))
        if changed:
            self._refresh_service(txn, service)

    def release_backends_of_service(
        self, txn: WriteTxn, service: ServiceName, source: str | None = None
    ) -> None:
        """Remove every instance of ``service`` (only those from ``source`` when given)."""
        prio = None if source is None else source_priority(source)
        changed = False
        for be in self._backends_of(txn, service):
            for key, _ in be.instances:
                if key[0] == service and (prio is None or key[1] == prio):
                    cur = self.backends.get(txn, be.address)
                    if cur is not None:
                        changed |= self._drop_instance(txn, cur, key)
        if changed:
            self._refresh_service(txn, service)

    def release_backends_from_source(self, txn: WriteTxn, source: str) -> None:
        """Remove every instance from ``source``, of every service (e.g. a source resync)."""
        prio = source_priority(source)
        touched: set[ServiceName] = set()
        for be in list(self.backends.all(txn)):
            cur = be
            for key, _ in be.instances:
                if key[1] == prio:
                    self._drop_instance(txn, cur, key)
                    touched.add(key[0])
                    nxt = self.backends.get(txn, be.address)
                    if nxt is None:
                        break
                    cur = nxt
        for name in sorted(touched):
            self._refresh_service(txn, name)

    def set_backend_health(
        self,
        txn: WriteTxn,
        service: ServiceName,
        address: L3n4Addr,
        healthy: bool,
        now: float | None = None,
    ) -> bool:
        """Mark ``service``'s instances at ``address`` (un)healthy; return True if changed."""
        be = self.backends.get(txn, address)
        if be is None:
            return False
        new = be
        for key, inst in be.instances:
            # The first report counts even when it repeats the default (healthy): it tells
            # the LB ops that health is now known, which ends a quarantine restored from
            # the maps after a restart.
            if key[0] == service and (inst.unhealthy == healthy or not inst.unhealthy_updated_at):
                new = new.with_instance(
                    key,
                    dataclasses.replace(
                        inst,
                        unhealthy=not healthy,
                        unhealthy_updated_at=time.time() if now is None else now,
                    ),
                )
        if new is be:
            return False
        self._be_put(txn, new, be)
        self._refresh_service(txn, service)
        return True

    # ----- node addresses and labels -----------------------------------------------------------
    def upsert_node_address(self, txn: WriteTxn, addr: NodeAddress) -> None:
        """Insert or replace a node address; NodePort/HostPort and same-address frontends are
        marked Pending so their expansion (and wildcard entries) are refreshed."""
        old = self.node_addresses.get(txn, (addr.address, addr.device_name))
        if old == addr:
            return
        self.node_addresses.insert(txn, addr)
        self._refresh_for_node_address(txn, addr)

    def delete_node_address(self, txn: WriteTxn, addr: NodeAddress) -> None:
        """Delete a node address (by address and device) and refresh the affected frontends."""
        old = self.node_addresses.get(txn, (addr.address, addr.device_name))
        if old is None:
            return
        self.node_addresses.delete(txn, old)
        self._refresh_for_node_address(txn, old)

    def set_node_labels(self, txn: WriteTxn, labels: Mapping[str, str]) -> None:
        """Set the local node's labels (the zone drives topology-aware backend selection)."""
        old_zone = self.node_zone
        self._node_labels = dict(labels)
        if self.node_zone != old_zone:
            for svc in list(self.services.all(txn)):
                if svc.traffic_distribution == PREFER_SAME_ZONE:
                    self._refresh_service(txn, svc.name)

    def set_node_ip(self, txn: WriteTxn, ip: IPAddress | None) -> None:
        """Set the local node's IP: with proxy delegation, a backend without node name at
        this address counts as local."""
        if ip == self._node_ip:
            return
        self._node_ip = ip
        for svc in list(self.services.all(txn)):
            if svc.proxy_delegation:
                self._refresh_service(txn, svc.name)

    def is_local(self, svc: Service | None, be: BackendParams) -> bool:
        """True when ``be`` runs on this node (node name, or node IP with proxy delegation)."""
        if be.node_name:
            return be.node_name == self.config.node_name
        return (
            svc is not None
            and bool(svc.proxy_delegation)
            and self._node_ip is not None
            and be.address.address == self._node_ip
        )

    # ----- backend selection --------------------------------------------------------------------
    def select_backends(self, txn: WriteTxn, fe: Frontend) -> tuple[BackendParams, ...]:
        """Compute the backends ``fe`` selects now (see the module docstring for the rules)."""
        return self._select_backends(
            txn, fe.address, fe.type, fe.service_name, fe.port_name, fe.service, fe.redirect_to
        )

    def _select_backends(
        self,
        txn: WriteTxn,
        address: L3n4Addr,
        fe_type: SVCType,
        service_name: ServiceName,
        port_name: str,
        service: Service | None,
        redirect_to: ServiceName | None,
    ) -> tuple[BackendParams, ...]:
        """`select_backends` for a frontend given by its fields (one not built yet)."""
        name = redirect_to or service_name
        svc = service if redirect_to is None else self.services.get(txn, name)
        # The family is the address's last byte (4 or 6).
        family = address[20]
        # The service's rows by address (`_backends_of` without building the list): the
        # family is read from the key, not the row.
        t = self._touched(txn)
        rows = t.backends_of.get(name)
        if rows is None:
            rows = self._load_backends_of(txn, t, name)
        if not rows:
            return ()  # no candidates (the service's backends are yet to come)
        candidates = preferred_instances_of(rows, name, family, port_name)
        if svc is None:
            return tuple(candidates)
        if _policy_for(address, fe_type, svc) is TrafficPolicy.LOCAL:
            candidates = [b for b in candidates if self.is_local(svc, b)]
        distribution = svc.traffic_distribution
        if not distribution:
            return tuple(candidates)  # the usual case
        if distribution == PREFER_SAME_ZONE:
            zone = self.node_zone
            if zone and redirect_to is None:
                candidates = self._zone_backends(txn, name, candidates, zone)
        elif distribution == PREFER_SAME_NODE:
            # Only serving (active) local backends may win the preference.
            local = [
                b
                for b in candidates
                if self.is_local(svc, b) and b.effective_state is BackendState.ACTIVE
            ]
            if local:
                candidates = local
        return tuple(candidates)

    def _zone_backends(
        self, txn: WriteTxn, name: ServiceName, candidates: list[BackendParams], zone: str
    ) -> list[BackendParams]:
        """Topology-aware routing: the ``candidates`` (the frontend's backends so far) meant
        for ``zone``, by their EndpointSlice hints.

        * Safeguard: when a candidate that is not terminating has no zone hints, the hints
          are not usable and every candidate stays (terminating endpoints lose their hints
          and do not count).
        * The service has endpoints hinted for the zone, but none of them is usable by
          this frontend (another port name, not ready): every candidate stays rather than
          none.
        * Otherwise only the candidates hinted for the zone stay, and those without hints
          (terminating ones, which the datapath uses only as the last resort). When no
          endpoint of the service is hinted for the zone at all, that leaves none but the
          unhinted.
        """
        if any(not b.for_zones and b.state not in _TERMINATING for b in candidates):
            return candidates
        in_zone = [b for b in candidates if zone in b.for_zones]
        usable = [b for b in in_zone if b.effective_state is BackendState.ACTIVE]
        if not usable and self._zone_has_endpoints(txn, name, zone):
            return candidates
        return [b for b in candidates if not b.for_zones or zone in b.for_zones]

    def _zone_has_endpoints(self, txn: WriteTxn, name: ServiceName, zone: str) -> bool:
        """Whether any backend of service ``name`` (any port, family or state) is hinted
        for ``zone``."""
        for be in self._backends_of(txn, name):
            inst = be.instance(name)
            if inst is not None and zone in inst.for_zones:
                return True
        return False

    # ----- per-service lookups -----------------------------------------------------------------
    # The writer finds a service's frontends and backends through its own per-service
    # address hints rather than the tables' non-unique ``service`` indexes: querying those
    # needs statedb's ordered views, which cost about 1 KB per service and a fifth of a
    # bulk load's CPU to keep up to date (the indexes stay, for readers that query them).
    #
    # A hint (``_fe_hint``/``_be_hint``: service name -> tuple of addresses) is a superset
    # of the addresses of the service's committed rows. A transaction's rows of the
    # services it read are folded into the hints when the writer sees the next
    # transaction (the one before is finished by then: both lock the LB tables): the
    # addresses of the rows as it left them, plus those it removed that the committed
    # tables still have (it was aborted). An address written by an aborted transaction
    # stays until its service is next read: then every hinted address is re-read through
    # the primary key (a hash lookup that sees the transaction's writes) and only rows of
    # the service count. That first read of a service in a transaction always comes
    # before the writer writes any of its rows, so it sees the committed rows. All writes
    # that add LB rows must go through the writer for the hints to hold.
    #
    # A hint of one address is that address (no tuple). A backend hint may be the
    # `CheckedBackends` a source last gave `set_backends` for the service, when the
    # service's rows are exactly those addresses (``_Touched.given``): the source keeps
    # that tuple anyway, and a frontend that selects all of them in that order stores the
    # same tuple as its ``backends`` (`_shared_backends`): one tuple of a service's
    # backends instead of three.
    def _touched(self, txn: WriteTxn) -> _Touched:
        t = self._touch
        if t is None or t.txn() is not txn:
            if self._fe_hint is None or self._be_hint is None:
                self._build_hints()
            elif t is not None:
                base = self.db.read_txn()
                fe_get, be_get = self.frontends.get, self.backends.get

                def fe_there(name: ServiceName, a: L3n4Addr) -> bool:
                    f = fe_get(base, a)
                    return f is not None and f.service_name == name

                def be_there(name: ServiceName, a: L3n4Addr) -> bool:
                    b = be_get(base, a)
                    return b is not None and b.instance(name) is not None

                _fold(self._fe_hint, t.frontends_of, t.frontends_gone, fe_there)
                _fold(self._be_hint, t.backends_of, t.backends_gone, be_there, t.given)
                self._fold_pure(t, base)
            t = _Touched(txn)
            self._touch = t
        return t

    def _fold_pure(self, t: _Touched, base: ReadTxn) -> None:
        """Fold a finished transaction into ``_pure`` (``base``: the committed tables): a
        service it read or wrote loses its entry; one whose rows it made from its given
        backends, and left so, gets that tuple when it has no frontends and the
        transaction was committed."""
        pure = self._pure
        if pure:
            for name in t.backends_of:
                pure.pop(name, None)
            for name in t.frontends_of:
                pure.pop(name, None)
            if len(pure) * 4 < self._pure_most:
                # A dict's table does not shrink as it empties: a copy is the size it needs
                # (the services remembered during a load are forgotten as they come).
                self._pure = pure = dict(pure)
                self._pure_most = len(pure)
        if not t.fresh:
            return
        if len(pure) >= _PURE_MAX:
            pure.clear()  # services whose frontends never came: they select the usual way
        fe_hint, be_hint = self._fe_hint, self._be_hint
        assert fe_hint is not None and be_hint is not None
        given_of = t.given
        committed: bool | None = None
        for name, (given, fresh) in t.fresh.items():
            rows = t.backends_of[name]
            if (
                given_of.get(name) is given
                and be_hint.get(name) is given
                and name not in fe_hint
                and len(rows) == len(fresh)
                and all(map(operator.is_, rows.values(), fresh))
            ):
                if committed is None:
                    # The transaction's rows are all committed or none is: an aborted
                    # one's rows are never the committed ones (each is a new object).
                    first = fresh[0]
                    committed = self.backends.get(base, given[0].address) is first
                if not committed:
                    return
                pure[name] = given
        self._pure_most = max(self._pure_most, len(pure))

    def _build_hints(self) -> None:
        """The hints from the committed tables (the writer's first transaction)."""
        base = self.db.read_txn()
        fe_hint: dict[ServiceName, list[L3n4Addr]] = {}
        for f in self.frontends.all(base):
            fe_hint.setdefault(f.service_name, []).append(f.address)
        be_hint: dict[ServiceName, list[L3n4Addr]] = {}
        for b in self.backends.all(base):
            for k in b.instance_keys():
                be_hint.setdefault(k[0], []).append(b.address)
        self._fe_hint = {name: _hint_of(addrs) for name, addrs in fe_hint.items()}
        self._be_hint = {name: _hint_of(addrs) for name, addrs in be_hint.items()}

    def _backends_of(self, txn: WriteTxn, name: ServiceName) -> list[Backend]:
        """The backends with an instance for ``name`` (as the txn sees them), by address."""
        t = self._touched(txn)
        rows = t.backends_of.get(name)
        if rows is None:
            rows = self._load_backends_of(txn, t, name)
        return [rows[a] for a in sorted(rows)]

    def _load_backends_of(
        self, txn: WriteTxn, t: _Touched, name: ServiceName
    ) -> dict[L3n4Addr, Backend]:
        """Read ``name``'s backends once per transaction; ``_be_put``/``_be_del`` keep the
        result current for the rest of it."""
        assert self._be_hint is not None
        hinted = self._be_hint.get(name)
        if hinted:
            addrs: Any = hinted
            if isinstance(hinted, CheckedBackends):
                addrs = list(map(_address, hinted))
            elif type(hinted) is not tuple:
                addrs = (hinted,)
            rows = rows_of_service(addrs, self.backends.get_many(txn, addrs), name)
            if isinstance(hinted, CheckedBackends) and len(rows) == len(hinted):
                # Still exactly the service's rows: the hint stays the given tuple.
                t.given[name] = hinted
        else:
            rows = {}
        t.backends_of[name] = rows
        return rows

    def _frontends_of(self, txn: WriteTxn, name: ServiceName) -> list[Frontend]:
        """The frontends of service ``name`` (as the txn sees them), by address."""
        t = self._touched(txn)
        rows = t.frontends_of.get(name)
        if rows is None:
            rows = self._load_frontends_of(txn, t, name)
        return [rows[a] for a in sorted(rows)] if len(rows) > 1 else list(rows.values())

    def _load_frontends_of(
        self, txn: WriteTxn, t: _Touched, name: ServiceName
    ) -> dict[L3n4Addr, Frontend]:
        """Read ``name``'s frontends once per transaction (kept current by ``_fe_put`` and
        ``_fe_del``)."""
        rows: dict[L3n4Addr, Frontend] = {}
        assert self._fe_hint is not None
        hinted = self._fe_hint.get(name)
        if hinted:
            get = self.frontends.get
            # Frontend hints are addresses (one, or a tuple of them).
            addrs: Any = hinted if type(hinted) is tuple else (hinted,)
            for a in addrs:
                f = get(txn, a)
                if f is not None and f.service_name == name:
                    rows[a] = f
        t.frontends_of[name] = rows
        return rows

    def _fe_put(self, txn: WriteTxn, fe: Frontend) -> None:
        t = self._touched(txn)
        name = fe.service_name
        rows = t.frontends_of.get(name)
        if rows is None:
            rows = self._load_frontends_of(txn, t, name)
        rows[fe.address] = fe
        self.frontends.insert(txn, fe)

    def _fe_del(self, txn: WriteTxn, fe: Frontend) -> None:
        t = self._touched(txn)
        name = fe.service_name
        rows = t.frontends_of.get(name)
        if rows is None:
            rows = self._load_frontends_of(txn, t, name)
        if rows.pop(fe.address, None) is not None:
            _gone(t.frontends_gone, name, fe.address)
        self.frontends.delete(txn, fe)

    def _be_put(self, txn: WriteTxn, be: Backend, old: Backend | None = None) -> None:
        """Write ``be``, which replaces ``old`` (the row as the txn saw it, when any)."""
        t = self._touched(txn)
        cached = t.backends_of
        given = t.given
        addr = be.address
        for key in be.instance_keys():
            name = key[0]
            rows = cached.get(name)
            if rows is None:
                rows = self._load_backends_of(txn, t, name)
            rows[addr] = be
            if given:
                given.pop(name, None)
        if old is not None and len(old.instances) > len(be.instances):
            for key in old.instance_keys():
                if be.instance(key[0]) is None:
                    self._instance_removed(txn, t, key[0], addr)
        self.backends.insert(txn, be)

    def _be_del(self, txn: WriteTxn, be: Backend) -> None:
        t = self._touched(txn)
        for key in be.instance_keys():
            self._instance_removed(txn, t, key[0], be.address)
        self.backends.delete(txn, be)

    def _instance_removed(
        self, txn: WriteTxn, t: _Touched, name: ServiceName, addr: L3n4Addr
    ) -> None:
        """Service ``name`` lost the backend at ``addr``: drop it from the txn's rows of the
        service (its hint keeps the address until the service is next read)."""
        rows = t.backends_of.get(name)
        if rows is None:
            rows = self._load_backends_of(txn, t, name)
        if rows.pop(addr, None) is not None:
            _gone(t.backends_gone, name, addr)
            t.given.pop(name, None)

    # ----- internals ----------------------------------------------------------------------------
    def _put_frontend(
        self,
        txn: WriteTxn,
        svc: Service,
        p: FrontendParams,
        *,
        force: bool,
        old: Frontend | None,
    ) -> None:
        """Write the frontend of ``p`` (``old``: its row as the txn sees it, or None)."""
        if old is None:
            self._fe_put(txn, self._new_frontend_row(txn, svc, p))
            return
        fe = dataclasses.replace(
            old,
            type=p.type,
            port_name=p.port_name,
            service_port=p.service_port,
            service=svc,
        )
        bes = self.select_backends(txn, fe)
        if (
            not force
            and old.params == fe.params
            and old.backends == bes
            and old.service is svc
        ):
            return
        if bes:
            bes = self._shared_backends(fe.redirect_to or fe.service_name, bes)
        self._fe_put(txn, fe.pending_with(svc, bes))

    def _new_frontend_row(self, txn: WriteTxn, svc: Service, p: FrontendParams) -> Frontend:
        """The row of a new frontend ``p`` of ``svc``: Pending, built once with the
        backends it selects."""
        given = self._given_selection(txn, svc, p)
        if given is not None:
            bes: tuple[BackendParams, ...] = given
        else:
            bes = self._select_backends(
                txn, p.address, p.type, p.service_name, p.port_name, svc, None
            )
            if bes:
                bes = self._shared_backends(p.service_name, bes)
        return new_frontend(
            p.address, p.type, p.service_name, p.port_name, p.service_port, svc, bes, 0,
            None, status_pending(),
        )

    def _given_selection(
        self, txn: WriteTxn, svc: Service, p: FrontendParams
    ) -> CheckedBackends | None:
        """The backends a new frontend ``p`` of ``svc`` selects when they are all of the
        `CheckedBackends` its source gave last (this transaction's, or the one in the
        service's hint), as that very tuple; None when the frontend may select otherwise
        (a traffic policy, distribution or filter that drops some, other rows), which
        the caller then finds out the usual way.

        When a service comes after its EndpointSlice (the usual order of a load), its
        frontend selects every backend the slice gave: this checks that on the rows at
        the tuple's addresses, without building the candidate list and comparing it
        with the tuple (`_select_backends`, `_shared_backends`)."""
        if svc.traffic_distribution or (
            _policy_for(p.address, p.type, svc) is _LOCAL
        ):
            return None
        name = p.service_name
        t = self._touched(txn)
        given = t.given.get(name)
        if given is not None:
            # Exactly the service's rows as this transaction left them.
            addrs = list(map(_address, given))
            found = list(map(t.backends_of[name].__getitem__, addrs))
        elif name in t.backends_of:
            return None  # rows read or written in this transaction, not the given ones
        else:
            # Nothing of the service written in this transaction: its rows are the
            # committed ones, whose addresses its hint holds (all of them).
            assert self._be_hint is not None
            given = self._be_hint.get(name)  # type: ignore[assignment]
            if not isinstance(given, CheckedBackends) or not given:
                return None
            if self._pure.get(name) is given:
                # The committed rows are ``given``'s one-instance rows (`_fold_pure`): it
                # selects them all when they are in order and serve the frontend.
                if type(given) is OrderedBackends:
                    # In order, of the first one's family and port names (its maker's word).
                    first = given[0]
                    if first.address[20] == p.address[20] and (
                        not p.port_name or p.port_name in first.port_names
                    ):
                        return given
                elif given_in_order(given, p.address[20], p.port_name):
                    return given
                return None
            addrs = list(map(_address, given))
            found = self.backends.get_many(txn, addrs)
        if selects_all_of(found, given, addrs, name, p.address[20], p.port_name):
            return given
        return None

    def _refresh_service(self, txn: WriteTxn, name: ServiceName, *, force: bool = False) -> None:
        """Recompute the backends of ``name``'s frontends (and of frontends redirected to it);
        re-mark those whose input changed (all of them when ``force``)."""
        svc = self.services.get(txn, name)
        fes = self._frontends_of(txn, name)
        if svc is not None:
            for fe in fes:
                self._refresh_frontend(txn, fe, svc, force)
        if name in self._redirect_targets.values():
            for addr, target in list(self._redirect_targets.items()):
                rfe = self.frontends.get(txn, addr)
                if target == name and rfe is not None and rfe.redirect_to == name and rfe.service:
                    self._refresh_frontend(txn, rfe, rfe.service, force)

    def _refresh_frontend(self, txn: WriteTxn, fe: Frontend, svc: Service, force: bool) -> None:
        cur = fe.copy_with(service=svc) if fe.service is not svc else fe
        bes = self.select_backends(txn, cur)
        if not force and bes == fe.backends and fe.service is svc:
            return
        if bes:
            bes = self._shared_backends(fe.redirect_to or fe.service_name, bes)
        self._fe_put(txn, fe.pending_with(svc, bes))

    def _shared_backends(
        self, name: ServiceName, bes: tuple[BackendParams, ...]
    ) -> tuple[BackendParams, ...]:
        """``bes`` (a frontend's backends from ``name``, just selected in the current
        transaction), or the equal `CheckedBackends` the service's source gave (this
        transaction's, or the one in its hint): the frontend row then shares the tuple
        the source and the hint keep."""
        assert self._touch is not None  # made current by the selection
        given = self._touch.given.get(name)
        if given is None:
            assert self._be_hint is not None
            given = self._be_hint.get(name)  # type: ignore[assignment]
            if not isinstance(given, CheckedBackends):
                return bes
        # The same objects in the same order (compared by identity in C) as a rule; the
        # first item tells most other cases apart without calling its ``__eq__``.
        if len(bes) == len(given) and bes[0] is given[0] and bes == given:
            return given
        return bes

    def _refresh_for_node_address(self, txn: WriteTxn, addr: NodeAddress) -> None:
        for fe in list(self.frontends.all(txn)):
            if fe.type in (SVCType.NODE_PORT, SVCType.HOST_PORT) or fe.address.address == (
                addr.address
            ):
                self._fe_put(txn, fe.pending())

    def _put_instance(
        self,
        txn: WriteTxn,
        service: ServiceName,
        params: BackendParams,
        key: tuple[str, int] | None = None,
    ) -> bool:
        """Set ``service``'s instance ``params``; ``key`` is its instance key when the caller
        has it (one tuple shared by a service's backends instead of one per backend)."""
        _validate_backend(service, params)
        if key is None or key[1] != source_priority(params.source):
            key = (service, source_priority(params.source))
        be = self.backends.get(txn, params.address)
        if be is None:
            self._be_put(txn, Backend.single(params.address, key, params))
            return True
        for k, inst in be.instances:
            if k == key and inst == params:
                return False
        self._be_put(txn, be.with_instance(key, params), be)
        return True

    def _drop_instance(self, txn: WriteTxn, be: Backend, key: tuple[str, int]) -> bool:
        if not any(k == key for k, _ in be.instances):
            return False
        new = be.without_instance(key)
        if new.instances:
            self._be_put(txn, new, be)
        else:
            self._be_del(txn, be)
        return True


class _Touched:
    """The rows of the services the writer read or wrote in one write transaction."""

    __slots__ = ("backends_gone", "backends_of", "fresh", "frontends_gone", "frontends_of",
                 "given", "txn")

    def __init__(self, txn: WriteTxn) -> None:
        # Weak: a finished transaction holds its tables' states, and so every row
        # version written since (the reconciler's statuses), until the next one.
        self.txn = weakref.ref(txn)
        # Per service, its rows by address as this txn sees them, once read (kept current
        # by the writer's _fe_*/_be_* helpers): later lookups in the txn need no re-read.
        self.frontends_of: dict[ServiceName, dict[L3n4Addr, Frontend]] = {}
        self.backends_of: dict[ServiceName, dict[L3n4Addr, Backend]] = {}
        # Per service, the addresses whose rows this txn removed from it (kept in the
        # service's hint: the txn may be aborted).
        self.frontends_gone: dict[ServiceName, set[L3n4Addr]] = {}
        self.backends_gone: dict[ServiceName, set[L3n4Addr]] = {}
        # Per service, the `CheckedBackends` whose addresses are exactly its rows' in
        # ``backends_of`` (set by `LBWriter.set_backends`; dropped when a row is added
        # to or removed from the service after it).
        self.given: dict[ServiceName, CheckedBackends] = {}
        # Per service whose first backends this txn wrote (`LBWriter._set_first_backends`),
        # the given tuple and the one-instance rows made of it, in its order.
        self.fresh: dict[ServiceName, tuple[CheckedBackends, list[Backend]]] = {}


def _gone(gone: dict[ServiceName, set[L3n4Addr]], name: ServiceName, addr: L3n4Addr) -> None:
    addrs = gone.get(name)
    if addrs is None:
        gone[name] = {addr}
    else:
        addrs.add(addr)


def _fold(
    hint: dict[ServiceName, Any],
    rows_of: dict[ServiceName, dict[L3n4Addr, Any]],
    gone: dict[ServiceName, set[L3n4Addr]],
    still_there: Callable[[ServiceName, L3n4Addr], bool],
    given: Mapping[ServiceName, CheckedBackends] | None = None,
) -> None:
    """Fold a finished transaction's rows into the hints: per service it read, the
    addresses of its rows as the transaction left them, plus those it removed whose rows
    the committed tables still have for the service (``still_there``: the transaction was
    aborted). The result is a superset of the committed rows whether the transaction was
    committed or aborted: before it, the service's hint held every address of its
    committed rows, and the transaction's rows were read through that hint. A service's
    ``given`` backends (exactly its rows' addresses) stand for its rows."""
    if not gone:
        # Nothing removed (a load): a service's given tuple, else its rows' addresses.
        given_of = given if given else _NO_GIVEN
        for name, rows in rows_of.items():
            kept = given_of.get(name)
            if kept:
                hint[name] = kept
            elif len(rows) == 1:
                for a in rows:
                    hint[name] = a
            elif rows:
                hint[name] = tuple(rows)
            else:
                hint.pop(name, None)
        return
    for name, rows in rows_of.items():
        removed = gone.get(name)
        extra = (
            tuple([a for a in removed if a not in rows and still_there(name, a)])
            if removed
            else ()
        )
        kept = given.get(name) if given else None
        if kept and not extra:
            hint[name] = kept
            continue
        addrs = tuple(rows) + extra if extra else tuple(rows)
        if addrs:
            hint[name] = addrs[0] if len(addrs) == 1 else addrs
        else:
            hint.pop(name, None)


#: `_fold`'s given tuples when it has none.
_NO_GIVEN: Mapping[ServiceName, CheckedBackends] = {}

#: A service's frontend hint: one address or a tuple of them.
_Addrs = L3n4Addr | tuple[L3n4Addr, ...]
#: A service's backend hint: one address, a tuple of them, or the `CheckedBackends`
#: whose addresses they are.
_Hint = _Addrs | CheckedBackends


def _hint_of(addrs: Iterable[L3n4Addr]) -> _Addrs:
    """The hint of ``addrs`` (at least one): the address itself when there is one."""
    t = tuple(addrs)
    return t[0] if len(t) == 1 else t


#: `LBWriter._pure` is cleared when it reaches this size (it bounds the memory kept for
#: services whose backends came and whose frontends never did).
_PURE_MAX = 1 << 16

#: A backend's address (``BackendParams.address``), read in C.
_address = operator.attrgetter("address")


def _policy_for(address: L3n4Addr, fe_type: SVCType, svc: Service) -> TrafficPolicy:
    """The traffic policy governing a frontend at ``address`` of type ``fe_type``: internal
    for ClusterIP and /i frontends."""
    internal = svc.int_traffic_policy
    if internal is svc.ext_traffic_policy:  # the usual case: one policy either way
        return internal
    if address.scope == SCOPE_INTERNAL or not fe_type.is_external:
        return internal
    return svc.ext_traffic_policy


def _validate_backend(service: ServiceName, p: BackendParams) -> None:
    if p.address.port == 0:
        problem = "port 0 is not allowed"
    elif not 0 <= p.weight <= 65535:
        problem = f"invalid weight {p.weight}"
    elif not isinstance(p.state, BackendState):
        problem = f"invalid state {p.state!r}"
    else:
        return
    raise InvalidBackendError(problem, obj=f"backend {p.address} of service {service}")


def _wrong_source(service: ServiceName, source: str, p: BackendParams) -> NoReturn:
    raise LBWriterError(
        f"backend {p.address} of service {service}: source {p.source!r} "
        f"given to set_backends for source {source!r}"
    )
