"""The agent's HTTP client for the Kubernetes API: one urllib3 connection pool, JSON in and
out, the API's errors as `K8sApiError`.

Why not the official ``kubernetes`` package: the agent uses a handful of its calls (list
and watch, and create/replace/delete of custom objects) on plain dicts, while importing
``kubernetes.client`` costs about 35 MB of RSS and 0.2-0.3 s of CPU for its generated
model classes. This module is what those calls need, on urllib3 (which that package
used too), with the same behaviour:

* a `Connection` says where the server is and how to trust and authenticate to it: the
  CA (a file or PEM data; the system's trust store without either), a client certificate
  and key (files or PEM data), ``insecure`` (no verification at all), the TLS server name
  when it is not the URL's host, a proxy (an HTTP(S) proxy URL; without one the
  ``https_proxy``/``all_proxy`` environment applies unless ``no_proxy`` names the host),
  and the ``Authorization`` header, asked for before every request (a token file that is
  rotated is re-read then);
* requests carry a ``(connect, read)`` or total timeout; urllib3 retries a request at
  most twice on a fresh connection (a pooled keep-alive connection the server closed), never
  on a status: a 429 or 503 with Retry-After is the caller's to back off from;
* a status outside 2xx raises `K8sApiError` with the verb, path, status, reason, the
  message of the API's Status body and its Retry-After; transport failures are urllib3's
  own exceptions (``MaxRetryError`` naming the reason, ``ReadTimeoutError``...) or
  ``OSError``, as callers catch them;
* bodies are JSON: encoded with orjson where installed (else ``json``), decoded with
  `sources.k8s_json.loads`; `open` hands back the undecoded, streamed response of a watch
  (its socket is read by `sources.k8s_watch_body`).
"""

from __future__ import annotations

import importlib
import ipaddress
import json
import os
import ssl
import tempfile
import threading
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import urllib3

from sources import k8s_json
from statedb.errors import StatewrightError

#: What every request says it is.
USER_AGENT = "statewright-agent"
#: Idle connections kept per host (more are opened when needed, then closed).
POOL_MAXSIZE = 16
#: How many bytes of an error response's body are kept (for its message).
MAX_ERROR_BODY = 64 * 1024

#: A request's timeout: seconds in all, or (connect, read) seconds.
Timeout = float | tuple[float, float]


class K8sApiError(StatewrightError):
    """The API server answered a request with a status outside 2xx."""

    def __init__(
        self,
        verb: str,
        path: str,
        status: int,
        reason: str = "",
        body: str = "",
        retry_after: float | None = None,
    ) -> None:
        self.verb = verb
        self.path = path
        self.status = status
        self.reason = reason
        self.body = body
        #: The Retry-After header in seconds, None without one (or not a number).
        self.retry_after = retry_after
        super().__init__(f"{verb} {path}: {self.summary}")

    @property
    def message(self) -> str:
        """The ``message`` of the API's Status body ("" when the body is not one)."""
        try:
            doc = json.loads(self.body) if self.body else None
        except ValueError:
            return ""
        msg = doc.get("message", "") if isinstance(doc, dict) else ""
        return msg if isinstance(msg, str) else str(msg)

    @property
    def summary(self) -> str:
        """``HTTP <status> <reason>: <message>``, what an operator sees in health."""
        msg = self.message
        return f"HTTP {self.status} {self.reason}".strip() + (f": {msg}" if msg else "")

    def __reduce__(self) -> tuple[Any, ...]:
        return (
            type(self),
            (self.verb, self.path, self.status, self.reason, self.body, self.retry_after),
        )


def describe_error(e: BaseException) -> str:
    """A one-line description of a client error."""
    if isinstance(e, K8sApiError):
        return e.summary
    if isinstance(e, urllib3.exceptions.MaxRetryError) and e.reason is not None:
        return f"cannot connect: {e.reason}"
    return f"{type(e).__name__}: {e}"


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

    def authorization(self) -> str:
        """The ``Authorization`` header for the current token."""
        return "Bearer " + self.current()


