"""What statedb's storage layout costs per row: today's records against key -> log position.

Prints one JSON object. Two layouts of one table's newest versions, both as statedb would
hold them between write transactions (docs/statedb.md, "What a smaller record buys"):

- ``records`` (statedb today): ``heads[key] = (row, revision, key)``, a plain tuple, and
  the change log a list of the same tuples;
- ``positions`` (the design measured for issue #30): ``heads[key]`` is the record's
  position in the log, tagged with the log's generation (``generation << 40 | index``:
  compaction writes a new log, and a reader holding an older one must tell the two
  apart), and the log is three parallel arrays: the rows, the keys and the revisions
  (``array('q')``, no int object per revision);
- ``indexes``: the same with plain list indexes (no generation tag: each log generation
  would come with a heads dict of its own), deletions told by their record's type in the
  log.

Figures, each layout beside the other in the same run:

- ``bytes_per_row_rss_*``: resident-set growth per row of a child process that builds the
  layout alone (collector off, rows and keys made before the first reading, as they exist
  in every layout); ``bytes_per_row_traced_*``: the same by tracemalloc (the bytes asked
  for, without the allocator's slack);
- ``get_ns_*``: process CPU time per lookup of a random key, median of interleaved rounds;
  each lookup is what `statedb.Table.get` does once the key is encoded (the state, the
  visibility check, the row);
- ``get_instructions_*``: the same lookups counted by callgrind (``--callgrind``; needs
  valgrind), per lookup, loop included;
- ``insert_ns_*``: process CPU time per write of a loop that inserts every row and then
  replaces every row (the committed head moves to ``older`` as a snapshot may need it).
"""

from __future__ import annotations

import argparse
import array
import gc
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

LAYOUTS = ("records", "positions", "indexes")
#: Bits of a position below the log generation's tag.
GEN_SHIFT = 40
#: The generation the measured log has (any; not 0, so positions are large ints).
GEN = 3


class Row:
    """A small row (a slotted object, as the LB tables' rows are)."""

    __slots__ = ("n",)

    def __init__(self, n: int) -> None:
        self.n = n


class Deletion(tuple[Any, ...]):
    """Stands for statedb's deletion record type in the lookups' type checks."""


class Store:
    """The parts of a version store and a table state a lookup reads."""

    __slots__ = ("heads", "lo", "newest", "objs", "revision", "rows", "store")

    def __init__(self) -> None:
        self.heads: dict[bytes, Any] = {}
        self.rows = self.heads
        self.store = self
        self.newest = 0
        self.revision = 0
        self.lo = GEN << GEN_SHIFT
        self.objs: list[Any] = []


def make_keys(n: int) -> list[bytes]:
    """Encoded primary keys of ``n`` rows (24 bytes each, as an address key)."""
    return [b"key-%020d" % i for i in range(n)]


def build(layout: str, rows: list[Row], keys: list[bytes]) -> tuple[Store, list[Any]]:
    """A state of ``layout`` holding ``rows`` (revisions 1000 up); returns it and its log."""
    st = Store()
    heads = st.heads
    rev = 1000
    if layout == "records":
        log: list[Any] = []
        for obj, pk in zip(rows, keys):
            rec = (obj, rev, pk)
            heads[pk] = rec
            log.append(rec)
            rev += 1
        parts: list[Any] = [log]
    else:
        objs, revs = st.objs, array.array("q")
        ks: list[bytes] = []
        if layout == "indexes":
            st.lo = 0
        pos = st.lo
        for obj, pk in zip(rows, keys):
            heads[pk] = pos
            objs.append(obj)
            ks.append(pk)
            revs.append(rev)
            pos += 1
            rev += 1
        parts = [objs, ks, revs]
    st.newest = st.revision = rev - 1
    return st, parts


def get_records(states: dict[str, Store], pk: bytes) -> Any:
    """Table.get's lookup on today's layout."""
    st = states["t"]
    e = st.rows.get(pk)
    if e is None:
        return None
    if st.revision < st.store.newest and e[1] > st.revision:
        raise AssertionError("an older snapshot: not measured")
    return e[0] if type(e) is tuple else None


