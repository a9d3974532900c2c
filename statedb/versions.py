"""Multi-version key -> record maps: one shared, mutable store per index of a table.

A `VersionStore` holds, for each key, the newest record (``heads``) and the
older records some open snapshot may still need (``older``: one record, or a
list in revision order). A snapshot is just a revision: a reader at revision
R sees, for each key, the newest record with ``revision <= R``, and a
deletion record or no record at all means "absent". Writers
(one per table at a time, under the table lock) add records with revisions
above every committed one, so no snapshot ever sees them before they commit;
they move the replaced committed record to ``older`` *before* installing the
new head, so a reader that finds a head too new for it always finds the
record it needs in ``older``.

Readers in other threads never iterate these dicts (iteration goes through
the change log, see `statedb.table_state.live_entries`); they only call
``dict.get``, which is atomic under the GIL. Two writer operations replace
what a reader may be looking at:

- retention (`retain`, and `trim` for the oldest snapshot alone) drops the
  records no live snapshot sees: a record is kept only while some live
  snapshot's revision ``l`` has ``record.revision <= l < next.revision``
  (``next``: the key's following record), so a snapshot held for a long time
  keeps one version per key it can see, not every version written since. A
  record a live reader needs is never removed;
- abort (`restore`) puts the committed head back before removing it from
  ``older``; a reader that read the aborted head checks, after reading ``older``,
  that the head is still the one it read, and reads again when it is not
  (`VersionStore.older_at`).

Records are the table's stored records (`statedb.table_state.Entry`): a
plain tuple ``(obj, revision, key)`` for an upsert, any other type (a
`statedb.table_state.Deletion`) for a deletion; index 1 is the revision.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from operator import itemgetter
from typing import Any

# A record: (obj, revision, key), a plain tuple unless a deletion; typed loosely to stay
# import-free.
Record = Any
# VersionStore.newest while a write transaction may install heads: above every revision.
WRITING = 1 << 62
_rev = itemgetter(1)


class VersionStore:
    """Key -> versions of one index of one table, shared by every snapshot of it."""

    __slots__ = ("cursor", "heads", "kept_for", "newest", "older", "stale", "sweeping")

    def __init__(self) -> None:
        # The newest record per key (committed or, during a write txn, the writer's own).
        self.heads: dict[bytes, Record] = {}
        # Older records still needed by some snapshot: one record or a list, oldest first.
        self.older: dict[bytes, Record | list[Record]] = {}
        # No head is above this revision: the committed revision between write
        # transactions, WRITING while one may be installing heads. A reader at or above it
        # takes the head without reading the head's revision (an int object elsewhere in
        # memory: one cache miss less per lookup). A writer raises it before it installs a
        # head, so a reader that got a newer head also sees the raised value.
        self.newest = 0
        # The sweep (`sweep`): keys of ``older`` still to check against the live snapshots
        # in the current pass, and whether a snapshot died since the pass began (the keys
        # already checked may keep records only it saw: another pass is due).
        self.cursor: list[bytes] = []
        self.stale = False
        # The live snapshot revisions below the committed one at the last trim: the ones
        # ``older`` may keep records for.
        self.kept_for: frozenset[int] = frozenset()
        # On a table's primary store: a sweep pass of one of its stores is under way or due.
        self.sweeping = False

    def get(self, key: bytes, revision: int) -> Record | None:
        """The live (not deleted) record of ``key`` at ``revision``, or None."""
        e = self.heads.get(key)
        if e is None:
            return None
        if revision < self.newest and e[1] > revision:
            return self.older_at(key, revision, e)
        return e if type(e) is tuple else None

    def older_at(self, key: bytes, revision: int, head: Record) -> Record | None:
        """The live record of ``key`` at ``revision`` when ``head`` is newer than that.

        What ``older`` holds is only trusted if the head is still ``head`` afterwards: an
        abort puts the committed head back and then takes it out of ``older``, so a reader
        that read ``older`` after that sees an older record there, but also a changed
        head, and reads again."""
        while True:
            found: Record | None = None
            o = self.older.get(key)
            if o is not None:
                if isinstance(o, list):
                    # Oldest first, revisions ascending: binary search (an old snapshot
                    # can be many versions behind).
                    i = bisect_right(o, revision, key=_rev)
                    if i:
                        found = o[i - 1]
                elif o[1] <= revision:
                    found = o
            h = self.heads.get(key)
            if h is head:
                return found if type(found) is tuple else None
            if h is None:
                # Taken out: an aborted insert of a new key, or a deletion every live
                # snapshot sees. Absent either way.
                return None
            if h[1] <= revision:
                return h if type(h) is tuple else None
            head = h

    # ----- writer side (table lock held) ----------------------------------------
    def put(self, key: bytes, record: Record, base_revision: int) -> Record | None:
        """Install ``record`` as the head of ``key``; return the previous head or None.

        A previous head at or below ``base_revision`` is committed, so snapshots may need
        it: it moves to ``older`` first. A newer one is the writer's own, seen by no one.
        """
        heads = self.heads
        old = heads.get(key)
        if old is not None and old[1] <= base_revision:
            self.keep_older(key, old)
        heads[key] = record
        return old

    def keep_older(self, key: bytes, head: Record) -> None:
        """Keep ``key``'s committed ``head``, about to be replaced, for the snapshots that
        may still read it (bulk writers that install heads themselves call this)."""
        older = self.older
        o = older.get(key)
        if o is None:
            older[key] = head
        elif type(o) is list:
            o.append(head)
        else:
            older[key] = [o, head]

    def restore(self, key: bytes, base_revision: int) -> None:
        """Undo a write transaction's records of ``key`` (those above ``base_revision``)."""
        heads = self.heads
        h = heads.get(key)
        if h is None or h[1] <= base_revision:
            return
        older = self.older
        o = older.get(key)
        if o is None:
            # The key had no record before the transaction.
            del heads[key]
            return
        if type(o) is list:
            heads[key] = o[-1]  # the head first: see the module docstring
            rest = o[:-1]
            if len(rest) == 1:
                older[key] = rest[0]
            else:
                older[key] = rest
        else:
            heads[key] = o
            del older[key]

    def retain(self, key: bytes, live: list[int], dropped: list[Record] | None = None) -> None:
        """Keep of ``key`` only the head and the older records a snapshot in ``live`` sees.

        ``live``: the revisions of the live snapshots, ascending, the committed revision
        included (no head may be above it: the writer calls this before its own writes). An
        older record is seen by snapshot ``l`` when ``record.revision <= l < next.revision``,
        ``next`` being the key's following record. A deletion head with nothing older left
        goes too: every snapshot reads the key as absent either way. The records taken out
        are appended to ``dropped`` when given."""
        heads = self.heads
        h = heads.get(key)
        older = self.older
        o = older.get(key)
        if o is None:
            if h is not None and type(h) is not tuple:
                del heads[key]
            return
        nxt = h[1] if h is not None else WRITING
        n = len(live)
        if type(o) is not list:
            i = bisect_left(live, o[1])
            if i < n and live[i] < nxt:
                return
            del older[key]
            if dropped is not None:
                dropped.append(o)
        else:
            keep: list[Record] = []
            for v in reversed(o):  # newest first: each record's next is the one after it
                i = bisect_left(live, v[1])
                if i < n and live[i] < nxt:
                    keep.append(v)
                elif dropped is not None:
                    dropped.append(v)
                nxt = v[1]
            if len(keep) == len(o):
                return
            if not keep:
                del older[key]
            elif len(keep) == 1:
                older[key] = keep[0]
            else:
                keep.reverse()
                older[key] = keep  # a new list: a reader may be searching the old one
                return
        if h is not None and type(h) is not tuple and key not in older:
            del heads[key]

    def sweep(self, live: list[int], budget: int, dropped: list[Record] | None = None) -> int:
        """Check up to ``budget`` keys of ``older`` against ``live`` (see `retain`); return
        how many were checked.

        Writers check each key they wrote against the snapshots live at the next write
        transaction; a record kept for a snapshot that dies later is found by this sweep,
        a pass over every key of ``older`` that starts once a snapshot died (``stale``) and
        goes on a slice per write transaction."""
        cursor = self.cursor
        if not cursor:
            if not self.stale or not self.older:
                self.stale = False
                return 0
            self.stale = False
            cursor = self.cursor = list(self.older)
        retain = self.retain
        done = 0
        while cursor and done < budget:
            retain(cursor.pop(), live, dropped)
            done += 1
        return done

    def trim(
        self, key: bytes, revision: int, oldest: int, dropped: list[Record] | None = None
    ) -> None:
        """Drop what no snapshot at or above ``oldest`` needs of ``key``, given that a record
        of it was written at ``revision`` (<= ``oldest``).

        The records taken out of ``older`` are appended to ``dropped`` when given (the
        table vacates their log slots, see `statedb.table_state.TableTxn`)."""
        heads = self.heads
        h = heads.get(key)
        if h is not None and type(h) is not tuple and h[1] <= oldest:
            # Deleted before every live snapshot: the key is gone for all of them.
            del heads[key]
            o = self.older.pop(key, None)
            if dropped is not None and o is not None:
                if type(o) is list:
                    dropped += o
                else:
                    dropped.append(o)
            return
        older = self.older
        o = older.get(key)
        if o is None:
            return
        if type(o) is list:
            keep = [v for v in o if v[1] >= revision]
            if dropped is not None and len(keep) != len(o):
                dropped += [v for v in o if v[1] < revision]
            if not keep:
                del older[key]
            elif len(keep) == 1:
                older[key] = keep[0]
            elif len(keep) != len(o):
                older[key] = keep
        elif o[1] < revision:
            del older[key]
            if dropped is not None:
                dropped.append(o)
