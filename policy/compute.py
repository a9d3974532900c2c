"""The policy computation: every local endpoint's policy entries, kept current incrementally.

For each endpoint, each rule whose subject selects the endpoint's identity contributes,
for each identity its peers select (identity 0 for "any") and each of its port keys, one
count to the entry (endpoint, identity, direction, protocol, port, prefix). An entry
exists while some contribution holds it; it denies when a deny rule contributes; its
``rules`` are the policies contributing. A direction is enforced for an endpoint when a
rule of that direction selects it.

What a change costs:

* an identity that appears or goes away (`upsert_identity`, `delete_identity`): the
  selector cache says which selections gained or lost it; for each rule using such a
  selector as peer, the endpoints that rule applies to get (or lose) the entries for that
  one identity. Nothing else is touched. Endpoints whose own identity it is are
  recomputed (their subjects may change).
* a policy that changes (`upsert_policy`, `delete_policy`): the endpoints selected by
  the old or the new version are recomputed, no others.
* an endpoint that appears, changes identity or goes away (`set_endpoint`,
  `delete_endpoint`): that endpoint is recomputed or dropped.
* the named ports of an identity change (`set_port_names`: a Pod's container ports
  changed, a pod came or went): the endpoints whose rules name ports are recomputed.

Named ports resolve per peer (policy/model.py): in an egress rule to the ports that name
has on the peer identity's pods (a rule with any peer: an entry for each identity whose
pods have the name), in an ingress rule to the endpoint's own; the entries are the
numeric ports, one key each.

`take_changes` returns what changed since the last call: the entries to write (or delete)
and the endpoints whose enforcement or revision changed, for the statedb writer
(policy/writer.py). `entries` and `enforcement` read the current state (tests, API).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from pyroaring import BitMap

from policy.model import NO_PORT_NAMES, Policy, PortNames, Rule
from policy.ports import PortKey, named_port_keys, rule_port_keys
from policy.repository import PolicyRepository
from policy.selector_cache import SelectionChange, SelectorCache
from tables.policy_entries import PolicyEndpoint, PolicyEntry, PolicyKey

#: (policy name, deny) -> how many contributions it makes to one entry.
Contributions = dict[tuple[str, bool], int]
#: A `PolicyKey` as a plain tuple, in its field order: what the computation keys on (tuples
#: hash in C; the dataclass is built only for the rows handed out).
KeyTuple = tuple[int, int, bool, int, int, int]


@dataclass(slots=True)
class PolicyChanges:
    """What `PolicyComputation.take_changes` hands to the writer."""

    #: Entries whose content changed: the new entry, or None for a key to delete.
    entries: dict[PolicyKey, PolicyEntry | None] = field(default_factory=dict)
    #: Endpoints whose enforcement row changed: the new row, or None to delete it.
    endpoints: dict[int, PolicyEndpoint | None] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.entries or self.endpoints)


@dataclass(slots=True)
class _EndpointState:
    identity: int
    contributions: dict[KeyTuple, Contributions] = field(default_factory=dict)
    #: (remote identity, egress) -> the keys present for it: deny precedence is decided
    #: within such a group (see `_group_rows`).
    groups: dict[tuple[int, bool], set[KeyTuple]] = field(default_factory=dict)
    egress: bool = False
    ingress: bool = False
    revision: int = 0
    #: The endpoint's own named ports (ingress rules' named ports resolve to them).
    names: PortNames = field(default_factory=dict)
    #: Whether a rule applying to it names ports (recomputed when port names change).
    uses_names: bool = False


class PolicyComputation:
    """The policy of every local endpoint (see the module doc)."""

    def __init__(self, cache: SelectorCache | None = None) -> None:
        self.cache = cache if cache is not None else SelectorCache()
        self.repo = PolicyRepository(self.cache)
        self._endpoints: dict[int, _EndpointState] = {}
        self._by_identity: dict[int, set[int]] = {}
        self._local = BitMap()  # identities of local endpoints
        self._dirty_keys: dict[int, set[KeyTuple]] = {}
        self._dirty_endpoints: set[int] = set()
        self._port_keys: dict[Rule, list[PortKey]] = {}
        #: Identity -> the named ports of its pods.
        self._names: dict[int, PortNames] = {}
        #: Entry rows written per change (statistics: the benchmark reads them).
        self.rows_changed = 0

    # ----- inputs --------------------------------------------------------------------------
    def upsert_identity(self, identity: int, labels: Iterable[str]) -> None:
        """An identity appeared (or its labels changed)."""
        self._apply_selection_changes(self.cache.upsert_identity(identity, labels))
        for ep in list(self._by_identity.get(identity, ())):
            self._recompute(ep)

    def delete_identity(self, identity: int) -> None:
        """An identity went away."""
        self._apply_selection_changes(self.cache.delete_identity(identity))
        for ep in list(self._by_identity.get(identity, ())):
            self._recompute(ep)

    def upsert_policy(self, policy: Policy) -> None:
        """A policy object appeared or changed."""
        old = self.repo.get(policy.key)
        if old == policy:
            return
        before = self._selected_endpoints(old) if old is not None else set()
        self.repo.upsert(policy)
        for ep in before | self._selected_endpoints(policy):
            self._recompute(ep)

    def delete_policy(self, key: str) -> None:
        """A policy object went away (``Kind/namespace/name``)."""
        old = self.repo.get(key)
        if old is None:
            return
        affected = self._selected_endpoints(old)
        self.repo.delete(key)
        for ep in affected:
            self._recompute(ep)

    def set_port_names(self, identity: int, names: PortNames) -> None:
        """The named ports of the pods of ``identity`` (empty: none); the endpoints whose
        rules name ports are recomputed when they changed."""
        if dict(self._names.get(identity, NO_PORT_NAMES)) == dict(names):
            return
        if names:
            self._names[identity] = names
        else:
            self._names.pop(identity, None)
        for ep, st in list(self._endpoints.items()):
            if st.uses_names:
                self._recompute(ep)

    def set_endpoint(
        self, endpoint_id: int, identity: int, names: PortNames = NO_PORT_NAMES
    ) -> None:
        """A local endpoint appeared, changed identity (0: none yet) or its own named
        ports."""
        st = self._endpoints.get(endpoint_id)
        if st is not None and st.identity == identity:
            if dict(st.names) != dict(names):
                st.names = names
                self._recompute(endpoint_id)
            return
        if st is not None:
            self._unlink(endpoint_id, st.identity)
        else:
            st = _EndpointState(identity)
            self._endpoints[endpoint_id] = st
            self._dirty_endpoints.add(endpoint_id)
        st.identity = identity
        st.names = names
        self._by_identity.setdefault(identity, set()).add(endpoint_id)
        self._local.add(identity)
        self._recompute(endpoint_id)

    def delete_endpoint(self, endpoint_id: int) -> None:
        """A local endpoint went away: its entries and enforcement row go."""
        st = self._endpoints.pop(endpoint_id, None)
        if st is None:
            return
        self._unlink(endpoint_id, st.identity)
        self._dirty_keys.setdefault(endpoint_id, set()).update(st.contributions)
        self._dirty_endpoints.add(endpoint_id)

    def _unlink(self, endpoint_id: int, identity: int) -> None:
        eps = self._by_identity.get(identity)
        if eps is not None:
            eps.discard(endpoint_id)
            if not eps:
                del self._by_identity[identity]
                self._local.discard(identity)

    # ----- reading ------------------------------------------------------------------------
    def endpoint_ids(self) -> list[int]:
        """The local endpoints known, sorted."""
        return sorted(self._endpoints)

    def entries(self, endpoint_id: int) -> dict[PolicyKey, PolicyEntry]:
        """The current entries of an endpoint."""
        st = self._endpoints.get(endpoint_id)
        if st is None:
            return {}
        out: dict[PolicyKey, PolicyEntry] = {}
        for members in st.groups.values():
            for e in _group_rows(st.contributions, members):
                out[e.key] = e
        return out

    def enforcement(self, endpoint_id: int) -> PolicyEndpoint | None:
        """The enforcement row of an endpoint."""
        st = self._endpoints.get(endpoint_id)
        if st is None:
            return None
        return PolicyEndpoint(endpoint_id, st.egress, st.ingress, st.revision)

    def take_changes(self) -> PolicyChanges:
        """The entries and endpoint rows changed since the last call."""
        out = PolicyChanges()
        for ep, keys in self._dirty_keys.items():
            st = self._endpoints.get(ep)
            if st is None:
                for k in keys:
                    out.entries[PolicyKey(*k)] = None
                continue
            contributions = st.contributions
            for k in keys:
                if k not in contributions:
                    out.entries[PolicyKey(*k)] = None
            # A key's row depends on the denies of its group: rewrite the whole group.
            for g in {(k[1], k[2]) for k in keys}:
                members = st.groups.get(g)
                if members:
                    for e in _group_rows(contributions, members):
                        out.entries[e.key] = e
        for ep in self._dirty_endpoints:
            out.endpoints[ep] = self.enforcement(ep)
        self._dirty_keys = {}
        self._dirty_endpoints = set()
        return out

    # ----- computing -----------------------------------------------------------------------
    def _selected_endpoints(self, policy: Policy) -> set[int]:
        out: set[int] = set()
        for sel in {r.subject for r in policy.rules}:
            for ident in self.cache.selection(sel) & self._local:
                out |= self._by_identity.get(ident, set())
        return out

    def _ports(self, rule: Rule) -> list[PortKey]:
        keys = self._port_keys.get(rule)
        if keys is None:
            keys = self._port_keys[rule] = rule_port_keys(rule)
        return keys

    def _recompute(self, endpoint_id: int) -> None:
        st = self._endpoints.get(endpoint_id)
        if st is None:
            return
        dirty = self._dirty_keys.setdefault(endpoint_id, set())
        dirty.update(st.contributions)
        st.contributions = {}
        st.groups = {}
        egress = ingress = uses_names = False
        for subject, rules in self.repo.subjects():
            if st.identity not in self.cache.selection(subject):
                continue
            for rule in rules:
                uses_names = uses_names or rule.named
                if rule.egress:
                    egress = True
                else:
                    ingress = True
                if rule.peers is None:
                    self._contribute(endpoint_id, st, rule, (0,), 1)
                    if rule.named and rule.egress:
                        # any peer: its named ports resolve on each pod that has them
                        self._contribute(endpoint_id, st, rule, list(self._names), 1,
                                         static=False)
                else:
                    for peer in rule.peers:
                        self._contribute(endpoint_id, st, rule, self.cache.selection(peer), 1)
        dirty.update(st.contributions)
        st.egress, st.ingress, st.uses_names = egress, ingress, uses_names
        st.revision = self.repo.revision
        self._dirty_endpoints.add(endpoint_id)

    def _contribute(
        self,
        endpoint_id: int,
        st: _EndpointState,
        rule: Rule,
        identities: Iterable[int],
        sign: int,
        *,
        static: bool = True,
    ) -> list[KeyTuple]:
        """Add (``sign`` 1) or remove (-1) the rule's contributions for ``identities``:
        its numeric port keys (unless not ``static``) and its named ports resolved for
        each identity; returns the keys touched."""
        numeric = ports = self._ports(rule) if static else []
        named = rule.named
        who = (rule.policy, rule.deny)
        egress = rule.egress
        contributions = st.contributions
        groups = st.groups
        touched: list[KeyTuple] = []
        for ident in identities:
            if named:
                resolved = named_port_keys(rule, self._names_for(st, egress, ident))
                ports = sorted(set(numeric).union(resolved))
            for proto, port, plen in ports:
                key = (endpoint_id, ident, egress, proto, port, plen)
                c = contributions.get(key)
                if c is None:
                    c = contributions[key] = {}
                    g = (ident, egress)
                    members = groups.get(g)
                    if members is None:
                        groups[g] = {key}
                    else:
                        members.add(key)
                n = c.get(who, 0) + sign
                if n > 0:
                    c[who] = n
                else:
                    c.pop(who, None)
                    if not c:
                        del contributions[key]
                        g = (ident, egress)
                        members = groups[g]
                        members.discard(key)
                        if not members:
                            del groups[g]
                touched.append(key)
        return touched

    def _names_for(self, st: _EndpointState, egress: bool, ident: int) -> PortNames:
        """What a named port of a rule resolves through: the peer identity's pods' (egress;
        identity 0, any peer, has none: `_recompute` resolves such a rule per identity) or
        the endpoint's own (ingress)."""
        if not egress:
            return st.names
        return self._names.get(ident, NO_PORT_NAMES)

    def _apply_selection_changes(self, changes: list[SelectionChange]) -> None:
        for ch in changes:
            for rule in self.repo.rules_with_peer(ch.selector):
                for ident in self.cache.selection(rule.subject) & self._local:
                    for ep in self._by_identity.get(ident, ()):
                        st = self._endpoints[ep]
                        keys = self._contribute(ep, st, rule, (ch.identity,), 1 if ch.added else -1)
                        self._dirty_keys.setdefault(ep, set()).update(keys)


