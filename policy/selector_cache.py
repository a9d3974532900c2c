"""The selector cache: every selector in use and the identities it selects, kept current.

Cilium's agent resolves each label selector of the policy once, into the set of numeric
identities it selects, and updates that set as identities come and go; the policy
computation works on the numbers. Here each selection is a pyroaring ``BitMap``.

Incremental: a new identity is matched only against the selectors that can select it.
Selectors with an ``In`` requirement (matchLabels) are indexed by the (key, value) pairs
one of which a selected identity must carry; the others (only ``NotIn``, ``Exists``,
``DoesNotExist`` or nothing) are matched against every new identity. Adding a selector
matches it against the identities carrying one of its index pairs (a label index of the
identities), or all identities when it has none.

`upsert_identity` and `delete_identity` return the selectors whose selection changed:
the notification the policy computation uses to touch only the entries that depend on
them. Subscribers registered with `subscribe` are called with the same list.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from pyroaring import BitMap

from policy.selector import LabelView, Selector


@dataclass(slots=True)
class _Entry:
    selection: BitMap
    refs: int = 0


@dataclass(frozen=True, slots=True)
class SelectionChange:
    """One selector's selection gained or lost one identity."""

    selector: Selector
    identity: int
    added: bool


Subscriber = Callable[[list[SelectionChange]], None]


@dataclass(slots=True)
class SelectorCache:
    """Selectors in use -> the identities they select (see the module doc)."""

    _identities: dict[int, tuple[tuple[str, ...], LabelView]] = field(default_factory=dict)
    _by_label: dict[tuple[str, str], BitMap] = field(default_factory=dict)
    _all: BitMap = field(default_factory=BitMap)
    _entries: dict[Selector, _Entry] = field(default_factory=dict)
    _indexed: dict[tuple[str, str], set[Selector]] = field(default_factory=dict)
    _unindexed: set[Selector] = field(default_factory=set)
    _subscribers: list[Subscriber] = field(default_factory=list)

    # ----- selectors -----------------------------------------------------------------------------
    def add_selector(self, sel: Selector) -> BitMap:
        """Take a reference on ``sel`` (resolving it when new); return its selection."""
        entry = self._entries.get(sel)
        if entry is None:
            entry = _Entry(self._resolve(sel))
            self._entries[sel] = entry
            pairs = sel.index_pairs()
            if pairs:
                for p in pairs:
                    self._indexed.setdefault(p, set()).add(sel)
            else:
                self._unindexed.add(sel)
        entry.refs += 1
        return entry.selection

    def remove_selector(self, sel: Selector) -> None:
        """Drop a reference on ``sel``; the last one forgets it."""
        entry = self._entries.get(sel)
        if entry is None:
            return
        entry.refs -= 1
        if entry.refs > 0:
            return
        del self._entries[sel]
        pairs = sel.index_pairs()
        for p in pairs:
            sels = self._indexed.get(p)
            if sels is not None:
                sels.discard(sel)
                if not sels:
                    del self._indexed[p]
        if not pairs:
            self._unindexed.discard(sel)

    def selection(self, sel: Selector) -> BitMap:
        """The identities ``sel`` selects (a selector not in use is resolved, not cached)."""
        entry = self._entries.get(sel)
        return entry.selection if entry is not None else self._resolve(sel)

    def selectors(self) -> Iterator[Selector]:
        """The selectors in use."""
        return iter(self._entries)

    def refs(self, sel: Selector) -> int:
        """References held on ``sel``."""
        entry = self._entries.get(sel)
        return entry.refs if entry is not None else 0

    def _resolve(self, sel: Selector) -> BitMap:
        pairs = sel.index_pairs()
        if pairs:
            candidates = BitMap()
            for p in pairs:
                ids = self._by_label.get(p)
                if ids is not None:
                    candidates |= ids
        else:
            candidates = self._all
        return BitMap(i for i in candidates if sel.matches(self._identities[i][1]))

    # ----- identities ---------------------------------------------------------------------
    def labels_of(self, identity: int) -> tuple[str, ...] | None:
        """The labels of a known identity."""
        got = self._identities.get(identity)
        return got[0] if got is not None else None

    def identities(self) -> BitMap:
        """Every known identity."""
        return self._all

    def upsert_identity(self, identity: int, labels: Iterable[str]) -> list[SelectionChange]:
        """Add an identity (or change its labels); return the selections that changed."""
        labels = tuple(labels)
        old = self._identities.get(identity)
        if old is not None and old[0] == labels:
            return []
        changes = self.delete_identity(identity, notify=False) if old is not None else []
        view = LabelView(labels)
        self._identities[identity] = (labels, view)
        self._all.add(identity)
        pairs = {(k, v) for k, vals in view.by_key.items() for _, v in vals}
        for p in pairs:
            self._by_label.setdefault(p, BitMap()).add(identity)
        candidates: set[Selector] = set(self._unindexed)
        for p in pairs:
            sels = self._indexed.get(p)
            if sels:
                candidates |= sels
        for sel in candidates:
            if sel.matches(view):
                self._entries[sel].selection.add(identity)
                changes.append(SelectionChange(sel, identity, True))
        self._notify(changes)
        return changes

    def delete_identity(self, identity: int, *, notify: bool = True) -> list[SelectionChange]:
        """Forget an identity; return the selections that lost it."""
        old = self._identities.pop(identity, None)
        if old is None:
            return []
        self._all.discard(identity)
        # Only selectors that could select it can hold it: the unindexed ones and those
        # indexed under one of its labels.
        candidates: set[Selector] = set(self._unindexed)
        for k, vals in old[1].by_key.items():
            for _, v in vals:
                ids = self._by_label.get((k, v))
                if ids is not None:
                    ids.discard(identity)
                    if not ids:
                        del self._by_label[(k, v)]
                sels = self._indexed.get((k, v))
                if sels:
                    candidates |= sels
        changes = [
            SelectionChange(sel, identity, False)
            for sel in candidates
            if identity in self._entries[sel].selection
        ]
        for c in changes:
            self._entries[c.selector].selection.discard(identity)
        if notify:
            self._notify(changes)
        return changes

    # ----- notifications ------------------------------------------------------------------
    def subscribe(self, fn: Subscriber) -> None:
        """Call ``fn`` with the changed selections after every identity change."""
        self._subscribers.append(fn)

    def _notify(self, changes: list[SelectionChange]) -> None:
        if changes:
            for fn in self._subscribers:
                fn(changes)
