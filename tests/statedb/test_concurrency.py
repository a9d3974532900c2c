"""A concurrency fuzz test: writer threads on overlapping table subsets, reader threads
checking that every snapshot is consistent, and a change follower rebuilding a table.

Writers move value between rows of the tables they locked, so the sum over all
tables is the same in every committed state; a reader that ever sees another sum
saw a torn snapshot. Readers also check that per-table revisions never go back,
that secondary index results agree with a scan, and that counts match. Each
thread draws its operations from a random generator seeded from the test seed
(STATEDB_FUZZ_SEED, printed on failure); the thread interleaving is up to the OS,
so the seed fixes what is done, not the order.
"""

from __future__ import annotations

import functools
import os
import random
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

import pytest

from statedb import (
    DB,
    Index,
    ReadTxn,
    RevisionMismatchError,
    Table,
    Watch,
    WatchSet,
    keys,
    table_state,
)

ROWS_PER_TABLE = 8
START_VALUE = 100
TABLE_NAMES = ["a", "b", "c", "d"]
#: Tables each writer locks; they overlap so writers contend on shared tables.
WRITER_TABLES = [["a", "b"], ["b", "c", "d"], ["d", "a"], ["c"], ["a", "b", "c", "d"]]
TXNS_PER_WRITER = 300
#: Wall-clock cap on the writers (a bound on runtime, not an assertion).
MAX_SECONDS = 6.0
HANG_GUARD_S = 120.0


@dataclass(frozen=True, slots=True)
class Account:
    """A row holding some value; ``grp`` is derived from the value for index checks."""

    id: int
    value: int
    grp: str


def account(id: int, value: int) -> Account:
    """An Account with its group derived from its value."""
    return Account(id, value, f"g{value % 3}")


BY_ID: Index[Account, int] = Index("id", key=lambda a: a.id, encode=keys.uint64)
BY_GRP: Index[Account, str] = Index("grp", key=lambda a: a.grp, unique=False)
TOTAL = len(TABLE_NAMES) * ROWS_PER_TABLE * START_VALUE


class Abort(Exception):
    """Raised by a writer to abort its transaction on purpose."""


