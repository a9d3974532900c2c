"""benchmarks/k8s_memory.py's object accounting: what it counts, and under which name."""

from __future__ import annotations

import sys

from benchmarks.k8s_memory import object_bytes


def test_counts_untracked_referents_once_and_names_statedb_records() -> None:
    key = b"k" * 21
    big = 10**6 + 1
    name = "svc-" + "x" * 20
    records: list[tuple[list[object], int, bytes]] = [([], big + i, key) for i in range(3)]
    holder = [name, name, *records]
    out = {row[0]: row for row in object_bytes([holder, *records], 1, 50)}
    rec = out["statedb record (row, revision, key)"]
    assert rec[2] == 3
    assert rec[1] == 3 * sys.getsizeof(records[0])
    # Three distinct revisions, one shared key, the name held twice counted once.
    assert out["builtins.int"][2] == 3
    assert out["builtins.bytes"][2] == 1
    assert out["builtins.str"] == ["builtins.str", sys.getsizeof(name), 1]
    # Tracked objects are counted as themselves (gc.get_objects lists them), never
    # through what references them: only the holder list here.
    assert out["builtins.list"][2] == 1


def test_small_ints_and_per_service_division() -> None:
    small = (1, 2, 3)
    out = {row[0]: row for row in object_bytes([[small, 7]], 2, 50)}
    assert "builtins.int" not in out
    # The untracked tuple counted once, its size halved (two services).
    assert out["tuple of 3"] == ["tuple of 3", round(sys.getsizeof(small) / 2), 1]
