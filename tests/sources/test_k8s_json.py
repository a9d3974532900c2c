"""`sources.k8s_json.loads` decodes as ``json.loads`` does, with orjson and without it (CI
runs both: the fallback by hiding orjson, orjson where the agent extra installed it)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sources import k8s_json

DOCS = [
    b'{"kind":"EndpointSlice","endpoints":[{"addresses":["10.0.0.1"],'
    b'"conditions":{"ready":true}}],"ports":[{"port":8080,"protocol":"TCP"}]}',
    b'{"type":"MODIFIED","object":{"metadata":{"name":"a","resourceVersion":"12"}}}',
    '{"name":"café ☃","escaped":"caf\\u00e9"}'.encode(),
    b'{"lone":"\\ud800"}',  # a lone surrogate: orjson refuses, json not
    b'{"n":NaN,"i":-Infinity}',
    b'[1, 2.5, -0, 1e300, null, false]',
    b"  {}  \n",
]

BAD = [b"", b"{", b'{"a":}', b"[1,]", b"\xff\xfe", b'{"a":1} x']

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


@pytest.fixture(params=["orjson", "json"])
def decoder(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each test once with orjson (skipped where it is not installed) and once with the
    standard library alone."""
    if request.param == "json":
        monkeypatch.setattr(k8s_json, "ORJSON", None)
    elif k8s_json.ORJSON is None:
        pytest.skip("orjson is not installed (the agent extra brings it on x86_64/aarch64)")
    return str(request.param)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


@pytest.mark.parametrize("doc", DOCS)
def test_decodes_as_json_does(decoder: str, doc: bytes) -> None:
    assert _same(k8s_json.loads(doc), json.loads(doc))
    assert _same(k8s_json.loads(doc.decode("utf-8", "surrogatepass")), json.loads(doc))


def test_integers_past_64_bits(decoder: str) -> None:
    """The one difference: orjson gives such an integer as a float (no Kubernetes field
    holds one; a port or count that does is then refused by the converter's checks)."""
    big = 123456789012345678901234567890
    got = k8s_json.loads(b'{"big":%d}' % big)["big"]
    assert got == (big if decoder == "json" else float(big))


@pytest.mark.parametrize("doc", BAD)
def test_refuses_what_json_refuses(decoder: str, doc: bytes) -> None:
    with pytest.raises(ValueError):
        k8s_json.loads(doc)


@settings(max_examples=100, deadline=None, derandomize=True)
@given(json_values)
def test_round_trips_any_document(value: Any) -> None:
    text = json.dumps(value)
    for fast in (k8s_json.ORJSON, None):
        k8s_json.ORJSON, saved = fast, k8s_json.ORJSON
        try:
            assert _same(k8s_json.loads(text.encode()), json.loads(text))
        finally:
            k8s_json.ORJSON = saved


def test_without_orjson_installed_the_standard_library_decodes() -> None:
    code = (
        "import sys; sys.modules['orjson'] = None\n"
        "from sources import k8s_json\n"
        "assert k8s_json.DECODER == 'json' and k8s_json.ORJSON is None\n"
        "assert k8s_json.loads(b'{\"a\": [1]}') == {'a': [1]}\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 0, res.stderr
