"""The per-frontend records of FrontendOps and its byte-level map writes.

`FrontendState` is what the maps hold for one frontend address (only what was written
successfully); `PendingFrontend` is one frontend between its prepared writes and its
master; `CollectedWrites` gathers one frontend's backend entries and slots for one batch
call per map, with what to put back when a write fails. A backend's wanted entry is one
int (`want_of`), ordered so that the "most alive" value is the smallest. The write
helpers (`write_entries`, `write_counted`, `delete_counted`) take encoded keys and values
(bpf.lb's ``*_STRUCT`` layouts) and report how far a batch got.
"""

from __future__ import annotations

import errno
import ipaddress
from array import array
from collections.abc import Callable, Sequence
from operator import attrgetter
from sys import getrefcount
from typing import Any

from bpf import lb
from bpf.backend import MapBackend
from bpf.errors import BatchError, MapError
from bpfops.backend_states import BackendStates
from bpfops.lb_maps import delete_quiet
from bpfops.model import Addr, BackendSpec, FrontendSpec, IPAddress, IPNetwork, proto_number


#: A backend's wanted entry as one int ordered like (state, cluster id, zone): the
#: "most alive" value is the smallest. Small ints are shared, so an active backend of
#: cluster 0 in no zone costs no memory per reference.
def want_of(state: int, cluster_id: int, zone: int) -> int:
    if not (0 <= state <= 0xFF and 0 <= cluster_id <= 0xFFFF and 0 <= zone <= 0xFF):
        # The same error the codec gives for a value that does not fit its member.
        lb.BACKEND4_STRUCT.pack(b"\0" * 4, 0, 0, state, cluster_id, zone)
    return (state << 24) | (cluster_id << 8) | zone


