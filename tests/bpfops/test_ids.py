"""Id allocation: next-fit with wrap-around, exhaustion, restore reservations."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bpfops.ids import BLOCK, IDAllocator, IDExhaustedError
from reconciler.waiting import exhausted_resource


def alloc(first: int = 1, limit: int = 6) -> IDAllocator[str]:
    return IDAllocator("test", first, limit)


def test_next_fit_does_not_reuse_a_freed_id_immediately() -> None:
    a = alloc()
    assert [a.acquire(x) for x in "abc"] == [1, 2, 3]
    a.release("a")
    assert a.acquire("d") == 4  # 1 is free but the walk goes on
    assert a.acquire("a") == 5


def test_wraps_around_to_free_ids() -> None:
    a = alloc()
    for x in "abcde":
        a.acquire(x)
    a.release("b")
    a.release("d")
    assert a.acquire("f") == 2
    assert a.acquire("g") == 4


def test_acquire_is_idempotent_per_address() -> None:
    a = alloc()
    assert a.acquire("x") == a.acquire("x") == 1
    assert a.lookup("x") == 1 and a.lookup("y") is None


def test_exhaustion_names_the_allocator() -> None:
    a = alloc(limit=3)
    a.acquire("a")
    a.acquire("b")
    with pytest.raises(IDExhaustedError, match="no free test id"):
        a.acquire("c")
    a.release("a")
    assert a.acquire("c") == 1


def test_restored_ids_are_reserved_claimed_and_released() -> None:
    a = alloc(limit=20)
    a.reserve("svc-a", 7)
    a.reserve("svc-b", 3)
    assert a.next_id == 8
    assert a.acquire("new") == 8  # reservations are not handed out
    assert a.acquire("svc-b") == 3  # the owner claims its old id
    assert a.release_unclaimed() == 1  # svc-a never claimed its id
    assert a.restored == {}
    assert not a.is_taken(7)  # unclaimed: free again
    assert a.lookup("svc-b") == 3


def test_restored_alias_cannot_steal_a_claimed_id() -> None:
    a = alloc(limit=20)
    a.reserve("x/TCP", 4)
    a.reserve("x/UDP", 4)
    assert a.acquire("x/TCP") == 4
    assert a.acquire("x/UDP") == 5
    a.release_unclaimed()
    assert a.lookup("x/TCP") == 4


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 9)), max_size=60))
def test_ids_are_unique_and_in_range(ops: list[tuple[bool, int]]) -> None:
    a = alloc(limit=8)
    for acquire, n in ops:
        name = f"a{n}"
        if acquire:
            try:
                a.acquire(name)
            except IDExhaustedError:
                assert len(a) == 7
        else:
            a.release(name)
        ids = list(a.addr_to_id.values())
        assert len(ids) == len(set(ids))
        assert all(1 <= i < 8 for i in ids)


def test_tuple_owners_and_shared_reservations() -> None:
    """Owners that are tuples themselves, and ids shared by a holder and reservations."""
    a: IDAllocator[tuple[str, int]] = IDAllocator("test", 1, 6)
    assert a.acquire(("x", 1)) == 1
    assert a.owner_of(1) == ("x", 1) and a.is_taken(1)
    a.reserve(("y", 2), 1)
    assert a.owner_of(1) == ("x", 1)
    a.release(("x", 1))
    assert a.is_taken(1) and a.owner_of(1) is None  # still reserved by ("y", 2)
    assert a.claim_restored(("y", 2)) == 1 and a.owner_of(1) == ("y", 2)
    a.release(("y", 2))
    assert not a.is_taken(1) and len(a) == 0


class _Records:
    """A user's per-address records viewed as an allocator's holders, used as the LB Ops
    use their backend states: a record made after each acquire, dropped after release."""

    def __init__(self) -> None:
        self.records: dict[str, int] = {}

    def get(self, addr: str, /) -> int | None:
        return self.records.get(addr)

    def __setitem__(self, addr: str, id_: int, /) -> None:
        pass

    def update(self, held: object, /) -> None:
        pass

    def pop(self, addr: str, default: None, /) -> int | None:
        return self.records.get(addr, default)

    def clear(self) -> None:
        pass

    def values(self) -> list[int]:
        return list(self.records.values())

    def items(self) -> list[tuple[str, int]]:
        return list(self.records.items())

    def __len__(self) -> int:
        return len(self.records)


@settings(max_examples=100, deadline=None, derandomize=True)
@given(
    st.lists(st.tuples(st.sampled_from(["acquire", "release", "reserve", "unclaimed"]),
                       st.sampled_from("abcdefg"), st.integers(1, 8)), max_size=40)
)
def test_holders_view_behaves_like_the_own_dict(ops: list[tuple[str, str, int]]) -> None:
    own: IDAllocator[str] = IDAllocator("test", 1, 9)
    view = _Records()
    viewed: IDAllocator[str] = IDAllocator("test", 1, 9, view)
    for op, addr, id_ in ops:
        if op == "acquire":
            try:
                got = own.acquire(addr)
            except IDExhaustedError:
                with pytest.raises(IDExhaustedError):
                    viewed.acquire(addr)
                continue
            assert viewed.acquire(addr) == got
            view.records[addr] = got
        elif op == "release":
            assert viewed.release(addr) == own.release(addr)
            view.records.pop(addr, None)
        elif op == "reserve":
            own.reserve(addr, id_)
            viewed.reserve(addr, id_)
        else:
            assert viewed.release_unclaimed() == own.release_unclaimed()
        assert len(viewed) == len(own)
        assert dict(view.records) == dict(own.addr_to_id)  # type: ignore[call-overload]
        assert viewed.id_to_owners == own.id_to_owners


class _ReferenceIDs:
    """The allocator's rules written plainly, as the model: every id's owners in a dict
    of sets, next-fit over the whole range with wrap-around, reservations claimed by
    their address first (unless someone else already holds the id)."""

    def __init__(self, first: int, limit: int) -> None:
        self.first, self.limit, self.next_id = first, limit, first
        self.owners: dict[int, set[str]] = {}
        self.held: dict[str, int] = {}
        self.restored: dict[str, int] = {}

    def holder(self, id_: int) -> str | None:
        return next((a for a, i in self.held.items() if i == id_), None)

    def acquire(self, addr: str) -> int:
        if addr in self.held:
            return self.held[addr]
        if addr in self.restored:
            id_ = self.restored.pop(addr)
            if self.holder(id_) in (None, addr):
                self.held[addr] = id_
                return id_
            self.owners[id_].discard(addr)
            if not self.owners[id_]:
                del self.owners[id_]
        candidate = self.next_id
        for _ in range(self.limit - self.first):
            if candidate >= self.limit:
                candidate = self.first
            if candidate not in self.owners:
                self.owners[candidate] = {addr}
                self.held[addr] = candidate
                self.next_id = candidate + 1
                return candidate
            candidate += 1
        raise IDExhaustedError("full", self)

    # A reconciler.waiting.Resource, as the allocator is.
    unit = "reference id"

    def available(self) -> int:
        return self.limit - self.first - len(self.owners)

    def release(self, addr: str) -> int | None:
        id_ = self.held.pop(addr, None)
        if id_ is not None:
            self.owners[id_].discard(addr)
            if not self.owners[id_]:
                del self.owners[id_]
        return id_

    def reserve(self, addr: str, id_: int) -> None:
        if not self.first <= id_ < self.limit:
            return
        self.restored[addr] = id_
        self.owners.setdefault(id_, set()).add(addr)
        self.next_id = max(self.next_id, id_ + 1)
        if self.next_id >= self.limit:
            self.next_id = self.first

    def release_unclaimed(self) -> int:
        n = len(self.restored)
        for addr, id_ in self.restored.items():
            if self.held.get(addr) != id_:
                self.owners[id_].discard(addr)
                if not self.owners[id_]:
                    del self.owners[id_]
        self.restored.clear()
        return n


@settings(max_examples=300, deadline=None, derandomize=True)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["acquire", "acquire", "release", "reserve", "unclaimed"]),
            st.sampled_from("abcdefghij"),
            st.integers(0, 9),
        ),
        max_size=60,
    ),
    st.booleans(),
)
def test_the_allocator_follows_the_reference_across_wrap_arounds(
    ops: list[tuple[str, str, int]], viewed: bool
) -> None:
    """Ids 1..7 only, so the walk wraps around often: the allocator, whose index of ids is
    partial until the first wrap-around, hands out, frees, reports and refuses exactly as
    the plain model does."""
    view = _Records()
    a: IDAllocator[str] = IDAllocator("test", 1, 8, view if viewed else None)
    ref = _ReferenceIDs(1, 8)
    for op, addr, id_ in ops:
        if op == "acquire":
            try:
                want = ref.acquire(addr)
            except IDExhaustedError:
                with pytest.raises(IDExhaustedError):
                    a.acquire(addr)
                continue
            assert a.acquire(addr) == want
            view.records[addr] = want
        elif op == "release":
            assert a.release(addr) == ref.release(addr)
            view.records.pop(addr, None)
        elif op == "reserve":
            a.reserve(addr, id_)
            ref.reserve(addr, id_)
        else:
            assert a.release_unclaimed() == ref.release_unclaimed()
        assert len(a) == len(ref.held)
        for i in range(0, 9):
            assert a.is_taken(i) == (i in ref.owners), i
            assert a.owner_of(i) == ref.holder(i), i


def test_exhaustion_costs_one_probe_per_attempt_and_names_the_allocator() -> None:
    """A full range refuses at once, however large it is: one probe per attempt, and the
    error names the allocator as the exhausted resource (a reconciler parks on it)."""
    a = alloc(first=1, limit=3 * BLOCK + 7)
    for i in range(a.span):
        a.acquire(f"a{i}")
    assert a.available() == 0
    before = a.probes
    for i in range(1000):
        with pytest.raises(IDExhaustedError) as info:
            a.acquire(f"waiting-{i}")
        assert exhausted_resource(info.value) is a
    assert a.probes - before == 1000
    assert a.unit == "test id"
    a.release("a5")
    assert a.available() == 1
    assert a.acquire("waiting-0") == 6


def test_a_walk_over_a_nearly_full_range_skips_full_blocks() -> None:
    """The one free id far behind the walk is found in about span / BLOCK + 2 * BLOCK
    probes, not span."""
    span = 40 * BLOCK
    a = alloc(first=1, limit=1 + span)
    for i in range(span):
        a.acquire(f"a{i}")
    a.release("a5")
    assert a.acquire("b") == 6  # the walk wrapped and found it right away
    a.release(f"a{span - 100}")  # id span - 99: the walk is at 7, far before it
    before = a.probes
    assert a.acquire("c") == span - 99
    assert a.probes - before <= span // BLOCK + 2 * BLOCK


@settings(max_examples=100, deadline=None, derandomize=True)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["acquire", "acquire", "acquire", "release", "reserve"]),
            st.integers(0, 700),
            st.integers(BLOCK - 10, 3 * BLOCK + 40),
        ),
        max_size=150,
    ),
    st.integers(0, 600),
)
def test_the_block_skipping_walk_follows_the_reference(
    ops: list[tuple[str, int, int]], prefill: int
) -> None:
    """Over several blocks (the first and last partial), with most ids taken: the same ids
    as the plain next-fit walk, and ``available`` exact once the walk has wrapped."""
    first, limit = BLOCK - 10, 3 * BLOCK + 30
    a: IDAllocator[str] = IDAllocator("test", first, limit)
    ref = _ReferenceIDs(first, limit)
    for i in range(prefill):
        try:
            want = ref.acquire(f"p{i}")
        except IDExhaustedError:
            with pytest.raises(IDExhaustedError):
                a.acquire(f"p{i}")
            continue
        assert a.acquire(f"p{i}") == want
    for op, n, id_ in ops:
        addr = f"p{n}"
        if op == "acquire":
            try:
                want = ref.acquire(addr)
            except IDExhaustedError:
                with pytest.raises(IDExhaustedError):
                    a.acquire(addr)
                continue
            assert a.acquire(addr) == want
        elif op == "release":
            assert a.release(addr) == ref.release(addr)
        else:
            a.reserve(addr, id_)
            ref.reserve(addr, id_)
        if a.indexed:
            assert a.available() == ref.available()
            assert sum(a.block_taken.values()) == len(ref.owners)


def test_acquire_run_gives_what_acquire_gives_one_by_one() -> None:
    run, single = alloc(limit=10), alloc(limit=10)
    single.acquire("x")
    run.acquire("x")
    assert run.acquire_run(["a", "b", "c"]) == range(2, 5)
    assert [single.acquire(x) for x in "abc"] == [2, 3, 4]
    assert run.addr_to_id == single.addr_to_id
    assert run.next_id == single.next_id and run.probes == single.probes
    assert run.acquire("d") == single.acquire("d") == 5


def test_acquire_run_declines_what_is_not_one_run_from_next_id() -> None:
    a = alloc(limit=6)
    assert a.acquire_run(list("abcdef")) is None  # past the range's end
    a.reserve("r", 3)
    assert a.acquire_run(["a"]) is None  # a restored id to claim first
    a.release_unclaimed()
    for x in "abc":
        a.acquire(x)
    a.release("a")
    a.acquire("d")
    a.acquire("e")  # wraps around: the index is complete from here on
    assert a.indexed
    assert a.acquire_run(["f"]) is None
    assert len(a.addr_to_id) == 4  # what the declined runs asked for got nothing
