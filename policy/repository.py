"""The policy repository: every policy object in force, its rules indexed by selector.

One `Policy` per object (``Kind/namespace/name``); ``revision`` grows by one with every
change that changed something. The indexes answer the two questions of the incremental
computation: which rules apply to an endpoint (by subject selector) and which rules use a
selector as peer (an identity that appears or goes away in that selector's selection
changes those rules' entries, and nothing else).

Every selector the rules use holds one reference in the selector cache per rule use; a
policy's new selectors are taken before its old ones are dropped, so a selection shared
by the old and the new version is never resolved again.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from policy.model import Policy, Rule
from policy.selector import Selector
from policy.selector_cache import SelectorCache


@dataclass(slots=True)
class PolicyRepository:
    """The policies in force (see the module doc)."""

    cache: SelectorCache
    revision: int = 1
    _policies: dict[str, Policy] = field(default_factory=dict)
    _by_subject: dict[Selector, list[Rule]] = field(default_factory=dict)
    _by_peer: dict[Selector, list[Rule]] = field(default_factory=dict)

    def get(self, key: str) -> Policy | None:
        """The policy ``Kind/namespace/name``."""
        return self._policies.get(key)

    def policies(self) -> Iterator[Policy]:
        """Every policy, by key."""
        return (self._policies[k] for k in sorted(self._policies))

    def __len__(self) -> int:
        return len(self._policies)

    def rules(self) -> Iterator[Rule]:
        """Every rule of every policy."""
        for p in self.policies():
            yield from p.rules

    def subjects(self) -> Iterator[tuple[Selector, list[Rule]]]:
        """(subject selector, the rules it heads)."""
        return iter(self._by_subject.items())

    def rules_with_peer(self, sel: Selector) -> list[Rule]:
        """The rules naming ``sel`` as a peer."""
        return self._by_peer.get(sel, [])

    def upsert(self, policy: Policy) -> Policy | None:
        """Put ``policy`` in force (replacing its previous version); return the previous one.
        An identical policy changes nothing (not even the revision)."""
        old = self._policies.get(policy.key)
        if old == policy:
            return old
        self._index(policy, add=True)
        if old is not None:
            self._index(old, add=False)
        self._policies[policy.key] = policy
        self.revision += 1
        return old

    def delete(self, key: str) -> Policy | None:
        """Remove the policy ``key``; return it (None when unknown)."""
        old = self._policies.pop(key, None)
        if old is not None:
            self._index(old, add=False)
            self.revision += 1
        return old

    def _index(self, policy: Policy, *, add: bool) -> None:
        for rule in policy.rules:
            uses = [(self._by_subject, rule.subject)] + [
                (self._by_peer, p) for p in (rule.peers or ())
            ]
            for index, sel in uses:
                if add:
                    self.cache.add_selector(sel)
                    index.setdefault(sel, []).append(rule)
                else:
                    rules = index[sel]
                    rules.remove(rule)
                    if not rules:
                        del index[sel]
                    self.cache.remove_selector(sel)