class FrontendState:
    """What is in the maps for one frontend address (only what was written successfully).

    ``backends`` maps each backend the frontend references to what the frontend wants
    its entry to hold (``want_of``; None: nothing yet, a failure came between the reference
    and the want), in the frontend's order; ``slots`` holds the backend id of each slot
    1.. written (0, which no backend has: to be rewritten), all with the flags
    ``slot_flags``; ``master`` the encoded master value written.

    Between updates the state is kept compact (`compact`, which the ops call once a
    frontend's writes are done): a frontend whose backends all want the same (nearly
    every one) keeps them as one tuple of addresses followed by that want, not a dict
    (128 bytes for ten backends instead of 352) - or, for a new frontend whose backends
    all want 0 (active) and whose spec has ``shared_backends``, as that tuple (the
    frontend row's, which the ops then share: no bytes of their own) - and when its slots
    then hold a run of consecutive ids, one per backend (a new frontend of the initial
    sync: its backends' ids come from one run of the allocator), keeps the run's first id
    instead of the array (32 bytes instead of 136). Reading ``backends`` or ``slots``
    gives the dict or the array back (built again from the compact form), which the ops
    then change in place as before.
    """

    __slots__ = (
        "_backends",
        "_slots",
        "affinity",
        "id",
        "maglev",
        "master",
        "revnat",
        "scale_to_zero",
        "slot_flags",
        "source_ranges",
        "v6",
        "wildcard",
    )

    def __init__(self, id_: int, v6: bool) -> None:
        self.id = id_
        self.v6 = v6
        # A dict, or between updates a compact tuple: the addresses, then their one want.
        self._backends: dict[Addr, int | None] | tuple[Any, ...] = _NO_BACKENDS
        # Raw 32-bit ids (no int object per slot), or the first of a run of ids, one per
        # backend of the compact form (none yet: no slots).
        self._slots: array[int] | int = 0
        self.slot_flags = 0
        self.master: bytes | None = None
        # Backend ids with an affinity match entry, and the source ranges written: the
        # shared empty frozenset until the first one is added (most frontends have none).
        self.affinity: set[int] = EMPTY
        self.source_ranges: set[IPNetwork] = EMPTY
        self.maglev = False
        # The key of the VIP's wildcard entry the frontend references (wildcards.vip_key).
        self.wildcard: bytes | None = None
        self.revnat = False
        # The frontend's id is in the scale-to-zero map.
        self.scale_to_zero = False

    @property
    def backends(self) -> dict[Addr, int | None]:
        """Backend address -> this frontend's want (see the class docstring): the dict,
        built from the compact form first when the state holds that."""
        b = self._backends
        if isinstance(b, dict):
            return b
        self._expand_slots()  # while the tuple still counts the backends
        d: dict[Addr, int | None]
        if not b:
            d = {}
        elif b[-1] is None or type(b[-1]) is int:
            d = dict.fromkeys(b[:-1], b[-1])
        else:  # a shared tuple: its objects' addresses, each wanting 0
            d = dict.fromkeys(map(_ADDRESS, b), 0)
        self._backends = d
        return d

    @backends.setter
    def backends(self, value: dict[Addr, int | None]) -> None:
        self._expand_slots()
        self._backends = value

    @property
    def slots(self) -> array[int]:
        """The backend id of each slot (see the class docstring): the array, built from
        the compact form first when the state holds that."""
        s = self._slots
        if type(s) is int:
            return self._expand_slots()
        return s  # type: ignore[return-value]

    def _expand_slots(self) -> array[int]:
        """The slots as an array (the run of ids one per backend of the compact tuple,
        when the state holds its first id)."""
        s = self._slots
        if type(s) is int:
            s = self._slots = array("I", range(s, s + _count(self._backends)))
        return s  # type: ignore[return-value]

    @property
    def slot_count(self) -> int:
        """How many slots the state holds (without building the array)."""
        s = self._slots
        if type(s) is not int:
            return len(s)  # type: ignore[arg-type]
        b = self._backends  # `_count`, inline
        if not b or isinstance(b, dict):
            return len(b)
        last = b[-1]
        return len(b) - 1 if last is None or type(last) is int else len(b)

    @property
    def has_backends(self) -> bool:
        """Whether the frontend references any backend (without building the dict)."""
        return bool(self._backends)

    def set_compact(
        self,
        addrs: list[Addr],
        want: int,
        shared: tuple[Any, ...] | None = None,
        run: int | None = None,
        shared_known: bool = False,
    ) -> None:
        """Reference ``addrs`` (in order, no duplicates), each wanting ``want``: the
        backends in the compact form at once, as ``shared`` (a ``shared_backends`` tuple)
        when its objects' addresses are ``addrs`` (checked, unless ``shared_known``: the
        caller got ``addrs`` from ``shared`` itself) and the want is 0. Given ``run``, the
        slots (none so far) become the run of ids from ``run`` on, one per address."""
        if run is None:
            self._expand_slots()
        else:
            s = self._slots
            # Any slots: the array's, or the run's (one per backend of the compact form).
            if s if type(s) is not int else self._backends:
                raise ValueError("a run of slots for a frontend that has slots")
            self._slots = run
        if not addrs:
            self._backends = _NO_BACKENDS
        elif (
            want == 0
            and shared is not None
            and len(shared) == len(addrs)
            and (shared_known or list(map(_ADDRESS, shared)) == addrs)
        ):
            self._backends = shared
        else:
            self._backends = (*addrs, want)

    @property
    def is_compact(self) -> bool:
        """Whether the backends are held in the compact form (a tuple) right now."""
        return not isinstance(self._backends, dict)

    @property
    def slots_compact(self) -> bool:
        """Whether the slots are held as the first id of their run right now."""
        return type(self._slots) is int

    def compact(self, run: int | None = None) -> None:
        """Keep the backends as a tuple when they all want the same, until the next read
        of ``backends``; given ``run``, the first id of slots the caller knows to be a run
        of consecutive ids, one per backend (the bulk path's new frontend), keep the slots
        as that id too, until the next read of ``slots`` or ``backends``.

        A dict or array some caller still holds (a frame that is changing it) stays as it
        is, so calling this at any time loses nothing."""
        b = self._backends
        if type(b) is dict and getrefcount(b) <= _ONLY_HELD:
            if not b:
                self._backends = _NO_BACKENDS
                return
            wants = [*b.values()]
            want = wants[0]
            if wants.count(want) != len(wants):
                return
            b = self._backends = (*b, want)
        s = self._slots
        if (
            run is not None
            and type(s) is array
            and type(b) is tuple
            and len(s) == _count(b)
            and len(s)
            and s[0] == run
            and s[-1] == run + len(s) - 1
            and getrefcount(s) <= _ONLY_HELD
        ):
            self._slots = run


