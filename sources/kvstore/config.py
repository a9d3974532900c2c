"""The etcd client configuration: Cilium's ``--kvstore-opt etcd.config=FILE``.

The file is the etcd client YAML Cilium reads::

    endpoints:
    - https://10.0.0.1:2379
    - https://10.0.0.2:2379
    trusted-ca-file: /var/lib/etcd-secrets/etcd-client-ca.crt
    cert-file: /var/lib/etcd-secrets/etcd-client.crt
    key-file: /var/lib/etcd-secrets/etcd-client.key
    username: cilium          # optional, with password: etcd's auth (a token per connection)
    password: secret

Every error names the file and the field (`KVStoreConfigError`, an input error); the
TLS files are read when the file is loaded, so a missing, unreadable or mismatched
certificate or key stops the agent at start rather than at its first request.
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from statedb.errors import InputError


class KVStoreConfigError(InputError):
    """A kvstore option or etcd config file that cannot be used."""


@dataclass(frozen=True)
class EtcdConfig:
    """Where etcd is and how to talk to it."""

    endpoints: tuple[str, ...]
    trusted_ca_file: str = ""
    cert_file: str = ""
    key_file: str = ""
    username: str = ""
    password: str = ""
    #: Seconds one request may take before the next endpoint is tried.
    request_timeout: float = 5.0
    #: Seconds a new connection (TCP and the TLS handshake) may take before the next
    #: endpoint is tried (at most `request_timeout`): short, so an endpoint that does not
    #: answer at all is left quickly.
    connect_timeout: float = 2.0
    #: Where the configuration came from (the file), for errors.
    source: str = field(default="etcd config", compare=False)

    @property
    def tls(self) -> bool:
        return any(urlsplit(e).scheme == "https" for e in self.endpoints)

    def ssl_context(self) -> ssl.SSLContext:
        """The TLS client context: ``trusted-ca-file`` (else the system's CAs) and the
        client certificate; `KVStoreConfigError` naming the field and file when one
        cannot be read or the key does not match the certificate."""
        try:
            ctx = ssl.create_default_context(cafile=self.trusted_ca_file or None)
        except (OSError, ssl.SSLError) as e:
            raise KVStoreConfigError(f"{self.trusted_ca_file}: {_reason(e)}", obj=self.source,
                                     field="trusted-ca-file") from None
        if self.cert_file:
            for name, path in (("cert-file", self.cert_file), ("key-file", self.key_file)):
                try:
                    Path(path).read_bytes()
                except OSError as e:
                    raise KVStoreConfigError(f"{path}: {_reason(e)}", obj=self.source,
                                             field=name) from None
            try:
                ctx.load_cert_chain(self.cert_file, self.key_file)
            except (OSError, ssl.SSLError) as e:
                raise KVStoreConfigError(
                    f"{self.cert_file} with {self.key_file}: {_reason(e)}", obj=self.source,
                    field="cert-file") from None
        return ctx


def _reason(e: BaseException) -> str:
    if isinstance(e, ssl.SSLError):
        return f"not a usable certificate or key ({e.reason or e})"
    if isinstance(e, OSError) and e.strerror:
        return e.strerror
    return str(e)


_FIELDS = {"endpoints", "trusted-ca-file", "cert-file", "key-file", "username", "password",
           "ca-file"}


def parse_etcd_config(raw: Any, source: str = "etcd config") -> EtcdConfig:
    """The `EtcdConfig` of a parsed YAML document (``source`` names it in errors)."""
    if not isinstance(raw, Mapping):
        raise KVStoreConfigError("must be a mapping", obj=source)
    unknown = sorted(set(map(str, raw)) - _FIELDS)
    if unknown:
        raise KVStoreConfigError(f"unknown field(s) {', '.join(unknown)}", obj=source)
    eps = raw.get("endpoints")
    if isinstance(eps, str):
        eps = [eps]
    if not isinstance(eps, list) or not eps or not all(isinstance(e, str) for e in eps):
        raise KVStoreConfigError("must be a non-empty list of URLs", obj=source,
                                 field="endpoints")
    for e in eps:
        parts = urlsplit(e)
        if parts.scheme not in ("http", "https") or not parts.hostname or parts.port is None:
            raise KVStoreConfigError(f"{e!r} is not http(s)://host:port", obj=source,
                                     field="endpoints")
    values: dict[str, str] = {}
    for key in ("trusted-ca-file", "ca-file", "cert-file", "key-file", "username", "password"):
        v = raw.get(key, "")
        if not isinstance(v, str):
            raise KVStoreConfigError("must be a string", obj=source, field=key)
        values[key] = v
    if bool(values["cert-file"]) != bool(values["key-file"]):
        raise KVStoreConfigError("cert-file and key-file go together", obj=source)
    if bool(values["username"]) != bool(values["password"]):
        raise KVStoreConfigError("username and password go together", obj=source)
    config = EtcdConfig(
        endpoints=tuple(e.rstrip("/") for e in eps),
        trusted_ca_file=values["trusted-ca-file"] or values["ca-file"],
        cert_file=values["cert-file"],
        key_file=values["key-file"],
        username=values["username"],
        password=values["password"],
        source=source,
    )
    if config.tls or config.cert_file or config.trusted_ca_file:
        config.ssl_context()  # the files are read now: errors at start, not at first use
    return config


def load_etcd_config(path: str | Path) -> EtcdConfig:
    """Read and check the etcd config file ``path``."""
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise KVStoreConfigError(f"cannot read: {e.strerror or e}", obj=str(path)) from None
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise KVStoreConfigError(f"not YAML: {e}", obj=str(path)) from None
    return parse_etcd_config(raw, str(path))


def parse_kvstore_opts(opts: Mapping[str, str]) -> EtcdConfig:
    """The etcd config of ``--kvstore-opt`` pairs (``etcd.config=FILE``)."""
    unknown = sorted(set(opts) - {"etcd.config"})
    if unknown:
        raise KVStoreConfigError(f"unknown option(s) {', '.join(unknown)} (known: etcd.config)",
                                 obj="flag --kvstore-opt")
    path = opts.get("etcd.config")
    if not path:
        raise KVStoreConfigError("etcd.config=FILE is required with --kvstore etcd",
                                 obj="flag --kvstore-opt")
    return load_etcd_config(path)
