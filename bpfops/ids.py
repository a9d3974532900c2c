"""Service and backend id allocation: next-fit with wrap-around, plus restore from pinned maps.

Cilium hands out load-balancer ids by walking forward from the id after the last one
given out and wrapping around at the end of the range. A freed id is therefore not
reused until the walk comes back to it, which keeps a stale datapath reference (a
conntrack entry naming an old rev-NAT id, say) from pointing at a new, unrelated
service for as long as possible. Service ids double as rev-NAT ids, so they live in
``[1, 0xFFFF)``; backend ids in ``[1, 0xFFFFFFFF)`` (0 means "no backend" in the
datapath).

Restoring: after a restart the ids found in the pinned maps are *reserved* for the
addresses that held them (``reserve``), so nobody else can take them, and the walk
resumes after the highest one. The first frontend or backend with that address
*claims* its old id (``claim_restored``); ``release_unclaimed`` drops the reservations
nobody claimed (prune calls it once the tables are initialized).

Exhaustion: once every id of the range is taken, ``acquire`` raises `IDExhaustedError`
after one comparison (the number of taken ids is known), and the error names the
allocator as the exhausted resource (``available``: how many ids are free), so a
reconciler parks the object until an id is released instead of retrying it on a timer
(reconciler/waiting.py). A walk over a nearly full range skips whole blocks of taken ids
(a count per block of `BLOCK` ids), so finding the one free id costs at most about
``span / BLOCK + 2 * BLOCK`` probes, not ``span``.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from typing import Generic, Protocol, TypeVar

from reconciler.waiting import ResourceExhaustedError

A = TypeVar("A", bound=Hashable)

FIRST_SERVICE_ID = 1
SERVICE_ID_LIMIT = 0xFFFF  # exclusive; rev-NAT ids are __be16 and 0 is invalid
FIRST_BACKEND_ID = 1
BACKEND_ID_LIMIT = 0xFFFFFFFF  # exclusive
#: Ids per block of the walk's skip counts (a power of two).
BLOCK_SHIFT = 8
BLOCK = 1 << BLOCK_SHIFT


class IDExhaustedError(ResourceExhaustedError, RuntimeError):
    """No free id is left in the allocator's range; ``resource`` is the allocator."""


class Holders(Protocol[A]):
    """Where an allocator records which address holds which id (``addr_to_id``): a dict
    by default, or a view of a user's own per-address records (see `IDAllocator`)."""

    def get(self, addr: A, /) -> int | None:
        """The id ``addr`` holds, or None."""
        ...

    def __setitem__(self, addr: A, id_: int, /) -> None:
        """``addr`` now holds ``id_``."""
        ...

    def update(self, held: Iterable[tuple[A, int]], /) -> None:
        """Each address of ``held`` now holds its id (`__setitem__` of each)."""
        ...

    def pop(self, addr: A, default: None, /) -> int | None:
        """``addr`` no longer holds its id; return the id (``default``: it held none)."""
        ...

    def clear(self) -> None:
        """No address holds an id any more."""
        ...

    def values(self) -> Iterable[int]:
        """The ids held."""
        ...

    def items(self) -> Iterable[tuple[A, int]]:
        """Each address holding an id, with its id."""
        ...

    def __len__(self) -> int:
        """How many addresses hold an id."""
        ...


