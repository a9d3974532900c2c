"""``statewright explain``: where a BPF map entry comes from, and what an object produced,
asked of the running agent (``GET /explain/...``, statewright/agent/components/explain.py).

* ``explain MAP KEY``: MAP as ``bpf maps`` lists it (``lb4_services``, ``lb4_backends``,
  ``lb4_reverse_nat``, ``endpoints``, ``cilium_policy_v2_00042``...), KEY as bpftool
  prints it (hex bytes), as ``bpf dump`` prints it (``field=value`` pairs) or as
  ``lb list`` and the tables print it (``10.96.0.10:80/TCP [SLOT=n]``, a backend or
  service id, an IP, ``IDENTITY/ingress|egress/PROTO/PORT/PREFIX``): the statedb rows that
  produced it (revision, reconciler status), the source objects (manifest file and line,
  or kind/namespace/name with uid and resourceVersion) and, for a policy entry, the
  policies and rules;
* ``explain service|pod|policy|ciliumendpoint NAMESPACE/NAME``, ``explain node NAME``:
  every map entry the object produced.

A map of runtime state (connection tracking, NAT, the affinity LRU maps, counters,
events) has no row behind its entries: explain says what the map holds instead.

``-o json`` prints the agent's answer. Exit codes as the other agent commands; 1 also for
an entry that is not in the map, or an object that produced none.
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.parse
from typing import Any

from statewright.agent.client import AgentRequestError, AgentUnavailable
from statewright.cli.common import (
    EXIT_NO_AGENT,
    add_client_arguments,
    client,
    flat,
    format_table,
)

OBJECT_KINDS = ("service", "pod", "policy", "node", "ciliumendpoint")


def add_commands(subparsers: Any, commands: dict[str, argparse.ArgumentParser]) -> None:
    """Register ``explain`` (statewright/cli/__init__.py: the protocol)."""
    p = subparsers.add_parser(
        "explain", help="which rows and objects produced a map entry, or an object's entries",
        description="statewright explain MAP KEY | explain "
                    "service|pod|policy|ciliumendpoint NAMESPACE/NAME | explain node NAME",
        epilog="KEY forms: bpftool's hex bytes ('0a 60 00 0a 00 50 ...'), bpf dump's "
               "'field=value ...', a frontend '10.96.0.10:80/TCP [SLOT=1]', a backend or "
               "service id, an endpoint IP, a policy key 'IDENTITY/ingress/TCP/80/16'.",
    )
    p.add_argument("target", help="a map name, or service, pod, policy, ciliumendpoint, node")
    p.add_argument("what", nargs="+", help="the key (several words are joined), or NS/NAME")
    add_client_arguments(p)
    p.set_defaults(func=cmd_explain)
    commands["explain"] = p


def _get(path: str, args: argparse.Namespace) -> tuple[int, Any]:
    """(0, the agent's answer), or (`EXIT_NO_AGENT` / 1, None) with the message printed."""
    try:
        return 0, client(args).get(path)
    except AgentUnavailable as e:
        print(f"statewright explain: {e}", file=sys.stderr)
        return EXIT_NO_AGENT, None
    except AgentRequestError as e:
        print(f"statewright explain: {e}", file=sys.stderr)
        return 1, None


def cmd_explain(args: argparse.Namespace) -> int:
    """Ask the agent and print its answer."""
    what = " ".join(args.what)
    if args.target in OBJECT_KINDS:
        path = _object_path(args.target, what)
        if path is None:
            form = "NAME" if args.target == "node" else "NAMESPACE/NAME"
            print(f"statewright explain: {args.target} {what!r}: expected {form}",
                  file=sys.stderr)
            return 1
        code, answer = _get(path, args)
        if code:
            return code
        if args.output == "json":
            print(json.dumps(answer, indent=2))
        else:
            sys.stdout.write(format_object(args.target, what, answer))
        return 0 if answer["entries"] else 1
    query = urllib.parse.urlencode({"map": args.target, "key": what})
    code, answer = _get(f"/explain/entry?{query}", args)
    if code:
        return code
    if args.output == "json":
        print(json.dumps(answer, indent=2))
    else:
        sys.stdout.write(format_entry(answer))
    return 0 if answer["present"] or answer.get("runtime") else 1


def _object_path(kind: str, what: str) -> str | None:
    """The API path of ``explain KIND WHAT``; None when WHAT is not the kind's form."""
    if kind == "node":
        name = what.strip().removeprefix("/")
        if not name or "/" in name:
            return None
        return "/explain/node/" + urllib.parse.quote(name, safe="")
    ns, sep, name = what.partition("/")
    if not sep or not ns or not name or "/" in name:
        return None
    return "/explain/" + "/".join(urllib.parse.quote(x, safe="") for x in (kind, ns, name))


def _origin_text(o: dict[str, Any]) -> str:
    where = ""
    if o.get("file"):
        where = f"{o['file']}:{o['line']}" if o.get("line") else o["file"]
    elif o.get("uid") or o.get("resourceVersion"):
        where = f"uid {o.get('uid') or '?'} resourceVersion {o.get('resourceVersion') or '?'}"
    elif o.get("container_id"):
        where = f"container {o['container_id']}"
    name = f"{o['namespace']}/{o['name']}" if o["namespace"] else o["name"]
    return f"{o['kind']} {name}  ({o.get('source', '?')}) {where}".rstrip()


def format_entry(a: dict[str, Any]) -> str:
    """The human form of ``GET /explain/entry``."""
    lines = [f"{a['map']} {flat(a['key'])}"]
    if a.get("runtime"):
        lines.append(f"  runtime state, not derived from statedb rows: {a['runtime']}")
        return "\n".join(lines) + "\n"
    if not a["present"]:
        lines.append("  not in the map")
        return "\n".join(lines) + "\n"
    lines.append(f"  value: {flat(a['value'])}")
    lines.append("rows:")
    rows = [[r["table"], r.get("key", ""), r["revision"], r.get("status", "-"),
             " ".join(f"{k}={v}" for k, v in r.items()
                      if k not in ("table", "key", "revision", "status"))]
            for r in a["rows"]]
    if rows:
        lines += ["  " + line for line in
                  format_table(["TABLE", "KEY", "REVISION", "STATUS", "DETAILS"],
                               rows).splitlines()]
    else:
        lines.append("  (none: the entry has no row; the next prune removes it)")
    lines.append("objects:")
    lines += [f"  {_origin_text(o)}" for o in a["objects"]] or ["  (none)"]
    lines += [f"note: {n}" for n in a.get("notes") or []]
    for r in a.get("rules") or []:
        lines.append(f"policy {r['policy']} (revision {r['revision']}):")
        for rule in r["rules"]:
            peers = ", ".join(rule["peers"]) if rule["peers"] is not None else "all"
            lines.append(f"  {rule['direction']} {rule['action']} {rule['subject']} "
                         f"peers [{peers}] ports [{', '.join(rule['ports']) or 'all'}]")
    return "\n".join(lines) + "\n"


def format_object(kind: str, name: str, a: dict[str, Any]) -> str:
    """The human form of ``GET /explain/{kind}/{namespace}/{name}``."""
    lines = [f"{kind} {name}"]
    lines += [f"  {_origin_text(o)}" for o in a["object"]]
    if not a["entries"]:
        lines.append("  no map entries")
        return "\n".join(lines) + "\n"
    rows = [[e["map"], flat(e["key"])] for e in a["entries"]]
    lines += ["  " + line for line in format_table(["MAP", "KEY"], rows).splitlines()]
    return "\n".join(lines) + "\n"
