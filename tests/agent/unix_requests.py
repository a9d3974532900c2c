"""A `requests` session that sends every request to a unix socket (the agent's API), for
schemathesis, which speaks HTTP through `requests`. The URL's host is ignored."""

from __future__ import annotations

import socket
from typing import Any

import requests
import requests.adapters
import urllib3
import urllib3.connection


class _UnixConnection(urllib3.connection.HTTPConnection):
    def __init__(self, *args: Any, socket_path: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.socket_path = socket_path

    def _new_conn(self) -> socket.socket:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout if isinstance(self.timeout, (int, float)) else None)
        try:
            sock.connect(self.socket_path)
        except OSError:
            sock.close()
            raise
        return sock


class _UnixPool(urllib3.HTTPConnectionPool):
    ConnectionCls = _UnixConnection


class UnixAdapter(requests.adapters.HTTPAdapter):
    """Sends requests to ``socket_path`` over one connection pool."""

    def __init__(self, socket_path: str, timeout: float = 30.0) -> None:
        super().__init__()
        self.pool = _UnixPool("statewright-agent", timeout=timeout, maxsize=4,
                              socket_path=socket_path)

    def get_connection_with_tls_context(self, request: Any, verify: Any, proxies: Any = None,
                                        cert: Any = None) -> Any:
        return self.pool

    def get_connection(self, url: Any, proxies: Any = None) -> Any:
        return self.pool

    def close(self) -> None:
        self.pool.close()
        super().close()


def unix_session(socket_path: str) -> requests.Session:
    """A session whose ``http://agent/...`` requests go to ``socket_path``."""
    session = requests.Session()
    session.trust_env = False  # no proxies from the environment
    session.mount("http://", UnixAdapter(socket_path))
    return session
