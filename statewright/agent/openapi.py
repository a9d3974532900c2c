"""The OpenAPI 3.0 document of the agent's API, generated from the routes the components
declare (`statewright.component.Route`): paths, methods, path and query parameters,
request body and answer schemas, media types and error statuses.

Served at ``GET /openapi.json``; the server checks requests against the same schemas
(statewright/agent/api.py), and tests/agent/test_api_schemathesis.py fuzzes the live
socket with it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from statewright.api_types import JSON, Route

OPENAPI_VERSION = "3.0.3"

#: The body of every error answer.
ERROR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["error"],
    "properties": {"error": {"type": "string", "description": "what went wrong"}},
}

#: Statuses the server itself answers, by what makes it answer them.
BAD_REQUEST = "the request does not match its schema (the message names the field)"
TOO_LARGE = "the request body is larger than the server accepts"
NOT_ALLOWED = "the path does not take this method"


def _error_response(description: str) -> dict[str, Any]:
    return {"description": description,
            "content": {JSON: {"schema": {"$ref": "#/components/schemas/Error"}}}}


def operation_id(route: Route, method: str) -> str:
    """A stable operation id: method and the path's words (``put_endpoint_id``)."""
    words = [seg.strip("{}").replace("-", "_") for seg in route.pattern.strip("/").split("/")]
    return "_".join([method.lower(), *words]) if words != [""] else method.lower()


def _operation(route: Route, method: str) -> dict[str, Any]:
    op: dict[str, Any] = {"operationId": operation_id(route, method)}
    if route.summary:
        op["summary"] = route.summary
    params: list[dict[str, Any]] = [
        {"name": name, "in": "path", "required": True, "schema": {"type": "string"},
         **({"description": route.params[name]} if name in route.params else {})}
        for name in route.path_params
    ]
    for q in route.query:
        param: dict[str, Any] = {"name": q.name, "in": "query", "required": q.required,
                                 "schema": dict(q.schema)}
        if q.description:
            param["description"] = q.description
        params.append(param)
    if params:
        op["parameters"] = params
    if route.body is not None:
        op["requestBody"] = {"required": True,
                             "content": {JSON: {"schema": dict(route.body)}}}
    content: dict[str, Any] = {}
    for media in route.media_types:
        schema = route.response if media == JSON else None
        content[media] = {"schema": dict(schema) if schema is not None
                          else ({"type": "object"} if media == JSON else {"type": "string"})}
    success = "Created" if route.status == 201 else "OK"
    responses: dict[str, Any] = {
        str(route.status): {"description": success, "content": content}}
    errors: dict[int, str] = dict(route.errors)
    if route.body is not None or route.query:
        errors.setdefault(400, BAD_REQUEST)
    if route.body is not None:
        errors.setdefault(413, TOO_LARGE)
    errors.setdefault(405, NOT_ALLOWED)
    for status in sorted(errors):
        responses[str(status)] = _error_response(errors[status])
    op["responses"] = responses
    return op


def document(routes: Iterable[Route], info: Mapping[str, Any]) -> dict[str, Any]:
    """The OpenAPI document of ``routes``; ``info`` is its ``info`` object (title,
    version)."""
    paths: dict[str, dict[str, Any]] = {}
    for route in routes:
        item = paths.setdefault(route.pattern, {})
        for method in route.methods:
            key = method.lower()
            if key in item:
                raise ValueError(f"two routes for {method} {route.pattern}")
            item[key] = _operation(route, method)
    return {
        "openapi": OPENAPI_VERSION,
        "info": dict(info),
        "paths": paths,
        "components": {"schemas": {"Error": ERROR_SCHEMA}},
    }