@dataclass(frozen=True, slots=True)
class Connection:
    """Where an API server is and how to trust it and authenticate to it."""

    #: ``https://host:port`` (a path prefix, as behind a gateway, is kept).
    server: str
    ca_file: str = ""
    #: A PEM CA bundle (wins over ``ca_file``).
    ca_data: bytes = b""
    cert_file: str = ""
    cert_data: bytes = b""
    key_file: str = ""
    key_data: bytes = b""
    #: Skip verifying the server's certificate (kubeconfig ``insecure-skip-tls-verify``).
    insecure: bool = False
    #: The name to verify the server's certificate for, when not the URL's host.
    tls_server_name: str = ""
    #: A proxy URL; None: from the environment (``https_proxy``, ``no_proxy``...).
    proxy: str | None = None
    #: The ``Authorization`` header's value, asked for before every request (None: none).
    authorization: Callable[[], str] | None = None

    def __post_init__(self) -> None:
        url = urllib.parse.urlsplit(self.server)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ValueError(f"the API server {self.server!r} is not an http(s) URL")
        if bool(self.cert_file or self.cert_data) != bool(self.key_file or self.key_data):
            raise ValueError("a client certificate needs its key, and a key its certificate")


def _dumps(body: Any) -> bytes:
    fast = k8s_json.ORJSON
    if fast is not None:
        try:
            return bytes(fast.dumps(body))
        except TypeError:
            pass  # an integer beyond 64 bits, or a type orjson does not take: json says
    return json.dumps(body).encode()


def _load_pem_pair(ctx: ssl.SSLContext, conn: Connection) -> None:
    """Load the client certificate and key into ``ctx``; PEM data go through a private
    temporary directory removed at once (``load_cert_chain`` reads files only)."""
    if not (conn.cert_file or conn.cert_data):
        return
    if not (conn.cert_data or conn.key_data):
        ctx.load_cert_chain(conn.cert_file, conn.key_file)
        return
    with tempfile.TemporaryDirectory(prefix="statewright-k8s-") as tmp:
        cert, key = conn.cert_file, conn.key_file
        if conn.cert_data:
            cert = os.path.join(tmp, "cert.pem")
            Path(cert).write_bytes(conn.cert_data)
        if conn.key_data:
            key = os.path.join(tmp, "key.pem")
            fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(conn.key_data)
        ctx.load_cert_chain(cert, key)


def ssl_context(conn: Connection) -> ssl.SSLContext:
    """The TLS context of ``conn``: its CA (or the system's), its client certificate;
    no verification at all when ``insecure``. Raises OSError or ssl.SSLError for files
    or data that are not what they should be."""
    ctx = urllib3.util.ssl_.create_urllib3_context()
    if conn.insecure:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    elif conn.ca_data:
        ctx.load_verify_locations(cadata=conn.ca_data.decode("ascii", "replace"))
    elif conn.ca_file:
        ctx.load_verify_locations(cafile=conn.ca_file)
    else:
        ctx.load_default_certs()
    _load_pem_pair(ctx, conn)
    return ctx


def environment_proxy(server: str, environ: Mapping[str, str] | None = None) -> str:
    """The proxy the environment names for ``server`` ("" for none): ``https_proxy`` (or
    ``http_proxy`` for an http server), else ``all_proxy``, unless ``no_proxy`` names the
    host (a name or domain suffix, ``host:port``, an address or CIDR, or ``*``)."""
    env = os.environ if environ is None else environ
    proxies = urllib.request.getproxies_environment() if environ is None else {
        k[:-6].lower(): v for k, v in env.items() if k.lower().endswith("_proxy") and v
    }
    url = urllib.parse.urlsplit(server)
    proxy = proxies.get(url.scheme) or proxies.get("all") or ""
    if proxy and bypasses_proxy(server, proxies.get("no", "")):
        return ""
    return proxy


def bypasses_proxy(server: str, no_proxy: str) -> bool:
    """Whether ``no_proxy`` (comma separated) names the host of ``server``."""
    url = urllib.parse.urlsplit(server)
    host = (url.hostname or "").lower()
    if not host:
        return True
    netloc = url.netloc.lower().rpartition("@")[2]
    try:
        addr: ipaddress.IPv4Address | ipaddress.IPv6Address | None = ipaddress.ip_address(host)
    except ValueError:
        addr = None
    for entry in (e.strip().lower() for e in no_proxy.split(",")):
        if not entry:
            continue
        if entry == "*":
            return True
        if addr is not None:
            try:
                if addr in ipaddress.ip_network(entry, strict=False):
                    return True
            except ValueError:
                pass
        entry = entry.lstrip(".")
        for name in (host, netloc):
            if name == entry or name.endswith("." + entry):
                return True
    return False