def get_positions(states: dict[str, Store], pk: bytes) -> Any:
    """The same lookup on the position layout: a deletion head (a negative position) and
    another generation's position take the slow path, like an older snapshot."""
    st = states["t"]
    p = st.rows.get(pk)
    if p is None:
        return None
    i = p - st.lo
    if st.revision < st.store.newest or i >> GEN_SHIFT:
        raise AssertionError("an older snapshot or generation: not measured")
    return st.objs[i]


def get_indexes(states: dict[str, Store], pk: bytes) -> Any:
    """The same lookup on plain log indexes: the log's slot is the row or a deletion."""
    st = states["t"]
    p = st.rows.get(pk)
    if p is None:
        return None
    if st.revision < st.store.newest:
        raise AssertionError("an older snapshot: not measured")
    o = st.objs[p]
    return o if type(o) is not Deletion else None


GETS = {"records": get_records, "positions": get_positions, "indexes": get_indexes}


def rss_bytes() -> int:
    """This process's resident set."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def child_bytes(layout: str, n: int, traced: bool) -> float:
    """Run in a child process: the growth per row of building ``layout``, of the resident
    set or (``traced``) of the bytes tracemalloc counts."""
    gc.disable()
    rows = [Row(i) for i in range(n)]
    keys = make_keys(n)
    if traced:
        tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0] if traced else rss_bytes()
    kept = build(layout, rows, keys)
    after = tracemalloc.get_traced_memory()[0] if traced else rss_bytes()
    del kept
    return (after - before) / n


def bytes_per_row(n: int) -> dict[str, float]:
    """Each layout built in a process of its own (freed memory would blur the figure)."""
    out = {}
    for kind in ("rss", "traced"):
        for layout in LAYOUTS:
            res = subprocess.run(
                [sys.executable, __file__, "--child-bytes", layout, "--rows", str(n)]
                + (["--traced"] if kind == "traced" else []),
                capture_output=True, text=True, check=True, timeout=600,
            )
            out[f"bytes_per_row_{kind}_{layout}"] = round(float(res.stdout), 1)
    return out


def get_ns(n: int, gets: int, rounds: int) -> dict[str, float]:
    """Process CPU ns per lookup of a random key, both layouts over the same rows and
    probes, rounds interleaved (the order rotates); median per layout."""
    gc.disable()
    rows = [Row(i) for i in range(n)]
    keys = make_keys(n)
    states = {layout: {"t": build(layout, rows, keys)[0]} for layout in LAYOUTS}
    rng = random.Random(1)
    probe = [keys[rng.randrange(n)] for _ in range(gets)]
    for pk in probe[:1000]:
        row = get_records(states["records"], pk)
        assert all(GETS[layout](states[layout], pk) is row for layout in LAYOUTS)
    times: dict[str, list[float]] = {layout: [] for layout in LAYOUTS}
    for r in range(rounds):
        for layout in LAYOUTS[r % 3:] + LAYOUTS[: r % 3]:
            get, s = GETS[layout], states[layout]
            t0 = time.process_time()
            for pk in probe:
                get(s, pk)
            times[layout].append((time.process_time() - t0) / gets * 1e9)
    gc.enable()
    return {f"get_ns_{layout}": round(sorted(v)[len(v) // 2]) for layout, v in times.items()}


def insert_records(rows: list[Row], keys: list[bytes], st: Store, older: dict[bytes, Any],
                   rev: int) -> int:
    """Today's write loop (`TableTxn.insert_many`, reduced to its stores)."""
    heads = st.heads
    log: list[Any] = []
    append, get = log.append, heads.get
    base_rev = rev
    for obj, pk in zip(rows, keys):
        old = get(pk)
        rev += 1
        rec = (obj, rev, pk)
        if old is not None and old[1] <= base_rev:
            older[pk] = old
        heads[pk] = rec
        append(rec)
    st.objs = log
    return rev


def insert_positions(rows: list[Row], keys: list[bytes], st: Store, older: dict[bytes, Any],
                     rev: int) -> int:
    """The position layout's write loop: a committed head is one below the log's end."""
    heads, objs, revs = st.heads, st.objs, array.array("q")
    ks: list[bytes] = []
    oappend, kappend, rappend, get = objs.append, ks.append, revs.append, heads.get
    pos = base = st.lo + len(objs)
    for obj, pk in zip(rows, keys):
        old = get(pk)
        rev += 1
        if old is not None and old < base:
            older[pk] = old
        heads[pk] = pos
        pos += 1
        oappend(obj)
        kappend(pk)
        rappend(rev)
    return rev


