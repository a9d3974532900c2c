"""Delta.version: the resourceVersion number the applier counts progress in
(`K8sSource.applied_rv`), given by the reflector or read from the object."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from sources.k8s_reflector import Delta, Reflector, ResourceSpec, rv_number

SPEC = ResourceSpec("services", "Service", "v1", "services")


async def _deliver(*_: Any) -> None:
    """Not called: only the list page's deltas are made."""


def test_a_delta_made_without_a_version_reads_its_object() -> None:
    obj = {"metadata": {"resourceVersion": "42"}}
    assert Delta("upsert", "a", obj).version == 42 == rv_number(obj)
    assert Delta("delete", "a", {"metadata": {"name": "a"}}).version == 0
    assert Delta("upsert", "a", {"metadata": {"resourceVersion": "x1"}}).version == 0
    assert Delta("upsert", "a", {"metadata": None}).version == 0
    assert Delta("upsert", "a", obj, 7).version == 7


rvs = st.one_of(
    st.integers(0, 10**15).map(str),
    st.integers(0, 999).map(lambda i: f"00{i}"),
    st.text("0123456789x -", max_size=6),
    st.none(),
    st.integers(-3, 3),
)


@settings(max_examples=200, deadline=None)
@given(items=st.lists(st.tuples(st.sampled_from("abcdef"), rvs), max_size=8))
def test_a_list_pages_deltas_carry_what_their_objects_say(
    items: list[tuple[str, Any]],
) -> None:
    """The reflector gives each delta of a list page the number `Delta` would read from
    its object (whatever the resourceVersion's form)."""
    doc = {"items": [{"metadata": {"namespace": "ns", "name": n, "resourceVersion": rv}}
                     for n, rv in items]}
    deltas = Reflector(None, SPEC, _deliver)._page_deltas(doc, set())  # type: ignore[arg-type]
    assert deltas or not items
    for d in deltas:
        assert d.version == rv_number(d.obj)
        assert d == Delta(d.op, d.key, d.obj)
