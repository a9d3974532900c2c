"""Checks a JSON document against a JSON Schema: the OpenAPI 3.0 subset the agent's route
declarations use, so that the schema the OpenAPI document publishes is the one the API
server enforces.

Supported keywords: ``type`` (string, integer, number, boolean, object, array),
``nullable``, ``enum``, ``properties``, ``required``, ``additionalProperties`` (a bool or
a schema), ``items``, ``minItems``/``maxItems``, ``minimum``/``maximum``,
``minLength``/``maxLength``, ``pattern`` (Python ``re.search``), ``oneOf``/``anyOf``.
Other keywords (``description``, ``example``, ``title``, ...) are ignored. A keyword the
checker does not know how to check fails `check_schema`, so a route cannot publish a
rule the server silently skips.

A violation raises `SchemaViolation` naming the field path (``addressing.ipv4``,
``labels[2]``); bools are not integers, as in JSON Schema, and neither is ``1.0`` (the
handlers take Python ints).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from functools import lru_cache
from typing import Any

from statedb.errors import InputError

#: Keywords `validate` checks.
CHECKED = frozenset({
    "type", "nullable", "enum", "properties", "required", "additionalProperties", "items",
    "minItems", "maxItems", "minimum", "maximum", "minLength", "maxLength", "pattern",
    "oneOf", "anyOf",
})
#: Keywords that only describe.
ANNOTATIONS = frozenset({"description", "title", "example", "default", "format"})

_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "object": (Mapping,),
    "array": (list, tuple),
}


class SchemaViolation(InputError):
    """A document that does not match its JSON Schema; ``field`` is the path inside it
    (``request body: field 'addressing.ipv4': expected a string, got 5``)."""

    def __str__(self) -> str:
        where = f"field {self.field!r}" if self.field else ""
        return ": ".join(part for part in (self.obj, where, self.message) if part)


def check_schema(schema: Mapping[str, Any], where: str = "schema") -> None:
    """Raise ValueError when ``schema`` uses a keyword `validate` does not check."""
    unknown = set(schema) - CHECKED - ANNOTATIONS
    if unknown:
        raise ValueError(f"{where}: unsupported JSON Schema keyword(s) {sorted(unknown)}")
    for name, sub in (schema.get("properties") or {}).items():
        check_schema(sub, f"{where}.properties.{name}")
    for key in ("items", "additionalProperties"):
        if isinstance(schema.get(key), Mapping):
            check_schema(schema[key], f"{where}.{key}")
    for key in ("oneOf", "anyOf"):
        for i, sub in enumerate(schema.get(key) or ()):
            check_schema(sub, f"{where}.{key}[{i}]")


def validate(doc: Any, schema: Mapping[str, Any], obj: str = "request body") -> None:
    """Raise `SchemaViolation` (``obj``, field path) when ``doc`` does not match."""
    _check(doc, schema, obj, "")


def _describe(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _fail(obj: str, path: str, message: str) -> SchemaViolation:
    return SchemaViolation(message, obj=obj, field=path)


def _is_type(value: Any, name: str) -> bool:
    if name in ("integer", "number") and isinstance(value, bool):
        return False
    return isinstance(value, _TYPES[name])


@lru_cache(maxsize=256)
def _regex(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern)


def _check(value: Any, schema: Mapping[str, Any], obj: str, path: str) -> None:
    if value is None and schema.get("nullable"):
        return
    kind = schema.get("type")
    if kind is not None and not _is_type(value, kind):
        raise _fail(obj, path, f"expected {'an' if kind[0] in 'aeiou' else 'a'} {kind}, "
                               f"got {_describe(value)}")
    if "enum" in schema and value not in schema["enum"]:
        raise _fail(obj, path, f"{_describe(value)} is not one of "
                               f"{', '.join(map(repr, schema['enum']))}")
    if isinstance(value, str):
        _check_string(value, schema, obj, path)
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            raise _fail(obj, path, f"{value} is less than {schema['minimum']}")
        if "maximum" in schema and value > schema["maximum"]:
            raise _fail(obj, path, f"{value} is more than {schema['maximum']}")
    elif isinstance(value, Mapping):
        _check_object(value, schema, obj, path)
    elif isinstance(value, (list, tuple)):
        _check_array(value, schema, obj, path)
    for key in ("oneOf", "anyOf"):
        if key in schema:
            _check_alternatives(value, schema[key], key == "oneOf", obj, path)


def _check_string(value: str, schema: Mapping[str, Any], obj: str, path: str) -> None:
    if "minLength" in schema and len(value) < schema["minLength"]:
        raise _fail(obj, path, f"{_describe(value)} is shorter than {schema['minLength']}")
    if "maxLength" in schema and len(value) > schema["maxLength"]:
        raise _fail(obj, path, f"{_describe(value)} is longer than {schema['maxLength']}")
    if "pattern" in schema and not _regex(schema["pattern"]).search(value):
        raise _fail(obj, path, f"{_describe(value)} does not match {schema['pattern']!r}")


def _check_object(value: Mapping[str, Any], schema: Mapping[str, Any], obj: str,
                  path: str) -> None:
    props: Mapping[str, Any] = schema.get("properties") or {}
    extra = schema.get("additionalProperties", True)
    for name, item in value.items():
        if not isinstance(name, str):
            raise _fail(obj, path, f"key {_describe(name)} is not a string")
        sub = props.get(name)
        if sub is not None:
            _check(item, sub, obj, _join(path, name))
        elif extra is False:
            raise _fail(obj, _join(path, name), "unknown field")
        elif isinstance(extra, Mapping):
            _check(item, extra, obj, _join(path, name))
    # After the fields present: a wrong field is named before a missing one.
    missing = [name for name in schema.get("required") or () if name not in value]
    if len(missing) == 1:
        raise _fail(obj, _join(path, missing[0]), "missing (required)")
    if missing:
        raise _fail(obj, path, f"missing (required): {', '.join(missing)}")


def _check_array(value: Any, schema: Mapping[str, Any], obj: str, path: str) -> None:
    if "minItems" in schema and len(value) < schema["minItems"]:
        raise _fail(obj, path, f"{len(value)} item(s), at least {schema['minItems']} needed")
    if "maxItems" in schema and len(value) > schema["maxItems"]:
        raise _fail(obj, path, f"{len(value)} item(s), at most {schema['maxItems']} allowed")
    items = schema.get("items")
    if isinstance(items, Mapping):
        for i, item in enumerate(value):
            _check(item, items, obj, f"{path}[{i}]")


def _check_alternatives(value: Any, alternatives: Any, exactly_one: bool, obj: str,
                        path: str) -> None:
    reasons: list[str] = []
    matched = 0
    for sub in alternatives:
        try:
            _check(value, sub, obj, path)
        except SchemaViolation as e:
            reasons.append(e.message)
        else:
            matched += 1
    if matched == 0:
        raise _fail(obj, path, "matches none of the allowed forms: " + "; ".join(reasons))
    if exactly_one and matched > 1:
        raise _fail(obj, path, f"matches {matched} of the forms, exactly one allowed")


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name
