"""``statewright nodeport``: the agent's north-south programs, read through its API socket
(``GET /nodeport``): the external devices they are attached to (and how: tcx or clsact),
then the NAT entries (kind, the packet they match, what it is rewritten to, seconds left).

Socket, errors and exit codes as the other agent commands (statewright/cli/common.py).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from statewright.agent.client import AgentRequestError, AgentUnavailable
from statewright.cli.common import (
    EXIT_NO_AGENT,
    add_client_arguments,
    client,
    command_name,
    format_table,
)

NAT_COLUMNS = ["KIND", "PROTO", "SOURCE", "DESTINATION", "TO", "EXPIRES"]


def add_commands(subparsers: Any, commands: dict[str, argparse.ArgumentParser]) -> None:
    """Register ``nodeport`` (statewright/cli/__init__.py: the protocol)."""
    p = subparsers.add_parser("nodeport", help="north-south devices and NAT entries")
    add_client_arguments(p)
    p.set_defaults(func=cmd_nodeport)
    commands["nodeport"] = p


def cmd_nodeport(args: argparse.Namespace) -> int:
    """``statewright nodeport``."""
    try:
        doc = client(args).get("/nodeport")
    except AgentUnavailable as e:
        print(f"{command_name(args)}: {e}", file=sys.stderr)
        return EXIT_NO_AGENT
    except AgentRequestError as e:
        print(f"{command_name(args)}: {e}", file=sys.stderr)
        return 1
    if args.output == "json":
        print(json.dumps(doc, indent=2))
        return 0
    if not doc["enabled"]:
        print(f"north-south programs off: {doc['reason']}")
        return 0
    devices = ", ".join(f"{d['name']} ({d['mode']})" for d in doc["devices"]) or "none"
    print(f"devices: {devices}")
    rows = [[e["kind"], e["protocol"], e["source"], e["destination"], e["to"],
             f"{e['expires_in']}s"] for e in doc["nat"]]
    sys.stdout.write(format_table(NAT_COLUMNS, rows))
    return 0
