"""Ordered views of a table, built on demand, and compaction of the change log.

Writers keep only hash maps current. An ordered query asks `ordered_view`
for a `SortedMap` of one index at one state. Views are cached on the state
and the table remembers its newest view per index; a view for another
state is derived from that one by replaying the primary keys the log says
changed in between (O(k log n + chunks touched) for k changes), and only
built from scratch (O(n log n)) when no usable view exists. Derivation
works backwards too, so an old snapshot can reuse a newer view.

Keys of ordered views: the primary key for the primary index, the index key
for unique secondary indexes, and the escaped key, a terminator and the
primary key for non-unique ones (see `nonunique_key`).
"""

from __future__ import annotations

from collections.abc import Iterator
from operator import itemgetter
from typing import TYPE_CHECKING, Any

from statedb.sortedmap import SortedMap
from statedb.table_state import (
    Deletion,
    Entry,
    TableState,
    TableTxn,
    live_entries,
    log_position,
    new_tombstone,
)

if TYPE_CHECKING:
    from statedb.table import Table

_pk = itemgetter(2)

#: Log records beyond twice the rows (or what the last compaction kept) before a commit
#: compacts the log: small tables are not compacted at all.
COMPACT_SLACK = 1024


def escape_key(key: bytes) -> bytes:
    """Escape a non-unique index key so that a terminator can follow it (order-preserving)."""
    return key.replace(b"\x00", b"\x00\xff")


KEY_END = b"\x00\x01"


def nonunique_key(key: bytes, primary: bytes) -> bytes:
    """Ordered-view key of a non-unique index entry: escaped key, terminator, primary key.

    Ordered by index key first and primary key second, even when one index key is a
    prefix of another.
    """
    return escape_key(key) + KEY_END + primary


def changed_keys(st: TableState, lo_rev: int, hi_rev: int) -> set[bytes]:
    """Return the primary keys written in revisions (lo_rev, hi_rev] of st's log."""
    start = log_position(st.log, st.log_len, lo_rev)
    end = log_position(st.log, st.log_len, hi_rev)
    return {e[2] for e in st.log[start:end]}


def _view_items(table: Table[Any], pos: int, entry: Entry) -> list[bytes]:
    if pos == 0:
        return [entry[2]]
    idx = table.secondary[pos - 1]
    keys = idx.keys_of(entry[0])
    if idx.unique:
        return keys
    return [nonunique_key(k, entry[2]) for k in keys]


def build_view(table: Table[Any], st: TableState, pos: int) -> SortedMap:
    """Build the ordered view of index ``pos`` from scratch (O(n log n))."""
    entries = live_entries(st)
    if pos == 0:
        # Sorting by the extracted key (computed once per entry) keeps the comparisons
        # on bytes objects only.
        entries.sort(key=_pk)
        return SortedMap.from_sorted(list(map(_pk, entries)), entries)
    pairs = []
    for entry in entries:
        for k in _view_items(table, pos, entry):
            pairs.append((k, entry))
    pairs.sort(key=itemgetter(0))
    return SortedMap.from_sorted([k for k, _ in pairs], [v for _, v in pairs])


def replay(
    table: Table[Any],
    view: SortedMap,
    src: TableState,
    dst: TableState,
    keys: set[bytes],
    pos: int,
) -> SortedMap:
    """Turn ``view`` (of snapshot ``src``) into the view of snapshot ``dst``.

    ``keys`` must hold every primary key whose entry differs between the two.
    """
    out = view.transient()
    for pk in keys:
        _move(table, pos, out, src.entry(pk), dst.entry(pk))
    return out.seal()


def _move(table: Table[Any], pos: int, out: SortedMap, old: Any, new: Any) -> None:
    """Replace ``old`` (an entry or None) by ``new`` in the writable view ``out``."""
    if old is new:
        return
    new_items = _view_items(table, pos, new) if new is not None else []
    if old is not None:
        for k in _view_items(table, pos, old):
            # Only drop the key if it still holds this row: within one batch of changes a
            # unique key may already have moved to another row.
            if k not in new_items and out.get(k) is old:
                out.pop(k)
    for k in new_items:
        out.set(k, new)