class Fuzz:
    """Shared state of one fuzz run: the DB, the stop flag and collected failures."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.tables = {n: Table(n, BY_ID, BY_GRP) for n in TABLE_NAMES}
        self.db = DB(*self.tables.values())
        self.writers_done = threading.Event()
        self.failures: list[str] = []
        self.lock = threading.Lock()
        self.reads = 0
        self.commits = 0
        with self.db.write_txn(*self.tables.values()) as txn:
            for t in self.tables.values():
                for i in range(ROWS_PER_TABLE):
                    t.insert(txn, account(i, START_VALUE))

    def guarded(self, name: str, fn: Callable[[], None]) -> Callable[[], None]:
        """Wrap a thread body so a failure is recorded (and stops the run) instead of lost."""

        def run() -> None:
            try:
                fn()
            except BaseException:
                with self.lock:
                    self.failures.append(f"{name}:\n{traceback.format_exc()}")
                self.writers_done.set()

        return run

    # ----- writers -----------------------------------------------------------
    def writer(self, n: int, deadline: float) -> None:
        """Move value between rows of the locked tables; sometimes abort on purpose."""
        rng = random.Random(self.seed * 1000 + n)
        names = WRITER_TABLES[n]
        next_id = 1000 * (n + 1)
        for _ in range(TXNS_PER_WRITER):
            if self.writers_done.is_set() or time.monotonic() > deadline:
                return
            order = rng.sample(names, len(names))  # lock order must not matter
            tables = [self.tables[x] for x in order]
            try:
                with self.db.write_txn(*tables) as txn:
                    for _ in range(rng.randint(1, 4)):
                        src, dst = rng.choice(tables), rng.choice(tables)
                        rows = list(src.all(txn))
                        if not rows:
                            continue
                        a = rng.choice(rows)
                        op = rng.random()
                        if op < 0.6:
                            # Transfer between two rows (maybe the same one).
                            amount = rng.randint(1, 20)
                            src.insert(txn, replace(account(a.id, a.value - amount)))
                            b_rows = list(dst.all(txn))
                            b = rng.choice(b_rows)
                            dst.insert(txn, account(b.id, b.value + amount))
                        elif op < 0.75 and len(rows) > 2:
                            # Delete a row, handing its value to a new row elsewhere.
                            src.delete(txn, a)
                            next_id += 1
                            dst.insert(txn, account(next_id, a.value))
                        elif op < 0.9:
                            # Compare-and-swap a no-op value change through a revision.
                            got = src.get_revision(txn, a.id)
                            assert got is not None
                            obj, rev = got
                            with pytest.raises(RevisionMismatchError):
                                src.compare_and_swap(txn, rev + 1, account(a.id, obj.value))
                            src.compare_and_swap(txn, rev, account(a.id, obj.value))
                        else:
                            # Break the invariant, then abort: nobody may see it.
                            src.insert(txn, account(a.id, a.value + 1_000_000))
                            raise Abort
                with self.lock:
                    self.commits += 1
            except Abort:
                pass

    # ----- readers -------------------------------------------------------------
    def reader(self) -> None:
        """Check every snapshot: constant sum, monotonic revisions, index agreement."""
        last_rev = dict.fromkeys(TABLE_NAMES, 0)
        while True:
            finished = self.writers_done.is_set()  # check once more after the last commit
            txn = self.db.read_txn()
            total = 0
            for name, t in self.tables.items():
                rev = t.revision(txn)
                assert rev >= last_rev[name], f"{name}: revision went back {last_rev[name]}->{rev}"
                last_rev[name] = rev
                revs = list(t.revisions(txn))
                rows = [r for r, _ in revs]
                assert t.count(txn) == len(rows)
                assert all(r <= rev for _, r in revs), f"{name}: row newer than table"
                ids = [r.id for r in rows]
                assert ids == sorted(ids) and len(set(ids)) == len(ids)
                for g in ("g0", "g1", "g2"):
                    assert list(t.list(txn, BY_GRP.query(g))) == [r for r in rows if r.grp == g]
                if rows:
                    probe = rows[len(rows) // 2]
                    assert t.get(txn, probe.id) is probe
                total += sum(r.value for r in rows)
            assert total == TOTAL, f"torn snapshot: sum {total} != {TOTAL} in {txn!r}"
            with self.lock:
                self.reads += 1
            if finished:
                return

    def follower(self, result: dict[int, Account]) -> None:
        """Rebuild table "a" from a change iterator while the writers run."""
        t = self.tables["a"]
        with self.db.write_txn(t) as txn:
            it = t.changes(txn)
        try:
            last = -1
            while True:
                finished = self.writers_done.is_set()
                changes, watch = it.next(self.db.read_txn())
                for c in changes:
                    assert c.revision > last, "change iterator went back or repeated"
                    last = c.revision
                    if c.deleted:
                        result.pop(c.obj.id, None)
                    else:
                        result[c.obj.id] = c.obj
                if finished:
                    return
                watch.wait(0.05)  # wake on commit; the timeout only rechecks the stop flag
        finally:
            it.close()

    def watcher(self, taken: list[tuple[Watch, Watch, int, Account | None]]) -> None:
        """Take all() and get() watches on table "b" and wait on them while writers run.

        A watch may close spuriously (its docs say "may have changed"), so nothing is
        asserted here; the test checks at the end that every watch whose result did
        change was closed.
        """
        t = self.tables["b"]
        rng = random.Random(self.seed)
        while not self.writers_done.is_set():
            txn = self.db.read_txn()
            _, w_all = t.all_watch(txn)
            row, w_get = t.get_watch(txn, rng.randrange(ROWS_PER_TABLE))
            taken.append((w_all, w_get, t.revision(txn), row))
            del taken[:-500]
            WatchSet([w_all, w_get]).wait(0.05)


def all_rows(t: Table[Account], txn: object) -> Iterator[Account]:
    """Rows of ``t`` in a snapshot (typed helper)."""
    return t.all(txn)  # type: ignore[arg-type]


@pytest.mark.slow
@pytest.mark.parametrize("seed_offset", [0, 1])
def test_concurrent_writers_and_readers(seed_offset: int) -> None:
    """Writers on overlapping tables, readers, a change follower and a watcher, all at once."""
    seed = int(os.environ.get("STATEDB_FUZZ_SEED", "20240601")) + seed_offset
    fuzz = Fuzz(seed)
    followed: dict[int, Account] = {}
    taken: list[tuple[Watch, Watch, int, Account | None]] = []
    deadline = time.monotonic() + MAX_SECONDS
    threads = [
        threading.Thread(
            target=fuzz.guarded(f"writer{n}", functools.partial(fuzz.writer, n, deadline))
        )
        for n in range(len(WRITER_TABLES))
    ]
    workers = [
        threading.Thread(target=fuzz.guarded("reader0", fuzz.reader)),
        threading.Thread(target=fuzz.guarded("reader1", fuzz.reader)),
        threading.Thread(target=fuzz.guarded("follower", lambda: fuzz.follower(followed))),
        threading.Thread(target=fuzz.guarded("watcher", lambda: fuzz.watcher(taken))),
    ]
    old_interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # switch threads often to shake out races
    try:
        for th in workers + threads:
            th.start()
        for th in threads:
            th.join(HANG_GUARD_S)
        stuck = [th.name for th in threads if th.is_alive()]
        fuzz.writers_done.set()
        for th in workers:
            th.join(HANG_GUARD_S)
        stuck += [th.name for th in workers if th.is_alive()]
    finally:
        sys.setswitchinterval(old_interval)
    context = f"seed={seed} (rerun with STATEDB_FUZZ_SEED={seed - seed_offset})"
    assert not stuck, f"threads still running (deadlock?): {stuck}; {context}"
    assert not fuzz.failures, f"{context}\n" + "\n".join(fuzz.failures)
    txn = fuzz.db.read_txn()
    final_a = {r.id: r for r in all_rows(fuzz.tables["a"], txn)}
    assert followed == final_a, f"change follower diverged; {context}"
    total = sum(r.value for t in fuzz.tables.values() for r in all_rows(t, txn))
    assert total == TOTAL, context
    assert fuzz.commits > 0 and fuzz.reads > 0, context
    table_b = fuzz.tables["b"]
    for w_all, w_get, rev, row in taken:
        if table_b.revision(txn) != rev:
            assert w_all.closed, f"all() watch of b@{rev} still open; {context}"
        if row is not None and table_b.get(txn, row.id) is not row:
            assert w_get.closed, f"get({row.id}) watch of b@{rev} still open; {context}"


def _back_to_back_trial() -> list[int]:
    """One trial: return the revisions of all() watches left open by back-to-back commits."""
    t = Table("t", BY_ID, BY_GRP)
    db = DB(t)
    stop = threading.Event()
    taken: list[tuple[Watch, int]] = []

    def write(n: int) -> None:
        for i in range(100):
            with db.write_txn(t) as txn:
                t.insert(txn, account(n * 1000 + i % 5, i))

    def watch() -> None:
        while not stop.is_set():
            txn = db.read_txn()
            _, w = t.all_watch(txn)
            taken.append((w, t.revision(txn)))

    writers = [threading.Thread(target=write, args=(n,)) for n in range(4)]
    watchers = [threading.Thread(target=watch) for _ in range(2)]
    for th in watchers + writers:
        th.start()
    for th in writers:
        th.join(HANG_GUARD_S)
    stop.set()
    for th in watchers:
        th.join(HANG_GUARD_S)
    final = t.revision(db.read_txn())
    return [rev for w, rev in taken if rev != final and not w.closed]


def test_table_watch_not_lost_between_back_to_back_commits() -> None:
    """Writers committing one table back to back while readers keep taking all() watches:
    once the writers are done, every watch taken on an older revision must be closed.

    Guards against a lost wake-up: swapping and closing watches after the table locks are
    released would let two commits swap concurrently and drop a watch handed out in
    between, which would then never close.
    """
    old_interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        for trial in range(40):
            lost = _back_to_back_trial()
            assert not lost, f"trial {trial}: watches of revisions {lost[:5]} never closed"
    finally:
        sys.setswitchinterval(old_interval)


def _views_trial(trial: int) -> str | None:
    """One trial: a writer churns 8 rows while readers query old and new snapshots;
    returns a description of the first query that disagreed with primary-key lookups."""
    t = Table("t", BY_ID, BY_GRP)
    db = DB(t)
    stop = threading.Event()
    snaps: list[ReadTxn] = []
    bad: list[str] = []

    def write() -> None:
        rng = random.Random(trial)
        for i in range(6000):
            if stop.is_set():
                return
            with db.write_txn(t) as txn:
                t.insert(txn, account(rng.randrange(8), i))
                if rng.random() < 0.2:
                    t.delete(txn, account(rng.randrange(8), 0))
            if i % 50 == 0:
                snaps.append(db.read_txn())
        stop.set()

    def read(seed: int) -> None:
        rng = random.Random(seed)
        while not stop.is_set():
            txn = rng.choice(snaps) if snaps and rng.random() < 0.5 else db.read_txn()
            truth = [r for r in (t.get(txn, i) for i in range(8)) if r is not None]
            if list(t.all(txn)) != truth:
                bad.append(f"all() of {txn!r}")
            for g in ("g0", "g1", "g2"):
                if list(t.list(txn, BY_GRP.query(g))) != [r for r in truth if r.grp == g]:
                    bad.append(f"list({g}) of {txn!r}")
            if bad:
                stop.set()

    threads = [threading.Thread(target=write)]
    threads += [threading.Thread(target=read, args=(trial * 10 + n,)) for n in range(3)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(HANG_GUARD_S)
    return bad[0] if bad else None


def test_ordered_views_consistent_under_concurrent_readers() -> None:
    """Ordered queries (all, list) agree with hash lookups on every snapshot while readers
    on old and new snapshots derive ordered views concurrently with commits.

    Guards against log compaction at commit relabelling the table's cached view as the
    new state's view while a reader may have replaced the cache entry with the view of
    an older snapshot in the meantime: views derived from it would keep stale rows.
    """
    old_interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        for trial in range(6):
            bad = _views_trial(trial)
            assert bad is None, f"trial {trial}: {bad} disagrees with get()"
    finally:
        sys.setswitchinterval(old_interval)


def _held_snapshots_trial(trial: int) -> str | None:
    """One trial: a writer sets every row to one value per commit (and writes a poison
    value it then aborts, or deletes and re-inserts rows), while readers hold snapshots
    across many commits and keep re-reading them; returns the first disagreement."""
    t = Table("t", BY_ID, BY_GRP)
    db = DB(t)
    with db.write_txn(t) as txn:
        for i in range(ROWS_PER_TABLE):
            t.insert(txn, account(i, 0))
    stop = threading.Event()
    bad: list[str] = []

    def write() -> None:
        rng = random.Random(trial)
        for value in range(1, 1500):
            if stop.is_set():
                return
            if rng.random() < 0.3:
                txn = db.write_txn(t)
                for i in rng.sample(range(ROWS_PER_TABLE), 3):
                    t.insert(txn, account(i, -1))
                    if rng.random() < 0.5:
                        t.delete(txn, account(i, 0))
                txn.abort()
            with db.write_txn(t) as txn:
                gone = rng.randrange(ROWS_PER_TABLE)
                t.delete(txn, account(gone, 0))
                for i in range(ROWS_PER_TABLE):
                    t.insert(txn, account(i, value))
        stop.set()

    def read(seed: int) -> None:
        rng = random.Random(seed)
        held: list[tuple[ReadTxn, list[Account | None]]] = []
        while not stop.is_set() and not bad:
            txn = db.read_txn()
            rows = [t.get(txn, i) for i in range(ROWS_PER_TABLE)]
            values = {r.value if r is not None else None for r in rows}
            if len(values) != 1 or None in values or -1 in values:
                bad.append(f"torn or uncommitted read at {txn!r}: {rows}")
            held.append((txn, rows))
            if len(held) > 20:
                del held[rng.randrange(len(held))]
            for old, seen in held:
                again = [t.get(old, i) for i in range(ROWS_PER_TABLE)]
                if again != seen or list(t.all(old)) != seen:
                    bad.append(f"snapshot {old!r} changed: {seen} -> {again}")
                    break

    threads = [threading.Thread(target=write)]
    threads += [threading.Thread(target=read, args=(trial * 10 + n,)) for n in range(2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(HANG_GUARD_S)
    return bad[0] if bad else None


def test_held_snapshots_unchanged_by_later_commits_aborts_and_trims() -> None:
    """Snapshots held across many commits (and aborted writes, deletions, re-inserts and
    the trims they allow once snapshots are dropped) keep reading exactly their rows, and
    no read ever sees a torn or uncommitted state."""
    old_interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        for trial in range(3):
            bad = _held_snapshots_trial(trial)
            assert bad is None, f"trial {trial}: {bad}"
    finally:
        sys.setswitchinterval(old_interval)


def test_a_reader_that_read_an_aborted_head_is_not_fooled() -> None:
    """The interleaving the fuzz found: a reader reads a head a writer installed, the
    writer aborts (restoring the committed head), and only then the reader compares the
    head's revision with the store's ``newest``. It must take the slow path and see the
    committed row, never the aborted one."""
    t = Table("t", BY_ID, BY_GRP)
    db = DB(t)
    with db.write_txn(t) as w:
        t.insert(w, account(1, 10))
    snap = db.read_txn()
    st = snap.states["t"]
    pk = t.pk_encode(1)
    w = db.write_txn(t)
    t.insert(w, account(1, 99))
    head = st.rows.get(pk)  # the reader's first step: the aborted-to-be head
    assert head is not None and head[0].value == 99
    w.abort()
    # The reader's second step, after the abort completed.
    assert st.revision < st.store.newest and head[1] > st.revision
    assert st.store.older_at(pk, st.revision, head)[0].value == 10
    assert t.get(snap, 1).value == 10


def test_a_reader_reading_older_versions_during_an_abort_finds_the_restored_head() -> None:
    """The other interleaving the fuzz found: the committed head the snapshot needs is in
    ``older`` while a writer's head is installed; the writer aborts (the committed head
    goes back, then leaves ``older``); a reader that read the writer's head and reads
    ``older`` only now finds an even older version there. It must return the restored
    head, not that older version."""
    t = Table("t", BY_ID, BY_GRP)
    db = DB(t)
    with db.write_txn(t) as w:
        t.insert(w, account(1, 123))
    keep_old = db.read_txn()  # keeps the first version in ``older``
    with db.write_txn(t) as w:
        t.insert(w, account(1, 126))
    snap = db.read_txn()
    st = snap.states["t"]
    pk = t.pk_encode(1)
    w = db.write_txn(t)
    t.insert(w, account(1, 999))
    head = st.rows.get(pk)  # the reader's first step: the writer's head
    assert head is not None and head[0].value == 999
    w.abort()
    found = st.store.older_at(pk, st.revision, head)
    assert found is not None and found[0].value == 126
    assert t.get(snap, 1).value == 126 and t.get(keep_old, 1).value == 123


def test_held_snapshots_unchanged_while_a_sweep_runs_in_small_steps(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """As above, with the sweep (which checks every kept version again once a held snapshot
    is dropped) checking one key per write transaction: readers of the snapshots still
    held race with it over many commits."""
    monkeypatch.setattr(table_state, "SWEEP_CHUNK", 1)
    monkeypatch.setattr(table_state, "SWEEP_PER_WRITE", 0)
    old_interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        for trial in range(3, 5):
            bad = _held_snapshots_trial(trial)
            assert bad is None, f"trial {trial}: {bad}"
    finally:
        sys.setswitchinterval(old_interval)
