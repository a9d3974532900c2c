"""Reading a kubeconfig file into a `sources.k8s_http.Connection`.

The current context's cluster and user are used (``current-context`` must name one).
What is understood, with kubectl's meaning:

* cluster: ``server``, ``certificate-authority`` / ``certificate-authority-data``,
  ``insecure-skip-tls-verify``, ``tls-server-name``, ``proxy-url``;
* user: ``token``, ``tokenFile`` (re-read whenever the file changes), ``client-certificate``
  / ``client-certificate-data`` with ``client-key`` / ``client-key-data``, ``username``
  with ``password`` (basic authentication), and ``exec`` (a credential plugin: run when
  the agent starts and again once the token it returned expires);
* relative file names are taken from the kubeconfig's directory; ``*-data`` fields are
  base64.

A user that authenticates in a way the agent cannot (``auth-provider``, impersonation
with ``as``...) is refused with the field's name, not ignored: the agent would otherwise
talk to the API server as someone else than its operator meant.
"""

from __future__ import annotations

import base64
import binascii
import datetime
import json
import logging
import os
import subprocess
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from sources.k8s_http import Connection, TokenFile
from statedb.errors import InputError

log = logging.getLogger(__name__)

#: User fields that change who the agent is, which it does not implement.
UNSUPPORTED_USER_FIELDS = ("auth-provider", "as", "as-uid", "as-groups", "as-user-extra")
#: The credential plugin API versions understood (client.authentication.k8s.io).
EXEC_API_VERSIONS = ("client.authentication.k8s.io/v1", "client.authentication.k8s.io/v1beta1")
#: Seconds a credential plugin may run.
EXEC_TIMEOUT = 60.0
#: A plugin's token is renewed this many seconds before it expires.
EXEC_EARLY = 10.0


class KubeconfigError(InputError):
    """A kubeconfig the agent cannot use; the message names the file and the field."""


@dataclass(frozen=True, slots=True)
class Kubeconfig:
    """The parts of a kubeconfig the agent uses: its current context's cluster and user."""

    path: str
    context: str
    cluster: Mapping[str, Any]
    user: Mapping[str, Any]


