"""Where the agent's bytes are after a Kubernetes initial sync; prints one JSON object.

``python benchmarks/k8s_memory.py [--services N]`` is ``benchmarks/k8s.py --services N
--memory-breakdown`` without the churn (the keys are described there).

`MemoryBreakdown` starts tracemalloc before the load balancer and the source exist, and
after the sync (and a full collection) reports the traced heap grouped by source file and
by source line, and the live container objects grouped by type (``gc.get_objects``,
shallow ``sys.getsizeof``), each per service. ``memory_objects_bytes_per_service`` counts
every live object instead: the containers and, once each, the objects without references
they hold (ints, strings, bytes: a statedb revision, a name, a key), with statedb's stored
records (plain ``(row, revision, key)`` tuples) and the tuples of a frontend's backends
named apart from other tuples, and dicts by their size. ``memory_owners_bytes_per_service``
counts every object reachable from the agent's parts once, for the first part (in a fixed
order) that reaches it: statedb's records, revisions and tables per LB table, then the
rows of each table, what only each table's superseded versions hold (old rows and
revisions kept for snapshots or not yet trimmed), the LB Ops' backend states and frontend
states, the writer, the converter and the source (`owner_bytes`). tracemalloc counts the
bytes Python asked the allocator for; the resident set adds the allocator's slack, freed
pages it keeps, and what was in memory before tracing started (the interpreter and its
imports).
"""

from __future__ import annotations

import ctypes
import gc
import os
import sys
import tempfile
import tracemalloc
import types
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

#: The project's root: file names are shown relative to it.
_ROOT = str(Path(__file__).resolve().parent.parent) + "/"


def _short(filename: str) -> str:
    if filename.startswith(_ROOT):
        return filename[len(_ROOT):]
    for marker in ("site-packages/", "lib/python3"):
        at = filename.find(marker)
        if at >= 0:
            return filename[at:]
    return filename


