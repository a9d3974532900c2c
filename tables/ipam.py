"""IPAM: this node's pod addresses, allocated and released per owner, persisted atomically.

The node's pod CIDRs (IPv4 and/or IPv6) come from configuration (``IPAMConfig``) or, as in
Cilium's Kubernetes host-scope mode, from the Node's ``spec.podCIDRs``: then IPAM starts
*pending* (``IPAMConfig.pending`` says what it waits for; nothing is handed out,
`IPAMNotReadyError`) and `IPAM.set_pod_cidrs` gives it the CIDRs once the Node is known
(sources/k8s_node_cidrs.py). A later change of the CIDRs keeps every existing allocation
(its owner still uses it; `IPAM.outside_pod_cidrs` lists those outside the new CIDRs) and
hands out new addresses from the new CIDRs only. Which addresses of a CIDR are handed out
follows Cilium's host-scope allocator (Kubernetes' ``ipallocator.NewCIDRRange``):

* IPv4: the network address and the broadcast address are never handed out;
* IPv6: the network address (the subnet-router anycast address) is never handed out, and
  only the first 65,536 addresses of a larger prefix are used (the allocator's limit);
* the router address (Cilium's ``cilium_host`` address) is allocated at start, once per
  family, to the owner ``"router"``, from the pool like any other address; it survives
  restarts like any other allocation, but follows the pod CIDRs: one outside today's
  CIDRs is released and a new one allocated from them (at start, or when the Node's
  CIDRs change), so the gateway handed out is always inside the pod CIDRs.

Every allocation is a row of the ``ipam`` table (address -> owner). Every change is
written to ``<state_dir>/ipam.json`` (tables.state_dir: temporary file, fsync, rename)
inside the table's write transaction and *before* it commits: an allocation that a caller
saw has always been persisted, so a restarted agent never hands the same address out
again. If the write fails the transaction aborts and the caller gets the error.

``allocate_next`` continues after the last address it handed out (wrapping around), so a
released address is not immediately reused (as host-local and Cilium's allocator avoid).
"""

from __future__ import annotations

import ipaddress
import logging
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from statedb import DB, Index, ReadTxn, Table, WriteTxn
from statedb import keys as keycodec
from statedb.errors import InputError, StatewrightError
from tables.l3n4 import IPAddress, IPNetwork
from tables.state_dir import StateDirError, read_json, write_json_atomic

log = logging.getLogger("statewright.ipam")

IPAM_TABLE = "ipam"
STATE_FILE = "ipam.json"
ROUTER_OWNER = "router"
#: The most addresses of one IPv6 CIDR that are used (Cilium's host-scope limit).
IPV6_RANGE_LIMIT = 65536
STATE_VERSION = 1


class IPAMError(StatewrightError):
    """An IPAM operation that failed; ``http_status`` is what the API answers with."""

    http_status = 500


class IPAMRequestError(InputError, IPAMError):
    """A bad request: an address that is malformed, outside the pod CIDRs or never handed
    out (network, broadcast), or a family without a pod CIDR. Changes nothing."""

    http_status = 400


class IPAMNotReadyError(IPAMError):
    """IPAM has no pod CIDRs yet (it waits for the Node's ``spec.podCIDRs``): nothing is
    handed out until then. Changes nothing."""

    http_status = 503


class AddressInUseError(IPAMError):
    """The requested address is allocated to another owner."""

    http_status = 409

    def __init__(self, ip: IPAddress, owner: str, requested_by: str) -> None:
        super().__init__(
            f"ipam: {ip} is already allocated to {owner!r} (requested by {requested_by!r})"
        )
        self.ip = ip
        self.owner = owner


class PoolExhaustedError(IPAMError):
    """No free address is left in the family's pod CIDRs."""

    http_status = 503

    def __init__(self, family: int, cidrs: Sequence[IPNetwork], owner: str) -> None:
        where = ", ".join(str(c) for c in cidrs)
        super().__init__(f"ipam: no free IPv{family} address in {where} (for {owner!r})")
        self.family = family


class NotAllocatedError(IPAMError):
    """Release of an address that is not allocated (or not to the given owner)."""

    http_status = 404

    def __init__(self, ip: IPAddress, detail: str = "is not allocated") -> None:
        super().__init__(f"ipam: {ip} {detail}")
        self.ip = ip


