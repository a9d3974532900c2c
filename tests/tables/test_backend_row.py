"""Backend rows keep the value semantics of the frozen dataclass they were."""

from __future__ import annotations

import dataclasses
import pickle
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tables.backends import Backend, BackendParams
from tables.l3n4 import L3n4Addr


@dataclasses.dataclass(frozen=True, slots=True)
class RefBackend:
    """The reference: the row's former definition (a frozen dataclass)."""

    address: L3n4Addr
    instances: tuple[tuple[tuple[str, int], BackendParams], ...] = ()


RefBackend.__qualname__ = "Backend"  # its repr then reads like the row's

ADDR = L3n4Addr.parse("10.0.0.1:80/TCP")
keys = st.tuples(st.sampled_from(["a/x", "a/y", "b/z"]), st.sampled_from([1, 4]))
params = st.builds(
    BackendParams,
    st.just(ADDR),
    st.lists(st.sampled_from(["http", "dns"]), max_size=2).map(tuple),
    st.integers(0, 3),
)
instance_lists = st.lists(st.tuples(keys, params), max_size=3, unique_by=lambda kp: kp[0]).map(
    lambda xs: tuple(sorted(xs, key=lambda kp: kp[0]))
)


@given(instance_lists, instance_lists)
def test_backend_like_the_dataclass(a: Any, b: Any) -> None:
    x, y, rx, ry = Backend(ADDR, a), Backend(ADDR, b), RefBackend(ADDR, a), RefBackend(ADDR, b)
    assert x.instances == rx.instances and x.address is rx.address
    assert (x == y) == (rx == ry) and (x != y) == (rx != ry)
    assert hash(x) == hash(rx)
    assert repr(x) == repr(rx)
    assert pickle.loads(pickle.dumps(x)) == x
    assert x.instance_keys() == tuple(k for k, _ in a)
    for name in ("a/x", "a/y", "b/z"):
        want = next((p for k, p in a if k[0] == name), None)
        assert x.instance(name) is want
    assert x.service_names() == sorted({k[0] for k, _ in a})
    if len(a) == 1:
        ((k, p),) = a
        assert Backend.single(ADDR, k, p) == x


def test_backend_is_immutable() -> None:
    b = Backend(ADDR)
    with pytest.raises(dataclasses.FrozenInstanceError):
        b.address = ADDR
    with pytest.raises(dataclasses.FrozenInstanceError):
        del b.address
    assert b != RefBackend(ADDR) and b.instances == () and b.service_names() == []


@settings(max_examples=100, deadline=None)
@given(instance_lists, keys, params)
def test_instance_queries_agree_with_the_instances(insts: Any, key: Any, p: Any) -> None:
    """`has_instance` and `is_only_instance` read the stored form as the instances say."""
    row = Backend(ADDR, insts)
    assert row.has_instance(key) == any(k == key for k, _ in insts)
    assert row.is_only_instance(key, p) == (insts == ((key, p),))
    if len(insts) == 1:
        (k, q), = insts
        assert row.is_only_instance(k, q)
        assert Backend.single(ADDR, k, q).is_only_instance(k, q)