class MemoryBreakdown:
    """tracemalloc from `start` to `figures` (one frame per allocation: the line that
    allocated)."""

    def __init__(self, top: int = 40) -> None:
        self.top = top
        self._before = 0

    def start(self) -> None:
        """Start tracing (frames: 1)."""
        gc.collect()
        tracemalloc.start(1)
        self._before = tracemalloc.get_traced_memory()[0]

    def figures(
        self, services: int, owners: list[Owner] | None = None
    ) -> dict[str, Any]:
        """The breakdown, per service (bytes), and stop tracing; with ``owners`` (see
        `owner_bytes`, e.g. `lb_owners`) also ``memory_owners_bytes_per_service``."""
        gc.collect()
        snap = tracemalloc.take_snapshot()
        snap = snap.filter_traces((tracemalloc.Filter(False, tracemalloc.__file__),))
        traced = tracemalloc.get_traced_memory()[0] - self._before
        per = max(1, services)
        by_file = snap.statistics("filename")
        by_line = snap.statistics("lineno")
        out: dict[str, Any] = {
            "memory_traced_mb": round(traced / 2**20, 1),
            "memory_traced_bytes_per_service": round(traced / per),
            "memory_by_file_bytes_per_service": [
                [_short(s.traceback[0].filename), round(s.size / per), s.count]
                for s in by_file[: self.top]
            ],
            "memory_by_line_bytes_per_service": [
                [
                    f"{_short(s.traceback[0].filename)}:{s.traceback[0].lineno}",
                    round(s.size / per),
                    s.count,
                ]
                for s in by_line[: self.top]
            ],
        }
        lines = {
            (s.traceback[0].filename, s.traceback[0].lineno): f"{_short(s.traceback[0].filename)}:"
            f"{s.traceback[0].lineno}"
            for s in by_line[: self.top // 2]
        }
        del snap, by_file, by_line
        out["memory_holders_bytes_per_service"] = _holders(lines, per, self.top)
        peak = tracemalloc.get_traced_memory()[1] - self._before
        out["memory_traced_peak_mb"] = round(peak / 2**20, 1)
        tracemalloc.stop()
        out["memory_by_type_bytes_per_service"] = _types(per, self.top)
        out["memory_objects_bytes_per_service"] = object_bytes(gc.get_objects(), per, self.top)
        if owners is not None:
            out["memory_owners_bytes_per_service"] = owner_bytes(owners, per)
        return out


def _holders(lines: dict[tuple[str, int], str], per: int, top: int) -> list[list[Any]]:
    """Which objects hold what the top lines allocated: [line, holder type, shallow bytes
    of the held objects per service, references] (an object held twice counts twice)."""
    size: Counter[tuple[str, str]] = Counter()
    refs: Counter[tuple[str, str]] = Counter()
    trace_of = tracemalloc.get_object_traceback
    for o in gc.get_objects():
        holder = type(o).__qualname__
        for r in gc.get_referents(o):
            tb = trace_of(r)
            if tb is None:
                continue
            frame = tb[0]
            line = lines.get((frame.filename, frame.lineno))
            if line is None:
                continue
            key = (line, f"{holder} -> {type(r).__qualname__}")
            size[key] += sys.getsizeof(r)
            refs[key] += 1
    return [[line, holder, round(b / per), refs[(line, holder)]]
            for (line, holder), b in size.most_common(top)]


def _types(per: int, top: int) -> list[list[Any]]:
    """Live gc-tracked objects by type: [name, shallow bytes per service, count]."""
    size: Counter[str] = Counter()
    count: Counter[str] = Counter()
    for o in gc.get_objects():
        t = type(o)
        name = f"{t.__module__}.{t.__qualname__}"
        size[name] += sys.getsizeof(o)
        count[name] += 1
    return [[name, round(b / per), count[name]] for name, b in size.most_common(top)]


def _kind(o: object) -> str:
    """The name `object_bytes` counts ``o`` under."""
    t = type(o)
    if t is tuple:
        n = len(o)  # type: ignore[arg-type]
        if n == 3 and type(o[1]) is int and isinstance(o[2], bytes):  # type: ignore[index]
            return "statedb record (row, revision, key)"
        if n and type(o[0]).__name__ == "BackendParams":  # type: ignore[index]
            return "tuple of BackendParams"
        return f"tuple of {n}" if n < 8 else "tuple of 8+"
    if t is dict:
        n = len(o)  # type: ignore[arg-type]
        return f"dict of {n}" if n < 16 else "dict of 16-999" if n < 1000 else "dict of 1000+"
    return f"{t.__module__}.{t.__qualname__}"


def object_bytes(objs: list[Any], per: int, top: int) -> list[list[Any]]:
    """Every object of ``objs`` (gc-tracked ones) and, once each, the untracked objects
    they reference (ints beyond the interpreter's shared small ones, strings, bytes...), by
    `_kind`: [name, bytes per service, count] (``sys.getsizeof``, GC header included)."""
    size: Counter[str] = Counter()
    count: Counter[str] = Counter()
    seen: set[int] = set()
    tracked = gc.is_tracked
    for o in objs:
        k = _kind(o)
        size[k] += sys.getsizeof(o)
        count[k] += 1
        for r in gc.get_referents(o):
            if tracked(r) or type(r) is type or id(r) in seen:
                continue
            if type(r) is int and -5 <= r <= 256:
                continue
            seen.add(id(r))
            k = _kind(r)
            size[k] += sys.getsizeof(r)
            count[k] += 1
    return [[name, round(b / per), count[name]] for name, b in size.most_common(top)]


#: What `owner_bytes` does not follow: code, classes and modules are not the data.
_NOT_DATA = (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType,
             types.CodeType, types.FrameType, types.MethodType)


def _block(size: int) -> int:
    """The bytes pymalloc takes for an object of ``size`` bytes (16-byte size classes up to
    512 bytes; larger blocks come from malloc, counted as asked)."""
    return (size + 15) & ~15 if size <= 512 else size


#: An owner of `owner_bytes`: its name, its roots and whether what they reference is its
#: too (False: the roots alone).
Owner = tuple[str, list[Any], bool]


def owner_bytes(owners: list[Owner], per: int) -> list[list[Any]]:
    """Each object reachable (``gc.get_referents``) from the roots of an owner, counted
    once, for the first owner in ``owners`` that reaches it: ``[owner, bytes per service
    (``sys.getsizeof`` rounded up to pymalloc's size class), objects, its three largest
    types as [type, bytes per service]]``, in the order given. Classes, modules and
    functions are not followed, nor the shared small ints; a dict's keys are."""
    seen: set[int] = set()
    out: list[list[Any]] = []
    for name, roots, follow in owners:
        size = count = 0
        by_type: Counter[str] = Counter()
        stack = list(roots)
        while stack:
            o = stack.pop()
            i = id(o)
            if i in seen or isinstance(o, _NOT_DATA) or (type(o) is int and -5 <= o <= 256):
                continue
            seen.add(i)
            b = _block(sys.getsizeof(o))
            size += b
            count += 1
            by_type[type(o).__qualname__] += b
            if follow:
                stack.extend(gc.get_referents(o))
                if type(o) is dict:
                    # A dict of str keys does not report its keys as referents.
                    stack.extend(o)
        out.append([name, round(size / per), count,
                    [[t, round(b / per)] for t, b in by_type.most_common(3)]])
    return out


def lb_owners(lb: Any, source: Any) -> list[Owner]:
    """The parts of a `statewright.loadbalancer.LoadBalancer` and its Kubernetes source,
    in `owner_bytes`'s order: per table statedb's own objects (its dicts and log, then
    the stored records, then their revisions), then per table the rows, then the LB Ops,
    the writer, the converter, the source. After the rows, per table, what only superseded
    versions hold: their rows and revisions (``older``, and log records not yet trimmed)."""
    states = lb.db.read_txn().states
    owners: list[Owner] = []
    for name, st in states.items():
        store = st.store
        records = list(store.heads.values())
        owners.append((f"statedb {name}: dicts and log",
                       [store.heads, store.older, st.log, *(s.heads for s in st.secondary if s)],
                       False))
        owners.append((f"statedb {name}: records",
                       [*records, *store.older.values(), *st.log], False))
        owners.append((f"statedb {name}: revisions", [e[1] for e in records], False))
    for name, st in states.items():
        owners.append((f"rows {name}", [e[0] for e in st.store.heads.values()], True))
    for name, st in states.items():
        # What only superseded versions hold (rows, revisions): versions kept in ``older``
        # for snapshots, and log records not yet trimmed to gaps.
        heads = st.store.heads
        old = [e for e in st.log[: st.log_len] if type(e) is tuple and heads.get(e[2]) is not e]
        for kept in st.store.older.values():
            old.extend(kept if type(kept) is list else [kept])
        owners.append((f"statedb {name}: old versions",
                       [*(e[0] for e in old), *(e[1] for e in old)], True))
    ops = lb.ops
    if ops is not None:
        owners.append(("LB Ops: backend states", [ops.backend_states], True))
        owners.append(("LB Ops: frontend states", [ops.frontends], True))
        owners.append(("LB Ops: the rest", [ops], True))
    owners += [("LB writer", [lb.writer], True), ("k8s converter", [lb.converter], True),
               ("k8s source", [source], True)]
    return owners


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
            "uordblks", "fordblks", "keepcost",
        )
    ]


