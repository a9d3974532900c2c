"""An asyncio/trio etcd v3 client over etcd's JSON gateway (``/v3/...``), through httpx.

Why the gateway and not a gRPC client (aetcd, etcd3 over grpcio): the agent runs on anyio
(asyncio or trio); grpc.aio binds a client to asyncio, grpcio is a large native wheel
with its own threads, and the gateway is served by every etcd 3.4+ member on its client
port with the same semantics (it is gRPC inside etcd). What this module needs of etcd fits
in eight calls: range, put, delete, txn, compaction, lease grant/keep-alive/revoke, status
and the watch stream, each a JSON POST; keys and values are base64, 64-bit integers are
strings.

`EtcdClient` talks to one endpoint at a time and moves to the next on a transport error
or an answer meaning "this member cannot serve now" (no leader, timeout, unavailable), so a
dead member or a member cut from the quorum costs one retry. Every failure raises
`KVStoreUnavailable`; a watch whose start revision was compacted raises `CompactedError`
(the caller relists). TLS (client certificate, CA) and etcd's user/password auth (a token
per endpoint) come from `sources.kvstore.config.EtcdConfig`.
"""

from __future__ import annotations

import base64
import json
import ssl
from collections.abc import AsyncGenerator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from sources.kvstore.config import EtcdConfig
from statedb.errors import StatewrightError


class KVStoreError(StatewrightError):
    """An etcd request that failed (the message names the call and the endpoint)."""


class KVStoreUnavailable(KVStoreError):
    """No endpoint could serve the request now (connection refused, no leader, timeout)."""


class KVStoreClosed(KVStoreError):
    """A request on a client after `EtcdClient.aclose`: the agent is shutting down, or a
    caller kept a client it had closed."""


class CompactedError(KVStoreError):
    """A watch's start revision is older than etcd's compaction: relist."""

    def __init__(self, message: str, compact_revision: int) -> None:
        super().__init__(message)
        self.compact_revision = compact_revision


#: gRPC codes that mean "another member (or a later try) may serve it".
_RETRYABLE_CODES = {1, 4, 8, 10, 13, 14}

#: Transport errors of a connection the server dropped before any HTTP answer: a closed
#: connection (RemoteProtocolError), or a reset one while reading or writing. A TLS port
#: drops a plain-HTTP client in each of these ways: it closes after reading the first
#: bytes, which is a reset when more of the request arrived meanwhile (timing decides).
_DROPPED = (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError)


def _b64(s: str | bytes) -> str:
    return base64.b64encode(s.encode() if isinstance(s, str) else s).decode()


def _unb64(s: str | None) -> bytes:
    return base64.b64decode(s) if s else b""


def _range_end_b64(prefix: str) -> str:
    """The ``range_end`` (base64) that selects every key starting with ``prefix``."""
    raw = bytearray(prefix.encode())
    for i in range(len(raw) - 1, -1, -1):
        if raw[i] < 0xFF:
            raw[i] += 1
            return _b64(bytes(raw[: i + 1]))
    return _b64(b"\0")


@dataclass(frozen=True, slots=True)
class KeyValue:
    """One key as etcd holds it."""

    key: str
    value: bytes
    create_revision: int
    mod_revision: int
    lease: int = 0

    @classmethod
    def from_json(cls, kv: Mapping[str, Any]) -> KeyValue:
        return cls(
            _unb64(kv.get("key")).decode(),
            _unb64(kv.get("value")),
            int(kv.get("create_revision", 0)),
            int(kv.get("mod_revision", 0)),
            int(kv.get("lease", 0)),
        )


@dataclass(frozen=True, slots=True)
class WatchEvent:
    """A put (``value`` set) or a delete of ``kv.key`` at ``kv.mod_revision``."""

    deleted: bool
    kv: KeyValue


@dataclass(frozen=True, slots=True)
class Compare:
    """One txn condition: ``target`` (CREATE, MOD, VERSION, VALUE) of ``key`` equals
    ``value``."""

    key: str
    target: str
    value: int | str

    def to_json(self) -> dict[str, Any]:
        field = {"CREATE": "create_revision", "MOD": "mod_revision", "VERSION": "version",
                 "VALUE": "value"}[self.target]
        val = _b64(str(self.value)) if self.target == "VALUE" else str(self.value)
        return {"key": _b64(self.key), "target": self.target, "result": "EQUAL", field: val}