def _has_deny(c: Contributions) -> bool:
    return any(deny for _, deny in c)


def _covers(d: KeyTuple, k: KeyTuple) -> bool:
    """Whether key ``d``'s protocol and port prefix contain all of key ``k``'s traffic."""
    if d[3] and d[3] != k[3]:
        return False
    plen = d[5]
    if plen > k[5]:
        return False
    shift = 16 - plen
    return (k[4] >> shift) == (d[4] >> shift)


def _group_rows(
    contributions: dict[KeyTuple, Contributions], members: set[KeyTuple]
) -> Iterator[PolicyEntry]:
    """The rows of one (remote identity, direction) group of an endpoint.

    Deny precedence made explicit for a longest-prefix-match datapath: an allow key whose
    traffic a deny key of the same group contains becomes a deny row (naming the deny's
    policies too). Otherwise a longest-prefix lookup would find the more specific allow and
    miss the deny; across groups (the remote identity and the wildcard 0) the datapath
    combines its two lookups with deny first (docs/policy.md)."""
    denies = [d for d in members if _has_deny(contributions[d])]
    for k in members:
        c = contributions[k]
        if len(c) == 1:
            ((name, deny),) = c
            rules: tuple[str, ...] = (name,)
        else:
            deny = _has_deny(c)
            rules = tuple(sorted({name for name, _ in c}))
        if not deny and denies:
            covering = [d for d in denies if d != k and _covers(d, k)]
            if covering:
                deny = True
                names = set(rules)
                for d in covering:
                    names.update(n for n, is_deny in contributions[d] if is_deny)
                rules = tuple(sorted(names))
        yield PolicyEntry(PolicyKey(*k), deny, rules)
