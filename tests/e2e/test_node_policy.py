"""Network policy end to end through the whole agent (issue #16): pods created by
``statewright-cni`` as a runtime does, a NetworkPolicy written into the agent's manifest
directory, and real ``connect()`` calls from the client pod (see node_harness.py for the
environment).

The chain under test: manifest -> ``policies`` table -> the policy computation, which
selects the pods by their identity labels (the namespace label the agent adds and the
labels the runtime passed in ``args.cni.labels``) -> ``policy-entries`` and
``policy-endpoints`` -> the policy maps and ``policy_netns`` -> the socket program, which
refuses what the client pod's egress policy does not allow with EPERM, also through a
ClusterIP service whose backend is the server pod (checked after translation).

The server pod's labels are then changed through the API (``PATCH /endpoint``): its new
identity is no longer allowed, and allowed again once its labels are back.

Each step is timed from writing (or removing) the manifest, or from the PATCH, to the
first connection that shows it, bounded by `BOUND_S`, recorded for the e2e timings
summary and printed as JSON.
"""

from __future__ import annotations

import errno
import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from statewright.cni import AgentAPI
from tests.datapath.conftest import Client
from tests.e2e.conftest import need_machine, record
from tests.e2e.harness import BACKEND_PORT, ident, service_manifest
from tests.e2e.node_harness import NodeEnv, node_env, node_leftovers

pytestmark = pytest.mark.kernel

#: Generous: the manifests are polled, then the tables, maps and program follow.
BOUND_S = 30.0
NAMESPACE = "web"
VIP = "10.96.247.20"
OTHER_PORT = BACKEND_PORT + 1
POLICY = "client-egress"


@pytest.fixture(scope="module")
def node() -> Iterator[NodeEnv]:
    """The node with pods ``web/client``, ``web/server`` (servers started) and
    ``e2e/decoy`` (labelled like the server, in another namespace; servers started)."""
    need_machine()
    with node_env() as env:
        env.add_pod("client", NAMESPACE, {"app": "client"})
        env.serve(env.add_pod("server", NAMESPACE, {"app": "server"}))
        env.serve(env.add_pod("decoy", "e2e", {"app": "server"}))
        yield env


def deny_all_egress() -> str:
    """A NetworkPolicy selecting the client pod for egress with no rule: default deny."""
    return json.dumps(
        {
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": {"name": POLICY, "namespace": NAMESPACE},
            "spec": {"podSelector": {"matchLabels": {"app": "client"}}, "policyTypes": ["Egress"]},
        }
    )


def allow_egress_to_server() -> str:
    """The same policy allowing egress to the pods labelled ``app=server`` of its own
    namespace on TCP `BACKEND_PORT`."""
    return json.dumps(
        {
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": {"name": POLICY, "namespace": NAMESPACE},
            "spec": {
                "podSelector": {"matchLabels": {"app": "client"}},
                "policyTypes": ["Egress"],
                "egress": [
                    {
                        "to": [{"podSelector": {"matchLabels": {"app": "server"}}}],
                        "ports": [{"protocol": "TCP", "port": BACKEND_PORT}],
                    }
                ],
            },
        }
    )


def _connect(client: Client, host: str, port: int = BACKEND_PORT) -> dict[str, Any]:
    result: dict[str, Any] = client.tcp(host, port)[0]
    return result


def _eperm(result: dict[str, Any]) -> bool:
    return result.get("errno") == errno.EPERM


def _served_by(host: str, port: int = BACKEND_PORT) -> Callable[[dict[str, Any]], bool]:
    return lambda result: result.get("id") == ident(host, port)


def _patch_labels(api: AgentAPI, ref: str, labels: list[str]) -> float:
    """PATCH the endpoint's request labels; ``time.monotonic()`` before the request."""
    since = time.monotonic()
    api.request("PATCH", ref, {"labels": labels})
    return since


def _until(
    node: NodeEnv,
    what: str,
    since: float,
    probe: Callable[[], dict[str, Any]],
    want: Callable[[dict[str, Any]], bool],
) -> float:
    """Seconds from ``since`` (a manifest change) to the first ``probe()`` that ``want``
    accepts; AssertionError with the agent's log after `BOUND_S`."""
    while True:
        result = probe()
        elapsed = time.monotonic() - since
        if want(result):
            return elapsed
        if elapsed > BOUND_S:
            raise AssertionError(
                f"{what}: not in effect after {BOUND_S} s: last {result}\n"
                f"{node.agent.logs()[-3000:]}"
            )
        time.sleep(0.005)


