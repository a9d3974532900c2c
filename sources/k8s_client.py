"""Connecting to the Kubernetes API server: configuration, credentials, rate limits.

Three ways to say where the API server is (first that applies wins):

* a kubeconfig file (``k8s-kubeconfig``): its current context's cluster, CA and
  user (token, ``tokenFile``, client certificate); ``k8s-api-server`` given as
  well overrides the server address;
* an API server URL alone (``k8s-api-server``): credentials and CA from the
  service account's files when they exist (a node agent started by hand on a
  cluster node), none otherwise;
* in-cluster (``k8s-in-cluster``): ``KUBERNETES_SERVICE_HOST``/``_PORT``, the
  service account's token and CA under
  ``/var/run/secrets/kubernetes.io/serviceaccount``.

A kubeconfig is read by `sources.k8s_kubeconfig` (which fields it understands, and which
it refuses by name). Bearer tokens read from a file (the service account's projected
token, which the kubelet rotates, or a kubeconfig's ``tokenFile``) are re-read whenever
the file changes: `TokenFile` is consulted before every request, costing one ``stat``.

`K8sClient` is the agent's own small HTTP client (`sources.k8s_http`, on urllib3; the
official ``kubernetes`` package is not imported by the agent: about 35 MB of RSS) with a
token-bucket rate limiter (QPS and burst, like client-go's) in front of every request.
Its calls are blocking: callers run them in worker threads.
"""

from __future__ import annotations

import os
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import urllib3

from sources import k8s_kubeconfig
from sources.k8s_http import Connection, HttpClient, Timeout, TokenFile
from statedb.errors import InputError

__all__ = [
    "ClientSettings",
    "K8sClient",
    "K8sConfigError",
    "RateLimiter",
    "TokenFile",
    "build_connection",
    "resource_path",
]

SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
SA_TOKEN = f"{SA_DIR}/token"
SA_CA = f"{SA_DIR}/ca.crt"
HOST_ENV = "KUBERNETES_SERVICE_HOST"
PORT_ENV = "KUBERNETES_SERVICE_PORT"


class K8sConfigError(InputError):
    """The Kubernetes connection cannot be configured; the message says which setting."""


@dataclass(frozen=True, slots=True)
class ClientSettings:
    """Where the API server is and how fast the agent may talk to it."""

    kubeconfig: str = ""
    api_server: str = ""
    in_cluster: bool = False
    #: Sustained requests per second and the burst above it (client-go: 5 and 10; the
    #: agent sends a handful of requests per resource and reconnect, so 20/40 is ample).
    qps: float = 20.0
    burst: int = 40
    #: The service account's files (tests point these elsewhere).
    token_file: str = SA_TOKEN
    ca_file: str = SA_CA
    #: Environment for KUBERNETES_SERVICE_HOST/PORT (None: os.environ).
    environ: Mapping[str, str] | None = None

    def __post_init__(self) -> None:
        if self.qps <= 0:
            raise K8sConfigError(f"k8s-qps: must be > 0, got {self.qps}")
        if self.burst < 1:
            raise K8sConfigError(f"k8s-burst: must be >= 1, got {self.burst}")

    @property
    def enabled(self) -> bool:
        """True when any way of reaching an API server is configured."""
        return bool(self.kubeconfig or self.api_server or self.in_cluster)


class RateLimiter:
    """A thread-safe token bucket: ``qps`` tokens per second, at most ``burst`` saved."""

    def __init__(self, qps: float, burst: int, clock: Callable[[], float] = time.monotonic):
        self.qps = qps
        self.burst = burst
        self._clock = clock
        self._tokens = float(burst)
        self._last = clock()
        self._lock = threading.Lock()

    def reserve(self) -> float:
        """Take one token; return how long the caller must wait before using it."""
        with self._lock:
            now = self._clock()
            self._tokens = min(float(self.burst), self._tokens + (now - self._last) * self.qps)
            self._last = now
            self._tokens -= 1.0
            return 0.0 if self._tokens >= 0 else -self._tokens / self.qps

    def acquire(self) -> float:
        """Block (the calling worker thread) until a token is available; seconds waited."""
        wait = self.reserve()
        if wait > 0:
            time.sleep(wait)
        return wait


