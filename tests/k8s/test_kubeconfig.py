"""The kubeconfig shapes the agent understands (sources/k8s_kubeconfig.py), each used for
real against the fake API server, and the clear errors for the ones it does not."""

from __future__ import annotations

import base64
import datetime
import json
import os
import select
import socket
import stat
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import urllib3

from sources.k8s_client import ClientSettings, K8sClient, K8sConfigError, resource_path
from sources.k8s_http import describe_error
from sources.k8s_kubeconfig import KubeconfigError, connection, load

from .fake_apiserver import FakeAPIServer

NAMESPACES = resource_path("v1", "namespaces")


def _write(path: Path, cluster: dict[str, Any], user: dict[str, Any] | None = None) -> str:
    doc: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": cluster}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        "users": [{"name": "u", "user": user or {}}],
        "current-context": "x",
    }
    path.write_text(json.dumps(doc))
    return str(path)


def _ca_data(srv: FakeAPIServer) -> str:
    return base64.b64encode(srv.ca_pem).decode()


def _get(kubeconfig: str, times: int = 1) -> None:
    """``times`` requests through a client built from ``kubeconfig``."""
    c = K8sClient(ClientSettings(kubeconfig=kubeconfig))
    try:
        for _ in range(times):
            c.get(NAMESPACES, timeout=(5, 10))
    finally:
        c.close()


def _failure(kubeconfig: str, error: type[BaseException] = Exception) -> str:
    """How a request through a client built from ``kubeconfig`` fails (``error``), as
    the agent's health says it."""
    with pytest.raises(error) as e:
        _get(kubeconfig)
    return describe_error(e.value)


@pytest.fixture
def cert_server() -> Iterator[FakeAPIServer]:
    """A fake API server that takes client certificates signed by its CA."""
    with FakeAPIServer(client_certs=True) as srv:
        yield srv


def test_client_certificate_as_data(cert_server: FakeAPIServer, tmp_path: Path) -> None:
    leaf = cert_server.ca.issue_cert("statewright-agent")
    user = {
        "client-certificate-data": base64.b64encode(leaf.cert_chain_pems[0].bytes()).decode(),
        "client-key-data": base64.b64encode(leaf.private_key_pem.bytes()).decode(),
    }
    kc = _write(tmp_path / "kc", {"server": cert_server.url,
                                  "certificate-authority-data": _ca_data(cert_server)}, user)
    _get(kc)
    (rec,) = cert_server.requests
    assert rec.client_cert and rec.token == "" and rec.status == 200
    assert not list(tmp_path.glob("statewright-k8s-*"))  # nothing left of the PEM data


def test_client_certificate_and_ca_as_relative_files(
    cert_server: FakeAPIServer, tmp_path: Path
) -> None:
    leaf = cert_server.ca.issue_cert("statewright-agent")
    (tmp_path / "pki").mkdir()
    leaf.cert_chain_pems[0].write_to_path(str(tmp_path / "pki" / "agent.crt"))
    leaf.private_key_pem.write_to_path(str(tmp_path / "pki" / "agent.key"))
    (tmp_path / "pki" / "ca.crt").write_bytes(cert_server.ca_pem)
    kc = _write(
        tmp_path / "kc",
        {"server": cert_server.url, "certificate-authority": "pki/ca.crt"},
        {"client-certificate": "pki/agent.crt", "client-key": "pki/agent.key"},
    )
    _get(kc)
    assert [r.client_cert for r in cert_server.requests] == [True]


def test_without_a_client_certificate_the_server_refuses(
    cert_server: FakeAPIServer, tmp_path: Path
) -> None:
    kc = _write(tmp_path / "kc", {"server": cert_server.url,
                                  "certificate-authority-data": _ca_data(cert_server)})
    assert _failure(kc) == "HTTP 401 Unauthorized: Unauthorized"


@pytest.mark.filterwarnings("ignore::urllib3.exceptions.InsecureRequestWarning")
def test_insecure_skip_tls_verify(apiserver: FakeAPIServer, tmp_path: Path) -> None:
    user = {"token": apiserver.token}
    kc = _write(tmp_path / "kc", {"server": apiserver.url}, user)  # no CA: the system's
    assert "CERTIFICATE_VERIFY_FAILED" in _failure(kc, urllib3.exceptions.MaxRetryError)
    _get(_write(tmp_path / "kc2", {"server": apiserver.url, "insecure-skip-tls-verify": True},
                user))
    assert [r.status for r in apiserver.requests] == [200]


def test_tls_server_name(apiserver: FakeAPIServer, tmp_path: Path) -> None:
    """The certificate is checked for ``tls-server-name``, not the URL's host."""
    cluster = {"server": apiserver.url, "certificate-authority-data": _ca_data(apiserver)}
    user = {"token": apiserver.token}
    _get(_write(tmp_path / "ok", {**cluster, "tls-server-name": "localhost"}, user))
    bad = _write(tmp_path / "bad", {**cluster, "tls-server-name": "other.example"}, user)
    assert "other.example" in _failure(bad, urllib3.exceptions.MaxRetryError)


