"""``statewright operator``: the cluster-wide identity garbage collector
(statewright/operator.py), a second process next to the agents."""

from __future__ import annotations

import argparse
import logging
import signal
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from statewright.cli import Commands, SubParsers

log = logging.getLogger("statewright.operator")


def add_commands(subparsers: SubParsers, commands: Commands) -> None:
    """Register ``operator``."""
    # not statewright.operator: it imports the Kubernetes client, which every command
    # would then pay for when the parser is built
    from statewright.identity_gc_timing import DEFAULT_GRACE, DEFAULT_INTERVAL

    op = subparsers.add_parser(
        "operator", help="delete CiliumIdentities no CiliumEndpoint used for a grace period"
    )
    where = op.add_mutually_exclusive_group()
    where.add_argument("--kubeconfig", default="", help="a kubeconfig file")
    where.add_argument("--api-server", default="", help="the API server's URL")
    where.add_argument("--in-cluster", action="store_true", help="the pod's service account")
    op.add_argument("--grace", type=float, default=DEFAULT_GRACE,
                    help=f"seconds an identity stays unused before deletion ({DEFAULT_GRACE:.0f})")
    op.add_argument("--interval", type=float, default=DEFAULT_INTERVAL,
                    help=f"seconds between collection passes ({DEFAULT_INTERVAL:.0f})")
    op.add_argument("--identity-allocation-mode", choices=("crd", "kvstore"), default="crd",
                    help="where the identities are: CiliumIdentities (crd) or etcd (kvstore)")
    op.add_argument("--kvstore", choices=("etcd",), default="", help="the kvstore (kvstore mode)")
    op.add_argument("--kvstore-opt", action="append", default=[], metavar="KEY=VALUE",
                    help="etcd.config=FILE: the etcd client configuration (kvstore mode)")
    op.set_defaults(func=cmd_operator)
    commands["operator"] = op


def cmd_operator(args: argparse.Namespace) -> int:
    """Run the operator until SIGTERM or SIGINT; 2 when it cannot be configured."""
    import anyio

    from sources.k8s_client import ClientSettings, K8sClient, K8sConfigError
    from statewright.operator import IdentityGC

    if args.grace < 0 or args.interval <= 0:
        log.error("operator: --grace must be >= 0 and --interval > 0")
        return 2
    if args.identity_allocation_mode == "kvstore":
        return _kvstore_operator(args)
    if not (args.kubeconfig or args.api_server or args.in_cluster):
        log.error("operator: one of --kubeconfig, --api-server, --in-cluster is required "
                  "(or --identity-allocation-mode kvstore)")
        return 2
    try:
        client = K8sClient(ClientSettings(kubeconfig=args.kubeconfig, api_server=args.api_server,
                                          in_cluster=args.in_cluster))
    except K8sConfigError as e:
        log.error("operator: %s", e)
        return 2
    gc = IdentityGC(client, grace=args.grace, interval=args.interval)

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            await tg.start(gc.run)
            log.info("operator: collecting identities on %s (grace %.0f s)",
                     client.description, args.grace)
            with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                async for _ in signals:
                    tg.cancel_scope.cancel()
                    break

    try:
        anyio.run(main)
    finally:
        client.close()
    return 0


def _kvstore_operator(args: argparse.Namespace) -> int:
    """The identity GC of kvstore mode (sources/kvstore/gc.py) until SIGTERM or SIGINT."""
    import anyio

    from sources.kvstore.config import KVStoreConfigError, parse_kvstore_opts
    from sources.kvstore.etcd_client import EtcdClient
    from sources.kvstore.gc import KVStoreIdentityGC

    if args.kvstore != "etcd":
        log.error("operator: --identity-allocation-mode kvstore needs --kvstore etcd")
        return 2
    opts = dict(o.partition("=")[::2] for o in args.kvstore_opt)
    try:
        config = parse_kvstore_opts(opts)
    except KVStoreConfigError as e:
        log.error("operator: %s", e)
        return 2

    async def main() -> None:
        client = EtcdClient(config)
        gc = KVStoreIdentityGC(client, grace=args.grace, interval=args.interval)
        try:
            async with anyio.create_task_group() as tg:
                await tg.start(gc.run)
                log.info("operator: collecting identities in etcd %s (grace %.0f s)",
                         ", ".join(config.endpoints), args.grace)
                with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                    async for _ in signals:
                        tg.cancel_scope.cancel()
                        break
        finally:
            await client.aclose()

    anyio.run(main)
    return 0
