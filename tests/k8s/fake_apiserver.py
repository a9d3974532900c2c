"""A wire-level fake Kubernetes API server for tests: real HTTPS on loopback.

No kube-apiserver binary can be installed on the project's machines, so the
Kubernetes source is tested against this server, which speaks the API the way
the real one does for what the agent reads:

* HTTPS on ``127.0.0.1`` with an ephemeral port, the certificate signed by a CA
  the test generates (``trustme``); HTTP/1.1 with keep-alive; bearer-token
  authentication, or a client certificate signed by the CA with ``client_certs``
  (401 ``Unauthorized`` Status otherwise);
* discovery: ``/version``, ``/api``, ``/apis``, ``/api/v1`` and
  ``/apis/discovery.k8s.io/v1`` (the legacy documents; kubectl asks for the
  aggregated form first and falls back to these);
* Services, Pods, Nodes, Namespaces (core v1), EndpointSlices (discovery.k8s.io/v1),
  NetworkPolicies, and Cilium's CiliumNetworkPolicies, CiliumIdentities (cluster-scoped)
  and CiliumEndpoints (cilium.io/v2): get, list (across namespaces or in one), and watch;
* writes, as the agents and the operator make them: create (POST; 409 AlreadyExists when
  the name is taken; the server sets uid, resourceVersion and a creationTimestamp of now,
  whole seconds), update (PUT; the body's ``metadata.resourceVersion`` must be the stored
  one, else 409 Conflict; 422 without one, as for custom resources) and delete (DELETE;
  the deleted object; 404 when absent). Deleting an object deletes at once every object whose
  ``ownerReferences`` name its uid: the garbage collector's cascade (a CiliumEndpoint
  goes with its Pod), whether the deletion came through the API or `FakeAPIServer.delete`;
* one resourceVersion counter for every object (like etcd's revision); lists
  carry the revision they were served at; ``limit``/``continue`` pagination
  serves later pages from the snapshot of the first one (410 Gone once that
  revision has been compacted away, as the real server does);
* watches are chunked streams of JSON events, one per line: ADDED, MODIFIED,
  DELETED, BOOKMARK (with ``allowWatchBookmarks=true``, every ``bookmark_interval``
  seconds, never ahead of an event the stream has not sent yet), and ERROR with a Status
  of code 410 when the requested resourceVersion is older than the compaction point; a watch
  without resourceVersion (or "0") starts with synthetic ADDED events for the
  current state; ``timeoutSeconds`` ends the stream cleanly;
* ``fieldSelector`` on ``metadata.name``, ``metadata.namespace`` and (pods)
  ``spec.nodeName``; ``labelSelector`` with ``k=v``, ``k!=v`` and ``k``.

Fault controls for the scenarios: `FakeAPIServer.drop_watches` (connections
cut mid-stream, no final chunk), `stall_watches` (open, silent streams),
`fail_next` (429 with Retry-After, 500, ...), `expire` (compact the history:
watches from older versions get 410), `rotate_token`. Every request is logged
(`requests`) with the RBAC verb/resource it amounts to, so tests can check a
ClusterRole allows all of them.
"""

from __future__ import annotations

import base64
import collections
import http.server
import itertools
import json
import os
import queue
import select
import socket
import ssl
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlsplit

import trustme

try:
    import orjson
except ImportError:  # the standard library's json where orjson is not installed
    orjson = None  # type: ignore[assignment]


def _json_bytes(body: Any) -> bytes:
    """``body`` as JSON (orjson where installed: a list page of 500 EndpointSlices is
    served in a few ms instead of tens, as a real API server serves it, so a client's
    benchmark measures the client)."""
    if orjson is not None:
        return orjson.dumps(body)
    return json.dumps(body).encode()


def _json_copy(obj: Any) -> Any:
    """A deep copy of a JSON document (through its encoding, like the server's storage)."""
    if orjson is not None:
        return orjson.loads(orjson.dumps(obj))
    return json.loads(json.dumps(obj))


@dataclass(frozen=True, slots=True)
class Resource:
    """One served resource type: where it lives in the URL space and what it is called."""

    plural: str
    kind: str
    group: str  # "" for the core group
    version: str
    namespaced: bool
    short_names: tuple[str, ...] = ()

    @property
    def api_version(self) -> str:
        """``v1`` or ``group/version``."""
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def prefix(self) -> str:
        """``/api/v1`` or ``/apis/group/version``."""
        return f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"


RESOURCES: tuple[Resource, ...] = (
    Resource("services", "Service", "", "v1", True, ("svc",)),
    Resource("pods", "Pod", "", "v1", True, ("po",)),
    Resource("nodes", "Node", "", "v1", False, ("no",)),
    Resource("namespaces", "Namespace", "", "v1", False, ("ns",)),
    Resource("endpointslices", "EndpointSlice", "discovery.k8s.io", "v1", True),
    Resource("networkpolicies", "NetworkPolicy", "networking.k8s.io", "v1", True, ("netpol",)),
    Resource("ciliumnetworkpolicies", "CiliumNetworkPolicy", "cilium.io", "v2", True, ("cnp",)),
    Resource("ciliumidentities", "CiliumIdentity", "cilium.io", "v2", False, ("ciliumid",)),
    Resource("ciliumendpoints", "CiliumEndpoint", "cilium.io", "v2", True, ("cep", "ciliumep")),
)
_BY_KIND = {r.kind: r for r in RESOURCES}