_new = object.__new__


def new_state(id_: int, v6: bool) -> FrontendState:
    """``FrontendState(id_, v6)`` by a plain function call (a class call runs its
    ``__init__`` through a slower C path): the state of a new frontend, per update of
    the initial sync."""
    st = _new(FrontendState)
    st.id = id_
    st.v6 = v6
    st._backends = _NO_BACKENDS
    st._slots = 0
    st.slot_flags = 0
    st.master = None
    st.affinity = EMPTY
    st.source_ranges = EMPTY
    st.maglev = False
    st.wildcard = None
    st.revnat = False
    st.scale_to_zero = False
    return st


def _count(compact: dict[Addr, int | None] | tuple[Any, ...]) -> int:
    """How many backends a compact form holds: a tuple of addresses and their want (an
    int, or None), or a shared tuple (one object per backend); or a dict."""
    if not compact or isinstance(compact, dict):
        return len(compact)
    last = compact[-1]
    return len(compact) - 1 if last is None or type(last) is int else len(compact)


#: The ``address`` of a shared tuple's object.
_ADDRESS = attrgetter("address")

#: Whether the address of a frontend (its VIP: the IP, whatever the port) is one of the
#: node's addresses, which get no wildcard entry; None: the node has none.
IsLocal = Callable[[Addr], bool]

#: A key absent from a frontend's backends (its values may be None).
ABSENT: Any = object()

#: The wants of state alone (cluster 0, no zone: at most 256 values), one int object
#: each, shared by the frontends' backend dicts.
WANTS: dict[int, int] = {}

#: The empty set a frontend state starts with (read-only; replaced by a set on first add).
EMPTY: set[Any] = frozenset()  # type: ignore[assignment]

#: The compact form of no backends.
_NO_BACKENDS: tuple[Any, ...] = ()

#: ``getrefcount`` of a dict held by the state's attribute and one local variable (and
#: the call's argument): no one else has it.
_ONLY_HELD = 3


#: `bulk_undo` of the counts asked so far (a few: the backend counts of the frontends),
#: shared by every frontend's writes (read-only).
_BULK_UNDO: dict[int, tuple[tuple[None, ...], tuple[int, ...], tuple[int, ...]]] = {}
#: Counts above this get tuples of their own, not kept.
_SHARED_MAX = 4096


def bulk_undo(n: int) -> tuple[tuple[None, ...], tuple[int, ...], tuple[int, ...]]:
    """The undo sequences of ``n`` new backend entries and ``n`` slots appended (shared
    tuples): ``n`` Nones (the entries' previous written wants), ``0..n-1`` (the slots'
    indexes) and ``n`` zeros (the slots' previous ids)."""
    t = _BULK_UNDO.get(n)
    if t is None:
        t = ((None,) * n, tuple(range(n)), (0,) * n)
        if n <= _SHARED_MAX:
            _BULK_UNDO[n] = t
    return t


