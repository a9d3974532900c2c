"""The JSON Schema checker the API server uses (statewright/agent/json_schema.py): each
keyword it supports, the field path and message of a violation, and the endpoint change
request schema agreeing with `EndpointChange.parse` on what it accepts."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from statewright.agent.components.endpoint_schemas import ENDPOINT_CHANGE_REQUEST
from statewright.agent.json_schema import SchemaViolation, check_schema, validate
from tables.endpoints import EndpointChange, EndpointRequestError

SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["n"],
    "additionalProperties": False,
    "properties": {
        "n": {"type": "integer", "minimum": 1, "maximum": 9},
        "s": {"type": "string", "minLength": 1, "maxLength": 3, "pattern": "^[a-z]+$"},
        "e": {"type": "string", "enum": ["x", "y"]},
        "maybe": {"type": "string", "nullable": True},
        "list": {"type": "array", "items": {"type": "boolean"}, "minItems": 1, "maxItems": 2},
        "either": {"oneOf": [{"type": "integer"}, {"type": "array"}]},
        "any": {"anyOf": [{"type": "integer"}, {"type": "number"}]},
        "map": {"type": "object", "additionalProperties": {"type": "number"}},
    },
}


@pytest.mark.parametrize("doc", [
    {"n": 1}, {"n": 9, "s": "abc", "e": "y", "maybe": None, "list": [True]},
    {"n": 2, "maybe": "m", "either": [], "any": 1.5, "map": {"a": 1, "b": 2.5}},
    {"n": 3, "either": 4, "any": 2},
])
def test_documents_that_match(doc: dict[str, Any]) -> None:
    validate(doc, SCHEMA)


@pytest.mark.parametrize(("doc", "field", "message"), [
    ({}, "n", "missing (required)"),
    ({"n": True}, "n", "expected an integer, got True"),
    ({"n": 1.0}, "n", "expected an integer, got 1.0"),
    ({"n": 0}, "n", "0 is less than 1"),
    ({"n": 10}, "n", "10 is more than 9"),
    ({"n": 1, "s": ""}, "s", "is shorter than 1"),
    ({"n": 1, "s": "abcd"}, "s", "is longer than 3"),
    ({"n": 1, "s": "A"}, "s", "does not match"),
    ({"n": 1, "e": "z"}, "e", "'z' is not one of 'x', 'y'"),
    ({"n": 1, "maybe": 3}, "maybe", "expected a string"),
    ({"n": 1, "list": []}, "list", "at least 1 needed"),
    ({"n": 1, "list": [True, False, True]}, "list", "at most 2 allowed"),
    ({"n": 1, "list": [1]}, "list[0]", "expected a boolean"),
    ({"n": 1, "either": "x"}, "either", "matches none of the allowed forms"),
    ({"n": 1, "any": "x"}, "any", "matches none of the allowed forms"),
    ({"n": 1, "map": {"a": "b"}}, "map.a", "expected a number"),
    ({"n": 1, "other": 1}, "other", "unknown field"),
])
def test_violations_name_the_field(doc: dict[str, Any], field: str, message: str) -> None:
    with pytest.raises(SchemaViolation) as ei:
        validate(doc, SCHEMA, obj="thing")
    assert ei.value.field == field and message in ei.value.message
    assert str(ei.value).startswith(f"thing: field {field!r}: ")


def test_one_of_refuses_a_document_matching_two_forms() -> None:
    with pytest.raises(SchemaViolation, match="exactly one"):
        validate(3, {"oneOf": [{"type": "integer"}, {"type": "number"}]})


def test_check_schema_refuses_keywords_it_cannot_check() -> None:
    check_schema(SCHEMA)
    check_schema(ENDPOINT_CHANGE_REQUEST)
    for bad in ({"const": 1}, {"items": {"uniqueItems": True}},
                {"oneOf": [{"allOf": []}]}, {"additionalProperties": {"format": "x", "not": {}}}):
        with pytest.raises(ValueError, match="unsupported"):
            check_schema(bad)


_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5) | st.text(max_size=20)
    | st.sampled_from(["eth0", "lxc1", "aa:bb:cc:dd:ee:ff", "10.200.0.5", "fd00:200::5",
                       "k8s:app=web", "", "a/b"]),
    lambda children: st.lists(children, max_size=3)
    | st.dictionaries(st.sampled_from(["ipv4", "ipv6", "external-ipam", "app", "x"]),
                      children, max_size=3),
    max_leaves=8,
)
_REQUESTS = st.dictionaries(
    st.sampled_from([*sorted(ENDPOINT_CHANGE_REQUEST["properties"]), "colour"]), _VALUES,
    max_size=4)


@settings(max_examples=300, deadline=1000)
@given(doc=_REQUESTS)
def test_a_request_the_schema_accepts_parses(doc: dict[str, Any]) -> None:
    """The server checks the schema first, then the handler parses: whatever passes the
    schema either parses or is refused by the parser as bad input (400), never a bug."""
    try:
        validate(doc, ENDPOINT_CHANGE_REQUEST)
    except SchemaViolation:
        return
    try:
        EndpointChange.parse(doc)
    except EndpointRequestError:
        pass


def test_a_new_endpoint_needs_its_container_and_interface() -> None:
    """``PUT /endpoint/{id}`` with ``{}`` used to create an endpoint with no container and no
    interface (and allocate addresses): refused, naming both fields; PATCH takes any
    subset."""
    from statewright.agent.components.endpoint_schemas import ENDPOINT_CREATE_REQUEST
    from statewright.agent.components.endpoints import EndpointsComponent, EndpointsConfig

    with pytest.raises(SchemaViolation,
                       match=r"missing \(required\): container-id, interface-name"):
        validate({}, ENDPOINT_CREATE_REQUEST)
    with pytest.raises(SchemaViolation, match="'interface-name': missing"):
        validate({"container-id": "c0ffee"}, ENDPOINT_CREATE_REQUEST)
    validate({"container-id": "c0ffee", "interface-name": "lxc1"}, ENDPOINT_CREATE_REQUEST)
    validate({}, ENDPOINT_CHANGE_REQUEST)
    routes = EndpointsComponent(EndpointsConfig()).routes()
    bodies = {m: r.body for r in routes if r.pattern == "/endpoint/{id}" for m in r.methods}
    assert bodies["PUT"] is ENDPOINT_CREATE_REQUEST
    assert bodies["PATCH"] is ENDPOINT_CHANGE_REQUEST
