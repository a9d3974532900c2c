"""kvstore mode against a real etcd started with TLS (server certificate, client
certificates required: ``--client-cert-auth``) and etcd's auth enabled (a root user, a
user ``cilium`` with a role that may read and write): certificates made in the test with
the `cryptography` package (tests/kvstore/tls_certs.py).

Shown: two agents over TLS with a password agree on an identity and follow each other's
endpoints (range, txn, lease and the watch stream all carry the token); every wrong
setting fails with an error that names what is wrong: a wrong password or user, a user
without permission, a server certificate the configured CA did not sign, a client
certificate etcd does not trust, none at all, plain HTTP to the TLS port (however the port
drops the connection); unreadable or mismatched certificate files stop the agent at
start, naming the field and the file.
"""

from __future__ import annotations

import base64
import contextlib
import ipaddress
import os
import re
import signal
import socket
import ssl
import struct
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

import anyio
import pytest

from sources.kvstore.config import EtcdConfig, KVStoreConfigError, load_etcd_config
from sources.kvstore.etcd_client import EtcdClient, KVStoreError, KVStoreUnavailable
from sources.kvstore.session import KVStoreSession
from statewright.agent.config import ConfigError, load
from tests.k8s.helpers import wait_for
from tests.kvstore.backends import Agent, KVStoreBackend, manager, pod
from tests.kvstore.conftest import _require_etcd
from tests.kvstore.etcd_cluster import EtcdCluster
from tests.kvstore.tls_certs import TLSFiles, make_tls_files

pytestmark = pytest.mark.anyio

ROOT_PASSWORD = "root-pw"
PASSWORD = "s3cret"
#: The client's connect and request timeouts here: a bound against hangs. Every case
#: below is about what etcd answers, and on a starved machine etcd's side of one TLS
#: handshake alone took longer than the client's default 2 s connect timeout (the client
#: then reports a ConnectTimeout, which says nothing about the certificate):
#: `test_a_slow_handshake_still_names_the_refused_certificate`.
BOUND = 30.0


@dataclass
class SecureEtcd:
    etcd: EtcdCluster
    tls: TLSFiles

    def config(self, user: str = "cilium", password: str = PASSWORD, **kw: str) -> EtcdConfig:
        """The agents' configuration: TLS with the client certificate, ``user``; ``kw``
        replaces fields."""
        tls = self.tls
        return replace(EtcdConfig(tuple(self.etcd.endpoints), trusted_ca_file=str(tls.ca),
                                  cert_file=str(tls.client.cert), key_file=str(tls.client.key),
                                  username=user, password=password, request_timeout=BOUND,
                                  connect_timeout=BOUND), **kw)


def _b64(s: str) -> str:
    return base64.b64encode(s.encode()).decode()


async def _enable_auth(config: EtcdConfig) -> None:
    """A root user, a role that may read and write every key, user ``cilium`` with it, a
    user ``nobody`` without any role; then auth on."""
    c = EtcdClient(replace(config, username="", password=""))
    try:
        for path, body in (
            ("auth/user/add", {"name": "root", "password": ROOT_PASSWORD}),
            ("auth/user/grant", {"user": "root", "role": "root"}),
            ("auth/role/add", {"name": "agents"}),
            ("auth/role/grant", {"name": "agents", "perm": {
                "permType": "READWRITE", "key": _b64("\0"), "range_end": _b64("\0")}}),
            ("auth/user/add", {"name": "cilium", "password": PASSWORD}),
            ("auth/user/grant", {"user": "cilium", "role": "agents"}),
            ("auth/user/add", {"name": "nobody", "password": PASSWORD}),
            ("auth/enable", {}),
        ):
            await c.call(path, body)
    finally:
        await c.aclose()


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureEtcd]:
    """One etcd member on loopback with TLS, client certificates required, auth on."""
    _require_etcd()
    base = tmp_path_factory.mktemp("etcd-tls")
    tls = make_tls_files(base / "pki")
    ctx = ssl.create_default_context(cafile=str(tls.ca))
    ctx.load_cert_chain(str(tls.client.cert), str(tls.client.key))
    etcd = EtcdCluster(base / "data", size=1, scheme="https", ssl_context=ctx, extra_args=(
        "--cert-file", str(tls.server.cert), "--key-file", str(tls.server.key),
        "--client-cert-auth", "--trusted-ca-file", str(tls.ca),
        # Each password check is a bcrypt hash; etcd's default cost (10) takes ~64 times
        # the CPU of the lowest (4), enough on a starved test machine to pass the client's
        # 3 s request timeout. The cost changes nothing the tests look at.
        "--bcrypt-cost", "4"))
    etcd.start()
    try:
        s = SecureEtcd(etcd, tls)
        anyio.run(_enable_auth, s.config())
        yield s
    finally:
        etcd.stop()