class CollectedWrites:
    """One frontend's backend entries and slots, collected for one batch call per map.

    The encoded keys and values of each map are joined in one buffer (``be_keys``,
    ``be_values``, ``svc_keys``, ``svc_values``; a bytearray while they are collected one
    by one): a round joins its frontends' buffers, not their entries. Next to the entries,
    what their state held before, in the same order, so that `undo` can put back the state
    of what was not written: ``be_addrs`` and ``be_prev`` (each backend entry's address and
    previous written want), ``slot_idx`` and ``slot_prev`` (each slot's index and previous
    backend id, 0 for a slot appended): lists while collected one by one, or (collected in
    bulk) sequences that may be shared with other writes, never changed.
    """

    __slots__ = ("be_addrs", "be_keys", "be_prev", "be_values", "frontend", "run",
                 "slot_idx", "slot_prev", "states", "svc_keys", "svc_values")

    def __init__(
        self,
        states: BackendStates,
        frontend: FrontendState,
        be: tuple[bytes | bytearray, bytes | bytearray, Sequence[Addr], Sequence[int | None]],
        svc: tuple[bytes | bytearray, bytes | bytearray, Sequence[int], Sequence[int]],
    ) -> None:
        self.states = states
        self.frontend = frontend
        self.be_keys, self.be_values, self.be_addrs, self.be_prev = be
        self.svc_keys, self.svc_values, self.slot_idx, self.slot_prev = svc
        #: The first id when the frontend's slots are (once written) a run of consecutive
        #: ids, one per backend: set by who collected them so.
        self.run: int | None = None

    @classmethod
    def empty(cls, states: BackendStates, frontend: FrontendState) -> CollectedWrites:
        """Nothing collected yet, to collect entries one by one into."""
        return cls(states, frontend, (bytearray(), bytearray(), [], []),
                   (bytearray(), bytearray(), [], []))

    def buffers(self) -> tuple[bytearray, bytearray, bytearray, bytearray]:
        """The backend keys and values and the slot keys and values of writes made by
        `empty`, to collect entries into one by one (TypeError for joined writes)."""
        b = (self.be_keys, self.be_values, self.svc_keys, self.svc_values)
        if not all(isinstance(x, bytearray) for x in b):
            raise TypeError("the writes are joined already")
        return b  # type: ignore[return-value]

    def undo_lists(self) -> tuple[list[Addr], list[int | None], list[int], list[int]]:
        """``be_addrs``, ``be_prev``, ``slot_idx`` and ``slot_prev`` of writes made by
        `empty`, to append to one by one (TypeError for writes collected in bulk, which
        may share them as tuples)."""
        u = (self.be_addrs, self.be_prev, self.slot_idx, self.slot_prev)
        if not all(type(x) is list for x in u):
            raise TypeError("the writes were collected in bulk")
        return u  # type: ignore[return-value]

    @property
    def be_count(self) -> int:
        """How many backend entries are collected."""
        return len(self.be_addrs)

    @property
    def slot_count(self) -> int:
        """How many slots are collected."""
        return len(self.slot_idx)

    def undo(self, be_done: int, slots_done: int) -> None:
        """Put back the state of the backend entries from ``be_done`` on and of the slots
        from ``slots_done`` on (those before were written)."""
        states = self.states
        addrs, prev = self.be_addrs, self.be_prev
        for i in range(len(addrs) - 1, be_done - 1, -1):
            if addrs[i] in states:
                states.set_written(addrs[i], prev[i])
        idx, prev_ids = self.slot_idx, self.slot_prev
        if slots_done >= len(idx):
            return
        slots = self.frontend.slots
        for i in range(len(idx) - 1, slots_done - 1, -1):
            slots[idx[i]] = prev_ids[i]


def bulk_writes(
    states: BackendStates,
    frontend: FrontendState,
    be: tuple[bytes, bytes, Sequence[Addr], Sequence[None]],
    svc: tuple[bytes, bytes, Sequence[int], Sequence[int]],
    run: int,
) -> CollectedWrites:
    """``CollectedWrites(states, frontend, be, svc)`` with ``run`` set, by a plain function
    call (see `new_state`): the writes the bulk path collects."""
    w = _new(CollectedWrites)
    w.states = states
    w.frontend = frontend
    w.be_keys, w.be_values, w.be_addrs, w.be_prev = be
    w.svc_keys, w.svc_values, w.slot_idx, w.slot_prev = svc
    w.run = run
    return w


#: The orphans of a frontend that has none (shared: `PendingFrontend.orphans` is read only).
_NO_ORPHANS: tuple[tuple[Addr, int], ...] = ()


