"""The agent API's types, as components declare their routes: `Route` (path, methods,
handler and the schemas the server checks and the OpenAPI document shows), `QueryParam`,
the `Request` a handler gets, `ApiError` for an error answer, and the answers other than
JSON (`TextBody`, `NdjsonStream`).

statewright/agent/api.py serves them; statewright/agent/openapi.py documents them.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from statedb.errors import StatewrightError


@dataclass(frozen=True, slots=True)
class TextBody:
    """An API response that is plain text rather than JSON."""

    text: str


@dataclass(frozen=True, slots=True)
class NdjsonStream:
    """An API response streamed as newline-delimited JSON until the iterator ends or the
    client hangs up."""

    lines: Callable[[], Any]  # () -> AsyncIterator[str], each item one line with "\n"


@dataclass(frozen=True, slots=True)
class Request:
    """What a route handler sees: method, path parameters, query string and body."""

    params: Mapping[str, str]
    query: Mapping[str, str]
    method: str = "GET"
    body: bytes = b""

    def json(self) -> Any:
        """The body parsed as JSON; `ApiError` 400 when it is not JSON."""
        import json

        try:
            return json.loads(self.body or b"null")
        except ValueError as e:
            raise ApiError(400, f"request body is not JSON: {e}") from None


#: A route handler: returns a JSON-ready document, a `TextBody` or an `NdjsonStream`;
#: raises `ApiError` for an error response.
Handler = Callable[[Request], Awaitable[Any]]


class ApiError(StatewrightError):
    """An error response of the agent's API: HTTP status and message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


#: A JSON Schema (the OpenAPI 3.0 subset statewright/agent/json_schema.py checks).
Schema = Mapping[str, Any]

#: Media types of a route's answer: JSON documents, plain text, newline-delimited JSON.
JSON = "application/json"
TEXT = "text/plain"
NDJSON = "application/x-ndjson"


@dataclass(frozen=True, slots=True)
class QueryParam:
    """A query-string parameter a route reads: its name, the JSON Schema of its value
    (checked before the handler runs) and what it means."""

    name: str
    schema: Schema = field(compare=False)
    description: str = ""
    required: bool = False


@dataclass(frozen=True, slots=True)
class Route:
    """A route: ``pattern`` is a path such as ``/tables/{name}/changes``; ``methods`` the
    HTTP methods it answers.

    The rest describes the route for the OpenAPI document (statewright/agent/openapi.py)
    and for the server's checks before the handler runs (statewright/agent/api.py):
    ``body`` the JSON Schema of the request body (a route without one takes no body),
    ``query`` the query parameters, ``status`` the success status (200, or 201 Created
    for a route that creates, as Cilium's ``PUT /endpoint/{id}``), ``response`` the JSON
    Schema of that answer when it is JSON, ``media_types`` what it may be, ``errors`` the
    error statuses
    the handler answers with (the server adds 400/413 for routes with a body or query
    parameters, and 405 for a method the path does not take).
    """

    pattern: str
    handler: Handler
    methods: tuple[str, ...] = ("GET",)
    summary: str = field(default="", compare=False)
    body: Schema | None = field(default=None, compare=False)
    query: tuple[QueryParam, ...] = field(default=(), compare=False)
    status: int = field(default=200, compare=False)
    response: Schema | None = field(default=None, compare=False)
    media_types: tuple[str, ...] = field(default=(JSON,), compare=False)
    errors: Mapping[int, str] = field(default_factory=dict, compare=False)
    #: Path parameter name -> what it means.
    params: Mapping[str, str] = field(default_factory=dict, compare=False)
    _regex: re.Pattern[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        parts = []
        for seg in self.pattern.strip("/").split("/"):
            if seg.startswith("{") and seg.endswith("}"):
                parts.append(f"(?P<{seg[1:-1]}>[^/]+)")
            else:
                parts.append(re.escape(seg))
        object.__setattr__(self, "_regex", re.compile("^/" + "/".join(parts) + "/?$"))

    @property
    def path_params(self) -> list[str]:
        """The names of the pattern's ``{...}`` segments, in order."""
        return re.findall(r"\{([^}/]+)\}", self.pattern)

    def match(self, path: str) -> dict[str, str] | None:
        """The path parameters when ``path`` matches, else None."""
        m = self._regex.match(path)
        return None if m is None else dict(m.groupdict())
