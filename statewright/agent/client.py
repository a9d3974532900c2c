"""A client of the agent's API (statewright/agent/api.py) over its unix socket, standard
library only, so the CLI commands stay small and work in any process."""

from __future__ import annotations

import http.client
import json
import socket
from collections.abc import Iterator
from typing import Any

from statedb.errors import StatewrightError


class AgentUnavailable(StatewrightError, ConnectionError):
    """No agent answers on the socket; the message says where it looked and what to do."""


class AgentRequestError(StatewrightError, RuntimeError):
    """The agent answered with an error status; the message is the agent's."""


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("statewright-agent", timeout=timeout)
        self.path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self.path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


class AgentClient:
    """GET (and DELETE) requests to the agent listening on ``socket_path``."""

    def __init__(self, socket_path: str, timeout: float = 10.0) -> None:
        self.socket_path = socket_path
        self.timeout = timeout

    def _open(self, path: str, timeout: float | None, method: str = "GET") -> tuple[Any, Any]:
        conn = _UnixConnection(self.socket_path, self.timeout if timeout is None else timeout)
        try:
            conn.request(method, path)
            resp = conn.getresponse()
        except (FileNotFoundError, ConnectionRefusedError) as e:
            conn.close()
            raise AgentUnavailable(
                f"no agent is running (nothing answers on {self.socket_path}: "
                f"{e.strerror or e}); start one with `statewright agent` or `make run`, "
                "or point --socket / $STATEWRIGHT_SOCKET at its socket"
            ) from None
        except PermissionError as e:
            conn.close()
            raise AgentUnavailable(
                f"cannot open the agent socket {self.socket_path}: {e.strerror} "
                "(it is mode 0660: run as root or as a member of its group)"
            ) from None
        except TimeoutError:
            conn.close()
            raise AgentUnavailable(
                f"the agent on {self.socket_path} did not answer {path} within "
                f"{conn.timeout:g} s (busy or hung?)"
            ) from None
        except (OSError, http.client.HTTPException) as e:
            conn.close()
            raise AgentUnavailable(f"agent socket {self.socket_path}: {e or type(e).__name__}"
                                   ) from None
        if resp.status != 200:
            body = resp.read().decode(errors="replace")
            conn.close()
            try:
                doc = json.loads(body)
            except ValueError:
                doc = None
            msg = str(doc.get("error", body)) if isinstance(doc, dict) else body
            raise AgentRequestError(f"{path}: {msg.strip()}")
        return conn, resp

    def get(self, path: str) -> Any:
        """The decoded JSON answer of ``path``."""
        return _decode(path, self._read(path))

    def delete(self, path: str) -> Any:
        """The decoded JSON answer of ``DELETE path``."""
        return _decode(path, self._read(path, "DELETE"))

    def get_text(self, path: str) -> str:
        """The text answer of ``path``."""
        return self._read(path).decode(errors="replace")

    def _read(self, path: str, method: str = "GET") -> bytes:
        conn, resp = self._open(path, None, method)
        try:
            return bytes(resp.read())
        except TimeoutError:
            raise AgentUnavailable(
                f"the agent on {self.socket_path} stopped answering {path} within "
                f"{self.timeout:g} s (busy or hung?)"
            ) from None
        except (OSError, http.client.HTTPException) as e:
            raise AgentUnavailable(
                f"the connection to the agent on {self.socket_path} broke while reading "
                f"{path}: {e or type(e).__name__}"
            ) from None
        finally:
            conn.close()

    def stream(self, path: str) -> Iterator[Any]:
        """The documents of a newline-delimited JSON feed, as they arrive (no timeout). It
        ends when the agent ends the response (for a followed feed: the agent stopped)."""
        conn, resp = self._open(path, None)
        if conn.sock is not None:
            conn.sock.settimeout(None)
        try:
            while True:
                try:
                    line = resp.readline()
                except (OSError, http.client.HTTPException) as e:
                    raise AgentUnavailable(
                        f"the connection to the agent on {self.socket_path} broke while "
                        f"reading {path}: {e or type(e).__name__}"
                    ) from None
                if not line:
                    return
                if line.strip():
                    yield _decode(path, line)
        finally:
            conn.close()


def _decode(path: str, data: bytes) -> Any:
    """JSON ``data`` answered for ``path``; AgentRequestError when it is not JSON."""
    try:
        return json.loads(data)
    except ValueError as e:
        raise AgentRequestError(f"{path}: the agent's answer is not JSON ({e}): "
                                f"{data[:80]!r}") from None
