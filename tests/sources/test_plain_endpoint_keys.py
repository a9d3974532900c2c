"""The converter's loop for plain EndpointSlices reads an endpoint's keys by what it has:
conditions and addresses by subscript (a missing one: not plain), the optional keys only
when the dict has room for them. Whatever keys an endpoint or its conditions have (or
lack), the slice converts as the general loop converts its copy with ``hints: {}`` on
every endpoint (which only the general loop takes), and in the same order of addresses
the plain loop finds repeated addresses without a set.
"""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from sources.k8s_convert import ConversionError, convert_endpoint_slice

_VALUES: list[Any] = [True, False, None, 1, 0, 1.0, "true"]

conditions = st.one_of(
    st.none(),
    st.dictionaries(
        st.sampled_from(["ready", "serving", "terminating", "other"]),
        st.sampled_from(_VALUES),
        max_size=4,
    ),
    # Nearly plain: ready, any of the others with any value.
    st.fixed_dictionaries(
        {"ready": st.just(True)},
        optional={k: st.sampled_from(_VALUES) for k in ("serving", "terminating", "other")},
    ),
)
_FIELDS: dict[str, Any] = {
    "addresses": st.one_of(
        st.just(["10.0.0.1"]),
        st.lists(st.sampled_from(["10.0.0.1", "10.0.0.2", "x"]), min_size=1, max_size=2),
    ),
    "conditions": conditions,
    "nodeName": st.sampled_from(["node-a", "", None]),
    "zone": st.sampled_from(["zone-a", None, 3]),
    "hostname": st.just("pod-1"),
    "targetRef": st.just({"kind": "Pod", "name": "pod-1"}),
}
endpoint = st.one_of(
    # Addresses and conditions, with or without the optional keys.
    st.fixed_dictionaries(
        {k: _FIELDS[k] for k in ("addresses", "conditions")},
        optional={k: v for k, v in _FIELDS.items() if k not in ("addresses", "conditions")},
    ),
    # Any keys (perhaps neither addresses nor conditions).
    st.sets(st.sampled_from(sorted(_FIELDS))).flatmap(
        lambda keys: st.fixed_dictionaries({k: _FIELDS[k] for k in sorted(keys)})
    ),
)


def _slice(endpoints: list[dict[str, Any]], hinted: bool) -> dict[str, Any]:
    eps = copy.deepcopy(endpoints)
    if hinted:
        for ep in eps:
            ep["hints"] = {}
    return {
        "kind": "EndpointSlice",
        "metadata": {
            "name": "echo-abcde",
            "namespace": "default",
            "labels": {"kubernetes.io/service-name": "echo"},
        },
        "addressType": "IPv4",
        "endpoints": eps,
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
    }


def _convert(obj: dict[str, Any]) -> tuple[Any, ...] | str:
    try:
        return convert_endpoint_slice(obj).backends
    except ConversionError as e:
        return str(e)


@settings(max_examples=600, deadline=None)
@given(st.lists(endpoint, max_size=3))
def test_any_endpoint_keys_convert_as_the_general_loop_does(
    endpoints: list[dict[str, Any]],
) -> None:
    plain = _convert(_slice(endpoints, False))
    assert plain == _convert(_slice(endpoints, True))
    if isinstance(plain, tuple):
        assert len({b.address for b in plain}) == len(plain)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(1, 6), max_size=6), st.sampled_from([1, 2, 3]))
def test_addresses_in_any_order_or_repeated(last_bytes: list[int], keys: int) -> None:
    cond = {"ready": True, "serving": True, "terminating": False}
    endpoints = [
        {"addresses": [f"10.0.0.{b}"], "conditions": dict(list(cond.items())[:keys])}
        for b in last_bytes
    ]
    plain = _convert(_slice(endpoints, False))
    assert plain == _convert(_slice(endpoints, True))
    assert isinstance(plain, tuple)
    # Repeated addresses merge into one backend each, first come first.
    assert [str(b.address) for b in plain] == [
        f"10.0.0.{b}:8080/TCP" for b in dict.fromkeys(last_bytes)
    ]