def put_op(key: str, value: str | bytes, lease: int = 0) -> dict[str, Any]:
    """A txn operation writing ``key``."""
    body: dict[str, Any] = {"key": _b64(key), "value": _b64(value)}
    if lease:
        body["lease"] = str(lease)
    return {"request_put": body}


def get_op(key: str) -> dict[str, Any]:
    """A txn operation reading ``key``."""
    return {"request_range": {"key": _b64(key)}}


def delete_op(key: str) -> dict[str, Any]:
    """A txn operation deleting ``key``."""
    return {"request_delete_range": {"key": _b64(key)}}


@dataclass(frozen=True, slots=True)
class TxnResult:
    succeeded: bool
    revision: int
    #: The key-values the txn's range operations read (in order).
    kvs: list[KeyValue]


class EtcdClient:
    """See the module doc. One instance per agent; safe to use from concurrent tasks."""

    def __init__(self, config: EtcdConfig) -> None:
        self.config = config
        self._current = 0
        self._tokens: dict[str, str] = {}
        verify: ssl.SSLContext | bool = config.ssl_context() if config.tls else True
        timeout = httpx.Timeout(config.request_timeout,
                                connect=min(config.connect_timeout, config.request_timeout))
        self._http = httpx.AsyncClient(verify=verify, timeout=timeout)

    async def aclose(self) -> None:
        await self._http.aclose()

    @property
    def endpoint(self) -> str:
        """The endpoint requests go to now."""
        return self.config.endpoints[self._current % len(self.config.endpoints)]

    def _rotate(self, failed: str) -> None:
        if self.endpoint == failed:
            self._current = (self._current + 1) % len(self.config.endpoints)

    # ----- requests ---------------------------------------------------------------------------
    async def _headers(self, endpoint: str) -> dict[str, str]:
        """The request headers for ``endpoint``; every request asks for them first, so a
        closed client fails here with `KVStoreClosed` rather than httpx's RuntimeError."""
        if self._http.is_closed:
            raise KVStoreClosed(f"etcd {endpoint}: the client is closed")
        if not self.config.username:
            return {}
        token = self._tokens.get(endpoint)
        if token is None:
            resp = await self._http.post(
                endpoint + "/v3/auth/authenticate",
                json={"name": self.config.username, "password": self.config.password},
            )
            try:
                body = resp.json()
            except ValueError:
                body = {"error": self.http_error(resp)}
            if resp.status_code != 200 or "token" not in body:
                raise KVStoreError(f"etcd {endpoint}: authenticate as user "
                                   f"{self.config.username!r}: {body.get('error', body)}")
            token = str(body["token"])
            self._tokens[endpoint] = token
        return {"Authorization": token}

    async def call(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """POST ``body`` to ``/v3/<path>`` on the current endpoint, moving to the next one
        on failure; `KVStoreUnavailable` when none answered."""
        errors: list[str] = []
        for _ in range(len(self.config.endpoints)):
            endpoint = self.endpoint
            try:
                resp = await self._http.post(
                    f"{endpoint}/v3/{path}", json=body, headers=await self._headers(endpoint)
                )
            except (httpx.HTTPError, OSError) as e:  # OSError: ssl.SSLError httpx passes on
                errors.append(self.transport_error(endpoint, e))
                self._rotate(endpoint)
                continue
            try:
                out = resp.json()
            except ValueError:
                errors.append(f"{endpoint}: {self.http_error(resp)}")
                self._rotate(endpoint)
                continue
            if resp.status_code == 200 and "error" not in out:
                return out
            code = int(out.get("code", 0)) if isinstance(out, dict) else 0
            msg = out.get("error", resp.text) if isinstance(out, dict) else resp.text
            if code == 16 and self._tokens.pop(endpoint, None) is not None:
                continue  # token expired: authenticate again
            if code in _RETRYABLE_CODES or resp.status_code >= 500:
                errors.append(f"{endpoint}: {msg}")
                self._rotate(endpoint)
                continue
            raise KVStoreError(f"etcd {path} at {endpoint}: {msg}")
        raise KVStoreUnavailable(f"etcd {path}: no endpoint answered ({'; '.join(errors)})")

    def transport_error(self, endpoint: str, e: BaseException) -> str:
        """What went wrong talking to ``endpoint``; a failed TLS handshake says so and
        names the configuration's CA and certificate files."""
        text = f"{type(e).__name__}: {e}".rstrip(": ")
        cfg = self.config
        files = ", ".join(f"{k} {v}" for k, v in (("trusted-ca-file", cfg.trusted_ca_file),
                                                   ("cert-file", cfg.cert_file)) if v)
        refused = ("etcd (with --client-cert-auth) refuses the client certificate "
                   f"({'cert-file ' + cfg.cert_file if cfg.cert_file else 'no cert-file'}: "
                   "none, or not signed by a CA etcd trusts)")
        if "SSL" in text or "certificate" in text.lower():
            if "ALERT" in text.upper():  # the server's alert: it refused our certificate
                return f"{endpoint}: TLS handshake failed: {refused}: {e}"
            return f"{endpoint}: TLS handshake failed: {e} ({files or 'system CAs, no cert-file'})"
        if endpoint.startswith("https:") and not str(e) and isinstance(e, _DROPPED):
            # TLS 1.3: the server checks the client certificate after the client's side of
            # the handshake is done, and may refuse it by closing the connection.
            return f"{endpoint}: TLS connection closed without an answer: {refused}"
        if endpoint.startswith("http:") and isinstance(e, _DROPPED):
            return (f"{endpoint}: connection dropped without an HTTP answer ({text}): "
                    f"a TLS port? use {endpoint.replace('http:', 'https:', 1)}")
        return f"{endpoint}: {text}"

    def http_error(self, resp: httpx.Response) -> str:
        """An answer that is not etcd's JSON (a proxy, plain HTTP to a TLS port, the
        gateway refusing a client certificate), with what to do where it is known."""
        text = f"HTTP {resp.status_code}: {resp.text[:160].strip()}"
        if "HTTP request to an HTTPS server" in resp.text:
            text += f" (use {str(resp.url).split('/v3/')[0].replace('http:', 'https:', 1)})"
        if "CommonName of client" in resp.text:
            text += (f" (cert-file {self.config.cert_file} has a CommonName: etcd's JSON "
                     "gateway refuses such client certificates under --client-cert-auth; use "
                     "one without a CommonName, and username/password for etcd's auth)")
        return text

    # ----- key-values -------------------------------------------------------------------------
    async def get(self, key: str) -> KeyValue | None:
        out = await self.call("kv/range", {"key": _b64(key)})
        kvs = out.get("kvs") or []
        return KeyValue.from_json(kvs[0]) if kvs else None

    async def list_prefix(self, prefix: str) -> tuple[list[KeyValue], int]:
        """Every key under ``prefix`` and the revision they were read at."""
        body = {"key": _b64(prefix), "range_end": _range_end_b64(prefix)}
        out = await self.call("kv/range", body)
        kvs = [KeyValue.from_json(kv) for kv in out.get("kvs") or []]
        return kvs, int(out["header"]["revision"])

    async def put(self, key: str, value: str | bytes, lease: int = 0) -> int:
        body = put_op(key, value, lease)["request_put"]
        out = await self.call("kv/put", body)
        return int(out["header"]["revision"])

    async def delete(self, key: str, *, prefix: bool = False) -> int:
        """Delete ``key`` (or every key under it); returns how many were deleted."""
        body: dict[str, Any] = {"key": _b64(key)}
        if prefix:
            body["range_end"] = _range_end_b64(key)
        out = await self.call("kv/deleterange", body)
        return int(out.get("deleted", 0))

    async def txn(
        self, compare: Sequence[Compare], success: Sequence[Mapping[str, Any]],
        failure: Sequence[Mapping[str, Any]] = (),
    ) -> TxnResult:
        out = await self.call("kv/txn", {
            "compare": [c.to_json() for c in compare],
            "success": list(success),
            "failure": list(failure),
        })
        kvs = [
            KeyValue.from_json(kv)
            for r in out.get("responses") or []
            for kv in (r.get("response_range") or {}).get("kvs") or []
        ]
        return TxnResult(bool(out.get("succeeded")), int(out["header"]["revision"]), kvs)

    async def create(self, key: str, value: str | bytes, lease: int = 0) -> KeyValue | None:
        """Write ``key`` only if it does not exist (compare-and-swap on its creation);
        None when created, else the key as it is."""
        res = await self.txn([Compare(key, "CREATE", 0)], [put_op(key, value, lease)],
                             [get_op(key)])
        return None if res.succeeded else (res.kvs[0] if res.kvs else None)

    async def compact(self, revision: int) -> None:
        await self.call("kv/compaction", {"revision": str(revision), "physical": True})

    # ----- leases -----------------------------------------------------------------------------
    async def lease_grant(self, ttl: int) -> int:
        out = await self.call("lease/grant", {"TTL": str(ttl)})
        return int(out["ID"])

    async def lease_keepalive(self, lease: int) -> int:
        """Renew ``lease``; its TTL, 0 when it has expired."""
        out = await self.call("lease/keepalive", {"ID": str(lease)})
        return int((out.get("result") or {}).get("TTL", 0))

    async def lease_revoke(self, lease: int) -> None:
        await self.call("lease/revoke", {"ID": str(lease)})

    async def status(self) -> dict[str, Any]:
        """The current endpoint's member status (``leader`` is 0 without a leader)."""
        return await self.call("maintenance/status", {})

    async def probe(self, endpoint: str) -> None:
        """Whether ``endpoint`` itself answers a status request within the request
        timeout (no failover); `KVStoreUnavailable` when not, and requests then go to
        the next endpoint. A watch stream on a member that went silent (a partition
        that drops packets: no reset ever arrives) is found this way."""
        try:
            resp = await self._http.post(f"{endpoint}/v3/maintenance/status", json={},
                                         headers=await self._headers(endpoint))
        except (httpx.HTTPError, OSError) as e:  # OSError: ssl.SSLError httpx passes on
            self._rotate(endpoint)
            raise KVStoreUnavailable(f"etcd {self.transport_error(endpoint, e)}") from e
        if resp.status_code != 200:
            self._rotate(endpoint)
            raise KVStoreUnavailable(f"etcd {endpoint}: status: HTTP {resp.status_code}")

    # ----- watch ------------------------------------------------------------------------------
    async def watch(
        self, prefix: str, start_revision: int
    ) -> AsyncGenerator[list[WatchEvent], None]:
        """The changes under ``prefix`` from ``start_revision`` on, one list per etcd
        response (an empty one first, when etcd confirms the watch), from the current
        endpoint, until the stream breaks
        (`KVStoreUnavailable`) or the revision is compacted (`CompactedError`)."""
        endpoint = self.endpoint
        body = {"create_request": {
            "key": _b64(prefix), "range_end": _range_end_b64(prefix),
            "start_revision": str(start_revision), "progress_notify": True,
        }}
        timeout = httpx.Timeout(self.config.request_timeout, read=None)
        try:
            async with self._http.stream(
                "POST", f"{endpoint}/v3/watch", json=body, timeout=timeout,
                headers=await self._headers(endpoint),
            ) as resp:
                if resp.status_code != 200:
                    raise KVStoreUnavailable(f"etcd watch at {endpoint}: HTTP {resp.status_code}")
                async for line in resp.aiter_lines():
                    if not line.strip():
                        continue
                    events = self._watch_line(endpoint, json.loads(line))
                    if events is not None:
                        yield events
        except (httpx.HTTPError, OSError, ValueError) as e:
            self._rotate(endpoint)
            raise KVStoreUnavailable(f"etcd watch at {self.transport_error(endpoint, e)}") from e
        self._rotate(endpoint)
        raise KVStoreUnavailable(f"etcd watch at {endpoint}: stream ended")

    @staticmethod
    def _watch_line(endpoint: str, msg: Mapping[str, Any]) -> list[WatchEvent] | None:
        if "error" in msg:
            raise KVStoreUnavailable(f"etcd watch at {endpoint}: {msg['error']}")
        res = msg.get("result") or {}
        compact = int(res.get("compact_revision", 0))
        if compact:
            raise CompactedError(f"etcd watch at {endpoint}: compacted at {compact}", compact)
        if res.get("canceled"):
            raise KVStoreUnavailable(
                f"etcd watch at {endpoint}: canceled: {res.get('cancel_reason', '')}")
        evs = res.get("events")
        if not evs:
            return [] if res.get("created") else None  # [] : the stream is up
        return [WatchEvent(ev.get("type") == "DELETE", KeyValue.from_json(ev["kv"])) for ev in evs]
