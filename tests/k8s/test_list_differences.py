"""A reflector's lists deliver the difference to what it delivered before: the first list
everything (it tracks no keys: nothing can be missing), a relist exactly the objects new,
changed or gone, also after a list cut short by an expired continue token."""

from __future__ import annotations

import json
from typing import Any

import anyio
from hypothesis import given, settings
from hypothesis import strategies as st

from sources.k8s_http import K8sApiError
from sources.k8s_reflector import Delta, GoneError, Reflector, ReflectorConfig, ResourceSpec

SPEC = ResourceSpec("services", "Service", "v1", "services")

#: One list: name -> resourceVersion (non-canonical forms too), and the page whose
#: request finds its continue token expired (None: the list completes).
Listing = tuple[dict[str, str], int | None]


class _PagedClient:
    """Serves one listing at a time in pages of ``limit`` objects; the continue token is
    the offset. A page of ``expire_at`` answers 410 Gone."""

    def __init__(self) -> None:
        self.items: dict[str, str] = {}
        self.expire_at: int | None = None

    def get(self, path: str, query: list[tuple[str, str]], timeout: Any) -> bytes:
        q = dict(query)
        limit, start = int(q["limit"]), int(q.get("continue", "0"))
        if self.expire_at is not None and start == self.expire_at * limit:
            raise K8sApiError("GET", path, 410, "Gone")
        names = sorted(self.items)
        page = names[start : start + limit]
        items = [
            {"metadata": {"namespace": "ns", "name": n, "resourceVersion": self.items[n]}}
            for n in page
        ]
        more = start + limit < len(names)
        meta = {"resourceVersion": "9", "continue": str(start + limit) if more else ""}
        return json.dumps({"metadata": meta, "items": items}).encode()


async def _run_lists(listings: list[Listing]) -> None:
    client = _PagedClient()
    #: What the consumer holds: key -> resourceVersion, from the deliveries.
    held: dict[str, str] = {}
    delivered: list[Delta] = []

    async def deliver(_r: Reflector, deltas: list[Delta], _synced: bool) -> None:
        delivered.extend(deltas)
        for d in deltas:
            if d.op == "upsert":
                held[d.key] = d.obj["metadata"]["resourceVersion"]
            else:
                del held[d.key]

    r = Reflector(client, SPEC, deliver, ReflectorConfig(page_size=2))  # type: ignore[arg-type]
    for items, expire_at in listings:
        client.items, client.expire_at = items, expire_at
        before = dict(held)
        delivered.clear()
        if expire_at is not None and expire_at * 2 < len(items):
            try:
                await r._list()
            except GoneError:
                pass
            else:
                raise AssertionError("the expired continue token was not reported")
            # Only whole pages before the expired one were delivered, each object at
            # most once.
            assert len({d.key for d in delivered}) == len(delivered)
            continue
        await r._list()
        want = {f"ns/{n}": rv for n, rv in items.items()}
        assert held == want
        changed = {k for k in want if before.get(k) != want[k]}
        gone = before.keys() - want.keys()
        assert sorted(d.key for d in delivered if d.op == "upsert") == sorted(changed)
        assert sorted(d.key for d in delivered if d.op == "delete") == sorted(gone)
        assert r.store == {k: str(int(v)) if _canonical(v) else v for k, v in want.items()}


def _canonical(rv: str) -> bool:
    return rv.isascii() and rv.isdigit() and (rv[0] != "0" or rv == "0")


listings = st.lists(
    st.tuples(
        st.dictionaries(
            st.sampled_from("abcdefg"),
            st.one_of(st.sampled_from(["1", "2", "3"]), st.sampled_from(["01", "x"])),
            max_size=7,
        ),
        st.one_of(st.none(), st.integers(1, 3)),
    ),
    min_size=1,
    max_size=6,
)


@settings(max_examples=150, deadline=2000)
@given(listings=listings)
def test_each_completed_list_delivers_exactly_the_difference(listings: list[Listing]) -> None:
    anyio.run(_run_lists, listings)


def test_the_first_list_tracks_no_keys_and_a_relist_does() -> None:
    """The first list (nothing delivered) needs no set of the keys seen; a later one
    builds it to find what is gone."""
    r = Reflector(None, SPEC, None)  # type: ignore[arg-type]
    page = {"items": [{"metadata": {"namespace": "ns", "name": "a", "resourceVersion": "1"}}]}
    deltas = r._page_deltas(page, None)
    assert [d.key for d in deltas] == ["ns/a"] and r.store == {"ns/a": "1"}
    seen: set[str] = set()
    page = {"items": [{"metadata": {"namespace": "ns", "name": "a", "resourceVersion": "1"}}]}
    assert r._page_deltas(page, seen) == [] and seen == {"ns/a"}