@dataclass(frozen=True, slots=True)
class Allocation:
    """One allocated address and who holds it."""

    ip: IPAddress
    owner: str

    @property
    def family(self) -> int:
        """4 or 6."""
        return self.ip.version

    def to_json(self) -> dict[str, Any]:
        """JSON form (API, CLI, ``db show``)."""
        return {"ip": str(self.ip), "owner": self.owner, "family": self.family}

    @staticmethod
    def table_header() -> list[str]:
        """Columns of ``db show ipam``."""
        return ["IP", "Owner"]

    def table_row(self) -> list[str]:
        """Cells of ``db show ipam``."""
        return [str(self.ip), self.owner]


#: Primary index: the address.
ipam_ip_index: Index[Allocation, IPAddress] = Index(
    "ip",
    key=lambda a: a.ip,
    encode=keycodec.ip_address,
    parse=ipaddress.ip_address,
)
#: Secondary index: the owner (one owner may hold an address of each family, or more).
ipam_owner_index: Index[Allocation, str] = Index(
    "owner", key=lambda a: a.owner, encode=keycodec.string, unique=False
)


def new_ipam_table() -> Table[Allocation]:
    """A new, unregistered ``ipam`` table."""
    return Table(IPAM_TABLE, ipam_ip_index, ipam_owner_index, row_type=Allocation)


def parse_cidr(text: str) -> IPNetwork:
    """A pod CIDR from configuration; IPAMRequestError when it is not one."""
    try:
        net = ipaddress.ip_network(text, strict=True)
    except ValueError as e:
        raise IPAMRequestError(f"ipam: pod CIDR {text!r}: {e}") from None
    if net.version == 4 and net.prefixlen > 30:
        raise IPAMRequestError(f"ipam: pod CIDR {text}: too small (at most /30 for IPv4)")
    if net.version == 6 and net.prefixlen > 126:
        raise IPAMRequestError(f"ipam: pod CIDR {text}: too small (at most /126 for IPv6)")
    return net


def parse_address(text: str) -> IPAddress:
    """An address from a request; IPAMRequestError when it is not one."""
    if not isinstance(text, str):
        raise IPAMRequestError(f"ipam: address must be a string, got {text!r}")
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        raise IPAMRequestError(f"ipam: {text!r} is not an IP address") from None


def _parse_state(doc: Mapping[str, Any]) -> tuple[list[tuple[IPAddress, str]], dict[str, int]]:
    """Allocations and cursors of a version-1 state document; ValueError or TypeError
    when a field has the wrong shape."""
    allocations = doc.get("allocations", {})
    cursors = doc.get("cursors", {})
    if not isinstance(allocations, dict) or not isinstance(cursors, dict):
        raise ValueError("allocations and cursors must be objects")
    out: list[tuple[IPAddress, str]] = []
    for ip_text, owner in sorted(allocations.items()):
        if not isinstance(owner, str):
            raise ValueError(f"allocation {ip_text}: owner {owner!r} is not a string")
        out.append((ipaddress.ip_address(ip_text), owner))
    parsed_cursors: dict[str, int] = {}
    for k, v in cursors.items():
        if not isinstance(v, int) or isinstance(v, bool):
            raise ValueError(f"cursor {k}: {v!r} is not an integer")
        parsed_cursors[str(k)] = v
    return out, parsed_cursors


def pod_cidrs_of_node(node: Any) -> tuple[str, ...]:
    """The pod CIDRs of a Kubernetes Node object (a mapping as the API returns it):
    ``spec.podCIDRs``, else ``spec.podCIDR``; IPAMRequestError naming the node when
    there are none or one is not a CIDR (Cilium's Kubernetes IPAM mode waits for them)."""
    meta = node.get("metadata", {}) if isinstance(node, Mapping) else {}
    name = f"Node {meta.get('name', '?')}"
    spec = node.get("spec", {}) if isinstance(node, Mapping) else {}
    cidrs = spec.get("podCIDRs") or ([spec["podCIDR"]] if spec.get("podCIDR") else [])
    if not isinstance(cidrs, list) or not cidrs:
        raise IPAMRequestError("has no pod CIDRs", obj=name, field="spec.podCIDRs")
    for i, c in enumerate(cidrs):
        if not isinstance(c, str):
            raise IPAMRequestError(f"{c!r} is not a CIDR", obj=name, field=f"spec.podCIDRs[{i}]")
        try:
            parse_cidr(c)
        except IPAMRequestError as e:
            raise IPAMRequestError(e.message, obj=name, field=f"spec.podCIDRs[{i}]") from None
    return tuple(cidrs)


