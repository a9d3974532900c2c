"""Maglev: MurmurHash3 vectors, Cilium's fill order and weights, the corpus MAGLEV counts."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from bpfops.maglev import (
    DEFAULT_HASH_SEED,
    Maglev,
    MaglevBackend,
    hash_string,
    murmur3_128,
    seed_from_base64,
    slot_counts,
)

# $STATEWRIGHT_LB_CORPUS as every other corpus test ($STATEWRIGHT_CORPUS, the name this
# test used alone, is still read).
CORPUS = Path(
    os.environ.get("STATEWRIGHT_LB_CORPUS")
    or os.environ.get("STATEWRIGHT_CORPUS")
    or Path(__file__).parents[3] / "shared/conformance/cilium-lb"
)

# Reference values of MurmurHash3_x64_128 (computed with the reference implementation).
VECTORS = [
    (b"", 0, (0x0, 0x0)),
    (b"hello", 0, (0xCBD8A7B341BD9B02, 0x5B1E906A48AE1D19)),
    (
        b"The quick brown fox jumps over the lazy dog",
        42,
        (0x740DCF93FE0BD5D7, 0xC4546CF4EC705C8F),
    ),
    (
        b"[10.244.1.1:80/TCP,State:active]",
        616034178,
        (0x3C20BE4C03D692BB, 0x2737E93BC7643C87),
    ),
]


@pytest.mark.parametrize(("data", "seed", "want"), VECTORS)
def test_murmur3_reference_vectors(data: bytes, seed: int, want: tuple[int, int]) -> None:
    assert murmur3_128(data, seed) == want


def test_default_seed_decodes_to_its_first_word() -> None:
    assert seed_from_base64(DEFAULT_HASH_SEED) == 616034178
    with pytest.raises(ValueError, match="12"):
        seed_from_base64("AAAA")


def test_hash_string_format() -> None:
    assert hash_string("10.0.0.1", 80, "TCP") == "[10.0.0.1:80/TCP,State:active]"
    assert hash_string("fd00::1", 53, "UDP", True) == "[[fd00::1]:53/UDP/i,State:active]"


def test_unsupported_table_size_is_rejected() -> None:
    with pytest.raises(ValueError, match="1000"):
        Maglev(1000)


def test_every_slot_is_filled_and_equal_weights_split_evenly() -> None:
    ml = Maglev(1021)
    table = ml.lookup_table(MaglevBackend(i, f"b{i}") for i in range(1, 5))
    assert len(table) == 1021
    # 1021 = 4 * 255 + 1: the first backend in name order gets the extra slot.
    assert slot_counts(table) == [(1, 256), (2, 255), (3, 255), (4, 255)]


def test_weights_shape_the_counts() -> None:
    # The weighted example of Cilium's own maglev tests: names sort one, three, two, tzwe.
    ml = Maglev(1021)
    bes = [
        MaglevBackend(0, "one", 2),
        MaglevBackend(1, "three", 13),
        MaglevBackend(2, "two", 111),
        MaglevBackend(3, "tzwe", 10),
    ]
    counts = dict(slot_counts(ml.lookup_table(bes)))
    assert counts == {0: 16, 1: 98, 2: 832, 3: 75}


def test_input_order_does_not_matter() -> None:
    ml = Maglev(251)
    bes = [MaglevBackend(i, hash_string(f"10.0.0.{i}", 80, "TCP")) for i in range(1, 8)]
    assert ml.lookup_table(bes) == ml.lookup_table(reversed(bes))


def test_removing_a_backend_disturbs_few_other_slots() -> None:
    ml = Maglev(1021)
    bes = [MaglevBackend(i, hash_string(f"10.0.0.{i}", 80, "TCP")) for i in range(1, 4)]
    before = ml.lookup_table(bes)
    after = ml.lookup_table(bes[:2])
    moved = sum(1 for b, a in zip(before, after) if b in (1, 2) and a != b)
    assert moved / 1021 < 0.01
    assert set(after) == {1, 2}


def _corpus_maglev_lines() -> list[str]:
    if not CORPUS.is_dir():
        return []
    lines: list[str] = []
    for path in sorted(CORPUS.glob("*.txtar")):
        lines += re.findall(r"^MAGLEV: .*$", path.read_text(), re.M)
    return sorted(set(lines))


def test_corpus_maglev_counts() -> None:
    lines = _corpus_maglev_lines()
    if not lines:
        pytest.skip(f"corpus not found at {CORPUS}")
    ml = Maglev(1021)
    for line in lines:
        pairs = [(int(a), int(b)) for a, b in re.findall(r"(\d+)\((\d+)\)", line)]
        assert sum(n for _, n in pairs) == 1021, line
        # Same-weight backends named in the order of their ids (as the corpus addresses are).
        bes = [MaglevBackend(be, f"{i:03d}") for i, (be, _) in enumerate(sorted(pairs))]
        got = ", ".join(f"{b}({n})" for b, n in slot_counts(ml.lookup_table(bes)))
        assert f"INNER=[{got}]" in line, line