@pytest.fixture
async def kv(secure: SecureEtcd) -> AsyncIterator[KVStoreBackend]:
    backend = KVStoreBackend(secure.etcd.endpoints, config=secure.config(),
                             admin=secure.config("root", ROOT_PASSWORD))
    try:
        yield backend
    finally:
        await backend.close()


def _agent(tmp: Path, name: str, n: int) -> Agent:
    return Agent(name, manager(tmp / name, f"10.{60 + n}.0.0/24", seed=n),
                 ipaddress.IPv4Address(f"192.0.2.{n + 1}"))


async def test_two_agents_over_tls_with_a_password(kv: KVStoreBackend, tmp_path: Path) -> None:
    a, b = _agent(tmp_path, "node-a", 0), _agent(tmp_path, "node-b", 1)
    async with anyio.create_task_group() as tg:
        await kv.start_agent(tg, a)
        await kv.start_agent(tg, b)
        ea = await anyio.to_thread.run_sync(a.mgr.create, "0", pod("web", ["k8s:app=web"]))
        eb = await anyio.to_thread.run_sync(b.mgr.create, "0", pod("web2", ["k8s:app=web"]))
        await wait_for(lambda: a.mgr.get(str(ea.id)).identity == b.mgr.get(str(eb.id)).identity,
                       "one number for the label set")
        await wait_for(lambda: f"{ea.ipv4}/32" in b.remote() and f"{eb.ipv4}/32" in a.remote(),
                       "each has the other's endpoint (the watch streams carry the token)")
        num = a.mgr.get(str(ea.id)).identity
        assert (await kv.identities())[num]
        for ag in (a, b):
            await wait_for(lambda ag=ag: all(ok for ok, _ in ag.health()), f"{ag.name} healthy")
            assert ag.session.health().ok  # type: ignore[attr-defined]
        tg.cancel_scope.cancel()
    for ag in (a, b):
        await kv.stop_agent(ag)


async def _error_of(config: EtcdConfig) -> KVStoreError:
    c = EtcdClient(config)
    try:
        with pytest.raises(KVStoreError) as info:
            await c.put("t-errors/k", "v")
        return info.value
    finally:
        await c.aclose()


async def test_wrong_credentials_are_named(secure: SecureEtcd) -> None:
    e = await _error_of(secure.config(password="wrong"))
    assert not isinstance(e, KVStoreUnavailable)
    assert re.search(r"authenticate as user 'cilium': .*authentication failed", str(e)), e
    e = await _error_of(secure.config(user="mallory"))
    assert "authenticate as user 'mallory'" in str(e), e
    e = await _error_of(secure.config(user="nobody"))
    assert "kv/put" in str(e) and "permission denied" in str(e), e
    e = await _error_of(secure.config(user="", password=""))  # the certificate alone
    assert not isinstance(e, KVStoreUnavailable) and "kv/put" in str(e), e
    # The session reports it in health and keeps trying.
    s = KVStoreSession(EtcdClient(secure.config(password="wrong")), ttl=5, retry_interval=0.1)
    try:
        async with anyio.create_task_group() as tg:
            await tg.start(s.run)
            await wait_for(lambda: "authentication failed" in s.health().last_error,
                           "the session's health names the failure")
            assert not s.health().ok and not s.health().connected
            tg.cancel_scope.cancel()
    finally:
        await s.close()
        await s.client.aclose()


async def test_tls_failures_are_named(secure: SecureEtcd) -> None:
    tls = secure.tls
    e = await _error_of(secure.config(trusted_ca_file=str(tls.other_ca)))
    assert isinstance(e, KVStoreUnavailable)
    assert "TLS handshake failed" in str(e) and "certificate verify failed" in str(e), e
    assert f"trusted-ca-file {tls.other_ca}" in str(e), e
    e = await _error_of(secure.config(cert_file=str(tls.stranger.cert),
                                      key_file=str(tls.stranger.key)))
    assert isinstance(e, KVStoreUnavailable), e
    assert "refuses the client certificate (cert-file " + str(tls.stranger.cert) in str(e), e
    e = await _error_of(secure.config(cert_file=str(tls.named.cert),
                                      key_file=str(tls.named.key)))
    assert not isinstance(e, KVStoreUnavailable), e
    assert "has a CommonName" in str(e) and str(tls.named.cert) in str(e), e
    e = await _error_of(secure.config(cert_file="", key_file=""))
    assert isinstance(e, KVStoreUnavailable), e
    assert "refuses the client certificate (no cert-file" in str(e), e
    plain = tuple(u.replace("https://", "http://") for u in secure.etcd.endpoints)
    e = await _error_of(EtcdConfig(plain, request_timeout=BOUND, connect_timeout=BOUND))
    # (Go's TLS server answers plain HTTP with a 400, or closes the connection first)
    assert f"use {secure.etcd.endpoints[0]}" in str(e), e