@dataclass(frozen=True, slots=True)
class IPAMConfig:
    """The node's pod CIDRs, where state is kept, and whether to reserve router addresses.

    ``pending``: not empty when the pod CIDRs are not known yet, saying what IPAM waits
    for (e.g. "the Node's spec.podCIDRs"); `IPAM.set_pod_cidrs` ends it."""

    pod_cidrs: tuple[IPNetwork, ...] = ()
    state_dir: str | None = None
    reserve_router: bool = True
    pending: str = ""

    @classmethod
    def parse(
        cls, cidrs: Iterable[str], state_dir: str | None = None, reserve_router: bool = True
    ) -> IPAMConfig:
        """From configuration strings; IPAMRequestError naming a bad or overlapping CIDR."""
        nets = [parse_cidr(c) for c in cidrs]
        for i, a in enumerate(nets):
            for b in nets[i + 1 :]:
                if a.version == b.version and a.overlaps(b):
                    raise IPAMRequestError(f"ipam: pod CIDRs {a} and {b} overlap")
        return cls(tuple(nets), state_dir, reserve_router)


@dataclass(frozen=True, slots=True)
class _Range:
    """The addresses of one CIDR that may be handed out: ``first..last`` (integers)."""

    cidr: IPNetwork
    first: int
    last: int

    @classmethod
    def of(cls, cidr: IPNetwork) -> _Range:
        base = int(cidr.network_address)
        size = cidr.num_addresses
        if cidr.version == 4:
            return cls(cidr, base + 1, base + size - 2)  # no network, no broadcast
        return cls(cidr, base + 1, base + min(size, IPV6_RANGE_LIMIT) - 1)

    def contains(self, value: int) -> bool:
        return self.first <= value <= self.last

    def size(self) -> int:
        return self.last - self.first + 1