def allocator_figures() -> dict[str, float]:
    """Where the resident set is, by allocator (MB), without tracing: Python's small-object
    allocator (its arenas, the bytes in live blocks) and glibc's malloc (heap in use and
    free, mmapped blocks). What pymalloc's arenas hold beyond their live blocks, and
    glibc's free heap, is memory freed but kept."""
    out: dict[str, float] = {}
    fd, path = tempfile.mkstemp(prefix="statewright-mallocstats-")
    saved = os.dup(2)
    try:
        sys.stderr.flush()
        os.dup2(fd, 2)
        sys._debugmallocstats()
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(fd)
    text = Path(path).read_text()
    os.unlink(path)
    for line in text.splitlines():
        name, _, value = line.partition("=")
        value = value.strip().replace(",", "")
        if not value.isdigit():
            continue
        if "bytes/arena" in name:
            out["pymalloc_arenas_mb"] = round(int(value) / 2**20, 1)
        elif name.startswith("# bytes in allocated blocks"):
            out["pymalloc_live_mb"] = round(int(value) / 2**20, 1)
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallinfo2.restype = _MallInfo2
        info = libc.mallinfo2()
    except (OSError, AttributeError):
        return out
    out["malloc_heap_in_use_mb"] = round(info.uordblks / 2**20, 1)
    out["malloc_heap_free_mb"] = round(info.fordblks / 2**20, 1)
    out["malloc_mmapped_mb"] = round(info.hblkhd / 2**20, 1)
    return out


def main(argv: list[str] | None = None) -> int:
    """Run the sync with the breakdown and print the JSON figures."""
    import argparse

    from benchmarks import k8s

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--services", type=int, default=10_000)
    args = p.parse_args(argv)
    return k8s.main(
        ["--services", str(args.services), "--churn-seconds", "0.001", "--memory-breakdown"]
    )


if __name__ == "__main__":
    sys.exit(main())