@dataclass(slots=True)
class RequestRecord:
    """One request as the server saw it, with the RBAC attributes it amounts to."""

    method: str
    path: str
    query: dict[str, str]
    status: int = 0
    #: get | list | watch | create | update | delete ("" for discovery and unknown paths)
    verb: str = ""
    group: str = ""
    resource: str = ""
    namespace: str = ""
    name: str = ""
    token: str = ""
    #: Authenticated by a client certificate (``client_certs``).
    client_cert: bool = False
    #: time.monotonic() when the request arrived.
    time: float = field(default_factory=time.monotonic)


@dataclass(slots=True)
class _Fault:
    status: int
    retry_after: int | None
    match: str
    remaining: int


@dataclass(slots=True, eq=False)
class _Watcher:
    resource: Resource
    accepts: Callable[[Mapping[str, Any]], bool]
    events: queue.Queue[dict[str, Any] | None] = field(default_factory=queue.Queue)
    drop: threading.Event = field(default_factory=threading.Event)
    stalled: bool = False


def status_body(code: int, reason: str, message: str) -> dict[str, Any]:
    """A metav1.Status failure document as the API server returns it."""
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


_REASONS = {
    400: "BadRequest",
    401: "Unauthorized",
    404: "NotFound",
    405: "MethodNotAllowed",
    409: "Conflict",
    410: "Expired",
    415: "UnsupportedMediaType",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
}


def _field(obj: Mapping[str, Any], path: str) -> str:
    cur: Any = obj
    for part in path.split("."):
        if not isinstance(cur, Mapping):
            return ""
        cur = cur.get(part)
    return "" if cur is None else str(cur)


def _parse_selector(text: str, kind: str) -> Callable[[Mapping[str, Any]], bool]:
    """A field or label selector as a predicate; ValueError for what is not supported."""
    terms: list[tuple[str, str, str | None]] = []
    for raw in filter(None, (t.strip() for t in text.split(","))):
        if "!=" in raw:
            k, v = raw.split("!=", 1)
            terms.append((k.strip(), "!=", v.strip()))
        elif "==" in raw or "=" in raw:
            k, v = raw.split("==", 1) if "==" in raw else raw.split("=", 1)
            terms.append((k.strip(), "=", v.strip()))
        elif kind == "label":
            terms.append((raw, "exists", None))
        else:
            raise ValueError(f"invalid field selector {raw!r}")
    if kind == "field":
        for k, _, _ in terms:
            if k not in ("metadata.name", "metadata.namespace", "spec.nodeName"):
                raise ValueError(f'field label not supported: "{k}"')

    def accepts(obj: Mapping[str, Any]) -> bool:
        labels = (obj.get("metadata") or {}).get("labels") or {}
        for k, op, v in terms:
            have = _field(obj, k) if kind == "field" else labels.get(k)
            if op == "exists":
                if have is None:
                    return False
            elif op == "=":
                if (have or "") != v:
                    return False
            elif (have or "") == v:
                return False
        return True

    return accepts


def _drop_terms(text: str, fields: frozenset[str]) -> str:
    """A field selector without its terms on ``fields`` (see ``ignored_field_labels``)."""
    if not fields:
        return text
    kept = []
    for raw in filter(None, (t.strip() for t in text.split(","))):
        name = raw.split("!=", 1)[0].split("=", 1)[0].strip()
        if name not in fields:
            kept.append(raw)
    return ",".join(kept)


