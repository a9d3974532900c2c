"""``statewright operator``: CiliumIdentities no CiliumEndpoint used for the grace period
are deleted, through the fake API server, with the operator's own ClusterRole."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from sources.k8s_client import ClientSettings, K8sClient
from statewright.cli import build_parser
from statewright.operator import IdentityGC
from tables.cluster_identities import identity_object

from .fake_apiserver import FakeAPIServer
from .helpers import FAST, wait_for
from .rbac import disallowed

pytestmark = pytest.mark.anyio


def cep(name: str, identity: int) -> dict[str, Any]:
    return {
        "apiVersion": "cilium.io/v2",
        "kind": "CiliumEndpoint",
        "metadata": {"name": name, "namespace": "shop"},
        "status": {"identity": {"id": identity}, "networking": {"addressing": []}},
    }


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_unused_identities_are_deleted_after_the_grace_period(
    apiserver: FakeAPIServer, kubeconfig: str
) -> None:
    for num in (300, 301, 302):
        apiserver.upsert(identity_object(num, (f"k8s:app=a{num}",)))
    apiserver.upsert(cep("used", 300))
    clock = Clock()
    client = K8sClient(ClientSettings(kubeconfig=kubeconfig))
    gc = IdentityGC(client, grace=60.0, interval=3600.0, config=FAST, clock=clock)

    def names() -> list[str]:
        return sorted(o["metadata"]["name"] for o in apiserver.objects("CiliumIdentity"))

    try:
        async with anyio.create_task_group() as tg:
            await tg.start(gc.run)
            await wait_for(lambda: gc.synced, "operator synced")
            assert gc.collect() == []  # nothing unused long enough
            clock.now += 30
            apiserver.upsert(cep("late", 301))  # 301 used before its grace ran out
            await wait_for(lambda: "shop/late" in gc.endpoint_identity, "endpoint seen")
            clock.now += 31
            assert gc.collect() == ["302"]
            assert names() == ["300", "301"]
            # The endpoint using 301 goes: its clock starts again from then.
            apiserver.delete("CiliumEndpoint", "shop", "late")
            await wait_for(lambda: "shop/late" not in gc.endpoint_identity, "endpoint gone")
            clock.now += 59
            assert gc.collect() == []
            clock.now += 1
            assert await anyio.to_thread.run_sync(gc.collect) == ["301"]
            assert names() == ["300"]
            tg.cancel_scope.cancel()
    finally:
        client.close()
    assert disallowed(apiserver.requests, "operator-clusterrole.yaml") == []


def test_the_cli_refuses_a_bad_setting() -> None:
    parser = build_parser()
    args = parser.parse_args(["operator", "--api-server", "https://127.0.0.1:1", "--grace", "-1"])
    assert args.func(args) == 2