INSERTS = {"records": insert_records, "positions": insert_positions,
           "indexes": insert_positions}


def insert_ns(n: int, rounds: int) -> dict[str, float]:
    """Process CPU ns per write: ``n`` inserts then ``n`` replacements, fresh rows each
    round, rounds interleaved; median per layout."""
    keys = make_keys(n)
    times: dict[str, list[float]] = {layout: [] for layout in LAYOUTS}
    gc.disable()
    for r in range(rounds):
        for layout in LAYOUTS[r % 3:] + LAYOUTS[: r % 3]:
            first, second = [Row(i) for i in range(n)], [Row(i) for i in range(n)]
            st, write = Store(), INSERTS[layout]
            older: dict[bytes, Any] = {}
            t0 = time.process_time()
            rev = write(first, keys, st, older, 0)
            write(second, keys, st, older, rev)
            times[layout].append((time.process_time() - t0) / (2 * n) * 1e9)
            del st, older
    gc.enable()
    return {f"insert_ns_{layout}": round(sorted(v)[len(v) // 2]) for layout, v in times.items()}


def child_lookups(layout: str, n: int, gets: int, passes: int) -> None:
    """Run in a child process under callgrind: ``passes`` rounds of ``gets`` lookups."""
    rows = [Row(i) for i in range(n)]
    keys = make_keys(n)
    states = {"t": build(layout, rows, keys)[0]}
    rng = random.Random(1)
    probe = [keys[rng.randrange(n)] for _ in range(gets)]
    get = GETS[layout]
    for _ in range(passes):
        for pk in probe:
            get(states, pk)


def get_instructions(n: int, gets: int) -> dict[str, float]:
    """Instructions per lookup by callgrind: a run with two passes minus one with none."""
    out: dict[str, float] = {}
    for layout in LAYOUTS:
        counts = []
        for passes in (0, 2):
            with tempfile.TemporaryDirectory(prefix="statewright-layout-") as tmp:
                cg = Path(tmp) / "callgrind.out"
                subprocess.run(
                    ["valgrind", "--tool=callgrind", f"--callgrind-out-file={cg}",
                     sys.executable, __file__, "--child-lookups", layout, "--rows", str(n),
                     "--gets", str(gets), "--passes", str(passes)],
                    capture_output=True, text=True, check=True, timeout=1200,
                )
                counts.append(_callgrind_total(cg))
        out[f"get_instructions_{layout}"] = round((counts[1] - counts[0]) / (2 * gets))
    return out


def _callgrind_total(path: Path) -> int:
    """The total instruction count of a callgrind output file."""
    for line in path.read_text().splitlines():
        if line.startswith("summary:") or line.startswith("totals:"):
            return int(line.split()[1])
    raise RuntimeError(f"no totals in {path}")


def main(argv: list[str] | None = None) -> int:
    """Measure and print the JSON figures (or run one child's part)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=600_000, help="rows per table (600,000)")
    ap.add_argument("--gets", type=int, default=200_000, help="lookups per round (200,000)")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds (5)")
    ap.add_argument("--callgrind", action="store_true",
                    help="also count the lookups' instructions (valgrind; 20,000 rows)")
    ap.add_argument("--child-bytes", choices=LAYOUTS, help=argparse.SUPPRESS)
    ap.add_argument("--child-lookups", choices=LAYOUTS, help=argparse.SUPPRESS)
    ap.add_argument("--passes", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--traced", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child_bytes:
        print(child_bytes(args.child_bytes, args.rows, args.traced))
        return 0
    if args.child_lookups:
        child_lookups(args.child_lookups, args.rows, args.gets, args.passes)
        return 0
    out: dict[str, Any] = {"rows": args.rows, "load_avg_1m_at_start": os.getloadavg()[0]}
    out.update(bytes_per_row(args.rows))
    out.update(get_ns(args.rows, args.gets, args.rounds))
    out.update(insert_ns(min(args.rows, 200_000), args.rounds))
    if args.callgrind:
        if shutil.which("valgrind") is None:
            raise SystemExit("--callgrind needs valgrind")
        out.update(get_instructions(20_000, 50_000))
    out["load_avg_1m_at_end"] = os.getloadavg()[0]
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
