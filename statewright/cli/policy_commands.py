"""``statewright policy get|trace``: the agent's network policy, read through its API socket
(``GET /policy``, ``GET /policy/trace``).

* ``policy get``: the repository revision and every policy with its rules;
  ``policy get --endpoint ID``: that endpoint's enforcement and computed entries.
* ``policy trace --from LABELS --to LABELS --port P[/PROTO]``: whether the agent's policy
  allows the traffic (egress at the source, ingress at the destination) and by which
  policies. Labels are comma-separated ``[source:]key=value`` (``k8s`` when no source;
  namespace ``default`` unless ``io.kubernetes.pod.namespace`` is given; ``reserved:world``
  for addresses outside the cluster). Exit code 0 when allowed, 1 when denied.

Socket, errors and exit codes as the other agent commands (endpoint_commands.py, common.py).
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.parse
from typing import Any

from statewright.cli.common import add_client_arguments, agent_get, format_table

ENTRY_COLUMNS = ["IDENTITY", "DIRECTION", "PROTO", "PORT", "ACTION", "RULES"]


def add_commands(subparsers: Any, commands: dict[str, argparse.ArgumentParser]) -> None:
    """Register the ``policy`` command group (statewright/cli/__init__.py: the protocol)."""
    pol = subparsers.add_parser("policy", help="the agent's network policy")
    sub = pol.add_subparsers(dest="policy_command", required=True)
    get = sub.add_parser("get", help="policies and rules, or one endpoint's entries")
    get.add_argument("--endpoint", type=int, default=None, help="an endpoint id")
    add_client_arguments(get)
    get.set_defaults(func=cmd_policy_get)
    commands["policy get"] = get
    tr = sub.add_parser("trace", help="is traffic from LABELS to LABELS on a port allowed?")
    tr.add_argument("--from", dest="src", required=True, help="source labels, comma-separated")
    tr.add_argument("--to", dest="dst", required=True, help="destination labels")
    tr.add_argument("--port", required=True, help="destination port, P or P/PROTO (TCP)")
    add_client_arguments(tr)
    tr.set_defaults(func=cmd_policy_trace)
    commands["policy trace"] = tr


def _port_text(e: dict[str, Any]) -> str:
    if not e["port_prefix_len"]:
        return "any"
    if e["port_prefix_len"] == 16:
        return str(e["dport"])
    return f"{e['dport']}/{e['port_prefix_len']}"


def cmd_policy_get(args: argparse.Namespace) -> int:
    """``statewright policy get [--endpoint ID]``."""
    path = "/policy" if args.endpoint is None else f"/policy?endpoint={args.endpoint}"
    doc = agent_get(args, path)
    if args.output == "json":
        print(json.dumps(doc, indent=2))
        return 0
    print(f"revision {doc['revision']}")
    if args.endpoint is not None:
        enf = doc.get("enforcement") or {}
        print(
            f"endpoint {doc['endpoint']}: egress "
            f"{'enforced' if enf.get('egress_enforced') else 'allow-all'}, ingress "
            f"{'enforced' if enf.get('ingress_enforced') else 'allow-all'}, "
            f"computed at revision {enf.get('revision', '-')}"
        )
        rows = [
            [
                str(e["identity"] or "any"),
                e["direction"],
                str(e["protocol"] or "any"),
                _port_text(e),
                "deny" if e["deny"] else "allow",
                ",".join(e["rules"]),
            ]
            for e in doc["entries"]
        ]
        sys.stdout.write(format_table(ENTRY_COLUMNS, rows))
        return 0
    for p in doc["policies"]:
        print(f"\n{p['kind']} {p['name']}")
        for r in p["rules"]:
            peers = "any" if r["peers"] is None else " | ".join(r["peers"]) or "nothing"
            ports = ", ".join(r["ports"]) or "any port"
            print(
                f"  {r['direction']} {r['action']}: subject {r['subject']}; peers {peers}; {ports}"
            )
    return 0


def cmd_policy_trace(args: argparse.Namespace) -> int:
    """``statewright policy trace``: 0 when allowed, 1 when denied."""
    q = urllib.parse.urlencode({"from": args.src, "to": args.dst, "port": args.port})
    doc = agent_get(args, f"/policy/trace?{q}")
    if args.output == "json":
        print(json.dumps(doc, indent=2))
    else:
        print(f"from: {','.join(doc['from'])}")
        print(f"to:   {','.join(doc['to'])}")
        print(f"port: {doc['port']}/{doc['protocol']}  (policy revision {doc['revision']})")
        for side, what in (
            ("egress", "egress of the source"),
            ("ingress", "ingress of the destination"),
        ):
            v = doc[side]
            if not v["enforced"]:
                print(f"{what}: allowed (no policy selects it)")
                continue
            if v["denied-by"]:
                why = f"denied by {', '.join(v['denied-by'])}"
            elif v["allowed-by"]:
                why = f"allowed by {', '.join(v['allowed-by'])}"
            else:
                why = f"denied by default (selected by {', '.join(v['selected-by'])})"
            print(f"{what}: {why}")
        print(f"verdict: {doc['verdict'].upper()}")
    return 0 if doc["verdict"] == "allowed" else 1
