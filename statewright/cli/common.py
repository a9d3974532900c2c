"""What the command modules share: the agent's socket, the API client, errors, tables.

* `add_socket_argument` adds ``--socket`` (`add_client_arguments` also ``-o``); `client`
  connects to it, else to ``$STATEWRIGHT_SOCKET``, else to the default path (both from
  statewright/agent/config.py).
* `agent_get` asks the agent and turns its failures into the client commands' exit codes:
  `EXIT_NO_AGENT` (2) when no agent answers, 1 when the agent refuses, with a message
  naming the command and no traceback.
* `format_table` is every command's table: left-aligned columns, trailing blanks cut.
* `flat` renders a decoded map key or value (nested dicts) in one cell.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from statewright.agent import config as agent_config
from statewright.agent.client import AgentClient, AgentRequestError, AgentUnavailable

#: Exit code of a client command when no agent answers on the socket.
EXIT_NO_AGENT = 2


def add_socket_argument(p: argparse.ArgumentParser, help_text: str | None = None) -> None:
    """Add ``--socket`` (default: None, meaning `client`'s environment-or-default rule)."""
    p.add_argument(
        "--socket",
        default=None,
        help=help_text
        or f"agent API socket (default ${agent_config.SOCKET_ENV} or "
        f"{agent_config.DEFAULT_SOCKET})",
    )


def add_client_arguments(
    p: argparse.ArgumentParser,
    formats: tuple[str, ...] | None = ("table", "json"),
    default: str = "table",
) -> None:
    """``--socket`` and, unless ``formats`` is None, ``-o/--output`` among ``formats``."""
    add_socket_argument(p)
    if formats:
        p.add_argument("-o", "--output", choices=formats, default=default)


def client(args: argparse.Namespace) -> AgentClient:
    """A client of the agent at ``--socket``, ``$STATEWRIGHT_SOCKET`` or the default path."""
    return AgentClient(getattr(args, "socket", None) or agent_config.default_socket())


def command_name(args: argparse.Namespace) -> str:
    """``statewright endpoint get`` etc., from the command's function, for messages."""
    func = getattr(args, "func", None)
    name = getattr(func, "__name__", "").removeprefix("cmd_").replace("_", " ")
    return f"statewright {name}".rstrip()


def agent_get(args: argparse.Namespace, path: str) -> Any:
    """The agent's answer to ``GET path``, or SystemExit with a message naming the command
    (`EXIT_NO_AGENT`: no agent; 1: the agent refused)."""
    try:
        return client(args).get(path)
    except AgentUnavailable as e:
        print(f"{command_name(args)}: {e}", file=sys.stderr)
        raise SystemExit(EXIT_NO_AGENT) from None
    except AgentRequestError as e:
        print(f"{command_name(args)}: {e}", file=sys.stderr)
        raise SystemExit(1) from None


def format_table(header: Sequence[str], rows: Sequence[Sequence[Any]], gap: int = 2) -> str:
    """Left-aligned columns ``gap`` blanks apart, each line's trailing blanks cut."""
    cells = [[str(c) for c in header], *[[str(c) for c in row] for row in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    sep = " " * gap
    return "".join(sep.join(c.ljust(w) for c, w in zip(r, widths)).rstrip() + "\n" for r in cells)


def flat(value: Any) -> str:
    """A decoded map key or value in one cell: ``k=v`` pairs, nested; lists by length."""
    if isinstance(value, dict):
        return " ".join(f"{k}={flat(v)}" for k, v in value.items())
    if isinstance(value, list):
        return f"[{len(value)} values]"
    return str(value)
