"""Pod labels from the (fake) API server through the agent's components (issue #16): the
Kubernetes source reflects this node's Pods, the endpoints take their labels into their
identities, and a label change on the Pod moves the endpoint to another identity and so
changes the policy of the endpoints that select it."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from statewright.agent.components.endpoints import (
    ENDPOINTS,
    EndpointsComponent,
    EndpointsConfig,
)
from statewright.agent.components.kubernetes import (
    K8S_SOURCE,
    KubernetesComponent,
    KubernetesConfig,
)
from statewright.agent.components.lb import (
    LBComponentConfig,
    LBMapsComponent,
    LoadBalancerComponent,
    maps_placement,
)
from statewright.agent.components.policy import PolicyComponent
from statewright.agent.components.statedb import StateDBComponent
from statewright.agent.config import AgentConfig
from statewright.component import Hive
from tables.endpoints import EndpointChange
from tests.endpoints.helpers import new_pin_dir, remove_pins
from tests.endpoints.test_pod_labels import _in
from tests.k8s.fake_apiserver import FakeAPIServer
from tests.k8s.helpers import NODE, wait_for
from tests.k8s.objects import node

pytestmark = pytest.mark.anyio

NS = "k8s:io.kubernetes.pod.namespace"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def dirs() -> Iterator[tuple[str, str]]:
    pins = new_pin_dir("memory")
    state = tempfile.mkdtemp(prefix="sw-pod-labels-")
    try:
        yield pins, state
    finally:
        remove_pins("memory", pins)
        shutil.rmtree(state, ignore_errors=True)


def pod(name: str, labels: dict[str, str], *, ns: str = "web") -> dict[str, Any]:
    """A running Pod of this node without host ports."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "uid": f"uid-{name}", "labels": labels},
        "spec": {"nodeName": NODE, "containers": [{"name": "c"}]},
        "status": {"phase": "Running"},
    }


def allow_client_to_server() -> dict[str, Any]:
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": "client-egress", "namespace": "web"},
        "spec": {
            "podSelector": {"matchLabels": {"app": "client"}},
            "policyTypes": ["Egress"],
            "egress": [
                {
                    "to": [{"podSelector": {"matchLabels": {"app": "server"}}}],
                    "ports": [{"protocol": "TCP", "port": 8080}],
                }
            ],
        },
    }


@contextlib.asynccontextmanager
async def agent(config: AgentConfig) -> AsyncIterator[tuple[Hive, PolicyComponent]]:
    policy = PolicyComponent()
    hive = Hive(
        [
            StateDBComponent(),
            LoadBalancerComponent(LBComponentConfig.from_agent_config(config)),
            KubernetesComponent(KubernetesConfig.from_agent_config(config)),
            LBMapsComponent(maps_placement(config)),
            EndpointsComponent(
                EndpointsConfig.from_agent_config(config), link_exists=lambda e: True
            ),
            policy,
        ]
    )
    async with anyio.create_task_group() as tg:
        await hive.start(tg)
        try:
            yield hive, policy
        finally:
            await hive.stop()
            tg.cancel_scope.cancel()


def _config(
    apiserver: FakeAPIServer, dirs: tuple[str, str], tmp_path: Path, pod_cidr: str
) -> AgentConfig:
    """The agent on memory maps, its state in ``dirs``, following the fake API server."""
    pins, state = dirs
    return AgentConfig(
        pin_dir=pins,
        backend="memory",
        manifests=(),
        netlink=False,
        datapath=False,
        node_name=NODE,
        state_dir=state,
        pod_cidrs=(pod_cidr,),
        k8s_kubeconfig=apiserver.write_kubeconfig(tmp_path / "kubeconfig"),
    )