async def test_a_slow_handshake_still_names_the_refused_certificate(secure: SecureEtcd) -> None:
    """etcd paused (SIGSTOP) for 2.5 s while the client connects with a certificate it does
    not trust, as a starved etcd is: within the connect timeout the client still gets
    etcd's refusal, and names it."""
    tls = secure.tls
    proc = secure.etcd.members[0].proc
    assert proc is not None
    pid = proc.pid
    resume = threading.Timer(2.5, os.kill, (pid, signal.SIGCONT))
    os.kill(pid, signal.SIGSTOP)
    resume.start()
    try:
        e = await _error_of(secure.config(cert_file=str(tls.stranger.cert),
                                          key_file=str(tls.stranger.key)))
    finally:
        resume.join()
        os.kill(pid, signal.SIGCONT)
    assert isinstance(e, KVStoreUnavailable), e
    assert "refuses the client certificate (cert-file " + str(tls.stranger.cert) in str(e), e


@contextmanager
def _dropping_port(how: str) -> Iterator[str]:
    """A loopback port that drops every HTTP client as a TLS port drops a plain-HTTP one
    (Go's TLS server reads a record header, finds no TLS record and closes): after the
    request is in, ``close`` closes the connection (the client reads an end of stream)
    and ``reset`` resets it (what closing does when part of the request is still unread:
    the client's read or write fails). Returns the port's ``http://`` URL."""
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return  # the listener was closed
            with conn:
                conn.settimeout(5)
                data = b""
                with contextlib.suppress(OSError):
                    while b"\r\n\r\n" not in data or len(data) < _request_length(data):
                        chunk = conn.recv(65536)
                        if not chunk:
                            break
                        data += chunk
                if how == "reset":
                    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        listener.shutdown(socket.SHUT_RDWR)
        listener.close()
        thread.join(timeout=5)


def _request_length(data: bytes) -> int:
    """The length of the HTTP request whose start is ``data`` (headers + Content-Length)."""
    head, _, _ = data.partition(b"\r\n\r\n")
    m = re.search(rb"(?im)^content-length:\s*(\d+)", head)
    return len(head) + 4 + (int(m[1]) if m else 0)


@pytest.mark.parametrize("how", ["close", "reset"])
async def test_plain_http_to_a_tls_port_is_named_however_it_is_dropped(how: str) -> None:
    """Whichever way the TLS port drops the plain-HTTP client (an end of stream, or a reset
    seen by the read or the write: timing decides which against etcd), the error says to
    use https://; test_tls_failures_are_named shows it against etcd itself."""
    with _dropping_port(how) as url:
        e = await _error_of(EtcdConfig((url,), request_timeout=3.0))
    assert isinstance(e, KVStoreUnavailable), e
    assert f"use {url.replace('http:', 'https:', 1)}" in str(e), e
    assert "connection dropped without an HTTP answer" in str(e), e


def test_unusable_tls_files_stop_the_agent_at_start(secure: SecureEtcd, tmp_path: Path) -> None:
    tls = secure.tls
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate\n")
    url = secure.etcd.endpoints[0]
    cases = [
        (f"trusted-ca-file: {garbage}\n", "trusted-ca-file", str(garbage)),
        (f"trusted-ca-file: {tls.ca}\ncert-file: {tls.client.cert}\n"
         f"key-file: {tmp_path}/missing.key\n", "key-file", "No such file"),
        (f"trusted-ca-file: {tls.ca}\ncert-file: {tls.client.cert}\n"
         f"key-file: {tls.stranger.key}\n", "cert-file", "not a usable certificate or key"),
    ]
    for extra, field, what in cases:
        f = tmp_path / "etcd.config"
        f.write_text(f"endpoints: [{url}]\n{extra}")
        with pytest.raises(KVStoreConfigError) as info:
            load_etcd_config(f)
        assert str(f) in str(info.value) and field in str(info.value), info.value
        assert what in str(info.value), info.value
        with pytest.raises(ConfigError, match=re.escape(str(f))):
            load(None, {"identity_allocation_mode": "kvstore", "kvstore": "etcd",
                        "kvstore_opt": [f"etcd.config={f}"]})