class _ConnectProxy:
    """A minimal HTTP CONNECT proxy on loopback that counts the tunnels it opened."""

    def __init__(self) -> None:
        self._sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        self.tunnels: list[str] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._accept, daemon=True)]
        self._threads[0].start()

    def _accept(self) -> None:
        self._sock.settimeout(0.1)
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            t = threading.Thread(target=self._tunnel, args=(conn,), daemon=True)
            self._threads.append(t)
            t.start()

    def _tunnel(self, conn: socket.socket) -> None:
        with conn:
            head = b""
            while b"\r\n\r\n" not in head:
                more = conn.recv(4096)
                if not more:
                    return
                head += more
            method, target, _ = head.split(b"\r\n", 1)[0].decode().split(" ", 2)
            assert method == "CONNECT"
            host, port = target.rsplit(":", 1)
            self.tunnels.append(target)
            with socket.create_connection((host, int(port))) as up:
                conn.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
                socks = [conn, up]
                while not self._stop.is_set():
                    ready, _, _ = select.select(socks, [], [], 0.1)
                    for s in ready:
                        data = s.recv(65536)
                        if not data:
                            return
                        (up if s is conn else conn).sendall(data)

    def close(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(5)
        self._sock.close()


def test_proxy_url(apiserver: FakeAPIServer, tmp_path: Path) -> None:
    proxy = _ConnectProxy()
    try:
        _get(_write(tmp_path / "kc", {"server": apiserver.url, "proxy-url": proxy.url,
                                      "certificate-authority-data": _ca_data(apiserver)},
                    {"token": apiserver.token}))
    finally:
        proxy.close()
    assert proxy.tunnels == [f"127.0.0.1:{apiserver.port}"]
    assert [r.status for r in apiserver.requests] == [200]


def test_username_and_password_are_basic_auth(tmp_path: Path) -> None:
    kc = _write(tmp_path / "kc", {"server": "https://10.0.0.1:6443"},
                {"username": "admin", "password": "s3cret"})
    conn = connection(load(kc))
    assert conn.authorization is not None
    assert conn.authorization() == "Basic " + base64.b64encode(b"admin:s3cret").decode()


def _plugin(tmp_path: Path, status: dict[str, Any], api: str = "client.authentication.k8s.io/v1",
            exit_code: int = 0) -> Path:
    """An exec credential plugin printing ``status`` and counting its runs in ``runs``."""
    script = tmp_path / "plugin.py"
    script.write_text(
        "import json, os, sys\n"
        f"open({str(tmp_path / 'runs')!r}, 'a').write(os.environ['KUBERNETES_EXEC_INFO'] + "
        "'\\n')\n"
        f"print(json.dumps({{'apiVersion': {api!r}, 'kind': 'ExecCredential', "
        f"'status': {status!r}}}))\n"
        f"print('plugin says no', file=sys.stderr)\n"
        f"sys.exit({exit_code})\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


def _exec_user(script: Path, **extra: Any) -> dict[str, Any]:
    return {"exec": {"apiVersion": "client.authentication.k8s.io/v1", "command": sys.executable,
                     "args": [str(script)], "env": [{"name": "X", "value": "1"}],
                     "interactiveMode": "Never", **extra}}


def test_exec_plugin_token_is_renewed_when_it_expires(
    apiserver: FakeAPIServer, tmp_path: Path
) -> None:
    gone = (datetime.datetime.now(datetime.UTC) - datetime.timedelta(minutes=1)).isoformat()
    script = _plugin(tmp_path, {"token": apiserver.token, "expirationTimestamp": gone})
    kc = _write(tmp_path / "kc", {"server": apiserver.url,
                                  "certificate-authority-data": _ca_data(apiserver)},
                _exec_user(script))
    _get(kc, times=2)
    runs = (tmp_path / "runs").read_text().splitlines()
    assert len(runs) >= 3  # at the start, then before each request (expired each time)
    assert json.loads(runs[0])["spec"] == {"interactive": False}
    assert [r.token for r in apiserver.requests] == [apiserver.token] * 2

    later = (datetime.datetime.now(datetime.UTC) + datetime.timedelta(hours=1)).isoformat()
    (tmp_path / "runs").unlink()
    script = _plugin(tmp_path, {"token": apiserver.token, "expirationTimestamp": later})
    _get(kc)
    assert len((tmp_path / "runs").read_text().splitlines()) == 1


def test_exec_plugin_client_certificate(cert_server: FakeAPIServer, tmp_path: Path) -> None:
    leaf = cert_server.ca.issue_cert("statewright-agent")
    script = _plugin(tmp_path, {"clientCertificateData": leaf.cert_chain_pems[0].bytes().decode(),
                                "clientKeyData": leaf.private_key_pem.bytes().decode()})
    _get(_write(tmp_path / "kc", {"server": cert_server.url,
                                  "certificate-authority-data": _ca_data(cert_server)},
                _exec_user(script)))
    assert [r.client_cert for r in cert_server.requests] == [True]


@pytest.mark.parametrize(
    ("user", "field"),
    [
        ({"auth-provider": {"name": "oidc", "config": {}}}, "users.auth-provider"),
        ({"token": "t", "as": "admin"}, "users.as"),
        ({"exec": {"command": "x"}}, "users.exec.apiVersion"),
        ({"exec": {"apiVersion": "client.authentication.k8s.io/v1"}}, "users.exec.command"),
        ({"exec": {"apiVersion": "client.authentication.k8s.io/v1", "command": "x",
                   "interactiveMode": "Always"}}, "users.exec.interactiveMode"),
        ({"exec": {"apiVersion": "client.authentication.k8s.io/v1",
                   "command": "/nonexistent/plugin"}}, "users.exec.command"),
        ({"client-certificate-data": "bm90IGEgY2VydA=="}, "a client certificate needs its key"),
        ({"client-key-data": "!!!"}, "client-key-data"),
        ({"client-certificate": "missing.crt", "client-key": "missing.key"},
         "client-certificate"),
    ],
)
def test_unsupported_or_broken_users_name_the_field(
    tmp_path: Path, user: dict[str, Any], field: str
) -> None:
    kc = _write(tmp_path / "kc", {"server": "https://10.0.0.1:6443"}, user)
    with pytest.raises(K8sConfigError, match="k8s-kubeconfig") as e:
        K8sClient(ClientSettings(kubeconfig=kc))
    assert field in str(e.value) and kc in str(e.value)


def test_exec_plugin_failures_say_why(tmp_path: Path) -> None:
    kc = _write(tmp_path / "kc", {"server": "https://10.0.0.1:6443"},
                _exec_user(_plugin(tmp_path, {"token": "t"}, exit_code=3)))
    with pytest.raises(K8sConfigError, match="exited with 3: plugin says no"):
        K8sClient(ClientSettings(kubeconfig=kc))
    kc = _write(tmp_path / "kc", {"server": "https://10.0.0.1:6443"},
                _exec_user(_plugin(tmp_path, {"token": "t"}, api="v0")))
    with pytest.raises(K8sConfigError, match=r"printed no client\.authentication\.k8s\.io/v1"):
        K8sClient(ClientSettings(kubeconfig=kc))
    kc = _write(tmp_path / "kc", {"server": "https://10.0.0.1:6443"},
                _exec_user(_plugin(tmp_path, {})))
    with pytest.raises(K8sConfigError, match="neither a token nor a certificate"):
        K8sClient(ClientSettings(kubeconfig=kc))


@pytest.mark.parametrize(
    ("doc", "why"),
    [
        ("", "no mapping at the top"),
        ("[1, 2]", "no mapping at the top"),
        ("clusters: []\n", "current-context"),
        ("current-context: x\ncontexts: []\n", "contexts: no entry named 'x'"),
        ("current-context: x\ncontexts: [{name: x, context: {cluster: c}}]\n",
         "clusters: no entry named 'c'"),
        ("current-context: x\ncontexts: [{name: x, context: {cluster: c}}]\n"
         "clusters: [{name: c, cluster: {}}]\n", "clusters.server: no server address"),
        ("current-context: x\ncontexts: [{name: x, context: {cluster: c}}]\n"
         "clusters: [{name: c, cluster: {server: 'ftp://h'}}]\n", "not an http(s) URL"),
        ("current-context: x\ncontexts: [{name: x, context: {cluster: c}}]\n"
         "clusters: [{name: c, cluster: {server: 'https://h', certificate-authority-data: "
         "'%%%'}}]\n", "certificate-authority-data: not base64"),
        ("{unclosed", "cannot read it"),
    ],
)
def test_broken_kubeconfigs_say_what_is_wrong(tmp_path: Path, doc: str, why: str) -> None:
    path = tmp_path / "kc"
    path.write_text(doc)
    with pytest.raises(K8sConfigError) as e:
        K8sClient(ClientSettings(kubeconfig=str(path)))
    assert why in str(e.value) and str(path) in str(e.value)


def test_a_ca_that_is_not_a_certificate(tmp_path: Path) -> None:
    kc = _write(tmp_path / "kc", {"server": "https://10.0.0.1:6443",
                                  "certificate-authority-data":
                                  base64.b64encode(b"not a pem").decode()})
    with pytest.raises(K8sConfigError, match="cannot use the TLS certificates"):
        K8sClient(ClientSettings(kubeconfig=kc))


def test_kubeconfig_errors_are_input_errors(tmp_path: Path) -> None:
    with pytest.raises(KubeconfigError) as e:
        load(str(tmp_path / "none"))
    assert isinstance(e.value, ValueError) and "cannot read it" in str(e.value)
    assert not os.path.exists(tmp_path / "none")
