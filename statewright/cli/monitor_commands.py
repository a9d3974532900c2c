"""``statewright monitor``: the datapath's flows (drops, policy verdicts of new flows,
service translations) from the running agent (``GET /monitor``), as they happen.

The agent sends the flows it kept (the last 1,000) first, then live ones, until
interrupted (exit 0) or until the agent ends the stream (exit 1). Filters, each
repeatable: ``--pod NAME|NS/NAME``, ``--namespace NS``, ``--identity N`` (either side of
the flow), ``--verdict FORWARDED|DROPPED|TRANSLATED``, ``--type drop|policy|trace``.
Human lines by default; ``-o json`` prints one Hubble-style document per line
(``{"flow": {...}, "node_name": ..., "time": ...}``, the flow with Hubble's field names).
``--no-follow`` prints the kept flows and exits; ``monitor stats`` prints the counters.
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.parse
from typing import Any

from statewright.agent.client import AgentRequestError, AgentUnavailable
from statewright.cli.common import EXIT_NO_AGENT, add_client_arguments, client
from statewright.observe.flows import flow_line


def add_commands(subparsers: Any, commands: dict[str, argparse.ArgumentParser]) -> None:
    """Register ``monitor`` and ``monitor stats`` (statewright/cli/__init__.py)."""
    p = subparsers.add_parser("monitor", help="the datapath's flows, live (drops, policy "
                              "verdicts, service translations)")
    p.add_argument("what", nargs="?", choices=("stats",), help="stats: the counters")
    p.add_argument("--pod", action="append", default=[], help="NAME or NAMESPACE/NAME")
    p.add_argument("--namespace", action="append", default=[])
    p.add_argument("--identity", action="append", default=[], type=int)
    p.add_argument("--verdict", action="append", default=[],
                   choices=("FORWARDED", "DROPPED", "TRANSLATED", "forwarded", "dropped",
                            "translated"))
    p.add_argument("--type", dest="types", action="append", default=[],
                   choices=("drop", "policy", "trace"))
    p.add_argument("--no-follow", dest="follow", action="store_false",
                   help="print the kept flows and exit")
    add_client_arguments(p, ("table", "json"))
    p.set_defaults(func=cmd_monitor)
    commands["monitor"] = p


def monitor_path(args: argparse.Namespace) -> str:
    """The ``/monitor`` request of the arguments."""
    q: dict[str, str] = {}
    for key, values in (("pod", args.pod), ("namespace", args.namespace),
                        ("identity", [str(i) for i in args.identity]),
                        ("verdict", [v.upper() for v in args.verdict]),
                        ("type", args.types)):
        if values:
            q[key] = ",".join(values)
    if not args.follow:
        q["follow"] = "0"
    return "/monitor" + ("?" + urllib.parse.urlencode(q) if q else "")


def cmd_monitor(args: argparse.Namespace) -> int:
    """Stream the flows (or print the counters)."""
    agent = client(args)
    try:
        if args.what == "stats":
            print(json.dumps(agent.get("/monitor/stats"), indent=2))
            return 0
        for doc in agent.stream(monitor_path(args)):
            if args.output == "json":
                print(json.dumps(doc), flush=True)
            else:
                print(flow_line(doc["flow"]), flush=True)
    except AgentUnavailable as e:
        print(f"statewright monitor: {e}", file=sys.stderr)
        return EXIT_NO_AGENT
    except AgentRequestError as e:
        print(f"statewright monitor: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    if not args.follow:
        return 0
    print(f"statewright monitor: the agent on {agent.socket_path} ended the stream "
          "(it stopped?)", file=sys.stderr)
    return 1