class IDAllocator(Generic[A]):
    """Maps addresses to ids from ``[first, limit)``, next-fit with wrap-around.

    An id may have several owners: an address that holds it (``addr_to_id``) and
    restored addresses that merely reserve it. It is free once it has no owner.

    ``id_to_owners`` (id -> owners) is complete only once the walk has wrapped around
    (``indexed``). Until then every id at or above ``next_id`` is free, since ids are
    handed out in increasing order and reservations move ``next_id`` past themselves, so
    an id handed out needs no entry there: it lists only the ids that were reserved
    (restore) and whoever owns them. At the first wrap-around (or a reservation of an id
    below ``next_id`` while some are held) the index is completed from the holders and
    kept for every id from then on (until `reset`). Not indexing saves a dict entry per
    held id: about 50 bytes per backend of a 100,000-backend node.

    ``holders``: a user that keeps a record per address holding an id anyway (the LB
    Ops' backend states) can pass a view of those records as ``addr_to_id`` instead of
    the allocator's own dict, saving a dict entry per address. The view reads each
    address's id from its record; the user then creates the record, with the id, for
    every id `acquire` or `acquire_run` returns (`acquire_run` does not tell the view),
    and drops it only after `release` (or `reset`).

    Once indexed, ``block_taken`` counts the taken ids of each block of `BLOCK` ids (only
    blocks with any), so the walk skips a full block at once; ``probes`` counts the ids
    the walks examined (a measure of the work, for tests and benchmarks).
    """

    __slots__ = (
        "addr_to_id",
        "block_taken",
        "first",
        "id_to_owners",
        "indexed",
        "limit",
        "name",
        "next_id",
        "own_holders",
        "probes",
        "restored",
    )

    def __init__(
        self, name: str, first: int, limit: int, holders: Holders[A] | None = None
    ) -> None:
        if not 0 <= first < limit:
            raise ValueError(f"{name} id range [{first}, {limit}) is empty")
        self.name = name
        self.first = first
        self.limit = limit
        self.next_id = first
        # Owners per id: the owner itself when it is the only one (almost always), else a
        # tuple of them (a set per id cost about 200 bytes more for each service and
        # backend, a one-owner tuple 56). A tuple owner is always kept inside a tuple.
        self.id_to_owners: dict[int, A | tuple[A, ...]] = {}
        # Whether id_to_owners lists every held id (see the class docstring).
        self.indexed = False
        own: dict[A, int] = {}
        self.addr_to_id: Holders[A] = own if holders is None else holders
        #: Whether ``addr_to_id`` is the allocator's own dict (not a user's view, whose
        #: user records every id handed out: `acquire_run` does not tell the view).
        self.own_holders = holders is None
        self.restored: dict[A, int] = {}
        self.block_taken: dict[int, int] = {}
        self.probes = 0

    @property
    def unit(self) -> str:
        """What one id is, for health ("service id"): the allocator is a
        `reconciler.waiting.Resource`."""
        return f"{self.name} id"

    @property
    def span(self) -> int:
        """How many ids the range has."""
        return self.limit - self.first

    def available(self) -> int:
        """How many ids `acquire` can hand out now: exact once the walk has reached the
        end of the range (only then can it run out; the index is completed here if it
        just did); before, the ids the walk has not reached yet (a lower bound)."""
        if not self.indexed and self.next_id >= self.limit:
            self._index_all()
        if self.indexed:
            return self.span - len(self.id_to_owners)
        return self.limit - self.next_id

    def __len__(self) -> int:
        return len(self.addr_to_id)

    def lookup(self, addr: A) -> int | None:
        """The id ``addr`` holds, or None."""
        return self.addr_to_id.get(addr)

    def owner_of(self, id_: int) -> A | None:
        """The address holding ``id_`` (reservations do not count), or None.

        A held id missing from the index (before the walk wrapped around) is found by a
        scan of the holders; a reserved id's holder is among its owners (whoever claimed
        it), so `claim_restored` never scans.
        """
        for owner in self._owners(id_):
            if self.addr_to_id.get(owner) == id_:
                return owner
        if not self.indexed and id_ not in self.id_to_owners:
            for addr, held in self.addr_to_id.items():
                if held == id_:
                    return addr
        return None

    def _owners(self, id_: int) -> tuple[A, ...]:
        owners = self.id_to_owners.get(id_)
        if owners is None:
            return ()
        if type(owners) is tuple:
            return owners
        return (owners,)  # type: ignore[return-value]

    def is_taken(self, id_: int) -> bool:
        """Whether ``id_`` is held or reserved (before the first wrap-around, a held id
        that was never reserved takes a scan of the holders)."""
        if id_ in self.id_to_owners:
            return True
        return not self.indexed and id_ < self.next_id and id_ in set(self.addr_to_id.values())

    def _index_all(self) -> None:
        """Complete ``id_to_owners`` with every held id (at the first wrap-around)."""
        if self.indexed:
            return
        for addr, id_ in list(self.addr_to_id.items()):
            self._own(addr, id_)
        self.indexed = True
        counts: dict[int, int] = {}
        for id_ in self.id_to_owners:
            b = id_ >> BLOCK_SHIFT
            counts[b] = counts.get(b, 0) + 1
        self.block_taken = counts

    def _block_capacity(self, block: int) -> int:
        """How many ids of the range block ``block`` holds (the first and last may be
        partial)."""
        lo = max(self.first, block << BLOCK_SHIFT)
        hi = min(self.limit, (block + 1) << BLOCK_SHIFT)
        return hi - lo

    def _taken(self, id_: int) -> None:
        """``id_`` just got its first owner: count it in its block (once indexed)."""
        if self.indexed:
            b = id_ >> BLOCK_SHIFT
            self.block_taken[b] = self.block_taken.get(b, 0) + 1

    def _freed(self, id_: int) -> None:
        """``id_`` just lost its last owner: uncount it (once indexed)."""
        if self.indexed:
            b = id_ >> BLOCK_SHIFT
            left = self.block_taken[b] - 1
            if left:
                self.block_taken[b] = left
            else:
                del self.block_taken[b]

    def _own(self, addr: A, id_: int) -> None:
        if id_ not in self.id_to_owners:
            self.id_to_owners[id_] = addr if type(addr) is not tuple else (addr,)
            self._taken(id_)
            return
        owners = self._owners(id_)
        if addr not in owners:
            self.id_to_owners[id_] = (*owners, addr)

    def _disown(self, addr: A, id_: int) -> None:
        owners = self._owners(id_)
        if addr not in owners:
            return
        rest = tuple(o for o in owners if o != addr)
        if len(rest) > 1:
            self.id_to_owners[id_] = rest
        elif rest:
            self.id_to_owners[id_] = rest[0] if type(rest[0]) is not tuple else rest
        else:
            del self.id_to_owners[id_]
            self._freed(id_)

    def acquire(self, addr: A) -> int:
        """The id of ``addr``: its current one, its restored one, or the next free one.

        Raises IDExhaustedError naming the allocator when the range is full, at the cost
        of one comparison.
        """
        current = self.addr_to_id.get(addr)
        if current is not None:
            return current
        if self.restored:
            restored = self.claim_restored(addr)
            if restored is not None:
                return restored
        candidate = self.next_id
        owners = self.id_to_owners
        if not self.indexed and candidate < self.limit and candidate not in owners:
            # Free: nothing at or above next_id is taken before the first wrap-around.
            self.probes += 1
            self.addr_to_id[addr] = candidate
            self.next_id = candidate + 1
            return candidate
        self._index_all()
        if len(owners) >= self.span:
            self.probes += 1
            raise IDExhaustedError(
                f"no free {self.name} id: all {self.span} ids in [{self.first}, "
                f"{self.limit}) are in use",
                self,
            )
        candidate = self._walk(candidate)
        owners[candidate] = addr if type(addr) is not tuple else (addr,)
        self._taken(candidate)
        self.addr_to_id[addr] = candidate
        self.next_id = candidate + 1
        return candidate

    def acquire_run(self, addrs: list[A]) -> range | None:
        """Ids for ``addrs``, addresses that hold none (the caller knows), as `acquire`
        would give them one after the other, when that is one run from ``next_id`` on:
        nothing restored to claim and the walk not wrapped around yet (every id at or
        above ``next_id`` is free, see the class docstring). None when that does not
        hold (nothing is acquired then: `acquire` each address instead)."""
        start = self.next_id
        end = start + len(addrs)
        if self.restored or self.indexed or end > self.limit:
            return None
        ids = range(start, end)
        if self.own_holders:
            self.addr_to_id.update(zip(addrs, ids))
        self.probes += len(addrs)
        self.next_id = end
        return ids

    def _walk(self, candidate: int) -> int:
        """The first free id from ``candidate`` on, wrapping around; one must be free.
        A block whose ids are all taken is skipped at once."""
        owners, blocks = self.id_to_owners, self.block_taken
        first, limit = self.first, self.limit
        probes = 0
        while True:
            if candidate >= limit:
                candidate = first
            probes += 1
            if candidate not in owners:
                self.probes += probes
                return candidate
            b = candidate >> BLOCK_SHIFT
            if blocks.get(b, 0) >= self._block_capacity(b):
                candidate = (b + 1) << BLOCK_SHIFT
            else:
                candidate += 1

    def release(self, addr: A) -> int | None:
        """Give up the id ``addr`` holds (it becomes free once no one else owns it)."""
        id_ = self.addr_to_id.pop(addr, None)
        if id_ is not None:
            self._disown(addr, id_)
        return id_

    # -- restore -----------------------------------------------------------------

    def reserve(self, addr: A, id_: int) -> None:
        """Reserve ``id_`` for ``addr`` (found in the maps after a restart)."""
        if not self.first <= id_ < self.limit:
            return
        if not self.indexed and id_ < self.next_id and len(self.addr_to_id):
            # The id may be held by an address the partial index does not list; the
            # reservation must see that holder (a restore reserves before anyone holds).
            self._index_all()
        self.restored[addr] = id_
        self._own(addr, id_)
        self.next_id = max(self.next_id, id_ + 1)
        if self.next_id >= self.limit:
            self._index_all()  # the walk starts over among taken ids
            self.next_id = self.first

    def claim_restored(self, addr: A) -> int | None:
        """Turn ``addr``'s reservation into its id; None when it has none."""
        id_ = self.restored.pop(addr, None)
        if id_ is None:
            return None
        holder = self.owner_of(id_)
        if holder is not None and holder != addr:
            # Another address already holds it (e.g. restored protocol aliases): give up.
            self._disown(addr, id_)
            return None
        self.addr_to_id[addr] = id_
        return id_

    def release_unclaimed(self) -> int:
        """Drop every reservation not claimed yet; returns how many."""
        n = 0
        for addr, id_ in list(self.restored.items()):
            if self.addr_to_id.get(addr) != id_:
                self._disown(addr, id_)
            n += 1
        self.restored.clear()
        return n

    def reset(self) -> None:
        """Forget everything (used before restoring from the maps again)."""
        self.next_id = self.first
        self.id_to_owners.clear()
        self.block_taken = {}
        self.indexed = False
        self.addr_to_id.clear()
        self.restored.clear()