def _pool_manager(conn: Connection, retries: urllib3.Retry) -> urllib3.PoolManager:
    """A pool manager for ``conn``: direct, or through its (or the environment's) proxy."""
    kwargs: dict[str, Any] = {"maxsize": POOL_MAXSIZE, "retries": retries}
    if conn.server.startswith("https:"):
        kwargs["ssl_context"] = ssl_context(conn)
        kwargs["cert_reqs"] = ssl.CERT_NONE if conn.insecure else ssl.CERT_REQUIRED
        if conn.insecure:
            kwargs["assert_hostname"] = False
        if conn.tls_server_name:
            kwargs["server_hostname"] = conn.tls_server_name
    proxy = environment_proxy(conn.server) if conn.proxy is None else conn.proxy
    if not proxy:
        return urllib3.PoolManager(**kwargs)
    scheme = urllib.parse.urlsplit(proxy).scheme.lower()
    if scheme.startswith("socks"):
        try:
            socks = importlib.import_module("urllib3.contrib.socks")
        except ImportError:
            raise ValueError(
                f"the proxy {proxy} is a SOCKS proxy, which needs the PySocks package "
                "(pip install PySocks)"
            ) from None
        manager: urllib3.PoolManager = socks.SOCKSProxyManager(proxy, **kwargs)
        return manager
    if scheme not in ("http", "https"):
        raise ValueError(f"the proxy {proxy!r} is not an http(s) or socks URL")
    return urllib3.ProxyManager(proxy, **kwargs)


def _timeout(timeout: Timeout) -> urllib3.Timeout:
    if isinstance(timeout, tuple):
        return urllib3.Timeout(connect=timeout[0], read=timeout[1])
    return urllib3.Timeout(total=timeout)


def _retry_after(headers: Any) -> float | None:
    value = headers.get("Retry-After") if headers is not None else None
    try:
        return None if value is None else max(0.0, float(value))
    except (TypeError, ValueError):
        return None


class HttpClient:
    """Requests to one API server over one connection pool (blocking: worker threads).

    Raises ValueError (with the reason) when ``conn``'s TLS material or proxy cannot be
    used."""

    def __init__(self, conn: Connection) -> None:
        self.connection = conn
        # urllib3 may retry a request on a fresh connection (a pooled keep-alive connection
        # the server closed), but never by itself on a status (429/503 with Retry-After):
        # the reflector backs off and reports it.
        retries = urllib3.Retry(total=2, status=0, redirect=0, respect_retry_after_header=False)
        try:
            self._pool = _pool_manager(conn, retries)
        except (OSError, ssl.SSLError) as e:
            raise ValueError(f"cannot use the TLS certificates: {e}") from None
        self._base = conn.server.rstrip("/")

    def _headers(self, content_type: str) -> dict[str, str]:
        headers = {"Accept": "application/json", "User-Agent": USER_AGENT}
        if content_type:
            headers["Content-Type"] = content_type
        auth = self.connection.authorization
        if auth is not None:
            value = auth()
            if value:
                headers["Authorization"] = value
        return headers

    def url(self, path: str, query: Iterable[tuple[str, str]] = ()) -> str:
        """The URL of ``path`` (from ``/``) with ``query``."""
        q = urllib.parse.urlencode(list(query))
        return f"{self._base}{path}?{q}" if q else f"{self._base}{path}"

    def open(
        self,
        verb: str,
        path: str,
        *,
        query: Iterable[tuple[str, str]] = (),
        body: Any = None,
        content_type: str = "application/json",
        timeout: Timeout,
    ) -> urllib3.BaseHTTPResponse:
        """Send a request; the streamed response (body unread: the caller reads or closes
        it). A status outside 2xx raises `K8sApiError` (its body read and released)."""
        data = None if body is None else _dumps(body)
        resp = self._pool.request(
            verb,
            self.url(path, query),
            body=data,
            headers=self._headers(content_type if data is not None else ""),
            timeout=_timeout(timeout),
            preload_content=False,
        )
        if 200 <= resp.status <= 299:
            return resp
        try:
            raw = resp.data  # all of it: the connection goes back to the pool clean
        finally:
            resp.release_conn()
        raise K8sApiError(
            verb,
            path,
            resp.status,
            resp.reason or "",
            raw[:MAX_ERROR_BODY].decode("utf-8", "replace"),
            _retry_after(resp.headers),
        )

    def read(self, verb: str, path: str, **request: Any) -> bytes:
        """`open` (same arguments), then the whole body (the connection goes back to the
        pool)."""
        resp = self.open(verb, path, **request)
        try:
            return resp.data
        finally:
            resp.release_conn()

    def request(self, verb: str, path: str, **request: Any) -> Any:
        """`read` (same arguments), decoded as JSON (None for an empty body)."""
        raw = self.read(verb, path, **request)
        return k8s_json.loads(raw) if raw.strip() else None

    def close(self) -> None:
        """Close the pooled connections."""
        self._pool.clear()
