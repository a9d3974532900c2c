"""benchmarks/k8s_memory's owner attribution: each object counted once, for the first
owner that reaches it, and only the roots of an owner that does not follow references."""

from __future__ import annotations

import sys

from benchmarks.k8s_memory import owner_bytes


def test_each_object_counts_once_for_its_first_owner() -> None:
    shared = [f"shared-{i}" for i in range(3)]
    first = {"a": shared}
    second = ("x-" * 40, shared)
    out = owner_bytes([("first", [first], True), ("second", [second], True)], per=1)
    (name1, bytes1, count1, _), (name2, bytes2, count2, _) = out
    assert (name1, name2) == ("first", "second")
    # first: its dict, the key "a", the list and its three strings.
    assert count1 == 6
    # second: its tuple and the long string; the list and its strings were first's.
    assert count2 == 2
    assert bytes2 >= sys.getsizeof(second) + sys.getsizeof(second[0])
    assert bytes1 >= sum(sys.getsizeof(s) for s in shared) + sys.getsizeof(shared)


def test_an_owner_that_does_not_follow_counts_its_roots_alone() -> None:
    inner = ["not the holder's " * 4]
    holder = [inner]
    out = owner_bytes([("shallow", [holder], False), ("deep", [holder, inner], True)], per=1)
    assert [(row[0], row[2]) for row in out] == [("shallow", 1), ("deep", 2)]
