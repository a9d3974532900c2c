"""BackendStates: FrontendOps' record of each backends-map entry, one int per backend.

Per backend address the ops need the entry's id, how many frontends reference it, the
value last written (its "want", see `frontend_state.want_of`) and what the frontends
referencing it want. That is one int in one dict, 32 bytes for the usual active backend
(a slotted object per backend would take 88 bytes and its id int 32 more), in four
fields:

* bits 0-31: the backend id;
* bits 32-55: the reference count (frontends holding the entry; at most one per service
  id, so below 2**16);
* bits 56-88: the one want, when exactly one frontend wants the entry, else ``NONE``;
* bits 89-121: the want last written to the backends map, ``NONE`` before the first.

``NONE`` is ``2**32``: wants fit 32 bits, so it never equals one. The fields with the
usual value zero (an active backend of cluster 0 in no zone) are the high ones, which
keeps the int small.

What each frontend wants is kept by the frontend itself (``_FrontendState.backends``
maps each backend address to that frontend's want, None for none yet), and passed in as
``prev`` where a want changes. When several frontends want an entry, its wants are
counted by value in ``shared`` (want -> how many frontends want it): the entry holds the
smallest, the "most alive" value.

The class is also the backend id allocator's record of which address holds which id
(``bpfops.ids.Holders``): the ops add an address's state right after ``acquire`` gave it
its id, and remove it right after ``release``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from bpfops.model import Addr

ID_MASK = 0xFFFFFFFF
REF_SHIFT = 32
REF_MASK = 0xFFFFFF
REF_ONE = 1 << REF_SHIFT
WANT_SHIFT = 56
WRITTEN_SHIFT = 89
FIELD_MASK = (1 << 33) - 1
#: A want or written field holding no value.
NONE = 1 << 32
#: The fields below ``written``.
BELOW_WRITTEN = (1 << WRITTEN_SHIFT) - 1
#: Everything but the want field.
NOT_WANT = ~(FIELD_MASK << WANT_SHIFT)
#: A new entry's fields beside its id: no reference, no want, not written.
NEW_ENTRY = (NONE << WANT_SHIFT) | (NONE << WRITTEN_SHIFT)


def written_of(packed: int) -> int | None:
    """The want last written (None: not written yet)."""
    w = packed >> WRITTEN_SHIFT
    return None if w == NONE else w


def with_written(packed: int, written: int | None) -> int:
    """``packed`` with its written field set to ``written`` (None: not written)."""
    return (packed & BELOW_WRITTEN) | ((NONE if written is None else written) << WRITTEN_SHIFT)


def with_want(packed: int, want: int) -> int:
    """``packed`` with its one-want field set to ``want`` (``NONE``: zero or several)."""
    return (packed & NOT_WANT) | (want << WANT_SHIFT)


class BackendStates:
    """The per-backend state of `FrontendOps`: address -> packed int, plus the counted
    wants of entries several frontends want (see the module docstring)."""

    __slots__ = ("packed", "shared")

    def __init__(self) -> None:
        self.packed: dict[Addr, int] = {}
        self.shared: dict[Addr, dict[int, int]] = {}

    # -- the id allocator's holders ----------------------------------------------------

    def get(self, addr: Addr, /) -> int | None:
        """The id of the backend at ``addr`` (None: no state)."""
        v = self.packed.get(addr)
        return None if v is None else v & ID_MASK

    def __setitem__(self, addr: Addr, id_: int, /) -> None:
        """Nothing to record: the ops `add` the state with ``id_``."""

    def update(self, held: Iterable[tuple[Addr, int]], /) -> None:
        """Nothing to record: the ops `add` the states with the ids."""

    def pop(self, addr: Addr, default: None, /) -> int | None:
        """The id of the backend at ``addr``, whose state the ops `remove` next."""
        v = self.packed.get(addr)
        return default if v is None else v & ID_MASK

    def clear(self) -> None:
        """Nothing to clear: the ops call `reset` with the allocator's reset."""

    def values(self) -> list[int]:
        """The ids held."""
        return [v & ID_MASK for v in self.packed.values()]

    def items(self) -> list[tuple[Addr, int]]:
        """Each backend address with its id."""
        return [(a, v & ID_MASK) for a, v in self.packed.items()]

    def __len__(self) -> int:
        return len(self.packed)

    def __iter__(self) -> Iterator[Addr]:
        return iter(self.packed)

    def __contains__(self, addr: object) -> bool:
        return addr in self.packed

    # -- the states --------------------------------------------------------------------

    def add(self, addr: Addr, id_: int) -> int:
        """Record a new entry for ``addr`` with ``id_`` (no reference, want, nor write);
        return its packed state."""
        v = id_ | NEW_ENTRY
        self.packed[addr] = v
        return v

    def remove(self, addr: Addr) -> None:
        """Forget the entry of ``addr``."""
        del self.packed[addr]
        self.shared.pop(addr, None)

    def reset(self) -> None:
        """Forget every entry."""
        self.packed.clear()
        self.shared.clear()

    def id(self, addr: Addr) -> int:
        """The id of the entry of ``addr`` (KeyError: none)."""
        return self.packed[addr] & ID_MASK

    def refcount(self, addr: Addr) -> int:
        """How many frontends reference the entry."""
        return (self.packed[addr] >> REF_SHIFT) & REF_MASK

    def unreferenced(self) -> list[Addr]:
        """The addresses whose entry no frontend references (one pass over the states,
        the field read inline: a prune at 60,000 services looks at 600,000 of them)."""
        shift, mask = REF_SHIFT, REF_MASK
        return [a for a, v in self.packed.items() if not (v >> shift) & mask]

    def set_refcount(self, addr: Addr, n: int) -> None:
        """Set the reference count."""
        if not 0 <= n <= REF_MASK:
            raise ValueError(f"backend {addr}: reference count {n} out of range")
        v = self.packed[addr]
        self.packed[addr] = (v & ~(REF_MASK << REF_SHIFT)) | (n << REF_SHIFT)

    def written(self, addr: Addr) -> int | None:
        """The want last written to the backends map (None: not written)."""
        return written_of(self.packed[addr])

    def set_written(self, addr: Addr, written: int | None) -> None:
        """Record the want last written (None: not written)."""
        self.packed[addr] = with_written(self.packed[addr], written)

    def is_shared(self, addr: Addr) -> bool:
        """Whether several frontends want the entry."""
        return addr in self.shared

    def has_wants(self, addr: Addr) -> bool:
        """Whether any frontend wants the entry."""
        return (self.packed[addr] >> WANT_SHIFT) & FIELD_MASK != NONE or addr in self.shared

    def effective(self, addr: Addr) -> int:
        """The want the entry should hold: the smallest (call only when `has_wants`)."""
        wants = self.shared.get(addr)
        if wants is not None:
            return min(wants)
        return (self.packed[addr] >> WANT_SHIFT) & FIELD_MASK

    def set_want(self, addr: Addr, prev: int | None, want: int) -> None:
        """A frontend that wanted ``prev`` (None: nothing) now wants ``want``."""
        wants = self.shared.get(addr)
        if wants is not None:
            if prev is not None:
                _uncount(wants, prev)
            wants[want] = wants.get(want, 0) + 1
            return
        v = self.packed[addr]
        one = (v >> WANT_SHIFT) & FIELD_MASK
        if one == NONE or prev is not None:
            # No want yet, or the one want is this frontend's.
            self.packed[addr] = with_want(v, want)
            return
        # Another frontend's want, and now this one's.
        self.shared[addr] = {one: 2} if one == want else {one: 1, want: 1}
        self.packed[addr] = with_want(v, NONE)

    def pop_want(self, addr: Addr, prev: int | None) -> None:
        """A frontend that wanted ``prev`` (None: nothing) no longer wants the entry."""
        if prev is None:
            return
        wants = self.shared.get(addr)
        if wants is None:
            self.packed[addr] = with_want(self.packed[addr], NONE)
            return
        _uncount(wants, prev)
        if len(wants) == 1:
            ((one, n),) = wants.items()
            if n == 1:
                del self.shared[addr]
                self.packed[addr] = with_want(self.packed[addr], one)


def _uncount(wants: dict[int, int], want: int) -> None:
    n = wants[want]
    if n == 1:
        del wants[want]
    else:
        wants[want] = n - 1
