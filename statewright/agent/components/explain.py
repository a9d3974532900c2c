"""The ``explain`` component: `statewright explain` on the agent's socket.

``GET /explain/entry?map=MAP&key=KEY`` answers which rows (with their revisions and the
reconciler's status) and which source objects (manifest file and line, or the Kubernetes
object's uid and resourceVersion; tables/origins.py) produced one map entry, and for a
policy entry which policies and rules (for a map of runtime state: what it holds);
``GET /explain/{kind}/{namespace}/{name}`` (kind ``service``, ``pod``, ``policy`` or
``ciliumendpoint``) and ``GET /explain/node/{name}`` list every map entry the object
produced (statewright/observe/provenance.py). It reads what the other components own and
writes nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from statedb.errors import InputError
from statewright.agent.components.endpoints import ENDPOINTS
from statewright.agent.components.lb import LB_MAPS
from statewright.agent.components.nodes import NODES
from statewright.agent.components.policy_maps import POLICY_MAPS_COMPONENT
from statewright.agent.components.statedb import DATABASE
from statewright.api_types import ApiError, QueryParam, Request, Route
from statewright.component import OK, Component, ComponentError, Health, Hive
from statewright.observe.provenance import (
    OBJECT_KINDS,
    EndpointView,
    LBView,
    PolicyView,
    Provenance,
)
from tables.origins import ORIGINS_TABLE

_OBJECT_SCHEMA = {"type": "object", "additionalProperties": True}
_ENTRY_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["map", "key", "present", "rows", "objects", "rules"],
    "properties": {
        "map": {"type": "string"},
        "key": {},
        "present": {"type": ["boolean", "null"]},
        "notes": {"type": "array", "items": {"type": "string"}},
        "runtime": {"type": "string"},
        "value": {},
        "rows": {"type": "array", "items": _OBJECT_SCHEMA},
        "objects": {"type": "array", "items": _OBJECT_SCHEMA},
        "rules": {"type": "array", "items": _OBJECT_SCHEMA},
    },
}
_OBJECT_ENTRIES_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["object", "entries"],
    "properties": {
        "object": {"type": "array", "items": _OBJECT_SCHEMA},
        "entries": {"type": "array", "items": _OBJECT_SCHEMA},
    },
}
_MAP = QueryParam("map", {"type": "string", "minLength": 1, "maxLength": 256},
                  "map name as `bpf maps` lists it", required=True)
_KEY = QueryParam("key", {"type": "string", "minLength": 1, "maxLength": 1024},
                  "key: bpftool's hex bytes, `bpf dump`'s field=value pairs, or a frontend "
                  "address / id / IP as `lb list` and the tables print them", required=True)
_ERRORS = {400: "map, key or kind not understood", 503: "the agent has not started"}


class ExplainComponent(Component):
    """See the module doc."""

    name = "explain"
    needs = (DATABASE,)
    uses = (LB_MAPS, ENDPOINTS, POLICY_MAPS_COMPONENT, NODES)

    def __init__(self) -> None:
        self.provenance: Provenance | None = None

    async def start(self, hive: Hive) -> None:
        db = hive.get(self, DATABASE)
        lb = hive.find(self, LB_MAPS)
        lb_view = None
        if lb is not None and lb.plain_maps is not None:
            lb_view = LBView(lb.services, lb.frontends, lb.backends, lb.node_addresses,
                             lb.plain_maps, getattr(lb.ops, "backend_id", None))
        policy = None
        pm = hive.find(self, POLICY_MAPS_COMPONENT)
        if pm is not None and pm.policy_maps is not None and pm.entries is not None:
            policy = PolicyView(pm.entries, db.table("policies"), pm.policy_maps,
                                netns_rows=pm.netns, netns_map=pm.netns_map,
                                flags_map=_component_attr(hive, "endpoint-datapath",
                                                          "flags_map"))
        endpoints = None
        manager = hive.find(self, ENDPOINTS)
        if manager is not None:
            maps = _component_attr(hive, "endpoints", "maps") or {}
            endpoints = EndpointView(manager.endpoints, manager.entries.endpoint_map,
                                     maps.get("endpoints"), manager.entries.ipcache,
                                     maps.get("ipcache"), hive.find(self, NODES))
        origins = None
        if ORIGINS_TABLE in {t.name for t in db.tables}:
            origins = db.table(ORIGINS_TABLE)
        self.provenance = Provenance(db, origins, lb_view, policy, endpoints)

    def health(self) -> list[Health]:
        if self.provenance is None:
            return [Health(self.name, OK, "not started")]
        return [Health(self.name, OK, f"explains {len(self.provenance.map_names())} map(s)")]

    def routes(self) -> Sequence[Route]:
        return (
            Route("/explain/entry", self._entry, query=(_MAP, _KEY), response=_ENTRY_SCHEMA,
                  errors=_ERRORS, summary="the rows and source objects behind one map entry"),
            Route("/explain/node/{name}", self._node, response=_OBJECT_ENTRIES_SCHEMA,
                  errors=_ERRORS, params={"name": "the Node's name"},
                  summary="every map entry a Node (another node of the cluster) produced"),
            Route("/explain/{kind}/{namespace}/{name}", self._object,
                  response=_OBJECT_ENTRIES_SCHEMA, errors=_ERRORS,
                  params={"kind": f"one of {', '.join(OBJECT_KINDS)}",
                          "namespace": "the object's namespace", "name": "its name"},
                  summary="every map entry an object produced"),
        )

    def _prov(self) -> Provenance:
        if self.provenance is None:
            raise ApiError(503, "the explain component has not started")
        return self.provenance

    async def _entry(self, req: Request) -> Any:
        prov = self._prov()
        try:
            return prov.explain_entry(req.query["map"], req.query["key"])
        except InputError as e:
            raise ApiError(400, str(e)) from None

    async def _node(self, req: Request) -> Any:
        try:
            return self._prov().describe_object("node", "", req.params["name"])
        except InputError as e:
            raise ApiError(400, str(e)) from None

    async def _object(self, req: Request) -> Any:
        prov = self._prov()
        kind = req.params["kind"]
        if kind not in OBJECT_KINDS or kind == "node":
            raise ApiError(400, f"kind {kind!r}: expected one of {', '.join(OBJECT_KINDS)}")
        try:
            return prov.describe_object(kind, req.params["namespace"], req.params["name"])
        except InputError as e:
            raise ApiError(400, str(e)) from None


def _component_attr(hive: Hive, name: str, attr: str) -> Any:
    """Attribute ``attr`` of the component called ``name``, None when the agent runs
    without it."""
    try:
        return getattr(hive.component(name), attr, None)
    except ComponentError:
        return None
