"""Policies from the (fake) API server: list, watch, a refused object, deletion, the
initializer of the policies table."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from policy.k8s import PolicyK8sSource
from policy.source import PolicyObjects, new_policies_table
from sources.k8s_client import ClientSettings, K8sClient
from statedb import DB
from tests.k8s.fake_apiserver import FakeAPIServer
from tests.k8s.helpers import FAST, wait_for

from .test_writer_and_sources import TO_DB_5432, cnp

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def netpol(name: str, port: int) -> dict[str, object]:
    return {
        "kind": "NetworkPolicy",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"podSelector": {}, "ingress": [{"ports": [{"port": port}]}]},
    }


async def test_policies_listed_watched_and_refused_alone(
    apiserver: FakeAPIServer, tmp_path: Path
) -> None:
    apiserver.upsert(netpol("np", 80))
    apiserver.upsert(cnp("web", TO_DB_5432))
    kubeconfig = apiserver.write_kubeconfig(tmp_path / "kubeconfig")
    client = K8sClient(ClientSettings(kubeconfig=kubeconfig))
    db = DB()
    table = new_policies_table()
    db.register(table)
    src = PolicyK8sSource(db, client, PolicyObjects(table), FAST)
    with db.write_txn(table) as txn:
        src.register_initializer(txn)

    def names() -> list[str]:
        return [p.key for p in table.all(db.read_txn())]

    try:
        async with anyio.create_task_group() as tg:
            await tg.start(src.run)
            await wait_for(lambda: table.initialized(db.read_txn())[0], "initial lists")
            assert names() == ["CiliumNetworkPolicy/default/web", "NetworkPolicy/default/np"]
            # A bad version is refused alone; the good one stays in force.
            apiserver.upsert(netpol("np", 70000))
            apiserver.upsert(netpol("other", 443))
            await wait_for(lambda: "NetworkPolicy/default/other" in names(), "other")
            assert "NetworkPolicy default/np" in src.errors
            assert "out of range" in src.errors["NetworkPolicy default/np"]
            np = next(p for p in table.all(db.read_txn()) if p.name == "default/np")
            assert np.rules[1].ports[0].port == 80
            # Fixed, then deleted.
            apiserver.upsert(netpol("np", 81))
            await wait_for(lambda: not src.errors, "error resolved")
            apiserver.delete("CiliumNetworkPolicy", "default", "web")
            await wait_for(lambda: "CiliumNetworkPolicy/default/web" not in names(), "deletion")
            assert all(ok for _, ok, _ in src.health())
            tg.cancel_scope.cancel()
    finally:
        client.close()