def ordered_view(table: Table[Any], st: TableState, pos: int) -> SortedMap:
    """Return the ordered view of index ``pos`` (0 = primary) for state ``st``."""
    if isinstance(st, TableTxn):
        return _txn_view(table, st, pos)
    view = st.ordered[pos]
    if view is not None:
        return view
    cached = table.ordered_cache[pos]
    if cached is not None and cached[0].log is st.log:
        base, base_view = cached
        newer = st if st.revision >= base.revision else base
        lo, hi = sorted((base.revision, st.revision))
        keys = changed_keys(newer, lo, hi)
        view = replay(table, base_view, base, st, keys, pos)
    else:
        view = build_view(table, st, pos)
    st.ordered[pos] = view
    if cached is None or cached[0].revision <= st.revision:
        table.ordered_cache[pos] = (st, view)
    return view


class TxnView:
    """A write transaction's ordered view of one index, kept current write by write.

    ``view`` is a transient map updated with each new log record of the transaction;
    ``in_view`` remembers which entry the view holds for every key the transaction
    wrote, so that one more write costs O(log n) instead of a replay of all of them.
    """

    __slots__ = ("frozen", "in_view", "synced", "view")

    def __init__(self, view: SortedMap, synced: int) -> None:
        self.view = view
        self.synced = synced
        self.in_view: dict[bytes, Any] = {}
        self.frozen: SortedMap | None = None


def _txn_view(table: Table[Any], tt: TableTxn, pos: int) -> SortedMap:
    """Ordered view of a write transaction's contents: its base view plus its own writes."""
    n = len(tt.log)
    tv = tt.view_cache.get(pos)
    if tv is None:
        tv = TxnView(ordered_view(table, tt.base, pos).transient(), tt.base.log_len)
        tt.view_cache[pos] = tv
    if tv.synced < n:
        base = tt.base
        in_view = tv.in_view
        for pk in {e[2] for e in tt.log[tv.synced : n]}:
            old = in_view[pk] if pk in in_view else base.entry(pk)
            new = tt.entry(pk)
            _move(table, pos, tv.view, old, new)
            in_view[pk] = new
        tv.synced = n
        tv.frozen = None
    if tv.frozen is None:
        tv.frozen = tv.view.freeze()
    return tv.frozen


class TxnOverlay:
    """A write transaction's own changes as one non-unique index sees them.

    ``entries``: primary key -> the transaction's current record of that row (None once
    deleted), for every row it wrote; ``keys``: primary key -> that record's index keys;
    ``by_key``: index key -> the primary keys of written rows having it now. Kept in step
    with the log lazily, O(1) per write, so a query after each write costs no view copy.
    """

    __slots__ = ("by_key", "entries", "keys", "synced")

    def __init__(self, synced: int) -> None:
        self.synced = synced
        self.entries: dict[bytes, Entry | None] = {}
        self.keys: dict[bytes, list[bytes]] = {}
        self.by_key: dict[bytes, set[bytes]] = {}


def _txn_overlay(table: Table[Any], tt: TableTxn, pos: int) -> TxnOverlay:
    """The overlay of index ``pos`` for ``tt``, brought up to its last write."""
    ov = tt.overlays.get(pos)
    if ov is None:
        ov = tt.overlays[pos] = TxnOverlay(tt.base.log_len)
    n = len(tt.log)
    if ov.synced < n:
        keys_of = table.secondary[pos - 1].keys_of
        entries, keys, by_key = ov.entries, ov.keys, ov.by_key
        for e in tt.log[ov.synced : n]:
            pk = e[2]
            for k in keys.get(pk, ()):
                by_key[k].discard(pk)
            if type(e) is not tuple:
                entries[pk] = None
                keys[pk] = []
                continue
            ks = keys_of(e[0])
            entries[pk] = e
            keys[pk] = ks
            for k in ks:
                group = by_key.get(k)
                if group is None:
                    by_key[k] = {pk}
                else:
                    group.add(pk)
        ov.synced = n
    return ov


