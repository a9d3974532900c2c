"""``statewright endpoint list|get`` and ``statewright ipam``: the agent's endpoints and
address pools, read through its API socket (``GET /endpoint``, ``GET /endpoint/{id}``,
``GET /ipam``).

The socket is ``--socket``, else ``$STATEWRIGHT_SOCKET``, else /run/statewright/agent.sock.
When no agent answers, the command says so and exits 2 (no traceback); an error answer of
the agent (an unknown endpoint) is printed and exits 1.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.parse
from typing import Any

from statewright.agent.client import AgentClient, AgentRequestError, AgentUnavailable

SOCKET_ENV = "STATEWRIGHT_SOCKET"
DEFAULT_SOCKET = "/run/statewright/agent.sock"
ENDPOINT_COLUMNS = ["ID", "POD", "INTERFACE", "IPV4", "IPV6", "IDENTITY", "POLICY", "STATE"]


def add_commands(subparsers: Any, commands: dict[str, argparse.ArgumentParser]) -> None:
    """Register the ``endpoint`` and ``ipam`` command groups (leaves set ``func`` and are
    recorded in ``commands``, as statewright/cli.py describes)."""
    ep = subparsers.add_parser("endpoint", help="the agent's endpoints")
    sub = ep.add_subparsers(dest="endpoint_command", required=True)
    lst = sub.add_parser("list", help="list endpoints")
    _common(lst)
    lst.set_defaults(func=cmd_endpoint_list)
    commands["endpoint list"] = lst
    get = sub.add_parser("get", help="one endpoint (id, container-id:X, pod-name:NS/NAME, ...)")
    get.add_argument("id")
    _common(get, json_default=True)
    get.set_defaults(func=cmd_endpoint_get)
    commands["endpoint get"] = get

    ipam = subparsers.add_parser("ipam", help="the agent's pod CIDRs and allocations")
    _common(ipam)
    ipam.set_defaults(func=cmd_ipam)
    commands["ipam"] = ipam


def _common(p: argparse.ArgumentParser, json_default: bool = False) -> None:
    p.add_argument(
        "--socket",
        default=None,
        help=f"agent API socket (default ${SOCKET_ENV} or {DEFAULT_SOCKET})",
    )
    p.add_argument(
        "-o", "--output", choices=("table", "json"), default="json" if json_default else "table"
    )


def _client(args: argparse.Namespace) -> AgentClient:
    return AgentClient(args.socket or os.environ.get(SOCKET_ENV) or DEFAULT_SOCKET)


def _command(args: argparse.Namespace) -> str:
    """``statewright endpoint get`` etc., from the command's function, for messages."""
    func = getattr(args, "func", None)
    name = getattr(func, "__name__", "").removeprefix("cmd_").replace("_", " ")
    return f"statewright {name}".rstrip()


def _get(args: argparse.Namespace, path: str) -> Any:
    """The agent's answer, or raise SystemExit with the right code and a message naming
    the command (2: no agent, as the other client commands; 1: the agent refused)."""
    try:
        return _client(args).get(path)
    except AgentUnavailable as e:
        print(f"{_command(args)}: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    except AgentRequestError as e:
        print(f"{_command(args)}: {e}", file=sys.stderr)
        raise SystemExit(1) from None


def format_table(header: list[str], rows: list[list[str]]) -> str:
    """Left-aligned columns separated by two spaces."""
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows)]
    lines = [
        "  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip() for r in [header, *rows]
    ]
    return "\n".join(lines) + "\n"


def endpoint_row(ep: dict[str, Any], policy: dict[int, dict[str, Any]] | None = None) -> list[str]:
    """One table row of an endpoint document; ``policy``: the endpoints' policy rows by id
    (``GET /policy/endpoints``) for the POLICY column (revision and enforced directions)."""
    pol = (policy or {}).get(ep["id"])
    pod = f"{ep['k8s-namespace']}/{ep['k8s-pod-name']}" if ep.get("k8s-pod-name") else ""
    return [
        str(ep["id"]),
        pod,
        f"{ep.get('interface-name', '')}({ep.get('interface-index', 0)})",
        ep["addressing"].get("ipv4", ""),
        ep["addressing"].get("ipv6", ""),
        str(ep.get("identity", "")),
        _policy_cell(pol),
        ep.get("state", ""),
    ]


def _policy_cell(pol: dict[str, Any] | None) -> str:
    """``r<revision>`` plus ``+egress``/``+ingress`` for the enforced directions; ``-``."""
    if pol is None:
        return "-"
    dirs = [d for d in ("egress", "ingress") if pol.get(f"{d}_enforced")]
    return f"r{pol['revision']}" + "".join(f"+{d}" for d in dirs)


def _policy_rows(args: argparse.Namespace) -> dict[int, dict[str, Any]]:
    """The endpoints' policy rows by id; empty when the agent has no policy component."""
    try:
        doc = _client(args).get("/policy/endpoints")
    except (AgentUnavailable, AgentRequestError):
        return {}
    return {int(r["endpoint_id"]): r for r in doc.get("endpoints", [])}


def cmd_endpoint_list(args: argparse.Namespace) -> int:
    """``statewright endpoint list``."""
    eps = _get(args, "/endpoint")
    if args.output == "json":
        print(json.dumps(eps, indent=2))
    else:
        pol = _policy_rows(args)
        sys.stdout.write(format_table(ENDPOINT_COLUMNS, [endpoint_row(e, pol) for e in eps]))
    return 0


def cmd_endpoint_get(args: argparse.Namespace) -> int:
    """``statewright endpoint get ID``."""
    ref = urllib.parse.quote(args.id, safe=":")
    ep = _get(args, f"/endpoint/{ref}")
    if args.output == "json":
        print(json.dumps(ep, indent=2))
    else:
        sys.stdout.write(format_table(ENDPOINT_COLUMNS, [endpoint_row(ep)]))
    return 0


def cmd_ipam(args: argparse.Namespace) -> int:
    """``statewright ipam``: pools with usage, router addresses, allocations."""
    doc = _get(args, "/ipam")
    if args.output == "json":
        print(json.dumps(doc, indent=2))
        return 0
    pools = [[p["cidr"], str(p["used"]), str(p["size"])] for p in doc["pools"]]
    sys.stdout.write(format_table(["POOL", "USED", "SIZE"], pools))
    for fam, ip in sorted(doc.get("router", {}).items()):
        print(f"router {fam}: {ip}")
    allocs = [[a["ip"], a["owner"]] for a in doc["allocations"]]
    sys.stdout.write("\n" + format_table(["IP", "OWNER"], allocs))
    return 0