def resource_path(api_version: str, plural: str, namespace: str = "", name: str = "") -> str:
    """The API path of a resource collection or object: ``/api/v1/...`` for the core group,
    ``/apis/<group>/<version>/...`` for the others; namespaced when ``namespace`` is given."""
    root = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
    parts = [root]
    if namespace:
        parts.append(f"namespaces/{urllib.parse.quote(namespace, safe='')}")
    parts.append(plural)
    if name:
        parts.append(urllib.parse.quote(name, safe=""))
    return "/".join(parts)


def build_connection(s: ClientSettings) -> tuple[Connection, str]:
    """The connection ``s`` describes and a description of where it points."""
    env = os.environ if s.environ is None else s.environ
    if s.kubeconfig:
        try:
            conn = k8s_kubeconfig.connection(
                k8s_kubeconfig.load(s.kubeconfig), s.api_server.rstrip("/")
            )
        except k8s_kubeconfig.KubeconfigError as e:
            raise K8sConfigError(f"k8s-kubeconfig: {e}") from None
        return conn, f"{conn.server} (kubeconfig {s.kubeconfig})"
    if s.api_server:
        server = s.api_server.rstrip("/")
        token = TokenFile(s.token_file).authorization if os.path.isfile(s.token_file) else None
        ca = s.ca_file if os.path.isfile(s.ca_file) else ""
        return _connection(server, "k8s-api-server", ca_file=ca, authorization=token), server
    if s.in_cluster:
        host, port = env.get(HOST_ENV, ""), env.get(PORT_ENV, "")
        if not host or not port:
            raise K8sConfigError(f"k8s in-cluster: {HOST_ENV} and {PORT_ENV} must be set")
        if not os.path.isfile(s.token_file):
            raise K8sConfigError(f"k8s in-cluster: no service account token at {s.token_file}")
        if not os.path.isfile(s.ca_file):
            raise K8sConfigError(f"k8s in-cluster: no CA certificate at {s.ca_file}")
        server = f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"
        conn = _connection(server, "k8s in-cluster", ca_file=s.ca_file,
                           authorization=TokenFile(s.token_file).authorization)
        return conn, f"{server} (in-cluster)"
    raise K8sConfigError("k8s: none of k8s-kubeconfig, k8s-api-server, k8s-in-cluster is set")


def _connection(server: str, what: str, **kwargs: Any) -> Connection:
    try:
        return Connection(server=server, **kwargs)
    except ValueError as e:
        raise K8sConfigError(f"{what}: {e}") from None


class K8sClient:
    """Requests to the API server behind one rate limiter (blocking calls: worker threads).

    Paths come from `resource_path`; a status outside 2xx raises
    `sources.k8s_http.K8sApiError`, a transport failure urllib3's exception or OSError."""

    def __init__(self, settings: ClientSettings) -> None:
        self.settings = settings
        self.connection, self.description = build_connection(settings)
        try:
            self.http = HttpClient(self.connection)
        except ValueError as e:
            raise K8sConfigError(f"k8s: {self.description}: {e}") from None
        self.limiter = RateLimiter(settings.qps, settings.burst)

    def get(
        self, path: str, *, query: Iterable[tuple[str, str]] = (), timeout: Timeout
    ) -> bytes:
        """GET ``path``: the undecoded body (a list page, decoded by the caller)."""
        self.limiter.acquire()
        return self.http.read("GET", path, query=query, timeout=timeout)

    def watch(
        self, path: str, *, query: Iterable[tuple[str, str]], timeout: Timeout
    ) -> urllib3.BaseHTTPResponse:
        """GET ``path`` with ``query`` (a watch): the streamed response, body unread."""
        self.limiter.acquire()
        return self.http.open("GET", path, query=query, timeout=timeout)

    def create(self, path: str, body: Mapping[str, Any], *, timeout: Timeout) -> Any:
        """POST ``body`` to the collection ``path``: the object as the server stored it."""
        self.limiter.acquire()
        return self.http.request("POST", path, body=body, timeout=timeout)

    def replace(self, path: str, body: Mapping[str, Any], *, timeout: Timeout) -> Any:
        """PUT ``body`` (with its resourceVersion) at ``path``: the object as stored."""
        self.limiter.acquire()
        return self.http.request("PUT", path, body=body, timeout=timeout)

    def delete(self, path: str, *, timeout: Timeout) -> Any:
        """DELETE ``path``: the server's answer (the object, or a Status)."""
        self.limiter.acquire()
        return self.http.request("DELETE", path, timeout=timeout)

    def close(self) -> None:
        """Close the connection pool."""
        self.http.close()