def nonunique_entries(table: Table[Any], st: TableState, pos: int, key: bytes) -> Iterator[Entry]:
    """The records under ``key`` in non-unique index ``pos`` of ``st``, in primary key order.

    In a write transaction, without a view of its own contents: the committed base's view
    (cached, or derived once per snapshot) with the transaction's own writes laid over it
    (`TxnOverlay`), so write-query-write loops never copy or freeze a view.
    """
    prefix = escape_key(key) + KEY_END
    if isinstance(st, TableTxn) and pos not in st.view_cache:
        ov = _txn_overlay(table, st, pos)
        base = ordered_view(table, st.base, pos).items_prefix(prefix)
        entries = ov.entries
        if not entries:
            return (e for _, e in base)
        out = [e for _, e in base if e[2] not in entries]
        mine = ov.by_key.get(key)
        if mine:
            out.extend(entries[pk] for pk in mine)
            out.sort(key=_pk)
        return iter(out)
    return (e for _, e in ordered_view(table, st, pos).items_prefix(prefix))


class Compaction:
    """A log compaction in progress (`Table.compaction`): the log being compacted, how far
    its records were filtered, and the records kept so far.

    Each commit filters the next `COMPACT_CHUNK` records (or twice what was appended since
    the last step, whichever is more, so the job always catches up with the log's end);
    the commit that reaches the end publishes the new log. A compaction of a large table
    thus costs every commit a bounded slice of work instead of one commit the whole log
    (benchmarks/soak.py: 100 to 250 ms on the event loop every 50 s for 100,000 backends).

    What changes in the old log's filtered stretch meanwhile is safe to miss: only records
    dropped by trimming (upserts vacated to gaps) and deletions whose rows every change
    iterator has seen (`TableTxn.release_tombstones`) change, so the kept records are a
    superset of what filtering at the end would keep. A kept upsert vacated meanwhile is
    no key's record (readers skip it) and leaves at the next compaction; a kept deletion
    released meanwhile gets its object-less record at publication (`_publish`).
    """

    __slots__ = ("deletions", "kept", "log", "pos", "seen_len", "start_len")

    def __init__(self, log: list[Entry], log_len: int) -> None:
        self.log = log
        self.pos = 0
        #: The log's length when the job began: a cached view of a state before it was not
        #: asked for while the job ran (`compact_log` drops it).
        self.start_len = log_len
        #: The log's length at the last step (what was appended since is caught up with).
        self.seen_len = log_len
        self.kept: list[Entry] = []
        #: Positions in ``kept`` of the deletions kept with their row (held for change
        #: iterators when filtered).
        self.deletions: list[int] = []

    def step(self, table: Table[Any], st: TableState) -> bool:
        """Filter the next slice of ``st``'s log; True once the whole log is filtered."""
        n = st.log_len
        end = min(n, self.pos + max(COMPACT_CHUNK, 2 * (n - self.seen_len)))
        self.seen_len = n
        # Records the trim has not checked yet (the last transaction's) stay: the next trim
        # reads them to find what it can drop. The others it has checked against every live
        # snapshot, and only states at or after this compaction read the new log: of a
        # checked upsert they need it only while it is its row's latest record.
        # An upsert is its row's latest record when it is the head (the writer holds the
        # table lock, and st is its newest state: `TableState.entry` would return the head
        # too); a gap is no key's head.
        untrimmed = table.trimmed_revision
        head = st.rows.get
        kept = self.kept
        # A slice, not islice: islice would step through the first ``pos`` records.
        for e in st.log[self.pos : end]:
            if type(e) is tuple:
                if head(e[2]) is e or e[1] > untrimmed:
                    kept.append(e)
            elif type(e) is Deletion and e[0] is not None:
                self.deletions.append(len(kept))
                kept.append(e)
            elif e[1] > untrimmed:
                kept.append(e)
        self.pos = end
        return end >= n

    def publish(self, table: Table[Any]) -> list[Entry]:
        """The new log, with its held deletions recorded in ``table.held_tombstones``."""
        log = self.kept
        held = table.held_tombstones
        still = {rev for rev, _ in held}
        held.clear()
        for i in self.deletions:
            e = log[i]
            if e[1] in still:
                held.append((e[1], i))
            else:  # released while the compaction ran
                log[i] = new_tombstone(None, e[1], e[2])
        return log