class PendingFrontend:
    """One frontend between its prepared writes and its master: what the later steps need."""

    __slots__ = ("active", "fe", "head", "inactive", "is_local", "master_flags",
                 "master_key", "orphans", "slot_backends", "state", "writes")

    def __init__(
        self,
        fe: FrontendSpec,
        state: FrontendState,
        is_local: IsLocal | None,
        writes: CollectedWrites,
        slot_backends: Sequence[BackendSpec],
        active: int,
        inactive: int,
        master_flags: int,
    ) -> None:
        self.fe = fe
        self.state = state
        self.is_local = is_local
        self.writes = writes
        self.slot_backends = slot_backends
        self.active = active
        self.inactive = inactive
        self.master_flags = master_flags
        addr = fe.addr
        #: The frontend's IP and port in network order (``frontend_plan.addr_head``): how
        #: its services-map keys begin, and its rev-NAT value.
        self.head = addr[12:18] if addr[20] == 4 else addr[:18]
        #: The encoded key of its master (``frontend_plan.master_key``), when known.
        self.master_key: bytes | None = None
        #: Backends the frontend dropped that no one else references (address and id),
        #: left in the backends map until its master no longer counts them (see
        #: `RoundWriter.write`); read only.
        self.orphans: Sequence[tuple[Addr, int]] = _NO_ORPHANS


def new_pending(
    fe: FrontendSpec,
    state: FrontendState,
    is_local: IsLocal | None,
    writes: CollectedWrites,
    slot_backends: Sequence[BackendSpec],
    active: int,
    inactive: int,
    master_flags: int,
    orphans: list[tuple[Addr, int]] | None,
    head: bytes,
    master_key: bytes,
) -> PendingFrontend:
    """``PendingFrontend(...)`` by a plain function call (see `new_state`), with its
    ``orphans`` when given some and its ``head`` and ``master_key`` as given."""
    p = _new(PendingFrontend)
    p.fe = fe
    p.state = state
    p.is_local = is_local
    p.writes = writes
    p.slot_backends = slot_backends
    p.active = active
    p.inactive = inactive
    p.master_flags = master_flags
    p.orphans = orphans if orphans else _NO_ORPHANS
    p.head = head
    p.master_key = master_key
    return p


def write_counted(
    m: MapBackend, keys: bytes, values: bytes, count: int
) -> tuple[int, MapError | None]:
    """Write ``count`` joined entries as `write_entries` does; return how many were
    written and the error that stopped the rest (None when all were)."""
    try:
        write_entries(m, keys, values, count)
    except BatchError as exc:
        return exc.done, exc
    except MapError as exc:
        return 0, exc
    return count, None


def delete_counted(m: MapBackend, keys: list[bytes]) -> tuple[int, MapError | None]:
    """Delete encoded keys in order, one batch call (one delete for one key); an absent
    key counts as deleted. Returns how many were deleted and the error that stopped the
    rest (None when all were)."""
    done = 0
    while done < len(keys):
        try:
            if len(keys) - done == 1:
                delete_quiet(m, keys[done])
            else:
                m.delete_batch(keys[done:])
        except BatchError as exc:
            done += exc.done
            if exc.errno != errno.ENOENT:
                return done, exc
            done += 1  # absent already
            continue
        except MapError as exc:
            return done, exc
        return len(keys), None
    return done, None


def write_entries(m: MapBackend, keys: bytes, values: bytes, count: int) -> None:
    """Write ``count`` encoded entries, joined in ``keys`` and ``values``, in order: one
    update for one entry, else one batch call (BatchError.done tells how many were written
    before a failure)."""
    if count == 1:
        m.update(keys, values)
    elif count:
        m.update_batch(keys, values)


def ref_ids(refs: int | set[int] | None) -> set[int]:
    """The ids of a wildcard_refs value."""
    if refs is None:
        return set()
    return {refs} if isinstance(refs, int) else refs


def swap16(port: int) -> int:
    return int.from_bytes((port & 0xFFFF).to_bytes(2, "little"), "big")


def ip_of(raw: bytes) -> IPAddress:
    return ipaddress.ip_address(raw)


def backend_bytes(addr: Addr, want: int) -> bytes:
    """The encoded backends-map value of ``addr`` holding ``want`` (see ``want_of``)."""
    st = lb.BACKEND6_STRUCT if addr.is_v6 else lb.BACKEND4_STRUCT
    return st.pack(
        addr.packed,
        lb.swap16(addr.port),
        proto_number(addr.proto),
        want >> 24,
        (want >> 8) & 0xFFFF,
        want & 0xFF,
    )
