"""``statewright ct list|flush|stats``: the agent's connection tracking, read through its API
socket (``GET /ct``, ``DELETE /ct``, ``GET /ct/stats``).

* ``ct list [--limit N]``: every tracked flow: protocol, source and destination as its
  first packet carried them, direction seen from the endpoint, seconds left, counters;
* ``ct flush``: remove every entry (established flows are then new flows to policy);
* ``ct stats``: garbage-collection figures and the tc programs' drop counters by reason.

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

LIST_COLUMNS = ["PROTO", "SOURCE", "DESTINATION", "DIRECTION", "EXPIRES", "PACKETS", "BYTES",
                "FLAGS"]


def add_commands(subparsers: Any, commands: dict[str, argparse.ArgumentParser]) -> None:
    """Register the ``ct`` command group (statewright/cli/__init__.py: the protocol)."""
    grp = subparsers.add_parser("ct", help="the agent's connection tracking")
    sub = grp.add_subparsers(dest="ct_command", required=True)
    ls = sub.add_parser("list", help="the tracked flows")
    ls.add_argument("--limit", type=int, default=0, help="at most N entries (0: all)")
    add_client_arguments(ls)
    ls.set_defaults(func=cmd_ct_list)
    commands["ct list"] = ls
    fl = sub.add_parser("flush", help="remove every tracked flow")
    add_client_arguments(fl)
    fl.set_defaults(func=cmd_ct_flush)
    commands["ct flush"] = fl
    st = sub.add_parser("stats", help="garbage collection and drop counters")
    add_client_arguments(st)
    st.set_defaults(func=cmd_ct_stats)
    commands["ct stats"] = st


def _call(args: argparse.Namespace, method: str, path: str) -> tuple[int, Any]:
    """(0, the agent's answer), or (`EXIT_NO_AGENT`: no agent / 1: the agent refused, None) with the
    message printed, as the other agent commands."""
    agent = client(args)
    try:
        return 0, agent.delete(path) if method == "DELETE" else agent.get(path)
    except AgentUnavailable as e:
        print(f"{command_name(args)}: {e}", file=sys.stderr)
        return EXIT_NO_AGENT, None
    except AgentRequestError as e:
        print(f"{command_name(args)}: {e}", file=sys.stderr)
        return 1, None


def cmd_ct_list(args: argparse.Namespace) -> int:
    """``statewright ct list``."""
    if args.limit < 0:
        print(f"{command_name(args)}: --limit must be >= 0, got {args.limit}", file=sys.stderr)
        return 2
    code, doc = _call(args, "GET", f"/ct?limit={args.limit}")
    if code:
        return code
    if args.output == "json":
        print(json.dumps(doc, indent=2))
        return 0
    rows = [[e["protocol"], e["source"], e["destination"], e["direction"],
             f"{e['expires_in']}s", str(e["packets"]), str(e["bytes"]),
             ",".join(e["flags"]) or "-"] for e in doc["entries"]]
    sys.stdout.write(format_table(LIST_COLUMNS, rows))
    return 0


def cmd_ct_flush(args: argparse.Namespace) -> int:
    """``statewright ct flush``."""
    code, doc = _call(args, "DELETE", "/ct")
    if code:
        return code
    if args.output == "json":
        print(json.dumps(doc, indent=2))
    else:
        print(f"flushed {doc['removed']} entries")
    return 0


def cmd_ct_stats(args: argparse.Namespace) -> int:
    """``statewright ct stats``."""
    code, doc = _call(args, "GET", "/ct/stats")
    if code:
        return code
    if args.output == "json":
        print(json.dumps(doc, indent=2))
        return 0
    gc = doc["gc"]
    entries = ", ".join(f"{k} {v}" for k, v in sorted(gc["entries"].items())) or "not counted yet"
    print(f"GC: {gc['gc_runs']} runs, {gc['removed_total']} entries removed, "
          f"last {gc['last_duration_s']}s; entries: {entries}")
    rows = [[str(d["reason"]), d["description"], d["direction"], str(d["packets"]),
             str(d["bytes"])] for d in doc["drops"]]
    sys.stdout.write(format_table(["REASON", "DESCRIPTION", "DIRECTION", "PACKETS", "BYTES"],
                                  rows))
    return 0
