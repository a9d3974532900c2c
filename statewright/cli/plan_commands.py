"""``statewright plan``: what the agent would change in the LB maps pinned on this node,
computed from its sources without writing anything.

The sources are the agent's own components (manifests, a Kubernetes API server from a
kubeconfig, netlink for the node addresses NodePort frontends expand over), run in this
process on a database of its own until every initial state is in. The pinned maps are
read (read-only) and copied into memory maps; the agent's FrontendOps, restoring the
service and backend ids from that copy as a restarted agent does, applies every frontend
and prunes. The copy then holds what the agent would write; `statewright.observe.plan`
lists the entries that would be added, changed and removed per map.

Exit status: 0 when nothing would change, 2 when something would, 1 when the plan cannot
be made (bad configuration, sources that do not sync, maps that cannot be read).
Plan covers the LB maps, also from a kubeconfig: the endpoint, ipcache and policy maps
also hold what the pods on this node (the CNI, the agent's state directory) and netlink
say, which no manifest or API object describes, and the ipcache does not record which
owner wrote an entry (docs/observability.md says why in full).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from statedb.errors import StatewrightError
from statewright.agent import config as agent_config
from statewright.observe.plan import diff_snapshots, plan_json, plan_text

EXIT_CHANGES = 2


class PlanError(StatewrightError, RuntimeError):
    """The plan cannot be made; the message says why."""


def add_commands(subparsers: Any, commands: dict[str, argparse.ArgumentParser]) -> None:
    """Register ``plan`` (statewright/cli/__init__.py: the protocol)."""
    p = subparsers.add_parser(
        "plan", help="what the agent would change in the pinned LB maps (writes nothing)",
        description="Compute the LB map entries the agent would write from its sources "
                    "and compare them with the maps pinned on this node. Exit 0: no "
                    "change, 2: changes, 1: no plan.",
    )
    p.add_argument("--config", metavar="FILE", help="the agent's YAML configuration file")
    p.add_argument("--pin-dir", metavar="DIR",
                   help=f"the pinned maps (default {agent_config.DEFAULT_PIN_DIR})")
    p.add_argument("--manifests", action="append", metavar="PATH",
                   help="manifest file or directory (repeatable; default as the agent)")
    p.add_argument("--k8s-kubeconfig", metavar="PATH", help="read the objects of this "
                   "kubeconfig's API server")
    p.add_argument("--node-name", help="this node's name (default as the agent)")
    p.add_argument("--node-label", dest="node_labels", action="append", metavar="KEY=VALUE")
    p.add_argument("--lb-flag", dest="lb_flags", action="append", metavar="FLAG",
                   help="Cilium-style LB flag, as the agent takes it")
    p.add_argument("--no-netlink", dest="netlink", action="store_false", default=None,
                   help="no node addresses from netlink (as an agent run with --no-netlink)")
    p.add_argument("--timeout", type=float, default=30.0, metavar="SECONDS",
                   help="how long the sources may take to sync (default 30)")
    p.add_argument("-o", "--output", choices=("table", "json"), default="table")
    p.set_defaults(func=cmd_plan)
    commands["plan"] = p


def _config(args: argparse.Namespace) -> agent_config.AgentConfig:
    overrides: dict[str, Any] = {
        "pin_dir": args.pin_dir, "node_name": args.node_name, "node_labels": args.node_labels,
        "lb_flags": args.lb_flags, "netlink": args.netlink,
        "k8s_kubeconfig": args.k8s_kubeconfig,
        "manifests": [os.path.abspath(p) for p in args.manifests] if args.manifests else None,
    }
    return agent_config.load(args.config, overrides)


def cmd_plan(args: argparse.Namespace) -> int:
    """Compute and print the plan."""
    import anyio

    try:
        cfg = _config(args)
        if cfg.k8s_kubeconfig and not os.path.isfile(cfg.k8s_kubeconfig):
            raise PlanError(f"k8s-kubeconfig: {cfg.k8s_kubeconfig}: no such file")
        doc, text = anyio.run(make_plan, cfg, args.timeout)
    except (agent_config.ConfigError, PlanError) as e:
        print(f"statewright plan: {e}", file=sys.stderr)
        return 1
    if args.output == "json":
        print(json.dumps(doc, indent=2))
    else:
        sys.stdout.write(text)
    return EXIT_CHANGES if doc["changes"] else 0


def _components(cfg: agent_config.AgentConfig) -> list[Any]:
    """The agent's table-filling components, with the LB maps in memory (never opened
    where the agent's are)."""
    from statewright.agent.components.kubernetes import KubernetesComponent, KubernetesConfig
    from statewright.agent.components.lb import (
        LBComponentConfig,
        LoadBalancerComponent,
        lb_config_of,
    )
    from statewright.agent.components.sources import (
        ManifestsComponent,
        ManifestsConfig,
        NetlinkComponent,
        NetlinkConfig,
    )
    from statewright.agent.components.statedb import StateDBComponent
    from statewright.loadbalancer import MapsPlacement

    lb_cfg = LBComponentConfig(lb_config_of(cfg), MapsPlacement("memory", ""), cfg.node_labels)
    return [
        StateDBComponent(),
        LoadBalancerComponent(lb_cfg),
        ManifestsComponent(ManifestsConfig.from_agent_config(cfg)),
        KubernetesComponent(KubernetesConfig.from_agent_config(cfg)),
        NetlinkComponent(NetlinkConfig.from_agent_config(cfg)),
    ]


