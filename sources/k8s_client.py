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

Bearer tokens read from a file (the service account's projected token, which
the kubelet rotates, or a kubeconfig's ``tokenFile``) are re-read whenever the
file changes: `TokenFile` is consulted before every request through the
client's ``refresh_api_key_hook``, costing one ``stat``.

`K8sClient` wraps the official ``kubernetes`` client (blocking; callers run it
in worker threads) with a token-bucket rate limiter (QPS and burst, like
client-go's) in front of every request.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import urllib3
import yaml

from statedb.errors import InputError

if TYPE_CHECKING:
    import kubernetes.client

# The ``kubernetes`` package (0.2-0.3 s of CPU to import) is imported where a client is
# built, not here: an agent without a Kubernetes source never imports it.

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


class TokenFile:
    """A bearer token kept in a file, re-read when the file changes (rotation)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._key: tuple[int, int, int] | None = None
        self._token = ""
        self._lock = threading.Lock()
        #: How many times the token was (re-)read.
        self.reads = 0

    def current(self) -> str:
        """The token as in the file now (the last good one when the file is unreadable)."""
        try:
            st = os.stat(self.path)
        except OSError:
            return self._token
        key = (st.st_ino, st.st_mtime_ns, st.st_size)
        with self._lock:
            if key != self._key:
                try:
                    text = Path(self.path).read_text().strip()
                except OSError:
                    return self._token
                if text:
                    self._token = text
                    self._key = key
                    self.reads += 1
            return self._token


def _install_token_file(cfg: kubernetes.client.Configuration, token: TokenFile) -> None:
    """Make every request carry the file's current token."""

    def refresh(c: kubernetes.client.Configuration) -> None:
        c.api_key["BearerToken"] = "Bearer " + token.current()

    refresh(cfg)
    cfg.refresh_api_key_hook = refresh  # type: ignore[assignment]  # declared as None


def _kubeconfig_token_file(path: str) -> str:
    """The ``tokenFile`` of the kubeconfig's current user (resolved against its directory)."""
    try:
        doc = yaml.safe_load(Path(path).read_text()) or {}
    except (OSError, yaml.YAMLError) as e:
        raise K8sConfigError(f"k8s-kubeconfig: cannot read {path}: {e}") from None
    ctx_name = doc.get("current-context")
    ctx = next(
        (c.get("context") or {} for c in doc.get("contexts") or [] if c.get("name") == ctx_name), {}
    )
    user = next(
        (u.get("user") or {} for u in doc.get("users") or [] if u.get("name") == ctx.get("user")),
        {},
    )
    tf = user.get("tokenFile") or ""
    if tf and not os.path.isabs(tf):
        tf = os.path.join(os.path.dirname(os.path.abspath(path)), tf)
    return str(tf)


def build_configuration(s: ClientSettings) -> tuple[kubernetes.client.Configuration, str]:
    """A client configuration for ``s`` and a description of where it points."""
    import kubernetes.client
    import kubernetes.config

    cfg = kubernetes.client.Configuration()
    env = os.environ if s.environ is None else s.environ
    if s.kubeconfig:
        try:
            kubernetes.config.load_kube_config(
                config_file=s.kubeconfig, client_configuration=cfg, persist_config=False
            )
        except (kubernetes.config.ConfigException, OSError, yaml.YAMLError) as e:
            raise K8sConfigError(f"k8s-kubeconfig: {s.kubeconfig}: {e}") from None
        tf = _kubeconfig_token_file(s.kubeconfig)
        if tf:
            _install_token_file(cfg, TokenFile(tf))
        if s.api_server:
            cfg.host = s.api_server.rstrip("/")
        return cfg, f"{cfg.host} (kubeconfig {s.kubeconfig})"
    if s.api_server:
        cfg.host = s.api_server.rstrip("/")
        if os.path.isfile(s.token_file):
            _install_token_file(cfg, TokenFile(s.token_file))
        if os.path.isfile(s.ca_file):
            cfg.ssl_ca_cert = s.ca_file
        return cfg, cfg.host
    if s.in_cluster:
        host, port = env.get(HOST_ENV, ""), env.get(PORT_ENV, "")
        if not host or not port:
            raise K8sConfigError(f"k8s in-cluster: {HOST_ENV} and {PORT_ENV} must be set")
        if not os.path.isfile(s.token_file):
            raise K8sConfigError(f"k8s in-cluster: no service account token at {s.token_file}")
        if not os.path.isfile(s.ca_file):
            raise K8sConfigError(f"k8s in-cluster: no CA certificate at {s.ca_file}")
        cfg.host = f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"
        cfg.ssl_ca_cert = s.ca_file
        _install_token_file(cfg, TokenFile(s.token_file))
        return cfg, f"{cfg.host} (in-cluster)"
    raise K8sConfigError("k8s: none of k8s-kubeconfig, k8s-api-server, k8s-in-cluster is set")


class K8sClient:
    """The official client's API objects behind one rate limiter (blocking calls)."""

    def __init__(self, settings: ClientSettings) -> None:
        import kubernetes.client

        self.settings = settings
        cfg, self.description = build_configuration(settings)
        # urllib3 may retry a request on a fresh connection (a pooled keep-alive connection
        # the server closed), but never by itself on a status (429/503 with Retry-After):
        # the reflector backs off and reports it.
        cfg.retries = urllib3.Retry(total=2, status=0, redirect=0, respect_retry_after_header=False)
        self.configuration = cfg
        self.api_client = kubernetes.client.ApiClient(cfg)
        self.core = kubernetes.client.CoreV1Api(self.api_client)
        self.discovery = kubernetes.client.DiscoveryV1Api(self.api_client)
        self.limiter = RateLimiter(settings.qps, settings.burst)

    def call(self, func: Callable[..., Any], /, **kwargs: Any) -> Any:
        """``func(**kwargs)`` after taking a rate-limiter token (blocks the worker thread)."""
        self.limiter.acquire()
        return func(**kwargs)

    def close(self) -> None:
        """Close the connection pool."""
        self.api_client.close()