def load(path: str) -> Kubeconfig:
    """Read ``path`` and pick its current context's cluster and user."""
    try:
        doc = yaml.safe_load(Path(path).read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        raise KubeconfigError(f"cannot read it: {e}", obj=path) from None
    if not isinstance(doc, dict):
        raise KubeconfigError("not a kubeconfig (no mapping at the top)", obj=path)
    name = doc.get("current-context")
    if not name:
        raise KubeconfigError("no current context", obj=path, field="current-context")
    ctx = _named(doc, "contexts", str(name), path).get("context")
    if not isinstance(ctx, dict) or not ctx.get("cluster"):
        raise KubeconfigError("names no cluster", obj=path, field=f"contexts[{name}].context")
    cluster = _named(doc, "clusters", str(ctx["cluster"]), path).get("cluster")
    if not isinstance(cluster, dict):
        raise KubeconfigError("not a mapping", obj=path, field=f"clusters[{ctx['cluster']}]")
    user: Any = {}
    if ctx.get("user"):
        user = _named(doc, "users", str(ctx["user"]), path).get("user") or {}
        if not isinstance(user, dict):
            raise KubeconfigError("not a mapping", obj=path, field=f"users[{ctx['user']}]")
    return Kubeconfig(path, str(name), cluster, user)


def _named(doc: Mapping[str, Any], section: str, name: str, path: str) -> Mapping[str, Any]:
    for item in doc.get(section) or []:
        if isinstance(item, dict) and item.get("name") == name:
            return item
    raise KubeconfigError(f"no entry named {name!r}", obj=path, field=section)


def connection(kc: Kubeconfig, server: str = "") -> Connection:
    """The connection ``kc`` describes (``server``, when given, replaces its address)."""
    base = os.path.dirname(os.path.abspath(kc.path))
    c, u = kc.cluster, kc.user
    for bad in UNSUPPORTED_USER_FIELDS:
        if bad in u:
            raise KubeconfigError(
                "not supported by the agent: use a token, tokenFile, client certificate "
                "or exec plugin",
                obj=kc.path,
                field=f"users.{bad}",
            )
    server = server or str(c.get("server") or "")
    if not server:
        raise KubeconfigError("no server address", obj=kc.path, field="clusters.server")
    ca_file, ca_data = _file_or_data(kc, c, "certificate-authority", base)
    cert_file, cert_data = _file_or_data(kc, u, "client-certificate", base)
    key_file, key_data = _file_or_data(kc, u, "client-key", base)
    auth = _authorization(kc, base)
    if auth is None and "exec" in u:
        plugin = ExecPlugin(kc, base)
        if plugin.token_or_none() is not None:
            auth = plugin.authorization
        else:
            cert_data, key_data = plugin.client_certificate()
            cert_file = key_file = ""
    if auth is None:
        auth = _basic(u)
    proxy = c.get("proxy-url")
    try:
        return Connection(
            server=server.rstrip("/"),
            ca_file=ca_file,
            ca_data=ca_data,
            cert_file=cert_file,
            cert_data=cert_data,
            key_file=key_file,
            key_data=key_data,
            insecure=bool(c.get("insecure-skip-tls-verify", False)),
            tls_server_name=str(c.get("tls-server-name") or ""),
            proxy=str(proxy) if proxy else None,
            authorization=auth,
        )
    except ValueError as e:
        raise KubeconfigError(str(e), obj=kc.path) from None


def _file_or_data(
    kc: Kubeconfig, section: Mapping[str, Any], key: str, base: str
) -> tuple[str, bytes]:
    """(file, b"") or ("", decoded data) for ``key`` / ``key-data`` (data wins)."""
    data = section.get(f"{key}-data")
    if data:
        try:
            return "", base64.b64decode(str(data), validate=True)
        except (binascii.Error, ValueError):
            raise KubeconfigError("not base64", obj=kc.path, field=f"{key}-data") from None
    name = section.get(key)
    if not name:
        return "", b""
    path = os.path.normpath(os.path.join(base, str(name)))
    if not os.path.isfile(path):
        raise KubeconfigError(f"no such file {path}", obj=kc.path, field=key)
    return path, b""


def _authorization(kc: Kubeconfig, base: str) -> Callable[[], str] | None:
    """The ``Authorization`` header source of the user's token or token file (None
    without either: an exec plugin, basic authentication or a certificate may follow)."""
    u = kc.user
    if u.get("token"):
        header = f"Bearer {u['token']}"
        return lambda: header
    if u.get("tokenFile"):
        path = os.path.normpath(os.path.join(base, str(u["tokenFile"])))
        return TokenFile(path).authorization
    return None


def _basic(u: Mapping[str, Any]) -> Callable[[], str] | None:
    """Basic authentication's header source (None without ``username``/``password``)."""
    if u.get("username") and u.get("password") is not None:
        pair = f"{u['username']}:{u['password']}".encode()
        header = "Basic " + base64.b64encode(pair).decode()
        return lambda: header
    return None


class ExecPlugin:
    """A credential plugin (the user's ``exec``): runs its command, which prints an
    ExecCredential; its token is used until ``expirationTimestamp`` and then the command
    is run again."""

    def __init__(self, kc: Kubeconfig, base: str) -> None:
        spec = kc.user.get("exec")
        self._where = kc.path
        if not isinstance(spec, dict) or not spec.get("command"):
            raise self._error("needs a command", "command")
        api = str(spec.get("apiVersion") or "")
        if api not in EXEC_API_VERSIONS:
            raise self._error(f"apiVersion {api!r} is not one of {', '.join(EXEC_API_VERSIONS)}",
                              "apiVersion")
        if spec.get("interactiveMode") == "Always":
            raise self._error("the agent runs without a terminal", "interactiveMode")
        command = str(spec["command"])
        if os.sep in command and not os.path.isabs(command):
            command = os.path.normpath(os.path.join(base, command))
        self._argv = [command, *(str(a) for a in spec.get("args") or [])]
        self._env = dict(os.environ)
        for item in spec.get("env") or []:
            if isinstance(item, dict) and "name" in item:
                self._env[str(item["name"])] = str(item.get("value", ""))
        self._env["KUBERNETES_EXEC_INFO"] = json.dumps(
            {"apiVersion": api, "kind": "ExecCredential", "spec": {"interactive": False}}
        )
        self._api = api
        self._lock = threading.Lock()
        self._status: dict[str, Any] = {}
        self._expires: datetime.datetime | None = None

    def _error(self, why: str, field: str) -> KubeconfigError:
        return KubeconfigError(why, obj=self._where, field=f"users.exec.{field}")

    def _run(self) -> None:
        try:
            done = subprocess.run(self._argv, env=self._env, capture_output=True, text=True,
                                  timeout=EXEC_TIMEOUT, check=False, stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise self._error(f"cannot run {self._argv[0]}: {e}", "command") from None
        if done.returncode != 0:
            tail = (done.stderr.strip().splitlines() or [""])[-1]
            raise self._error(f"{self._argv[0]} exited with {done.returncode}: {tail}",
                              "command")
        try:
            cred = json.loads(done.stdout)
        except ValueError:
            raise self._error(f"{self._argv[0]} printed no ExecCredential", "command") from None
        status = cred.get("status") if isinstance(cred, dict) else None
        if not isinstance(status, dict) or cred.get("apiVersion") != self._api:
            raise self._error(f"{self._argv[0]} printed no {self._api} ExecCredential status",
                              "command")
        if not status.get("token") and not (
            status.get("clientCertificateData") and status.get("clientKeyData")
        ):
            raise self._error("the credential has neither a token nor a certificate and key",
                              "command")
        self._status = status
        self._expires = _timestamp(status.get("expirationTimestamp"))

    def _fresh(self) -> dict[str, Any]:
        with self._lock:
            now = datetime.datetime.now(datetime.UTC)
            early = datetime.timedelta(seconds=EXEC_EARLY)
            if not self._status or (self._expires is not None and now + early >= self._expires):
                self._run()
            return self._status

    def token_or_none(self) -> str | None:
        """The plugin's token, None when it gives a client certificate instead."""
        token = self._fresh().get("token")
        return str(token) if token else None

    def authorization(self) -> str:
        """The ``Authorization`` header, the plugin run again once its token expired
        (a failed run keeps the last token: the request then fails with 401, reported)."""
        try:
            return f"Bearer {self._fresh().get('token', '')}"
        except KubeconfigError as e:
            log.warning("k8s: renewing the exec plugin's token: %s", e)
            return f"Bearer {self._status.get('token', '')}"

    def client_certificate(self) -> tuple[bytes, bytes]:
        """The plugin's (certificate, key) PEM."""
        status = self._fresh()
        return (str(status.get("clientCertificateData", "")).encode(),
                str(status.get("clientKeyData", "")).encode())


def _timestamp(value: Any) -> datetime.datetime | None:
    if not value:
        return None
    try:
        ts = datetime.datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        return None
    return ts if ts.tzinfo is not None else ts.replace(tzinfo=datetime.UTC)
