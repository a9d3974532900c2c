"""``statewright policy get|trace``: the agent's network policy, read through its API socket
(``GET /policy``, ``GET /policy/trace``).

* ``policy get``: the repository revision and every policy with its rules;
  ``policy get --endpoint ID``: that endpoint's enforcement and computed entries.
* ``policy trace --from LABELS --to LABELS --port P[/PROTO]``: whether the agent's policy
  allows the traffic (egress at the source, ingress at the destination) and by which
  policies. Labels are comma-separated ``[source:]key=value`` (``k8s`` when no source;
  namespace ``default`` unless ``io.kubernetes.pod.namespace`` is given; ``reserved:world``
  for addresses outside the cluster). Exit code 0 when allowed, 1 when denied.
  ``--from-pod NS/NAME`` / ``--to-pod NS/NAME`` (or ``--from-endpoint ID`` /
  ``--to-endpoint ID``) trace with a local endpoint's real identity and named ports, and
  say whether this node's datapath enforces each direction.
* ``policy wait REVISION [--endpoint ID] [--timeout S]``: wait until every endpoint (or
  that one) has realized policy revision REVISION or a later one in its maps (Cilium's
  ``policy wait``); exit code 0 when it has, 1 after the timeout.

Socket, errors and exit codes as the other agent commands (endpoint_commands.py, common.py).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.parse
from typing import Any

from policy.model import PROTOCOLS
from statewright.cli.common import add_client_arguments, agent_get, format_table

#: IP protocol number -> the name a policy spells it with (trace prints ``8080/TCP``).
PROTOCOL_NAMES = {number: name for name, number in PROTOCOLS.items()}

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
    tr.add_argument("--from", dest="src", help="source labels, comma-separated")
    tr.add_argument("--to", dest="dst", help="destination labels")
    for side in ("from", "to"):
        tr.add_argument(f"--{side}-pod", metavar="NS/NAME", help=f"the {side} side: a pod")
        tr.add_argument(f"--{side}-endpoint", metavar="ID", help=f"the {side} side: an "
                        "endpoint id")
    tr.add_argument("--port", required=True, help="destination port, P or P/PROTO (TCP)")
    add_client_arguments(tr)
    tr.set_defaults(func=cmd_policy_trace)
    commands["policy trace"] = tr
    wait = sub.add_parser("wait", help="wait until a policy revision is in the maps")
    wait.add_argument("revision", type=int, help="the policy revision (GET /policy)")
    wait.add_argument("--endpoint", type=int, default=None, help="only this endpoint")
    wait.add_argument("--timeout", type=float, default=30.0, help="seconds (default 30)")
    add_client_arguments(wait)
    wait.set_defaults(func=cmd_policy_wait)
    commands["policy wait"] = wait


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
            if r["action"] == "allow" and r["peers"] == []:
                # An allow rule that names no peer only selects its subject: default deny.
                print(f"  deny all {r['direction']}: subject {r['subject']}")
                continue
            peers = "any" if r["peers"] is None else " | ".join(r["peers"]) or "nothing"
            ports = ", ".join(r["ports"]) or "any port"
            print(
                f"  {r['direction']} {r['action']}: subject {r['subject']}; peers {peers}; {ports}"
            )
    return 0


def cmd_policy_trace(args: argparse.Namespace) -> int:
    """``statewright policy trace``: 0 when allowed, 1 when denied."""
    sides = {"from": args.src, "to": args.dst, "from-pod": args.from_pod,
             "to-pod": args.to_pod, "from-endpoint": args.from_endpoint,
             "to-endpoint": args.to_endpoint}
    q = urllib.parse.urlencode({**{k: v for k, v in sides.items() if v}, "port": args.port})
    doc = agent_get(args, f"/policy/trace?{q}")
    if args.output == "json":
        print(json.dumps(doc, indent=2))
    else:
        print(f"from: {','.join(doc['from'])}")
        print(f"to:   {','.join(doc['to'])}")
        proto = PROTOCOL_NAMES.get(doc["protocol"], str(doc["protocol"]))
        print(f"port: {doc['port']}/{proto}  (policy revision {doc['revision']})")
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
        for side, what in (("egress", "egress"), ("ingress", "ingress")):
            if doc.get("from-endpoint") or doc.get("to-endpoint"):
                print(f"{what} datapath: {doc[side].get('datapath', '')}")
        print(f"verdict: {doc['verdict'].upper()}")
    return 0 if doc["verdict"] == "allowed" else 1


def cmd_policy_wait(args: argparse.Namespace) -> int:
    """``statewright policy wait REVISION``: 0 once realized, 1 after the timeout."""
    deadline = time.monotonic() + args.timeout
    while True:
        doc = agent_get(args, "/policy/endpoints")
        rows = [r for r in doc["endpoints"]
                if args.endpoint is None or r["endpoint_id"] == args.endpoint]
        behind = [r["endpoint_id"] for r in rows
                  if (r.get("realized-revision") or 0) < args.revision]
        if args.endpoint is not None and not rows:
            behind = [args.endpoint]  # not known yet
        if not behind:
            print(f"policy revision {args.revision} realized"
                  + (f" by endpoint {args.endpoint}" if args.endpoint is not None else ""))
            return 0
        if time.monotonic() >= deadline:
            print(f"policy wait: revision {args.revision} not realized after {args.timeout:g} "
                  f"s by endpoint(s) {', '.join(map(str, behind[:10]))}", file=sys.stderr)
            return 1
        time.sleep(0.1)
