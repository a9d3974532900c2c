"""Decoding the API server's JSON: orjson when it is installed, else the standard library.

An EndpointSlice list page decodes about ten times faster with orjson (benchmarks/k8s.py,
``decode_*``: 3.8 against 37 us per EndpointSlice of 10 endpoints, 0.9 against 1.6 us per
Service), which at 60,000 services is seconds of an agent's initial sync. orjson is in the
``agent`` extra only where it ships wheels (CPython on x86_64 and aarch64), so installing
the agent never needs a compiler; without it `loads` is ``json.loads``.

The two accept the same documents: what orjson refuses and the standard library takes
(lone UTF-16 surrogates in strings, NaN and Infinity) is decoded again with
``json.loads``, so only a document neither accepts raises (a ValueError, as ``json.loads``
raises). One difference remains: orjson gives an integer beyond 64 bits as a float. No
Kubernetes field holds one (the API's integers are int32 and int64), and a port or count
that did would be refused by the converter's type checks.
"""

from __future__ import annotations

import importlib
import json
from typing import Any


def _orjson() -> Any:
    """The orjson module, or None where it is not installed (imported by name, so that
    type checking does not need it either)."""
    try:
        return importlib.import_module("orjson")
    except ImportError:
        return None


#: orjson, or None: `loads` then is ``json.loads``.
ORJSON: Any = _orjson()

#: The decoder in use: "orjson" or "json".
DECODER = "json" if ORJSON is None else "orjson"


def loads(data: bytes | bytearray | str) -> Any:
    """Decode one JSON document (raises ValueError when it is not one)."""
    fast = ORJSON
    if fast is not None:
        try:
            return fast.loads(data)
        except fast.JSONDecodeError:
            pass  # decoded again below: json.loads accepts a little more, or says why not
    return json.loads(data)