def _owner_refs(obj: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    return [r for r in refs if isinstance(r, Mapping)]


def _qualified(res: Resource) -> str:
    """``pods`` or ``ciliumendpoints.cilium.io`` (how the API server names a resource)."""
    return f"{res.plural}.{res.group}" if res.group else res.plural


def _already_exists(res: Resource, name: str) -> dict[str, Any]:
    body = status_body(409, "AlreadyExists", f'{_qualified(res)} "{name}" already exists')
    body["details"] = {"name": name, "group": res.group, "kind": res.plural}
    return body


def _now_rfc3339() -> str:
    """Now, as the API server writes timestamps (RFC 3339, whole seconds, UTC)."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _check_body(res: Resource, namespace: str, body: Any, *, name: str) -> tuple[str, str] | None:
    """Why ``body`` cannot be written as ``res`` (reason, message), or None."""
    if not isinstance(body, dict) or not isinstance(body.get("metadata"), dict):
        return "BadRequest", "the body must be an object with metadata"
    if body.get("kind") not in (None, res.kind):
        return "BadRequest", f"the body is a {body.get('kind')!r}, not a {res.kind}"
    meta = body["metadata"]
    got = meta.get("name")
    if not isinstance(got, str) or not got:
        return "Invalid", f"{res.kind}: metadata.name: Required value: name is required"
    if name and got != name:
        return "BadRequest", f"the name of the object ({got}) does not match the URL ({name})"
    if res.namespaced:
        if not namespace:
            return "BadRequest", f"{res.plural} are namespaced: the URL must name a namespace"
        if meta.get("namespace") not in (None, "", namespace):
            return "BadRequest", "the namespace of the object does not match the URL"
    return None


class FakeAPIServer:
    """The fake API server; ``with FakeAPIServer() as srv:`` starts and stops it."""

    def __init__(
        self,
        *,
        token: str | None = None,
        bookmark_interval: float = 0.2,
        default_watch_timeout: float = 1800.0,
        ca: trustme.CA | None = None,
        port: int = 0,
        history_limit: int = 0,
        ignored_field_labels: Iterable[str] = (),
        poll_interval: float = 0.05,
        host: str = "127.0.0.1",
        client_certs: bool = False,
    ) -> None:
        self.ca = ca or trustme.CA()
        #: The IPv4 address served on (another one than loopback: the three-node test bed
        #: binds it inside a network namespace of its own, tests/e2e/cluster_harness.py).
        self.host = host
        self._cert = self.ca.issue_cert(*dict.fromkeys((host, "127.0.0.1", "localhost")))
        self._ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self._cert.configure_cert(self._ctx)
        self._ctx.set_alpn_protocols(["http/1.1"])
        #: A client certificate signed by `ca` authenticates a request as the token does
        #: (asked for, not required: clients with a token present none).
        self.client_certs = client_certs
        if client_certs:
            self._ctx.verify_mode = ssl.CERT_OPTIONAL
            self.ca.configure_trust(self._ctx)
        self.token = token or f"token-{uuid.uuid4().hex}"
        self.bookmark_interval = bookmark_interval
        self.default_watch_timeout = default_watch_timeout
        #: Events kept for watches to resume from (0: all); older ones are compacted away
        #: (watches from before them get 410), as etcd's periodic compaction does.
        self.history_limit = history_limit
        #: Field-selector terms on these fields are ignored (every object matches them), as
        #: client-go's fake clientset ignores field selectors: Cilium's LB script tests rely
        #: on it (a Pod on another node is still seen through ``spec.nodeName=NODE``).
        self.ignored_field_labels = frozenset(ignored_field_labels)
        #: How often the serving thread checks for `stop` (what a stop may wait).
        self.poll_interval = poll_interval
        self._lock = threading.RLock()
        self._rv = 100
        #: Oldest resourceVersion a watch may start from (older: 410 Gone).
        self._oldest_rv = self._rv
        self._objects: dict[str, dict[tuple[str, str], dict[str, Any]]] = {
            r.plural: {} for r in RESOURCES
        }
        self._history: collections.deque[tuple[int, Resource, dict[str, Any]]] = collections.deque()
        self._watchers: set[_Watcher] = set()
        self._faults: list[_Fault] = []
        self._snapshots: dict[str, tuple[int, list[dict[str, Any]]]] = {}
        self._snap_ids = itertools.count(1)
        self._conns: set[socket.socket] = set()
        self._handler_threads: set[threading.Thread] = set()
        self._closing = threading.Event()
        self._stall_new = False
        #: Every request served, in order.
        self.requests: list[RequestRecord] = []
        self._httpd = _Server((host, port), _Handler, self)
        self.port: int = self._httpd.server_address[1]
        self._thread: threading.Thread | None = None

    # ----- lifecycle ------------------------------------------------------------------------
    @property
    def url(self) -> str:
        """``https://HOST:PORT``."""
        return f"https://{self.host}:{self.port}"

    @property
    def ca_pem(self) -> bytes:
        """The CA certificate (PEM) clients must trust."""
        return self.ca.cert_pem.bytes()

    def start(self) -> FakeAPIServer:
        """Serve in a background thread."""
        self._thread = threading.Thread(
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": self.poll_interval},
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving, cut every open connection and wait for the handler threads."""
        self._closing.set()
        if self._thread is not None:
            self._httpd.shutdown()
            self._thread.join()
            self._thread = None
        self._httpd.server_close()
        with self._lock:
            for w in self._watchers:
                w.drop.set()
                w.events.put(None)
            conns = list(self._conns)
            threads = list(self._handler_threads)
        for c in conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        for t in threads:
            t.join(timeout=5)

    def __enter__(self) -> FakeAPIServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def write_kubeconfig(
        self, path: str | os.PathLike[str], *, token_file: str | None = None, server: str = ""
    ) -> str:
        """Write a kubeconfig for this server (the token inline, or ``tokenFile``)."""
        user: dict[str, Any] = {"tokenFile": token_file} if token_file else {"token": self.token}
        doc = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "fake",
                    "cluster": {
                        "server": server or self.url,
                        "certificate-authority-data": base64.b64encode(self.ca_pem).decode(),
                    },
                }
            ],
            "users": [{"name": "agent", "user": user}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "agent"}}],
            "current-context": "fake",
        }
        with open(path, "w") as f:
            json.dump(doc, f)
        return str(path)

    # ----- the objects ------------------------------------------------------------------------
    @property
    def resource_version(self) -> int:
        """The current revision."""
        with self._lock:
            return self._rv

    def upsert(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        """Create or replace an object (by ``kind``); returns it as stored."""
        res = _BY_KIND[obj["kind"]]
        stored = _json_copy(obj)
        meta = stored.setdefault("metadata", {})
        if res.namespaced:
            meta.setdefault("namespace", "default")
        else:
            meta.pop("namespace", None)
        key = (meta.get("namespace", ""), meta["name"])
        stored["apiVersion"] = res.api_version
        with self._lock:
            old = self._objects[res.plural].get(key)
            self._rv += 1
            meta["resourceVersion"] = str(self._rv)
            if old is None:
                meta.setdefault("uid", str(uuid.uuid4()))
                meta.setdefault("creationTimestamp", "2026-11-23T00:00:00Z")
            else:
                meta["uid"] = old["metadata"]["uid"]
                meta["creationTimestamp"] = old["metadata"]["creationTimestamp"]
            self._objects[res.plural][key] = stored
            self._emit(res, "MODIFIED" if old is not None else "ADDED", stored)
        return stored

    def upsert_many(self, objs: Iterable[Mapping[str, Any]]) -> None:
        """`upsert` each object."""
        for obj in objs:
            self.upsert(obj)

    def delete(self, kind: str, namespace: str, name: str) -> int:
        """Delete an object, and the objects it owns (see `_delete_locked`); the revision
        of the deletion (0 when there was none)."""
        with self._lock:
            return self._delete_locked(_BY_KIND[kind], namespace, name)

    def _delete_locked(self, res: Resource, namespace: str, name: str) -> int:
        """Delete one object, then every object whose ``metadata.ownerReferences`` names
        its uid (the garbage collector's cascade, done at once: a CiliumEndpoint goes with
        its Pod). The revision of the deletion, 0 when there was no such object."""
        old = self._objects[res.plural].pop((namespace if res.namespaced else "", name), None)
        if old is None:
            return 0
        self._rv += 1
        rv = self._rv
        gone = _json_copy(old)
        gone["metadata"]["resourceVersion"] = str(rv)
        self._emit(res, "DELETED", gone)
        uid = old["metadata"].get("uid")
        for dep_res in RESOURCES:
            owned = [
                key
                for key, o in self._objects[dep_res.plural].items()
                if any(ref.get("uid") == uid for ref in _owner_refs(o))
            ]
            for ns, dep_name in owned:
                self._delete_locked(dep_res, ns, dep_name)
        return rv

    def replace(self, kind: str, objs: Iterable[Mapping[str, Any]]) -> int:
        """Replace every object of ``kind`` by ``objs`` without watch events, then end the
        kind's open watches with 410 Gone (the history is compacted): clients see the new
        set only by relisting. Each created, changed or deleted object takes a revision, as
        in `upsert` and `delete`; returns the revision after the replacement."""
        res = _BY_KIND[kind]
        fresh: dict[tuple[str, str], dict[str, Any]] = {}
        for obj in objs:
            if obj.get("kind") != kind:
                raise ValueError(f"replace {kind}: got a {obj.get('kind')!r} object")
            stored = _json_copy(obj)
            meta = stored.setdefault("metadata", {})
            if res.namespaced:
                meta.setdefault("namespace", "default")
            else:
                meta.pop("namespace", None)
            stored["apiVersion"] = res.api_version
            fresh[(meta.get("namespace", ""), meta["name"])] = stored
        with self._lock:
            current = self._objects[res.plural]
            for key in sorted(current.keys() - fresh.keys()):
                self._rv += 1
                del current[key]
            for key, stored in sorted(fresh.items()):
                old = current.get(key)
                meta = stored["metadata"]
                if old is not None:
                    meta["uid"] = old["metadata"]["uid"]
                    meta["creationTimestamp"] = old["metadata"]["creationTimestamp"]
                    meta["resourceVersion"] = old["metadata"]["resourceVersion"]
                    if old == stored:
                        continue
                self._rv += 1
                meta["resourceVersion"] = str(self._rv)
                meta.setdefault("uid", str(uuid.uuid4()))
                meta.setdefault("creationTimestamp", "2026-11-23T00:00:00Z")
                current[key] = stored
            self._oldest_rv = self._rv
            self._history.clear()
            self._snapshots.clear()
            ws = [w for w in self._watchers if w.resource is res]
            rv = self._rv
        for w in ws:
            w.events.put(self._expired_event(0))
            w.events.put(None)
        return rv

    def objects(self, kind: str) -> list[dict[str, Any]]:
        """The current objects of ``kind`` (copies)."""
        res = _BY_KIND[kind]
        with self._lock:
            return [_json_copy(o) for o in self._objects[res.plural].values()]

    # ----- writes through the API (create, update, delete) -------------------------------
    def create(self, res: Resource, namespace: str, body: Any) -> tuple[int, dict[str, Any]]:
        """(HTTP status, body) of a POST: 201 with the stored object, 409 AlreadyExists,
        400/422 for a body that is no object of ``res``."""
        problem = _check_body(res, namespace, body, name="")
        if problem:
            return 422 if problem[0] == "Invalid" else 400, status_body(
                422 if problem[0] == "Invalid" else 400, problem[0], problem[1]
            )
        meta = body["metadata"]
        key = (namespace if res.namespaced else "", meta["name"])
        with self._lock:
            if key in self._objects[res.plural]:
                return 409, _already_exists(res, meta["name"])
            stored = _json_copy(body)
            smeta = stored["metadata"]
            if res.namespaced:
                smeta["namespace"] = namespace
            else:
                smeta.pop("namespace", None)
            stored["kind"], stored["apiVersion"] = res.kind, res.api_version
            self._rv += 1
            smeta["resourceVersion"] = str(self._rv)
            smeta["uid"] = str(uuid.uuid4())
            smeta["creationTimestamp"] = _now_rfc3339()
            smeta.setdefault("generation", 1)
            self._objects[res.plural][key] = stored
            self._emit(res, "ADDED", stored)
            return 201, _json_copy(stored)

    def update(
        self, res: Resource, namespace: str, name: str, body: Any
    ) -> tuple[int, dict[str, Any]]:
        """(HTTP status, body) of a PUT: 200 with the stored object; 404 when it does not
        exist; 409 Conflict when ``metadata.resourceVersion`` is not the stored one (stale);
        422 without one (custom resources must name the version they replace)."""
        problem = _check_body(res, namespace, body, name=name)
        if problem:
            code = 422 if problem[0] == "Invalid" else 400
            return code, status_body(code, problem[0], problem[1])
        key = (namespace if res.namespaced else "", name)
        with self._lock:
            old = self._objects[res.plural].get(key)
            if old is None:
                return 404, status_body(404, "NotFound", f'{_qualified(res)} "{name}" not found')
            want_rv = str(body["metadata"].get("resourceVersion") or "")
            if not want_rv:
                return 422, status_body(
                    422,
                    "Invalid",
                    f'{_qualified(res)} "{name}" is invalid: '
                    "metadata.resourceVersion: Invalid value: 0: must be specified for an update",
                )
            if want_rv != old["metadata"]["resourceVersion"]:
                return 409, status_body(
                    409,
                    "Conflict",
                    f'Operation cannot be fulfilled on {_qualified(res)} "{name}":'
                    " the object has been modified; please apply your changes to the latest "
                    "version and try again",
                )
            stored = _json_copy(body)
            smeta = stored["metadata"]
            if res.namespaced:
                smeta["namespace"] = namespace
            stored["kind"], stored["apiVersion"] = res.kind, res.api_version
            for kept in ("uid", "creationTimestamp"):
                smeta[kept] = old["metadata"][kept]
            if stored == old:
                return 200, _json_copy(old)  # no change: no new revision
            self._rv += 1
            smeta["resourceVersion"] = str(self._rv)
            self._objects[res.plural][key] = stored
            self._emit(res, "MODIFIED", stored)
            return 200, _json_copy(stored)

    def delete_request(
        self, res: Resource, namespace: str, name: str
    ) -> tuple[int, dict[str, Any]]:
        """(HTTP status, body) of a DELETE: 200 with the object as it was deleted (objects
        it owns go with it), 404 when there is no such object."""
        with self._lock:
            old = self.get(res, namespace if res.namespaced else "", name)
            if old is None or not self._delete_locked(res, namespace, name):
                return 404, status_body(404, "NotFound", f'{_qualified(res)} "{name}" not found')
        return 200, old

    def _emit(self, res: Resource, etype: str, obj: dict[str, Any]) -> None:
        event = {"type": etype, "object": obj}
        self._history.append((self._rv, res, event))
        if self.history_limit and len(self._history) > self.history_limit:
            # One event out per event in: dropping many at once frees them all in one go
            # (about 100 ms for 20,000 EndpointSlice events), a pause in the server's
            # writes that a benchmark would count as the agent's latency.
            self._history.popleft()
            self._oldest_rv = self._history[0][0] - 1
        for w in self._watchers:
            if w.resource is res and w.accepts(obj):
                w.events.put(event)

    # ----- faults ---------------------------------------------------------------------------
    def drop_watches(self) -> int:
        """Cut every open watch connection mid-stream (no final chunk); returns how many."""
        with self._lock:
            ws = list(self._watchers)
        for w in ws:
            w.drop.set()
            w.events.put(None)
        return len(ws)

    def stall_watches(self, stall: bool = True, *, new_ones: bool | None = None) -> None:
        """Open watches (and, with ``new_ones``, later ones) stop sending anything, bookmarks
        included, while the connection stays open."""
        with self._lock:
            for w in self._watchers:
                w.stalled = stall
            if new_ones is not None:
                self._stall_new = new_ones

    def fail_next(
        self, status: int, count: int = 1, *, retry_after: int | None = None, match: str = ""
    ) -> None:
        """The next ``count`` requests whose path contains ``match`` fail with ``status`` (a
        Status body; ``Retry-After`` when given)."""
        with self._lock:
            self._faults.append(_Fault(status, retry_after, match, count))

    def clear_faults(self) -> None:
        """Forget the faults `fail_next` installed that were not used up."""
        with self._lock:
            self._faults.clear()

    def expire(self, *, notify_watches: bool = False) -> None:
        """Compact the history: watches and continue tokens from older versions get 410.
        With ``notify_watches`` open watches also get an ERROR 410 event and end."""
        with self._lock:
            self._oldest_rv = self._rv
            self._history.clear()
            self._snapshots.clear()
            ws = list(self._watchers) if notify_watches else []
        for w in ws:
            w.events.put(self._expired_event(0))
            w.events.put(None)

    def rotate_token(self, new_token: str | None = None) -> str:
        """Replace the accepted token (the old one gets 401 from now on); returns the new."""
        with self._lock:
            self.token = new_token or f"token-{uuid.uuid4().hex}"
            return self.token

    def send_bookmarks(self) -> None:
        """Send a BOOKMARK now on every open watch that asked for bookmarks."""
        with self._lock:
            for w in self._watchers:
                w.events.put({"type": "_BOOKMARK_NOW"})

    def watch_count(self) -> int:
        """How many watches are open."""
        with self._lock:
            return len(self._watchers)

    def _expired_event(self, rv: int) -> dict[str, Any]:
        return {
            "type": "ERROR",
            "object": status_body(
                410, "Expired", f"too old resource version: {rv} ({self._oldest_rv})"
            ),
        }

    def _take_fault(self, path: str) -> _Fault | None:
        with self._lock:
            for f in self._faults:
                if f.match in path and f.remaining > 0:
                    f.remaining -= 1
                    if f.remaining == 0:
                        self._faults.remove(f)
                    return f
        return None

    # ----- serving (called by the handler) ---------------------------------------------------
    def discovery(self, path: str) -> dict[str, Any] | None:
        """The discovery document at ``path``, or None."""
        if path == "/version":
            return {
                "major": "1",
                "minor": "32",
                "gitVersion": "v1.32.0-fake",
                "platform": "linux/amd64",
            }
        if path == "/api":
            return {
                "kind": "APIVersions",
                "versions": ["v1"],
                "serverAddressByClientCIDRs": [
                    {"clientCIDR": "0.0.0.0/0", "serverAddress": f"127.0.0.1:{self.port}"}
                ],
            }
        if path == "/apis":
            groups = sorted({(r.group, r.version) for r in RESOURCES if r.group})
            return {
                "kind": "APIGroupList",
                "apiVersion": "v1",
                "groups": [
                    {
                        "name": g,
                        "versions": [{"groupVersion": f"{g}/{v}", "version": v}],
                        "preferredVersion": {"groupVersion": f"{g}/{v}", "version": v},
                    }
                    for g, v in groups
                ],
            }
        for gv_prefix in {r.prefix for r in RESOURCES}:
            if path == gv_prefix:
                rs = [r for r in RESOURCES if r.prefix == gv_prefix]
                return {
                    "kind": "APIResourceList",
                    "apiVersion": "v1",
                    "groupVersion": rs[0].api_version,
                    "resources": [
                        {
                            "name": r.plural,
                            "singularName": r.kind.lower(),
                            "namespaced": r.namespaced,
                            "kind": r.kind,
                            "verbs": ["create", "delete", "get", "list", "update", "watch"],
                            **({"shortNames": list(r.short_names)} if r.short_names else {}),
                        }
                        for r in rs
                    ],
                }
        return None

    def get(self, res: Resource, namespace: str, name: str) -> dict[str, Any] | None:
        """One object, or None."""
        with self._lock:
            obj = self._objects[res.plural].get((namespace, name))
            return None if obj is None else _json_copy(obj)

    def list(
        self,
        res: Resource,
        namespace: str,
        accepts: Callable[[Mapping[str, Any]], bool],
        limit: int,
        cont: str,
    ) -> tuple[int, dict[str, Any]]:
        """(HTTP status, body) of a list, paginated with ``limit``/``continue``."""
        with self._lock:
            if cont:
                try:
                    tok = json.loads(base64.urlsafe_b64decode(cont.encode()))
                    snap_id, start = str(tok["id"]), int(tok["start"])
                except (ValueError, KeyError, TypeError):
                    return 400, status_body(400, "BadRequest", "invalid continue token")
                snap = self._snapshots.get(snap_id)
                if snap is None:
                    return 410, status_body(
                        410,
                        "Expired",
                        "The provided continue parameter is too old to display a consistent "
                        "list result. You can start a new list without the continue parameter.",
                    )
                rv, items = snap
            else:
                rv = self._rv
                items = [
                    o
                    for (ns, _), o in sorted(self._objects[res.plural].items())
                    if (not namespace or ns == namespace) and accepts(o)
                ]
                snap_id, start = "", 0
            page = items[start : start + limit] if limit > 0 else items[start:]
            nxt = start + len(page)
            meta: dict[str, Any] = {"resourceVersion": str(rv)}
            if nxt < len(items):
                if not snap_id:
                    snap_id = str(next(self._snap_ids))
                    self._snapshots[snap_id] = (rv, items)
                meta["continue"] = base64.urlsafe_b64encode(
                    json.dumps({"id": snap_id, "start": nxt, "rv": rv}).encode()
                ).decode()
                meta["remainingItemCount"] = len(items) - nxt
            elif snap_id:
                self._snapshots.pop(snap_id, None)
            out = []
            for o in page:
                # Like the real server: list items carry neither kind nor apiVersion. A
                # shallow copy: a stored object is never changed in place (every write
                # stores a new copy), so the page can share the rest until it is sent.
                item = dict(o)
                item.pop("kind", None)
                item.pop("apiVersion", None)
                out.append(item)
        return 200, {
            "kind": f"{res.kind}List",
            "apiVersion": res.api_version,
            "metadata": meta,
            "items": out,
        }

    def open_watch(
        self, res: Resource, namespace: str, accepts: Callable[[Mapping[str, Any]], bool], rv: str
    ) -> _Watcher:
        """Register a watcher with its initial events (replay, synthetic ADDED or 410)."""

        def ok(o: Mapping[str, Any]) -> bool:
            return (not namespace or (o.get("metadata") or {}).get("namespace") == namespace) and (
                accepts(o)
            )

        w = _Watcher(res, ok)
        with self._lock:
            w.stalled = self._stall_new
            if rv in ("", "0"):
                for (_, _), o in sorted(self._objects[res.plural].items()):
                    if ok(o):
                        w.events.put({"type": "ADDED", "object": o})
            else:
                start = int(rv)
                if start < self._oldest_rv:
                    w.events.put(self._expired_event(start))
                    w.events.put(None)
                    return w
                for erv, eres, event in self._history:
                    if erv > start and eres is res and ok(event["object"]):
                        w.events.put(event)
            self._watchers.add(w)
        return w

    def close_watch(self, w: _Watcher) -> None:
        """Forget a watcher."""
        with self._lock:
            self._watchers.discard(w)

    def bookmark(self, res: Resource, w: _Watcher) -> dict[str, Any] | None:
        """A BOOKMARK event at the current revision for the stream of ``w``; None while
        ``w`` has events queued that are not sent yet. A bookmark tells the client it has
        every event up to its revision: sent ahead of them, a watch ending right after it
        would resume past them and lose them. (Events are queued under the lock.)"""
        with self._lock:
            if not w.events.empty():
                return None
            rv = self._rv
        return {
            "type": "BOOKMARK",
            "object": {
                "kind": res.kind,
                "apiVersion": res.api_version,
                "metadata": {
                    "resourceVersion": str(rv),
                    "annotations": {"k8s.io/initial-events-end": "true"},
                },
            },
        }


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False

    def __init__(self, addr: tuple[str, int], handler: type[_Handler], fake: FakeAPIServer) -> None:
        self.fake = fake
        super().__init__(addr, handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        t = threading.Thread(
            target=self.process_request_thread, args=(request, client_address), daemon=True
        )
        with self.fake._lock:
            self.fake._handler_threads.add(t)
        t.start()

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self.fake._lock:
                self.fake._handler_threads.discard(threading.current_thread())

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Connection errors (clients hanging up, failed handshakes) are normal here."""


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server
    timeout = 30

    def setup(self) -> None:
        fake = self.server.fake
        raw: socket.socket = self.request
        raw.settimeout(10)
        # Like Go's net/http (the real API server): no Nagle delay on small watch events.
        raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        # wrap_socket takes over the descriptor: from here on only the TLS socket is valid.
        self._tls = fake._ctx.wrap_socket(raw, server_side=True)
        self.request = self._tls
        with fake._lock:
            fake._conns.add(self._tls)
        super().setup()

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            with self.server.fake._lock:
                self.server.fake._conns.discard(self._tls)

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: tests read `FakeAPIServer.requests` instead."""

    # ----- responses ------------------------------------------------------------------------
    def _send_json(
        self, status: int, body: Mapping[str, Any], headers: Mapping[str, str] | None = None
    ) -> None:
        data = _json_bytes(body)
        # Recorded before the answer leaves: a client that has it may read `requests` at once.
        self._record.status = status
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def _fail(self, status: int, message: str, headers: Mapping[str, str] | None = None) -> None:
        self._send_json(
            status, status_body(status, _REASONS.get(status, "Unknown"), message), headers
        )

    def _begin(
        self, method: str
    ) -> tuple[str, dict[str, str], tuple[Resource, str, str] | None] | None:
        """Record the request, check its token and injected faults: (path, query, target)
        to go on with, None when an answer was sent already."""
        fake = self.server.fake
        url = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query, keep_blank_values=True).items()}
        path = url.path.rstrip("/") or "/"
        auth = self.headers.get("Authorization", "")
        token = auth[7:].strip() if auth.lower().startswith("bearer ") else ""
        rec = self._record = RequestRecord(method, path, query, token=token)
        if fake.client_certs and self._tls.getpeercert():
            rec.client_cert = True
        target = self._route(path)
        if target is not None:
            res, namespace, name = target
            rec.group, rec.resource, rec.namespace, rec.name = (
                res.group,
                res.plural,
                namespace,
                name,
            )
            if method == "GET":
                watch = query.get("watch") in ("true", "1")
                rec.verb = "get" if name else "watch" if watch else "list"
            else:
                rec.verb = {"POST": "create", "PUT": "update", "DELETE": "delete"}[method]
        with fake._lock:
            fake.requests.append(rec)
        if token != fake.token and not rec.client_cert:
            self._discard_body()
            self._fail(401, "Unauthorized")
            return None
        fault = fake._take_fault(self.path)
        if fault is not None:
            self._discard_body()
            headers = {} if fault.retry_after is None else {"Retry-After": str(fault.retry_after)}
            self._fail(fault.status, f"injected fault {fault.status}", headers)
            return None
        return path, query, target

    def _discard_body(self) -> None:
        """Read a request body nobody will look at (the connection stays usable)."""
        length = int(self.headers.get("Content-Length") or 0)
        if length > 0:
            self.rfile.read(length)

    def _body(self) -> tuple[bool, Any]:
        """(ok, the request's JSON body); a 400/415 was sent when not ok."""
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length > 0 else b""
        ctype = self.headers.get("Content-Type", "application/json").split(";")[0].strip()
        if ctype != "application/json":
            self._fail(415, f"the body of a {self.command} must be application/json")
            return False, None
        try:
            return True, json.loads(raw or b"null")
        except ValueError as e:
            self._fail(400, f"the body is not JSON: {e}")
            return False, None

    def _write(self, method: str) -> None:
        """POST (to a collection), PUT and DELETE (to one object)."""
        fake = self.server.fake
        begun = self._begin(method)
        if begun is None:
            return
        path, _query, target = begun
        if target is None:
            self._discard_body()
            self._fail(404, f"the server could not find the requested resource ({path})")
            return
        res, namespace, name = target
        if (method == "POST") == bool(name):
            self._discard_body()
            self._fail(405, f"{method} is not allowed on {path}")
            return
        if method == "DELETE":
            self._discard_body()
            status, body = fake.delete_request(res, namespace, name)
        else:
            ok, doc = self._body()
            if not ok:
                return
            if method == "POST":
                status, body = fake.create(res, namespace, doc)
            else:
                status, body = fake.update(res, namespace, name, doc)
        self._send_json(status, body)

    def do_POST(self) -> None:
        self._write("POST")

    def do_PUT(self) -> None:
        self._write("PUT")

    def do_DELETE(self) -> None:
        self._write("DELETE")

    def do_GET(self) -> None:
        fake = self.server.fake
        begun = self._begin("GET")
        if begun is None:
            return
        path, query, target = begun
        rec = self._record
        doc = fake.discovery(path)
        if doc is not None:
            self._send_json(200, doc)
            return
        if target is None:
            self._fail(404, f"the server could not find the requested resource ({path})")
            return
        try:
            fsel = _parse_selector(
                _drop_terms(query.get("fieldSelector", ""), fake.ignored_field_labels), "field"
            )
            lsel = _parse_selector(query.get("labelSelector", ""), "label")
        except ValueError as e:
            self._fail(400, str(e))
            return

        def accepts(o: Mapping[str, Any]) -> bool:
            return fsel(o) and lsel(o)

        res, namespace, name = target
        if rec.verb == "get":
            obj = fake.get(res, namespace, name)
            if obj is None:
                self._fail(404, f'{res.plural} "{name}" not found')
            else:
                self._send_json(200, obj)
            return
        if rec.verb == "watch":
            self._watch(res, namespace, accepts, query)
            return
        try:
            limit = int(query.get("limit") or 0)
        except ValueError:
            self._fail(400, "invalid limit")
            return
        status, body = fake.list(res, namespace, accepts, limit, query.get("continue", ""))
        self._send_json(status, body)

    def _route(self, path: str) -> tuple[Resource, str, str] | None:
        for res in RESOURCES:
            if not path.startswith(res.prefix + "/"):
                continue
            parts = path[len(res.prefix) + 1 :].split("/")
            namespace = ""
            if res.namespaced and len(parts) >= 3 and parts[0] == "namespaces":
                namespace, parts = parts[1], parts[2:]
            if parts[0] != res.plural or len(parts) > 2:
                continue
            return res, namespace, parts[1] if len(parts) == 2 else ""
        return None

    # ----- watch -------------------------------------------------------------------------------
    def _chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def _client_gone(self) -> bool:
        """True when the client closed the connection (it sends nothing else on a watch)."""
        conn: ssl.SSLSocket = self.connection
        try:
            readable, _, _ = select.select([conn], [], [], 0)
            if not readable:
                return False
            conn.setblocking(False)
            try:
                return conn.recv(1) == b""
            finally:
                conn.setblocking(True)
        except ssl.SSLWantReadError:
            return False  # a TLS record without application data
        except (OSError, ValueError):
            return True

    def _watch(
        self,
        res: Resource,
        namespace: str,
        accepts: Callable[[Mapping[str, Any]], bool],
        query: Mapping[str, str],
    ) -> None:
        fake = self.server.fake
        try:
            timeout = float(query.get("timeoutSeconds") or fake.default_watch_timeout)
        except ValueError:
            self._fail(400, "invalid timeoutSeconds")
            return
        bookmarks = query.get("allowWatchBookmarks") in ("true", "1")
        w = fake.open_watch(res, namespace, accepts, query.get("resourceVersion", ""))
        self._record.status = 200
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.wfile.flush()
        deadline = time.monotonic() + timeout
        next_bookmark = time.monotonic() + fake.bookmark_interval
        clean_end = True
        held: dict[str, Any] | None = None
        try:
            while not fake._closing.is_set():
                now = time.monotonic()
                if now >= deadline:
                    break
                if w.drop.is_set():
                    clean_end = False
                    break
                if w.stalled:
                    if self._client_gone():
                        clean_end = False
                        break
                    time.sleep(0.02)
                    continue
                event: dict[str, Any] | None
                if held is not None:
                    event, held = held, None
                else:
                    try:
                        event = w.events.get(timeout=min(0.05, max(0.0, deadline - now)))
                    except queue.Empty:
                        event = {"type": "_IDLE"}
                if event is None:
                    # End of stream requested (410 sent, dropped or server stopping).
                    clean_end = not w.drop.is_set()
                    break
                if w.stalled:
                    # The stall began while waiting: keep the event, send it when it ends.
                    held = event
                    continue
                etype = event["type"]
                if etype in ("_IDLE", "_BOOKMARK_NOW"):
                    if etype == "_BOOKMARK_NOW":
                        next_bookmark = 0.0  # now, or once the queued events are sent
                    mark = (
                        fake.bookmark(res, w)
                        if bookmarks and time.monotonic() >= next_bookmark
                        else None
                    )
                    if mark is not None:
                        self._chunk(json.dumps(mark).encode() + b"\n")
                        next_bookmark = time.monotonic() + fake.bookmark_interval
                    elif etype == "_IDLE" and self._client_gone():
                        clean_end = False
                        break
                    continue
                self._chunk(json.dumps(event).encode() + b"\n")
                if etype == "ERROR":
                    break
            if clean_end:
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()
        except OSError:
            clean_end = False
        finally:
            fake.close_watch(w)
            self.close_connection = True
            if not clean_end:
                try:
                    self._tls.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