async def test_pod_labels_follow_the_pod_and_change_policy(
    apiserver: FakeAPIServer, dirs: tuple[str, str], tmp_path: Path
) -> None:
    apiserver.upsert(node(NODE))
    apiserver.upsert(pod("client", {"app": "client"}))
    apiserver.upsert(pod("server", {"app": "other"}))
    apiserver.upsert(allow_client_to_server())
    async with agent(_config(apiserver, dirs, tmp_path, "10.34.0.0/24")) as (hive, policy):
        manager = hive.lookup(ENDPOINTS)
        k8s: Any = hive.lookup(K8S_SOURCE)
        await wait_for(lambda: len(k8s.pod_labels) == 2, "the Pods listed")

        def create(name: str) -> int:
            # as statewright-cni sends it: pod name and namespace, no labels
            change = EndpointChange.parse({"k8s-pod-name": name, "k8s-namespace": "web"})
            return manager.create("0", change).id

        client_id = await anyio.to_thread.run_sync(create, "client")
        server_id = await anyio.to_thread.run_sync(create, "server")
        client, server = manager.get(str(client_id)), manager.get(str(server_id))
        assert client.identity_labels() == _in("web", "k8s:app=client")
        assert server.identity_labels() == _in("web", "k8s:app=other")

        assert policy.db is not None and policy.entries is not None
        entries, db = policy.entries, policy.db

        def remotes() -> set[int]:
            """The remote identities of the client's egress entries."""
            return {
                e.key.identity
                for e in entries.all(db.read_txn())
                if e.key.endpoint_id == client_id and e.key.egress and not e.deny
            }

        # the client is selected (namespace label) but nothing is labelled app=server
        await wait_for(lambda: policy.policy_endpoints is not None and any(
            p.endpoint_id == client_id and p.egress_enforced
            for p in policy.policy_endpoints.all(db.read_txn())
        ), "the client's egress enforced")
        assert server.identity not in remotes()

        # the Pod's label changes: the server endpoint gets another identity, which the
        # client's policy now allows
        apiserver.upsert(pod("server", {"app": "server"}))
        await wait_for(
            lambda: manager.get(str(server_id)).identity != server.identity, "server relabelled"
        )
        relabelled = manager.get(str(server_id))
        assert relabelled.identity_labels() == _in("web", "k8s:app=server")
        await wait_for(lambda: relabelled.identity in remotes(), "client policy follows")
        assert server.identity not in remotes()

        # a Pod of another namespace with the label is not selected by the policy
        apiserver.upsert(pod("decoy", {"app": "server"}, ns="other"))
        await wait_for(lambda: "other/decoy" in k8s.pod_labels, "decoy listed")
        decoy = await anyio.to_thread.run_sync(
            lambda: manager.create(
                "0", EndpointChange.parse({"k8s-pod-name": "decoy", "k8s-namespace": "other"})
            )
        )
        assert decoy.identity_labels() == _in("other", "k8s:app=server")
        await anyio.sleep(0.2)
        assert decoy.identity not in remotes()


def namespace(name: str, labels: dict[str, str]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}}


def namespace_selector_policy() -> dict[str, Any]:
    """Egress of web/client allowed to the pods of the namespaces labelled team=a."""
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": "to-team-a", "namespace": "web"},
        "spec": {
            "podSelector": {"matchLabels": {"app": "client"}},
            "policyTypes": ["Egress"],
            "egress": [{"to": [{"namespaceSelector": {"matchLabels": {"team": "a"}}}]}],
        },
    }


async def test_namespace_labels_go_into_pod_identities(
    apiserver: FakeAPIServer, dirs: tuple[str, str], tmp_path: Path
) -> None:
    apiserver.upsert(node(NODE))
    apiserver.upsert(namespace("web", {"team": "b"}))
    apiserver.upsert(namespace("db", {"team": "b"}))
    apiserver.upsert(pod("client", {"app": "client"}))
    apiserver.upsert(pod("pg", {"app": "pg"}, ns="db"))
    apiserver.upsert(namespace_selector_policy())
    async with agent(_config(apiserver, dirs, tmp_path, "10.35.0.0/24")) as (hive, policy):
        manager = hive.lookup(ENDPOINTS)
        k8s: Any = hive.lookup(K8S_SOURCE)
        component: Any = hive.component("endpoints")
        await wait_for(
            lambda: len(k8s.pod_labels) == 2 and component.namespace_source.synced,
            "Pods, Namespaces",
        )
        health = {h.name: h for h in hive.health()}
        assert "2 namespaces" in health["endpoints/namespaces"].message

        def create(name: str, ns: str) -> int:
            change = EndpointChange.parse({"k8s-pod-name": name, "k8s-namespace": ns})
            return manager.create("0", change).id

        client_id = await anyio.to_thread.run_sync(create, "client", "web")
        pg_id = await anyio.to_thread.run_sync(create, "pg", "db")
        pg = manager.get(str(pg_id))
        assert pg.identity_labels() == (
            "k8s:app=pg",
            "k8s:io.cilium.k8s.namespace.labels.kubernetes.io/metadata.name=db",
            "k8s:io.cilium.k8s.namespace.labels.team=b",
            f"{NS}=db",
        )
        assert policy.db is not None and policy.entries is not None
        entries, db = policy.entries, policy.db

        def remotes() -> set[int]:
            return {
                e.key.identity
                for e in entries.all(db.read_txn())
                if e.key.endpoint_id == client_id and e.key.egress and not e.deny
            }

        await anyio.sleep(0.2)
        assert pg.identity not in remotes()
        # the namespace's label changes: its pods move to new identities, which the
        # client's namespaceSelector now selects
        apiserver.upsert(namespace("db", {"team": "a"}))
        await wait_for(lambda: manager.get(str(pg_id)).identity != pg.identity, "pg relabelled")
        moved = manager.get(str(pg_id))
        assert "k8s:io.cilium.k8s.namespace.labels.team=a" in moved.identity_labels()
        await wait_for(lambda: moved.identity in remotes(), "client policy follows")