#: Log records a commit filters at least while a compaction is in progress (`Compaction`).
COMPACT_CHUNK = 4096


def compact_log(table: Table[Any], st: TableState) -> TableState:
    """Return ``st`` with its log rewritten without superseded entries and seen tombstones,
    or ``st`` itself when compaction is not worth it yet or not finished (`Compaction`:
    a large log is filtered a slice per commit).

    Runs at commit under the table lock. The new log keeps every live row's latest entry
    and the deletions some change iterator has not seen. Cached ordered views far behind
    ``st`` are dropped first (`drop_stale_views`, at every commit); the ones some query
    asked for while the compaction ran (a view is cached with the state it was last asked
    for at) are brought up to ``st`` so they stay derivable, and the others are dropped.
    A view brought up holds the compacted state live, and with it a version of every row
    written after it, until the log is `replay_limit` records past it: for a view built
    once and not asked for again (``all()`` at start, the initial prune) that would be
    every write transaction's trim sweeping those versions again for no reader. The
    compacted state is a new object: ``st`` may already be visible to readers through the
    view cache, and a state a reader can see never changes.
    """
    drop_stale_views(table, st)
    table.retired_logs.free_some()
    job = table.compaction
    if job is not None and job.log is not st.log:
        job = table.compaction = None  # the log was replaced: start again when due
    if job is None:
        # The log cannot shrink below what the last compaction kept (the live rows and the
        # deletions held for change iterators): wait until it doubled again.
        if st.log_len <= 2 * max(st.count, table.log_floor) + COMPACT_SLACK:
            return st
        job = table.compaction = Compaction(st.log, st.log_len)
    if not job.step(table, st):
        return st
    table.compaction = None
    for pos, cached in enumerate(table.ordered_cache):
        if cached is None or st.ordered[pos] is not None:
            continue
        if cached[0].log is st.log and cached[0].log_len >= job.start_len:
            ordered_view(table, st, pos)
        else:
            # Not asked for while the job ran, or an older log's view a reader stored
            # meanwhile (not derivable from st's log).
            table.ordered_cache[pos] = None
    log = job.publish(table)
    table.retired_logs.retire(st.log)
    table.log_floor = len(log)
    out = st.copy()
    out.log = log
    out.log_len = len(log)
    out.ordered = list(st.ordered)  # same contents, same views
    table.snapshots.track(out)
    out.tombstones = len(table.held_tombstones)
    # Relabel with the views computed above, never with whatever the cache holds now: a
    # reader may have stored an older snapshot's view there in the meantime.
    for pos, view in enumerate(out.ordered):
        table.ordered_cache[pos] = (out, view) if view is not None else None
    return out


def drop_stale_views(table: Table[Any], st: TableState) -> None:
    """Forget the table's cached ordered views that ``st`` (its newest state) could only
    derive with a long replay: more than `replay_limit` records behind, or of a log since
    replaced by compaction. Runs at every commit (O(indexes)).

    Such a view is one no query has asked for since (e.g. built by ``all()`` at start);
    its state, held by the cache, is a live snapshot, and would keep a version of every
    row written since until the next compaction replayed it. Dropped, the
    view is built anew if it is ever asked for again.
    """
    cache = table.ordered_cache
    limit = -1
    for pos, cached in enumerate(cache):
        if cached is None:
            continue
        base = cached[0]
        if base.log is st.log:
            if limit < 0:
                limit = replay_limit(st)
            if st.log_len - base.log_len <= limit:
                continue
        cache[pos] = None


def replay_limit(st: TableState) -> int:
    """How many log records a cached view may lag behind ``st`` and still be replayed at
    compaction: a quarter of the rows (replaying k changes costs O(k log n), building a
    view O(n log n)), at least `COMPACT_SLACK`."""
    return max(COMPACT_SLACK, st.count // 4)