@dataclass
class IPAM:
    """The node's address allocator over the ``ipam`` table (see the module doc).

    Thread-safe: every operation runs in a write transaction of the table, which holds
    the table's lock, and persists before committing."""

    db: DB
    config: IPAMConfig
    table: Table[Allocation] = field(default_factory=new_ipam_table)
    _cursor: dict[str, int] = field(default_factory=dict)
    #: Set by `restore` when the state file was unreadable and set aside ("" otherwise):
    #: the endpoints component reports it in its health.
    state_error: str = ""

    def __post_init__(self) -> None:
        if self.table not in self.db.tables:
            self.db.register(self.table)
        self._ranges = [_Range.of(c) for c in self.config.pod_cidrs]

    @property
    def pending(self) -> str:
        """What IPAM waits for before it hands out addresses ("" when it has its CIDRs)."""
        return self.config.pending

    def check_ready(self) -> None:
        """IPAMNotReadyError while the pod CIDRs are not known (`pending`)."""
        if self.config.pending:
            raise IPAMNotReadyError(
                f"ipam: no pod CIDRs yet (waiting for {self.config.pending}); "
                "no address is handed out until then"
            )

    # ----- start ------------------------------------------------------------------------------
    @property
    def state_path(self) -> str | None:
        """``<state_dir>/ipam.json``, or None when nothing is persisted."""
        if self.config.state_dir is None:
            return None
        return os.path.join(self.config.state_dir, STATE_FILE)

    def restore(self, reserve_router: bool = True) -> int:
        """Load the persisted allocations into the table (before anything is allocated),
        then reserve the router addresses (unless ``reserve_router`` is False: the agent
        reserves them with `reserve_routers` after the restored endpoints claimed their
        addresses); returns how many allocations were restored.
        Allocations outside today's pod CIDRs are kept (their owners still hold them) and
        logged; they are never handed out again while held."""
        restored = 0
        path = self.state_path
        state = self._read_state(path) if path is not None else None
        with self.db.write_txn(self.table) as txn:
            if state is not None:
                allocations, cursors = state
                for ip, owner in allocations:
                    if self._range_of(ip) is None and not self.config.pending:
                        log.warning(
                            "ipam: restored %s (owner %s) is outside the pod CIDRs %s",
                            ip,
                            owner,
                            ", ".join(str(c) for c in self.config.pod_cidrs) or "(none)",
                        )
                    self.table.insert(txn, Allocation(ip, owner))
                    restored += 1
                self._cursor = cursors
            if reserve_router:
                self._reserve_routers(txn)
            self._persist(txn)
        if restored:
            log.info("ipam: restored %d allocation(s) from %s", restored, path)
        return restored

    def _read_state(
        self, path: str
    ) -> tuple[list[tuple[IPAddress, str]], dict[str, int]] | None:
        """The allocations and cursors in the state file, or None when there is none.

        A file of an unknown version is an IPAMError (a newer agent wrote it; nothing is
        touched), and so is one that cannot be read at all (a StateDirError). A file that
        does not parse is set aside as ``ipam.json.corrupt-<time>``
        (its bytes kept for inspection) and IPAM starts empty: the endpoints' own state
        files then claim their addresses again (`EndpointManager.restore`), and
        `state_error` says so for the agent's health."""
        try:
            doc = read_json(path)
            if doc is None:
                return None
            if not isinstance(doc, dict):
                raise ValueError(f"expected an object, got {type(doc).__name__}")
            if doc.get("version") != STATE_VERSION:
                raise IPAMError(
                    f"ipam: state file {path}: version {doc.get('version')!r}, "
                    f"want {STATE_VERSION}"
                )
            return _parse_state(doc)
        except StateDirError as e:
            if not isinstance(e.__cause__, ValueError):
                raise  # not readable (permissions, I/O, not a file): not ours to move
            reason = str(e)
        except (ValueError, TypeError) as e:
            reason = f"state file {path}: {e}"
        aside = f"{path}.corrupt-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}"
        try:
            os.replace(path, aside)
        except OSError as e:
            raise StateDirError(path, f"unreadable ({reason}) and cannot be set aside: {e}") from e
        self.state_error = (
            f"ipam: {reason}; set aside as {os.path.basename(aside)}, allocations rebuilt "
            "from the endpoints' state files (addresses held by other owners are forgotten)"
        )
        log.error("%s", self.state_error)
        return None

    def set_pod_cidrs(self, cidrs: Iterable[str]) -> list[Allocation]:
        """Hand out addresses from ``cidrs`` from now on (ends `pending`), reserving a
        router address for a family that has none; returns the existing allocations outside
        the new CIDRs, which are kept (their owners still use them) and logged.
        IPAMRequestError for a bad or overlapping CIDR (nothing changes)."""
        parsed = IPAMConfig.parse(cidrs, self.config.state_dir, self.config.reserve_router)
        with self.db.write_txn(self.table) as txn:
            previous, ranges, cursor = self.config, self._ranges, dict(self._cursor)
            self.config = parsed
            self._ranges = [_Range.of(c) for c in parsed.pod_cidrs]
            try:
                added = self._reserve_routers(txn)
                if added:
                    self._persist(txn)
            except BaseException:
                # The transaction aborts: so do the new CIDRs and the cursors' moves.
                self.config, self._ranges, self._cursor = previous, ranges, cursor
                raise
            kept = [a for a in self.table.all(txn) if self._range_of(a.ip) is None]
        if previous.pod_cidrs != parsed.pod_cidrs or previous.pending:
            log.info(
                "ipam: pod CIDRs %s (were %s)",
                ", ".join(str(c) for c in parsed.pod_cidrs),
                ", ".join(str(c) for c in previous.pod_cidrs) or f"pending: {previous.pending}",
            )
        for a in kept:
            log.warning(
                "ipam: %s (owner %s) is outside the pod CIDRs %s; kept until released",
                a.ip,
                a.owner,
                ", ".join(str(c) for c in parsed.pod_cidrs),
            )
        return kept

    def outside_pod_cidrs(self, txn: ReadTxn | None = None) -> list[Allocation]:
        """Allocations outside today's pod CIDRs (restored, or from before a change of the
        CIDRs): kept until their owners release them."""
        if self.config.pending:
            return []
        rows = self.table.all(txn or self.db.read_txn())
        return [a for a in rows if self._range_of(a.ip) is None]

    def reserve_routers(self) -> None:
        """Allocate a router address per family where none is held (configuration allowing)."""
        with self.db.write_txn(self.table) as txn:
            if self._reserve_routers(txn):
                self._persist(txn)

    def _reserve_routers(self, txn: WriteTxn) -> bool:
        """Make the router addresses follow the pod CIDRs: a router address outside them
        (the CIDRs changed across a restart or on the Node) is released and a new one is
        allocated from today's CIDRs, as is one for a family that has none. Whether
        anything changed (the caller persists)."""
        if not self.config.reserve_router or self.config.pending:
            return False  # pending: no CIDRs to compare with yet (the Node brings them)
        changed = False
        for a in list(self.table.list(txn, ipam_owner_index.query(ROUTER_OWNER))):
            if self._range_of(a.ip) is None:
                self.table.delete(txn, a)
                changed = True
                log.warning(
                    "ipam: router address %s is outside the pod CIDRs %s; released (pods "
                    "keeping addresses outside them keep it as their gateway until they are "
                    "recreated)",
                    a.ip,
                    ", ".join(str(c) for c in self.config.pod_cidrs) or "(none)",
                )
        for family in self.families():
            if self.router(txn, family) is None:
                ip = self._allocate_next(txn, family, ROUTER_OWNER)
                changed = True
                log.info("ipam: router address %s", ip)
        return changed

    # ----- queries ----------------------------------------------------------------------------
    def families(self) -> list[int]:
        """The families with a pod CIDR, in order (4 before 6)."""
        return sorted({c.version for c in self.config.pod_cidrs})

    def cidrs(self, family: int) -> list[IPNetwork]:
        """The pod CIDRs of ``family``."""
        return [c for c in self.config.pod_cidrs if c.version == family]

    def router(self, txn: ReadTxn, family: int) -> IPAddress | None:
        """The router address of ``family`` (owner ``router``), if allocated."""
        for a in self.table.list(txn, ipam_owner_index.query(ROUTER_OWNER)):
            if a.family == family:
                return a.ip
        return None

    def owner_of(self, txn: ReadTxn, ip: IPAddress) -> str | None:
        """Who holds ``ip``, or None."""
        a = self.table.get(txn, ipam_ip_index.query(ip))
        return None if a is None else a.owner

    def allocations(self, txn: ReadTxn | None = None) -> list[Allocation]:
        """Every allocation, in address order."""
        return list(self.table.all(txn or self.db.read_txn()))

    def by_owner(self, owner: str, txn: ReadTxn | None = None) -> list[Allocation]:
        """The allocations of ``owner``."""
        return list(self.table.list(txn or self.db.read_txn(), ipam_owner_index.query(owner)))

    def status(self) -> dict[str, Any]:
        """Pools and usage, for the API and CLI."""
        txn = self.db.read_txn()
        used: dict[str, int] = {str(r.cidr): 0 for r in self._ranges}
        for a in self.table.all(txn):
            r = self._range_of(a.ip)
            if r is not None:
                used[str(r.cidr)] += 1
        return {
            "pending": self.config.pending,
            "pools": [
                {"cidr": str(r.cidr), "size": r.size(), "used": used[str(r.cidr)]}
                for r in self._ranges
            ],
            "router": {f"ipv{f}": str(ip) for f in self.families() if (ip := self.router(txn, f))},
            "allocations": [a.to_json() for a in self.table.all(txn)],
        }

    # ----- changes ----------------------------------------------------------------------------
    def allocate_next(self, family: int, owner: str) -> IPAddress:
        """The next free address of ``family`` for ``owner`` (persisted before it returns)."""
        self._check_owner(owner)
        self.check_ready()
        cursor = dict(self._cursor)
        try:
            with self.db.write_txn(self.table) as txn:
                ip = self._allocate_next(txn, family, owner)
                self._persist(txn)
        except BaseException:
            self._cursor = cursor  # the transaction aborted: so does the cursor's move
            raise
        return ip

    def allocate(self, ip: IPAddress | str, owner: str) -> IPAddress:
        """Allocate the requested ``ip`` to ``owner``. Idempotent for the same owner;
        AddressInUseError when another owner holds it; IPAMRequestError when it is not
        an address this node hands out."""
        self._check_owner(owner)
        addr = parse_address(ip) if isinstance(ip, str) else ip
        self.check_ready()
        self._check_allocatable(addr)
        with self.db.write_txn(self.table) as txn:
            held = self.table.get(txn, ipam_ip_index.query(addr))
            if held is not None:
                if held.owner != owner:
                    raise AddressInUseError(addr, held.owner, owner)
                return addr
            self.table.insert(txn, Allocation(addr, owner))
            self._persist(txn)
        return addr

    def release(self, ip: IPAddress | str, owner: str | None = None) -> Allocation:
        """Release ``ip`` (only if ``owner`` holds it, when given); returns what was held.
        NotAllocatedError when it is not allocated (or held by someone else);
        IPAMRequestError for the router address unless ``owner`` is ``"router"``."""
        addr = parse_address(ip) if isinstance(ip, str) else ip
        with self.db.write_txn(self.table) as txn:
            held = self.table.get(txn, ipam_ip_index.query(addr))
            if held is None:
                raise NotAllocatedError(addr)
            if owner is not None and held.owner != owner:
                raise NotAllocatedError(addr, f"is allocated to {held.owner!r}, not {owner!r}")
            if held.owner == ROUTER_OWNER and owner != ROUTER_OWNER:
                raise IPAMRequestError(
                    f"ipam: {addr} is this node's router address; it is not released"
                )
            self.table.delete(txn, held)
            self._persist(txn)
        return held

    def release_owner(self, owner: str) -> list[Allocation]:
        """Release every address ``owner`` holds (idempotent); returns them."""
        with self.db.write_txn(self.table) as txn:
            held = list(self.table.list(txn, ipam_owner_index.query(owner)))
            for a in held:
                self.table.delete(txn, a)
            if held:
                self._persist(txn)
        return held

    # ----- internals --------------------------------------------------------------------------
    @staticmethod
    def _check_owner(owner: str) -> None:
        if not isinstance(owner, str) or not owner:
            raise IPAMRequestError(f"ipam: owner must be a non-empty string, got {owner!r}")

    def _range_of(self, ip: IPAddress) -> _Range | None:
        value = int(ip)
        for r in self._ranges:
            if r.cidr.version == ip.version and r.contains(value):
                return r
        return None

    def _check_allocatable(self, ip: IPAddress) -> None:
        if self._range_of(ip) is not None:
            return
        for c in self.config.pod_cidrs:
            if ip in c:
                raise IPAMRequestError(
                    f"ipam: {ip} is reserved in pod CIDR {c} (network, broadcast or beyond "
                    "the allocator's range) and is never handed out"
                )
        cidrs = ", ".join(str(c) for c in self.config.pod_cidrs) or "(none configured)"
        raise IPAMRequestError(f"ipam: {ip} is not in this node's pod CIDRs {cidrs}")

    def _allocate_next(self, txn: WriteTxn, family: int, owner: str) -> IPAddress:
        if family not in (4, 6):
            raise IPAMRequestError(f"ipam: family must be 4 or 6, got {family!r}")
        ranges = [r for r in self._ranges if r.cidr.version == family]
        if not ranges:
            raise IPAMRequestError(f"ipam: IPv{family} has no pod CIDR on this node")
        make = ipaddress.IPv4Address if family == 4 else ipaddress.IPv6Address
        for r in ranges:
            key = str(r.cidr)
            last = self._cursor.get(key, r.first - 1)
            start = last + 1 if r.first <= last + 1 <= r.last else r.first
            value = start
            for _ in range(r.size()):
                ip = make(value)
                if self.table.get(txn, ipam_ip_index.query(ip)) is None:
                    self.table.insert(txn, Allocation(ip, owner))
                    self._cursor[key] = value
                    return ip
                value = value + 1 if value < r.last else r.first
        raise PoolExhaustedError(family, [r.cidr for r in ranges], owner)

    def _persist(self, txn: WriteTxn) -> None:
        """Write the table as it is in ``txn`` (not yet committed) to the state file."""
        path = self.state_path
        if path is None:
            return
        doc = {
            "version": STATE_VERSION,
            "allocations": {str(a.ip): a.owner for a in self.table.all(txn)},
            "cursors": dict(self._cursor),
        }
        write_json_atomic(path, doc)
