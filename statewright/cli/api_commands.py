"""``statewright api openapi``: the OpenAPI document of the agent's API, as the running
agent serves it (``GET /openapi.json`` on its socket) or, with ``--offline``, generated
from the agent's component list without an agent (statewright/agent/openapi.py).

The socket is ``--socket``, else ``$STATEWRIGHT_SOCKET``, else /run/statewright/agent.sock.
When no agent answers, the command says so and exits 2 (no traceback).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from statewright.agent import config as agent_config
from statewright.agent.client import AgentRequestError, AgentUnavailable
from statewright.cli.common import add_socket_argument, client


def add_commands(subparsers: Any, commands: dict[str, argparse.ArgumentParser]) -> None:
    """Register ``api openapi`` (as statewright/cli/__init__.py describes)."""
    api = subparsers.add_parser("api", help="the agent's HTTP API")
    sub = api.add_subparsers(dest="api_command", required=True)
    doc = sub.add_parser("openapi", help="print the API's OpenAPI document (JSON)")
    add_socket_argument(doc)
    doc.add_argument("--offline", action="store_true",
                     help="generate it from the agent's components instead of asking the "
                          "running agent")
    doc.set_defaults(func=cmd_openapi)
    commands["api openapi"] = doc


def offline_document() -> dict[str, Any]:
    """The document of an agent with the default configuration, without starting one."""
    from statewright.agent import openapi
    from statewright.agent.components.api import API_INFO
    from statewright.agent.runtime import agent_components
    from statewright.component import Hive

    routes = Hive(agent_components(agent_config.AgentConfig())).routes()
    return openapi.document(routes, API_INFO)


def cmd_openapi(args: argparse.Namespace) -> int:
    """Print the document."""
    if args.offline:
        doc = offline_document()
    else:
        try:
            doc = client(args).get("/openapi.json")
        except AgentUnavailable as e:
            print(f"statewright: {e}", file=sys.stderr)
            return 2
        except AgentRequestError as e:
            print(f"statewright: {e}", file=sys.stderr)
            return 1
    print(json.dumps(doc, indent=2))
    return 0
