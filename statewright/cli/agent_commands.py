"""``statewright agent``, the main job, and the commands that talk to a running agent through
its API socket: ``status``, ``db show|list|watch``, ``exec -- CMD``. It also extends ``lb list``
(asks the agent when one runs, any map backend; otherwise reads the pinned maps) and ``bpf dump``
(asks the agent when its maps are in memory).

Client commands print tables for people and JSON with ``-o json`` for scripts; when no
agent answers they say so (exit 2) instead of printing a traceback. The socket is
``--socket``, else $STATEWRIGHT_SOCKET, else /run/statewright/agent.sock.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import shutil
import sys
from typing import TYPE_CHECKING, Any

from statewright.agent import config as agent_config
from statewright.agent.client import AgentClient, AgentRequestError, AgentUnavailable
from statewright.cli.common import (
    EXIT_NO_AGENT,
    add_client_arguments,
    add_socket_argument,
    client,
    flat,
    format_table,
)

if TYPE_CHECKING:
    from statewright.cli import Commands, SubParsers

log = logging.getLogger("statewright.agent")

#: The namespace ``--demo`` (and ``make run``) creates for the example backends.
DEMO_NETNS = agent_config.DEMO_NETNS


def add_commands(subparsers: SubParsers, commands: Commands) -> None:
    """Register ``agent``, ``status``, ``db show|list|watch`` and ``exec``; route ``lb list``
    and ``bpf dump`` (registered earlier in ``commands``) through the agent."""
    ag = subparsers.add_parser(
        "agent", help="the main job: run the node agent in the foreground "
        "(--cleanup removes what it pinned)"
    )
    add_agent_arguments(ag)
    ag.set_defaults(func=cmd_agent)

    st = subparsers.add_parser(
        "status", help="health of the running agent",
        description="The running agent's health: overall state and each component's state "
                    "and reason.",
        epilog=f"exit codes: 0 the agent is OK, 1 it is Degraded (or the request failed), "
               f"{EXIT_NO_AGENT} no agent answers on the socket",
    )
    add_client_arguments(st)
    st.set_defaults(func=cmd_status)

    db = subparsers.add_parser("db", help="the running agent's statedb tables")
    dbsub = db.add_subparsers(dest="db_command", required=True)
    show = dbsub.add_parser("show", help="print a table")
    show.add_argument("table")
    add_client_arguments(show, formats=("table", "json", "yaml"))
    show.set_defaults(func=cmd_db_show)
    lst = dbsub.add_parser("list", help="list the tables")
    add_client_arguments(lst)
    lst.set_defaults(func=cmd_db_list)
    watch = dbsub.add_parser("watch", help="follow a table's changes (newline-delimited JSON)")
    watch.add_argument("table")
    add_client_arguments(watch, formats=None)
    watch.set_defaults(func=cmd_db_watch)

    ex = subparsers.add_parser(
        "exec", help="run a command in the agent's cgroup (and demo namespace)"
    )
    ex.add_argument("--socket", default=None, help="agent API socket")
    ex.add_argument("--no-netns", action="store_true", help="stay in this network namespace")
    ex.add_argument("--netns", metavar="NAME|PATH",
                    help="run in this network namespace instead of the demo one (a name of "
                         "`ip netns`, or a path such as /var/run/netns/NAME)")
    ex.add_argument("--endpoint", metavar="ID",
                    help="run in the network namespace of this endpoint (a pod's: its "
                         "netns-path)")
    ex.add_argument("cmd", nargs=argparse.REMAINDER, help="-- CMD [ARGS...]")
    ex.set_defaults(func=cmd_exec)

    commands.update({"agent": ag, "status": st, "db show": show, "db list": lst,
                     "db watch": watch, "exec": ex})
    _route_through_agent(commands)


def add_agent_arguments(ag: argparse.ArgumentParser) -> None:
    """The options of ``statewright agent``: each overrides its key of the configuration
    file (statewright/agent/config.py)."""
    ag.add_argument("--config", metavar="FILE", help="YAML configuration file")
    ag.add_argument("--cleanup", action="store_true",
                    help="detach the datapath links, unpin the agent's maps and exit")
    ag.add_argument("--pin-dir", metavar="DIR",
                    help="where the BPF maps are pinned (default "
                    f"{agent_config.DEFAULT_PIN_DIR}); one agent per directory")
    ag.add_argument("--backend", choices=agent_config.BACKENDS,
                    help="BPF maps: kernel, memory (in the process, nothing pinned) or auto "
                    "(kernel when possible, else memory; the default)")
    ag.add_argument("--manifests", action="append", metavar="PATH",
                    help="manifest file or directory (repeatable; default: the example manifests "
                         "installed with the agent, examples/manifests in the repository)")
    ag.add_argument("--manifests-interval", type=float, metavar="SECONDS",
                    help="how often the manifests are re-read (default 1)")
    ag.add_argument("--cgroup", help="cgroup v2 directory for the datapath "
                    "(default: <cgroup2 mount>/statewright, created by the agent)")
    ag.add_argument("--allow-root-cgroup", action="store_true", default=None,
                    help="allow attaching to the root cgroup (every process of the machine)")
    ag.add_argument("--no-datapath", dest="datapath", action="store_false", default=None,
                    help="attach no BPF programs (the maps are still written)")
    ag.add_argument("--node-name", help="this node's name (default: $NODE_NAME, else the "
                    "host name); backends on this node are local (externalTrafficPolicy)")
    ag.add_argument("--node-label", dest="node_labels", action="append", metavar="KEY=VALUE",
                    help="a label of this node, e.g. topology.kubernetes.io/zone=zone-a "
                    "(topology-aware routing); repeat for more")
    ag.add_argument("--state-dir", metavar="PATH",
                    help="endpoint and IPAM state kept for restarts (default "
                    f"{agent_config.DEFAULT_STATE_DIR})")
    ag.add_argument("--pod-cidr", dest="pod_cidrs", action="append", metavar="CIDR",
                    help="a pod CIDR of this node for the endpoints' IPAM; repeat for IPv6 "
                    "(default: the Node's spec.podCIDRs with a Kubernetes source, else "
                    f"{' '.join(agent_config.DEFAULT_POD_CIDRS)})")
    ag.add_argument("--k8s-kubeconfig", metavar="PATH",
                    help="follow the Kubernetes API server of this kubeconfig")
    ag.add_argument("--k8s-api-server", metavar="URL",
                    help="follow the Kubernetes API server at URL (no credentials)")
    ag.add_argument("--k8s-in-cluster", action="store_true", default=None,
                    help="follow the API server with the pod's service account (DaemonSet)")
    ag.add_argument("--k8s-qps", type=float, metavar="N",
                    help="API requests per second (default 20)")
    ag.add_argument("--k8s-burst", type=int, metavar="N",
                    help="API requests above --k8s-qps in a burst (default 40)")
    ag.add_argument("--auto-direct-node-routes", action=argparse.BooleanOptionalAction,
                    default=None,
                    help="routes to the other nodes' pod CIDRs via their InternalIPs "
                         "(native routing, docs/cluster.md; default off)")
    ag.add_argument("--identity-allocation-mode", choices=("crd", "kvstore"),
                    help="where identities, remote endpoints and nodes live: the API "
                         "server's objects (crd, default) or etcd (kvstore; docs/cluster.md)")
    ag.add_argument("--kvstore", choices=("etcd",), help="the kvstore of kvstore mode")
    ag.add_argument("--kvstore-opt", dest="kvstore_opt", action="append", metavar="KEY=VALUE",
                    help="a kvstore option: etcd.config=FILE (endpoints, TLS, auth)")
    ag.add_argument("--kvstore-lease-ttl", type=int, metavar="SECONDS",
                    help="TTL of this agent's etcd lease (default 15)")
    ag.add_argument("--cluster-name", help="this cluster's name in the kvstore's keys "
                    "(default: default)")
    ag.add_argument("--bpf-ct-global-max", type=int, metavar="N",
                    help="entries of each connection-tracking map (default 65536)")
    ag.add_argument("--conntrack-gc-interval", type=float, metavar="SECONDS",
                    help="seconds between two CT garbage collections (default 60)")
    ag.add_argument("--endpoint-datapath", action=argparse.BooleanOptionalAction,
                    default=None,
                    help="tc programs on the pods' veths: ingress policy, connection "
                         "tracking (default on, with the datapath on kernel maps)")
    ag.add_argument("--nodeport-datapath", action=argparse.BooleanOptionalAction,
                    default=None,
                    help="tc programs on the node's external devices: NodePort, LoadBalancer "
                         "and externalIPs for clients outside the node (default on, with the "
                         "datapath on kernel maps)")
    ag.add_argument("--sysctl", action=argparse.BooleanOptionalAction, default=None,
                    help="set the kernel settings the pods need (forwarding, rp_filter; "
                         "default on; restored by --cleanup)")
    ag.add_argument("--sysctl-netns", metavar="NAME|PATH",
                    help="set them in this network namespace instead of the agent's own")
    ag.add_argument("--procfs", metavar="PATH",
                    help="the proc filesystem whose sys/ holds them (default /proc)")
    ag.add_argument("--lb-flag", dest="lb_flags", action="append", metavar="FLAG",
                    help="Cilium-style LB flag, e.g. --lb-flag=--bpf-lb-algorithm=maglev")
    ag.add_argument("--api-socket", metavar="PATH",
                    help=f"the API's unix socket (default {agent_config.DEFAULT_SOCKET}; "
                    "clients take --socket or $STATEWRIGHT_SOCKET)")
    ag.add_argument("--metrics-port", type=int, metavar="PORT",
                    help="serve Prometheus metrics on 127.0.0.1:PORT (default off)")
    ag.add_argument("--no-netlink", dest="netlink", action="store_false", default=None,
                    help="do not follow the machine's devices and addresses (netlink)")
    ag.add_argument("--node-address", dest="node_addresses", action="append",
                    metavar="KEY=VALUE",
                    help="NodeAddressConfig field, e.g. devices=eth0 or nodeport-cidrs=10.0.0.0/8")
    ag.add_argument("--demo-netns", metavar="NAME",
                    help="create namespace NAME with the example backends (exec runs there)")
    ag.add_argument("--demo", action="store_true",
                    help=f"shorthand for --demo-netns {DEMO_NETNS}")
    ag.add_argument("--log-format", choices=("text", "json"),
                    help="text (the default) or one JSON object per line")
    ag.add_argument("--status-line", action="store_true", help="print a live status line")


def _fail(cmd: str, err: Exception) -> int:
    print(f"statewright {cmd}: {err}", file=sys.stderr)
    return EXIT_NO_AGENT if isinstance(err, AgentUnavailable) else 1


# ----- agent -------------------------------------------------------------------------------
def _overrides(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {
        name: getattr(args, name)
        for name in ("pin_dir", "backend", "manifests", "manifests_interval", "cgroup",
                     "allow_root_cgroup", "datapath", "node_name", "node_labels", "lb_flags",
                     "api_socket", "metrics_port", "netlink", "demo_netns", "log_format",
                     "k8s_kubeconfig", "k8s_api_server", "k8s_in_cluster", "k8s_qps",
                     "k8s_burst", "state_dir", "pod_cidrs", "auto_direct_node_routes",
                     "bpf_ct_global_max", "conntrack_gc_interval", "endpoint_datapath",
                     "identity_allocation_mode", "kvstore", "kvstore_opt", "kvstore_lease_ttl",
                     "cluster_name", "sysctl", "sysctl_netns", "procfs",
                     "nodeport_datapath")
    }
    if args.manifests:
        out["manifests"] = [os.path.abspath(p) for p in args.manifests]
    if args.demo and not args.demo_netns:
        if os.geteuid() == 0:
            out["demo_netns"] = DEMO_NETNS
        else:
            print("statewright agent: --demo: not root, so no demo namespace (ip netns needs "
                  "root); the example backends are not started", file=sys.stderr)
    if args.node_addresses:
        fields: dict[str, str] = {}
        for item in args.node_addresses:
            key, sep, value = item.partition("=")
            if not sep:
                raise agent_config.ConfigError(f"--node-address {item!r}: expected KEY=VALUE")
            fields[key] = value
        out["node_addresses"] = fields
    return out


def _unwrap(exc: BaseException) -> BaseException:
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


def cmd_agent(args: argparse.Namespace) -> int:
    """Run the agent in the foreground until SIGTERM/SIGINT, or clean up with --cleanup."""
    import anyio

    from statewright.agent.runtime import Agent, AgentError, JsonLogFormatter, status_printer

    try:
        cfg = agent_config.load(args.config, _overrides(args))
    except agent_config.ConfigError as e:
        print(f"statewright agent: {e}", file=sys.stderr)
        return 2
    if cfg.log_format == "json":
        for h in logging.getLogger().handlers:
            h.setFormatter(JsonLogFormatter())
    if args.cleanup:
        return cleanup(cfg)
    try:
        agent = Agent(cfg)
    except AgentError as e:
        print(f"statewright agent: {e}", file=sys.stderr)
        return 2
    # A long-running process with large tables: see statedb/gc_tuning.py (whole process,
    # so only here, never in library code or in-process tests).
    from statedb.gc_tuning import tune_gc

    tune_gc()

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            if args.status_line:
                tg.start_soon(status_printer, agent)
            await agent.run()
            tg.cancel_scope.cancel()

    if args.status_line:
        sock = cfg.api_socket
        env = "" if sock == agent_config.DEFAULT_SOCKET else f"STATEWRIGHT_SOCKET={sock} "
        cli = cli_command()
        print(
            "statewright agent: in a second terminal try\n"
            f"  {env}{cli} status\n  {env}{cli} lb list\n"
            + (f"  {env}{cli} exec -- curl -s http://10.96.10.10/\n"
               if cfg.demo_netns else ""),
            flush=True,
        )
    try:
        anyio.run(main)
    except BaseException as e:  # report start-up failures without a traceback
        err = _unwrap(e)
        if isinstance(err, AgentError):
            print(f"\nstatewright agent: cannot start: {err}", file=sys.stderr)
            return 1
        if isinstance(err, KeyboardInterrupt):
            return 0
        raise
    if args.status_line:
        print()
    return 0


def cli_command() -> str:
    """How to run this ``statewright`` from a shell: ``statewright`` when that name on PATH
    is this installation's script, else the script's path beside this interpreter (a
    virtualenv's ``.venv/bin/statewright``, as ``make run`` uses), else ``python -m``."""
    script = os.path.join(os.path.dirname(sys.executable), "statewright")
    on_path = shutil.which("statewright")
    if on_path is not None and os.path.realpath(on_path) == os.path.realpath(script):
        return "statewright"
    if os.access(script, os.X_OK):
        rel = os.path.relpath(script)  # .venv/bin/statewright from the repository
        return script if rel.startswith("..") else rel
    return f"{sys.executable} -m statewright"


def cleanup(cfg: agent_config.AgentConfig) -> int:
    """``agent --cleanup``: every component removes what it left on the machine (datapath
    links, pinned maps, the agent's cgroup, the demo namespace, the socket directory).
    Refused while an agent runs: one answering on the socket, or one holding the state
    directory's lock (an agent started with another socket)."""
    with contextlib.suppress(AgentUnavailable, AgentRequestError):
        AgentClient(cfg.api_socket, timeout=2).get("/health")
        print(f"statewright agent --cleanup: an agent is running on {cfg.api_socket}; "
              "stop it first", file=sys.stderr)
        return 1
    from statewright.agent.runtime import AgentError, lock_pins
    from statewright.agent.runtime import cleanup as cleanup_components
    from tables.state_dir import StateDirError, lock_state_dir

    fds: list[int] = []
    try:
        # an agent on another socket holds the state directory's lock while it runs, and
        # one on another state directory the pin directory's
        try:
            if os.path.isdir(cfg.state_dir):
                fds.append(lock_state_dir(cfg.state_dir))
            if os.path.isdir(cfg.pin_dir) and (pin_fd := lock_pins(cfg)) is not None:
                fds.append(pin_fd)
        except (StateDirError, AgentError) as e:
            print(f"statewright agent --cleanup: {e}; stop it first", file=sys.stderr)
            return 1
        removed, errors = cleanup_components(cfg)
    finally:
        for fd in fds:
            os.close(fd)
    for r in removed:
        print(f"removed {r}")
    if not removed:
        print(f"nothing to remove under {cfg.pin_dir}")
    for msg in errors:
        print(f"statewright agent --cleanup: {msg}", file=sys.stderr)
    return 1 if errors else 0


# ----- client commands ---------------------------------------------------------------------
def cmd_status(args: argparse.Namespace) -> int:
    """Print the agent's health (exit 0 when OK, 1 when Degraded, 2 when no agent runs)."""
    try:
        c = client(args)
        health = c.get("/health")
        info = c.get("/agent")
    except (AgentUnavailable, AgentRequestError) as e:
        return _fail("status", e)
    if args.output == "json":
        print(json.dumps({"health": health, "agent": info}, indent=2))
    else:
        print(f"Agent:    {health['state']} (pid {info['pid']}, node {info['node']}, "
              f"up {info['uptime_s']} s)")
        print(f"Maps:     {info['maps']['kind']} under {info['maps']['pin_dir']}")
        dp = info["datapath"]
        print(f"Datapath: {dp['state']}: {dp['reason']}")
        if info.get("netns"):
            print(f"Demo:     namespace {info['netns']} (statewright exec -- CMD runs there)")
        print()
        rows = [[x["name"], x["state"], x["message"]] for x in health["components"]]
        sys.stdout.write(format_table(["Component", "State", "Message"], rows, gap=3))
    return 0 if health["state"] == "OK" else 1


def cmd_db_show(args: argparse.Namespace) -> int:
    """Print one table of the running agent."""
    try:
        c = client(args)
        if args.output == "json":
            print(json.dumps(c.get(f"/tables/{args.table}"), indent=2))
        else:
            sys.stdout.write(c.get_text(f"/tables/{args.table}?format={args.output}"))
    except (AgentUnavailable, AgentRequestError) as e:
        return _fail("db show", e)
    return 0


def cmd_db_list(args: argparse.Namespace) -> int:
    """List the agent's tables."""
    try:
        tables = client(args).get("/tables")
    except (AgentUnavailable, AgentRequestError) as e:
        return _fail("db list", e)
    if args.output == "json":
        print(json.dumps(tables, indent=2))
    else:
        rows = [[t["name"], str(t["rows"]), str(t["revision"]),
                 "yes" if t["initialized"] else "waiting for " + ", ".join(t["pending"])]
                for t in tables]
        sys.stdout.write(format_table(["Table", "Rows", "Revision", "Initialized"], rows, gap=3))
    return 0


def cmd_db_watch(args: argparse.Namespace) -> int:
    """Print a table's changes as they happen (newline-delimited JSON) until interrupted
    (exit 0) or until the agent ends the feed, which it does when it stops (exit 1)."""
    agent = client(args)
    try:
        for doc in agent.stream(f"/tables/{args.table}/changes"):
            print(json.dumps(doc), flush=True)
    except (AgentUnavailable, AgentRequestError) as e:
        return _fail("db watch", e)
    except KeyboardInterrupt:
        return 0
    print(f"statewright db watch: the agent on {agent.socket_path} ended the change feed "
          "(it stopped?)", file=sys.stderr)
    return 1


def cmd_exec(args: argparse.Namespace) -> int:
    """Run the command in the agent's cgroup (so the datapath balances its connections) and,
    when the agent runs the demo, in the demo namespace. Replaces this process."""
    cmd = list(args.cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        print("statewright exec: no command given (statewright exec -- CMD ...)", file=sys.stderr)
        return 2
    try:
        info = client(args).get("/agent")
    except (AgentUnavailable, AgentRequestError) as e:
        return _fail("exec", e)
    dp = info["datapath"]
    cgroup = dp.get("cgroup") or ""
    if dp["state"] != "OK" or not cgroup:
        print(f"statewright exec: warning: the datapath is not attached ({dp['reason']}); "
              "service addresses are not translated", file=sys.stderr)
    if cgroup:
        try:
            # no O_CREAT: a directory that is not a cgroup has no cgroup.procs to create
            fd = os.open(os.path.join(cgroup, "cgroup.procs"), os.O_WRONLY | os.O_CLOEXEC)
            try:
                os.write(fd, str(os.getpid()).encode())
            finally:
                os.close(fd)
        except OSError as e:
            print(f"statewright exec: cannot join cgroup {cgroup}: {e}", file=sys.stderr)
            return 1
    try:
        argv = _in_netns(args, info, cmd)
    except (AgentUnavailable, AgentRequestError, ValueError) as e:
        return _fail("exec", e)
    if shutil.which(argv[0]) is None:
        print(f"statewright exec: {argv[0]}: command not found", file=sys.stderr)
        return 127
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execvp(argv[0], argv)
    except OSError as e:
        print(f"statewright exec: {argv[0]}: {e}", file=sys.stderr)
        return 126
    return 0  # not reached


def _in_netns(args: argparse.Namespace, info: dict[str, Any], cmd: list[str]) -> list[str]:
    """``cmd`` wrapped to run in the chosen network namespace: ``--endpoint``'s,
    ``--netns``, the demo one, or none (``--no-netns``)."""
    target = getattr(args, "netns", None) or ""
    if getattr(args, "endpoint", None):
        ep = client(args).get(f"/endpoint/{args.endpoint}")
        target = ep.get("netns-path") or ""
        if not target:
            raise ValueError(f"endpoint {args.endpoint} has no netns-path")
    if target:
        if "/" in target:
            return ["nsenter", f"--net={target}", "--", *cmd]
        return ["ip", "netns", "exec", target, *cmd]
    netns = "" if args.no_netns else info.get("netns") or ""
    return ["ip", "netns", "exec", netns, *cmd] if netns else cmd


# ----- lb list and bpf dump through the agent ---------------------------------------------
def _route_through_agent(commands: Commands) -> None:
    """Extend ``lb list`` (lb_commands.py) and ``bpf dump`` (bpf_commands.py),
    registered before this module, so that they ask the running agent first. ``lb list``
    always does; ``bpf dump MAP`` only when the agent's maps are in memory under --pin-dir
    (only the agent can read those). Each keeps its own function as ``pinned_func``, the
    fallback reading the pinned maps directly."""
    for path, func, help_text in (
        ("lb list", cmd_lb_list, "agent API socket (used when an agent runs)"),
        ("bpf dump", cmd_bpf_dump, "agent API socket"),
    ):
        parser = commands.get(path)
        if parser is None:
            raise RuntimeError(f"statewright.cli.agent_commands extends `{path}`, which is "
                               "not registered: register its module before agent_commands")
        add_socket_argument(parser, help_text)
        parser.set_defaults(func=func, pinned_func=parser.get_default("func"))


def cmd_bpf_dump(args: argparse.Namespace) -> int:
    """One LB map's entries from the agent when it runs on memory maps under --pin-dir."""
    pinned: int
    if os.sep in args.map:
        pinned = args.pinned_func(args)
        return pinned
    try:
        agent = client(args)
        info = agent.get("/agent")
        if info["maps"]["kind"] != "memory" or info["maps"]["pin_dir"] != args.pin_dir:
            raise AgentUnavailable("the agent's maps are not in memory under --pin-dir")
        entries = agent.get(f"/bpf/maps/{args.map}")["entries"]
    except AgentUnavailable:
        pinned = args.pinned_func(args)
        return pinned
    except AgentRequestError as e:
        return _fail("bpf dump", e)
    if args.output == "json":
        print(json.dumps(entries, indent=2))
    else:
        rows = [[flat(e["key"]), flat(e["value"])] for e in entries]
        sys.stdout.write(format_table(["KEY", "VALUE"], rows))
    return 0


def cmd_lb_list(args: argparse.Namespace) -> int:
    """Frontends with their backends from the running agent; without an agent, from the
    maps pinned under --pin-dir (kernel maps only), saying so."""
    from statewright.cli.lb_commands import format_list

    try:
        records = client(args).get("/lb/services")
    except AgentUnavailable as e:
        print(f"statewright lb list: {e}\nstatewright lb list: reading the maps pinned under "
              f"{args.pin_dir} instead", file=sys.stderr)
        result: int = args.pinned_func(args)
        return result
    except AgentRequestError as e:
        return _fail("lb list", e)
    if args.output == "json":
        print(json.dumps(records, indent=2))
    else:
        sys.stdout.write(format_list(records))
    return 0