def test_pod_identities_carry_namespace_and_runtime_labels(node: NodeEnv) -> None:
    deadline = time.monotonic() + BOUND_S
    while True:
        eps = node.endpoints()
        if set(eps) >= {"client", "server", "decoy"} and all(
            e["state"] == "ready" for e in eps.values()
        ):
            break
        assert time.monotonic() < deadline, eps
        time.sleep(0.05)
    def labels(ns: str, app: str) -> list[str]:
        # no Namespace object in the manifests: the namespace's labels are unknown
        return [
            f"k8s:app={app}",
            f"k8s:io.cilium.k8s.namespace.labels.kubernetes.io/metadata.name={ns}",
            f"k8s:io.kubernetes.pod.namespace={ns}",
            "statewright:namespace-labels=unknown",
        ]

    assert eps["client"]["identity-labels"] == labels("web", "client")
    assert eps["server"]["identity-labels"] == labels("web", "server")
    assert eps["decoy"]["identity-labels"] == labels("e2e", "server")
    # one identity per label set: the decoy's namespace makes it another identity
    assert len({eps[n]["identity"] for n in ("client", "server", "decoy")}) == 3


def test_policy_from_manifest_to_connect(node: NodeEnv) -> None:
    server, decoy = node.pods["server"], node.pods["decoy"]
    client = node.client_in(node.pods["client"])
    s4, s6, d4 = server.address(4), server.address(6), decoy.address(4)
    timings: dict[str, float] = {}

    # no policy: everything connects (the first IPv6 packets may wait for neighbour
    # discovery: retried within the bound), and the service's VIP reaches the server pod
    start = time.monotonic()
    for host in (s4, s6, d4):
        _until(node, f"baseline {host}", start, lambda h=host: _connect(client, h),
               _served_by(host))
    since = node.write("server-svc", service_manifest("server", VIP, [s4]))
    _until(node, "service", since, lambda: _connect(client, VIP, 80), _served_by(s4))

    # default deny for the client's egress
    since = node.write(POLICY, deny_all_egress())
    timings["default_deny_s"] = _until(node, "default deny", since,
                                       lambda: _connect(client, s4), _eperm)
    assert _eperm(_connect(client, s6))
    assert _eperm(_connect(client, d4))
    assert _eperm(_connect(client, VIP, 80))
    # only the client is selected: the server pod still connects out
    other = node.client_in(server)
    assert _served_by(d4)(_connect(other, d4))

    # allow egress to app=server of namespace web on BACKEND_PORT
    since = node.write(POLICY, allow_egress_to_server())
    timings["allow_s"] = _until(node, "allow rule", since, lambda: _connect(client, s4),
                                _served_by(s4))
    assert _served_by(s6)(_connect(client, s6))
    # through the service: the policy sees the backend (the server pod, BACKEND_PORT)
    timings["allow_service_s"] = _until(node, "allow through the service", since,
                                        lambda: _connect(client, VIP, 80), _served_by(s4))
    # the decoy has the label but not the namespace; another port is not allowed
    assert _eperm(_connect(client, d4))
    assert _eperm(_connect(client, s4, OTHER_PORT))

    # the server's labels change (PATCH /endpoint): another identity, not allowed; back
    # again: allowed (an identity change reaches the ipcache and the client's policy map)
    api = AgentAPI(node.agent.socket)
    ref = f"/endpoint/{node.endpoints()['server']['id']}"
    since = _patch_labels(api, ref, ["k8s:app=other"])
    timings["relabel_deny_s"] = _until(node, "server relabelled app=other", since,
                                       lambda: _connect(client, s4), _eperm)
    since = _patch_labels(api, ref, ["k8s:app=server"])
    timings["relabel_allow_s"] = _until(node, "server relabelled app=server", since,
                                        lambda: _connect(client, s4), _served_by(s4))

    # the policy removed: allowed again
    since = node.remove(POLICY)
    timings["removed_s"] = _until(node, "policy removed", since, lambda: _connect(client, d4),
                                  _served_by(d4))
    assert _served_by(s4)(_connect(client, s4))

    for what, seconds in timings.items():
        record(f"policy {what}", seconds)
    print(json.dumps({"node_policy_timings": timings, "bound_s": BOUND_S}))


def test_everything_is_removed_afterwards_also_on_failure() -> None:
    need_machine()

    class Boom(Exception):
        pass

    created = None
    with pytest.raises(Boom), node_env() as env:
        created = env
        env.add_pod("doomed", NAMESPACE, {"app": "client"})
        env.write(POLICY, deny_all_egress())
        raise Boom
    assert created is not None
    assert node_leftovers(created) == []
