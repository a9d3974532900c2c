"""The selector cache (selections as BitMaps, incremental, notifications), selectors' source
matching, and port ranges as prefixes."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from policy.ports import port_key_matches, range_to_prefixes
from policy.selector import Requirement, Selector, label_requirement
from policy.selector_cache import SelectionChange, SelectorCache
from tables.identities import pod_identity_labels

WEB = label_requirement("app", "web")
NOT_DB = Requirement("any", "app", "NotIn", ("db",))


def test_selections_follow_identities_and_notify() -> None:
    cache = SelectorCache()
    seen: list[list[SelectionChange]] = []
    cache.subscribe(seen.append)
    web, not_db = Selector((WEB,)), Selector((NOT_DB,))
    cache.upsert_identity(256, pod_identity_labels({"app": "web"}, "a"))
    assert list(cache.add_selector(web)) == [256]
    assert list(cache.add_selector(not_db)) == [256]
    changes = cache.upsert_identity(257, pod_identity_labels({"app": "db"}, "a"))
    assert changes == [] and seen == []  # selected by neither
    changes = cache.upsert_identity(258, pod_identity_labels({"app": "web"}, "b"))
    assert {(c.selector, c.identity, c.added) for c in changes} == {
        (web, 258, True),
        (not_db, 258, True),
    }
    assert seen == [changes]
    assert list(cache.selection(web)) == [256, 258]
    gone = cache.delete_identity(256)
    assert {(c.selector, c.added) for c in gone} == {(web, False), (not_db, False)}
    assert list(cache.selection(web)) == [258]
    # References: the selector stays while one is held.
    cache.add_selector(web)
    cache.remove_selector(web)
    assert cache.refs(web) == 1
    cache.remove_selector(web)
    assert web not in set(cache.selectors())


def test_selector_sources() -> None:
    labels = ("k8s:app=web", "reserved:host")
    assert Selector((label_requirement("app", "web"),)).matches(labels)
    assert Selector((label_requirement("k8s:app", "web"),)).matches(labels)
    assert not Selector((label_requirement("container:app", "web"),)).matches(labels)
    assert Selector((Requirement("reserved", "host", "Exists"),)).matches(labels)
    assert Selector().matches(())


@settings(max_examples=200, deadline=None)
@given(lo=st.integers(0, 65535), span=st.integers(0, 3000))
def test_port_prefixes_cover_the_range_exactly(lo: int, span: int) -> None:
    hi = min(65535, lo + span)
    prefixes = range_to_prefixes(lo, hi)
    for port in {lo - 1, lo, (lo + hi) // 2, hi, hi + 1, 0, 65535} & set(range(65536)):
        covered = [p for p in prefixes if port_key_matches((6, p[0], p[1]), 6, port)]
        assert len(covered) == (1 if lo <= port <= hi else 0), (lo, hi, port, prefixes)
    assert len(prefixes) <= 32
