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
import sys
import urllib.parse
from typing import Any

from statewright.agent.client import AgentRequestError, AgentUnavailable
from statewright.cli.common import add_client_arguments, agent_get, client, format_table

ENDPOINT_COLUMNS = ["ID", "POD", "INTERFACE", "IPV4", "IPV6", "IDENTITY", "POLICY", "STATE"]


def add_commands(subparsers: Any, commands: dict[str, argparse.ArgumentParser]) -> None:
    """Register the ``endpoint`` and ``ipam`` command groups (leaves set ``func`` and are
    recorded in ``commands``, as statewright/cli/__init__.py describes)."""
    ep = subparsers.add_parser("endpoint", help="the agent's endpoints")
    sub = ep.add_subparsers(dest="endpoint_command", required=True)
    lst = sub.add_parser("list", help="list endpoints")
    add_client_arguments(lst)
    lst.set_defaults(func=cmd_endpoint_list)
    commands["endpoint list"] = lst
    get = sub.add_parser("get", help="one endpoint (id, container-id:X, pod-name:NS/NAME, ...)")
    get.add_argument("id")
    add_client_arguments(get, default="json")
    get.set_defaults(func=cmd_endpoint_get)
    commands["endpoint get"] = get

    ipam = subparsers.add_parser("ipam", help="the agent's pod CIDRs and allocations")
    add_client_arguments(ipam)
    ipam.set_defaults(func=cmd_ipam)
    commands["ipam"] = ipam


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


#: Marks, in the POLICY column, ingress rules this node computes but does not enforce.
UNENFORCED = "*"


def _policy_cell(pol: dict[str, Any] | None) -> str:
    """``r<revision>`` plus ``+egress``/``+ingress`` for the directions policies select
    (``+ingress*`` when the node's datapath does not enforce ingress); ``-``."""
    if pol is None:
        return "-"
    dirs = [d for d in ("egress", "ingress") if pol.get(f"{d}_enforced")]
    cell = f"r{pol['revision']}" + "".join(f"+{d}" for d in dirs)
    return cell + UNENFORCED if "ingress" in dirs and pol.get("ingress-datapath") else cell


def _policy_rows(args: argparse.Namespace) -> dict[int, dict[str, Any]]:
    """The endpoints' policy rows by id, each with the node's ``ingress-datapath`` (why
    ingress is not enforced, or None); empty when the agent has no policy component."""
    try:
        doc = client(args).get("/policy/endpoints")
    except (AgentUnavailable, AgentRequestError):
        return {}
    why = doc.get("ingress-datapath")
    return {int(r["endpoint_id"]): {**r, "ingress-datapath": why}
            for r in doc.get("endpoints", [])}


def cmd_endpoint_list(args: argparse.Namespace) -> int:
    """``statewright endpoint list``."""
    eps = agent_get(args, "/endpoint")
    if args.output == "json":
        print(json.dumps(eps, indent=2))
    else:
        pol = _policy_rows(args)
        rows = [endpoint_row(e, pol) for e in eps]
        sys.stdout.write(format_table(ENDPOINT_COLUMNS, rows))
        unenforced = [p for p in pol.values() if _policy_cell(p).endswith(UNENFORCED)]
        if unenforced:
            print(f"{UNENFORCED} ingress rules computed but not enforced on this node: "
                  f"{unenforced[0]['ingress-datapath']}")
    return 0


def cmd_endpoint_get(args: argparse.Namespace) -> int:
    """``statewright endpoint get ID``."""
    ref = urllib.parse.quote(args.id, safe=":")
    ep = agent_get(args, f"/endpoint/{ref}")
    if args.output == "json":
        print(json.dumps(ep, indent=2))
    else:
        sys.stdout.write(format_table(ENDPOINT_COLUMNS, [endpoint_row(ep)]))
    return 0


def cmd_ipam(args: argparse.Namespace) -> int:
    """``statewright ipam``: pools with usage, router addresses, allocations."""
    doc = agent_get(args, "/ipam")
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