async def _wait_initialized(lb: Any, hive: Any, timeout: float) -> None:
    import anyio

    from statewright.component import DEGRADED

    tables = (lb.services, lb.frontends, lb.backends, lb.node_addresses)
    with anyio.move_on_after(timeout):
        while True:
            txn = lb.db.read_txn()
            pending = {n for t in tables for n in t.pending_initializers(txn)}
            if not pending:
                return
            await anyio.sleep(0.05)
    # Why, as the sources' health says it (e.g. the API server refusing connections).
    bad = [h for h in hive.health() if h.state == DEGRADED]
    why = "; ".join(next((f"{h.name}: {h.message}" for h in bad
                          if h.name.startswith(f"{name}/")), "") for name in sorted(pending))
    why = why.strip("; ")
    raise PlanError(f"the sources did not sync within {timeout:g} s (waiting for: "
                    f"{', '.join(sorted(pending))})" + (f": {why}" if why else ""))


def _pinned_snapshot(pin_dir: str) -> Any:
    from bpfops.lb_maps import LBMaps, LBSnapshot
    from statewright.cli.lb_commands import LBCliError, open_pinned_lb_maps

    if not os.path.isdir(pin_dir):
        return LBSnapshot({}, {False: [], True: []}), 0
    try:
        with open_pinned_lb_maps(pin_dir) as maps:
            assert isinstance(maps, LBMaps)
            return maps.snapshot(), maps.maglev_table_size
    except (LBCliError, OSError) as e:
        raise PlanError(f"cannot read the maps pinned under {pin_dir}: {e}") from e


async def make_plan(cfg: agent_config.AgentConfig, timeout: float) -> tuple[dict[str, Any],
                                                                              str]:
    """(the JSON document, the text) of the plan for configuration ``cfg``."""
    import anyio

    from statewright.agent.components.lb import LB
    from statewright.component import ComponentError, Hive

    current, _table_size = _pinned_snapshot(cfg.pin_dir)
    hive = Hive(_components(cfg))
    errors: list[str] = []
    failed: list[PlanError] = []
    wanted = None
    # Failures are kept and raised after the task group, so that the caller gets the
    # PlanError itself rather than an exception group around it.
    async with anyio.create_task_group() as tg:
        try:
            await hive.start(tg)
            lb = hive.lookup(LB)
            await _wait_initialized(lb, hive, timeout)
            wanted = await _apply(lb, current, errors)
        except ComponentError as e:
            failed.append(PlanError(str(e)))
        except PlanError as e:
            failed.append(e)
        finally:
            await hive.stop()
            tg.cancel_scope.cancel()
    if failed:
        raise failed[0]
    assert wanted is not None
    diffs = diff_snapshots(current, wanted)
    doc = plan_json(diffs, pin_dir=cfg.pin_dir, sources=_sources(cfg), errors=errors)
    text = plan_text(diffs)
    if errors:
        text += "".join(f"error: {e}\n" for e in errors)
    return doc, text


async def _apply(lb: Any, current: Any, errors: list[str]) -> Any:
    """Apply every frontend to a memory copy of ``current`` as the agent's reconciler
    would (ids restored from the copy), prune (with its look at every map entry, which
    the agent's Ops return as an awaitable), and return the copy's snapshot."""
    maps = lb.open_maps()
    try:
        maps.restore(current)
        lb.build_reconciler(prune_interval=None)
        ops = lb.ops
        txn = lb.db.read_txn()
        for fe in lb.frontends.all(txn):
            try:
                ops.update(txn, 0, fe)
            except Exception as e:  # reported like the agent's reconciler would
                errors.append(f"{fe.address} ({fe.service_name}): {e}")
        audit = ops.prune(txn, lb.frontends.all(txn))
        if audit is not None:
            await audit
        return maps.snapshot()
    finally:
        lb.close_maps()


def _sources(cfg: agent_config.AgentConfig) -> dict[str, Any]:
    return {
        "manifests": list(cfg.manifests),
        "kubeconfig": cfg.k8s_kubeconfig or None,
        "netlink": cfg.netlink,
    }
